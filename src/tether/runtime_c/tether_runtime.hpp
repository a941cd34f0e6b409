// tether_runtime.hpp: a header-only C++11 RAII wrapper of the C runtime (tether_runtime.h).
//
//     tether::Model model("model_dir");              // throws tether::Error (status + message) on failure
//     model.set_input(0, pixels.data(), pixels.size() * sizeof(float));
//     model.run();
//     tether::Tensor out = model.output(0);          // out.data<float>(), out.shape(), out.dtype_name()
//
// Built with -fno-exceptions (or with TETHER_RUNTIME_NO_EXCEPTIONS defined) nothing throws: check model.ok() after
// construction and the Status every call returns; tether::last_error() holds the message.
#ifndef TETHER_RUNTIME_HPP_
#define TETHER_RUNTIME_HPP_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tether_runtime.h"

#if !defined(TETHER_RUNTIME_NO_EXCEPTIONS) && (defined(__cpp_exceptions) || defined(__EXCEPTIONS))
#define TETHER_RUNTIME_EXCEPTIONS 1
#include <stdexcept>
#else
#define TETHER_RUNTIME_EXCEPTIONS 0
#endif

namespace tether {

inline std::string last_error() { return tether_rt_last_error(); }

#if TETHER_RUNTIME_EXCEPTIONS
// A failed call: status() is the tether_rt_status, what() the runtime's one-line message.
class Error : public std::runtime_error {
 public:
  Error(int status, const std::string& message) : std::runtime_error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};
#endif

// The status of a call; with exceptions on, a failure throws before it is returned.
class Status {
 public:
  explicit Status(int code = TETHER_RT_OK) : code_(code) {}
  bool ok() const { return code_ == TETHER_RT_OK; }
  int code() const { return code_; }
  const char* name() const { return tether_rt_status_name(code_); }

 private:
  int code_;
};

namespace detail {
inline Status check(int code) {
#if TETHER_RUNTIME_EXCEPTIONS
  if (code != TETHER_RT_OK) throw Error(code, tether_rt_last_error());
#endif
  return Status(code);
}
}  // namespace detail

// A view of one input or output buffer of a Model (valid while the Model lives).
class Tensor {
 public:
  Tensor() { info_ = tether_rt_tensor(); }
  explicit Tensor(const tether_rt_tensor& info) : info_(info) {}
  std::string name() const { return info_.name ? info_.name : ""; }
  tether_rt_dtype dtype() const { return info_.dtype; }
  std::string dtype_name() const { return info_.dtype_name ? info_.dtype_name : ""; }
  std::vector<int64_t> shape() const { return std::vector<int64_t>(info_.shape, info_.shape + info_.ndim); }
  std::size_t size() const { return info_.size; }
  std::size_t nbytes() const { return info_.nbytes; }
  void* raw() const { return info_.data; }
  template <typename T>
  T* data() const { return static_cast<T*>(info_.data); }
  template <typename T>
  std::vector<T> to_vector() const {
    const T* p = data<T>();
    return std::vector<T>(p, p + info_.nbytes / sizeof(T));
  }

 private:
  tether_rt_tensor info_;
};

// Threads a parallel kernel uses, process-wide (the caller included).
inline Status set_num_threads(int32_t n) { return detail::check(tether_rt_set_num_threads(n)); }
inline int32_t num_threads() { return tether_rt_get_num_threads(); }

// A loaded model folder; movable, not copyable; freed with the object.
class Model {
 public:
  Model() : m_(nullptr), status_(TETHER_RT_ERR_ARGUMENT) {}
  explicit Model(const std::string& folder, const tether_rt_options* options = nullptr) : m_(nullptr), status_(0) {
    status_ = detail::check(tether_rt_load(folder.c_str(), options, &m_));
  }
  ~Model() { tether_rt_free(m_); }
  Model(Model&& other) noexcept : m_(other.m_), status_(other.status_) { other.m_ = nullptr; }
  Model& operator=(Model&& other) noexcept {
    if (this != &other) {
      tether_rt_free(m_);
      m_ = other.m_;
      status_ = other.status_;
      other.m_ = nullptr;
    }
    return *this;
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  bool ok() const { return m_ != nullptr; }
  Status status() const { return status_; }
  tether_rt_model* get() const { return m_; }

  int32_t num_inputs() const { return tether_rt_num_inputs(m_); }
  int32_t num_outputs() const { return tether_rt_num_outputs(m_); }
  int32_t num_nodes() const { return tether_rt_num_nodes(m_); }
  uint64_t storage_bytes() const { return tether_rt_storage_bytes(m_); }
  int32_t input_index(const std::string& name) const {
    int32_t i = tether_rt_input_index(m_, name.c_str());
    if (i < 0) detail::check(TETHER_RT_ERR_ARGUMENT);
    return i;
  }
  int32_t output_index(const std::string& name) const {
    int32_t i = tether_rt_output_index(m_, name.c_str());
    if (i < 0) detail::check(TETHER_RT_ERR_ARGUMENT);
    return i;
  }
  Tensor input(int32_t index) const {
    tether_rt_tensor t = tether_rt_tensor();
    detail::check(tether_rt_input(m_, index, &t));
    return Tensor(t);
  }
  Tensor output(int32_t index) const {
    tether_rt_tensor t = tether_rt_tensor();
    detail::check(tether_rt_output(m_, index, &t));
    return Tensor(t);
  }
  Tensor output(const std::string& name) const { return output(output_index(name)); }

  Status set_input(int32_t index, const void* data, std::size_t nbytes) {
    return detail::check(tether_rt_set_input(m_, index, data, nbytes));
  }
  Status set_input(const std::string& name, const void* data, std::size_t nbytes) {
    return detail::check(tether_rt_set_input_by_name(m_, name.c_str(), data, nbytes));
  }
  template <typename T>
  Status set_input(int32_t index, const std::vector<T>& values) {
    return set_input(index, values.data(), values.size() * sizeof(T));
  }
  Status set_input(int32_t index, tether_rt_dtype dtype, const std::vector<int64_t>& shape, const void* data) {
    return detail::check(tether_rt_set_input_tensor(m_, index, dtype, static_cast<int32_t>(shape.size()),
                                                    shape.data(), data));
  }
  Status bind_input(int32_t index, const void* data, std::size_t nbytes) {
    return detail::check(tether_rt_bind_input(m_, index, data, nbytes));
  }
  Status bind_output(int32_t index, void* data, std::size_t nbytes) {
    return detail::check(tether_rt_bind_output(m_, index, data, nbytes));
  }
  Status load_params(const std::string& path) { return detail::check(tether_rt_load_params(m_, path.c_str())); }
  Status run() { return detail::check(tether_rt_run(m_)); }
  Status get_output(int32_t index, void* dst, std::size_t nbytes) const {
    return detail::check(tether_rt_get_output(m_, index, dst, nbytes));
  }

 private:
  tether_rt_model* m_;
  Status status_;
};

}  // namespace tether

#endif  // TETHER_RUNTIME_HPP_
