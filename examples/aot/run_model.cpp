// run_model.cpp: run an ahead-of-time tether model (docs/deploy.md "The AOT module") from C++.
//
//   tether compile model.onnx --aot --name model -o out/
//   python -m ziglang c++ -std=c++17 -O2 -Iout examples/aot/run_model.cpp out/libmodel.a -o run_model_cpp
//   ./run_model_cpp input0.bin -o output0.bin
//
// The same file formats and exit codes as run_model.c; --threads N lends the model N-1 worker threads (the
// calling thread is the N-th). Another prefix: -DMODEL_PREFIX=digits -DMODEL_HEADER='"digits.h"'.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model_select.h"  /* the generated model header and M(name) for its prefix */

namespace {

struct AotError : std::runtime_error {
  int code;
  AotError(int c, const std::string& what) : std::runtime_error(what + ": " + M(error_message)(c)), code(c) {}
};

void check(int rc, const char* what) {
  if (rc) throw AotError(rc, what);
}

// 64-byte aligned bytes, freed on scope exit
struct AlignedFree {
  void operator()(std::uint8_t* p) const { ::operator delete[](p, std::align_val_t(64)); }
};
using Buffer = std::unique_ptr<std::uint8_t[], AlignedFree>;
Buffer aligned_bytes(std::size_t n) {
  return Buffer(static_cast<std::uint8_t*>(::operator new[](n ? n : 1, std::align_val_t(64))));
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

// The model with its own workspace and, optionally, worker threads: one object per concurrent user.
class Model {
 public:
  explicit Model(int threads = 1) : workspace_(aligned_bytes(M(workspace_size)())) {
    check(M(workspace_init)(workspace_.get(), M(workspace_size)()), "workspace");
    if (threads > 1) {
      check(M(set_num_threads)(threads), "threads");
      for (int i = 1; i < threads; i++) workers_.emplace_back([] { M(thread_worker)(); });
      // a worker that enters after threads_stop would serve on: stop only workers known to be inside
      while (M(num_workers)() < threads - 1) std::this_thread::yield();
    }
  }
  ~Model() {
    if (!workers_.empty()) {
      M(threads_stop)();
      for (auto& t : workers_) t.join();
      M(set_num_threads)(1);
    }
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // params of a model built with --params external: kept alive by this object
  void load_params(const std::string& path) {
    std::vector<char> bytes = read_file(path);
    params_ = aligned_bytes(bytes.size());
    std::copy(bytes.begin(), bytes.end(), params_.get());
    check(M(load_params)(params_.get(), bytes.size()), path.c_str());
  }

  std::vector<std::vector<char>> run(const std::vector<std::vector<char>>& inputs) {
    std::vector<const void*> in;
    std::vector<std::uint64_t> in_sizes;
    for (const auto& x : inputs) {
      in.push_back(x.data());
      in_sizes.push_back(x.size());
    }
    std::vector<std::vector<char>> outputs(M(num_outputs)());
    std::vector<void*> out;
    std::vector<std::uint64_t> out_sizes;
    for (int i = 0; i < M(num_outputs)(); i++) {
      outputs[i].resize(M(output_nbytes)(i));
      out.push_back(outputs[i].data());
      out_sizes.push_back(outputs[i].size());
    }
    if (static_cast<int>(inputs.size()) != M(num_inputs)()) throw AotError(TETHER_AOT_BAD_INDEX, "inputs");
    check(M(run_arrays)(in.data(), in_sizes.data(), out.data(), out_sizes.data(), workspace_.get()), "run");
    return outputs;
  }

 private:
  Buffer workspace_;
  Buffer params_;
  std::vector<std::thread> workers_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string params;
  std::vector<std::string> in_paths, out_paths;
  int threads = 1;
  bool outputs_next = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--params" && i + 1 < argc) params = argv[++i];
    else if (a == "--threads" && i + 1 < argc) threads = std::stoi(argv[++i]);
    else if (a == "-o") outputs_next = true;
    else (outputs_next ? out_paths : in_paths).push_back(a);
  }
  try {
    Model model(threads);
    if (!params.empty()) model.load_params(params);
    std::vector<std::vector<char>> inputs;
    for (const auto& p : in_paths) inputs.push_back(read_file(p));
    auto outputs = model.run(inputs);
    for (std::size_t i = 0; i < outputs.size(); i++) {
      std::cout << "output " << i << " " << M(output_name)(static_cast<int>(i)) << ", " << outputs[i].size()
                << " bytes\n";
      if (i < out_paths.size()) std::ofstream(out_paths[i], std::ios::binary).write(outputs[i].data(),
                                                                                   outputs[i].size());
    }
  } catch (const AotError& e) {
    std::cerr << e.what() << "\n";
    return e.code;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 100;
  }
  return 0;
}
