// run_model.cpp: run a model folder (deploy.json + deploy.so + deploy.params) with the C runtime's C++ wrapper.
//
//     run_model MODEL_DIR [-i INPUT.raw]... [-o OUT_DIR] [-t THREADS]
//
// The same command line as examples/c/run_model.c: each -i file holds the raw bytes of one input in order (what
// numpy's x.astype("float32").tofile(path) writes); inputs without a file get a fixed pattern. Prints every
// output's shape and a few values; with -o, writes output K to OUT_DIR/output_K.raw. The output buffers are bound
// to this program's own vectors (zero copy): the kernels write the results straight into them.
//
// Build (docs/deploy.md), e.g. for a Raspberry Pi 4 after `tether runtime --target rasp4b -o rt`:
//     zig c++ -target aarch64-linux-gnu -O2 -std=c++17 -Irt/include run_model.cpp rt/lib/libtether_runtime.a \
//         -ldl -lpthread -o run_model
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "tether_runtime.hpp"

static std::vector<unsigned char> read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read input file " + path);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// the pattern of examples/c/run_model.c, so both programs see the same inputs
static std::vector<unsigned char> pattern(const tether::Tensor& in) {
  std::vector<unsigned char> bytes(in.nbytes());
  if (in.dtype() != TETHER_RT_FLOAT32 && in.dtype() != TETHER_RT_FLOAT64) {
    for (std::size_t b = 0; b < bytes.size(); b++) bytes[b] = static_cast<unsigned char>(b & 0x3F);
    return bytes;
  }
  for (std::size_t k = 0; k < in.size(); k++) {
    float v = static_cast<float>(static_cast<int>((static_cast<uint32_t>(k) * 2654435761u) >> 20 & 0xFF) - 128) /
              128.0f;
    if (in.dtype() == TETHER_RT_FLOAT32) std::memcpy(&bytes[k * 4], &v, 4);
    else {
      double d = v;
      std::memcpy(&bytes[k * 8], &d, 8);
    }
  }
  return bytes;
}

int main(int argc, char** argv) {
  std::string folder, out_dir;
  std::vector<std::string> files;
  int threads = 0;
  for (int k = 1; k < argc; k++) {
    std::string a = argv[k];
    if (a == "-i" && k + 1 < argc) files.push_back(argv[++k]);
    else if (a == "-o" && k + 1 < argc) out_dir = argv[++k];
    else if (a == "-t" && k + 1 < argc) threads = std::atoi(argv[++k]);
    else if (folder.empty() && a[0] != '-') folder = a;
    else folder.clear(), k = argc;
  }
  if (folder.empty()) {
    std::cerr << "usage: " << argv[0] << " MODEL_DIR [-i INPUT.raw]... [-o OUT_DIR] [-t THREADS]\n";
    return 2;
  }
  try {
    if (threads > 0) tether::set_num_threads(threads);
    tether::Model model(folder);
    for (int32_t k = 0; k < model.num_inputs(); k++) {
      std::vector<unsigned char> bytes = k < static_cast<int32_t>(files.size()) ? read_raw(files[k])
                                                                                : pattern(model.input(k));
      model.set_input(k, bytes.data(), bytes.size());
    }
    std::vector<std::vector<unsigned char>> results(model.num_outputs());
    for (int32_t k = 0; k < model.num_outputs(); k++) {
      results[k].resize(model.output(k).nbytes() + 64);
      // aligned for any element type: the start of the vector's storage, rounded up to 64 bytes
      std::size_t skew = (64 - reinterpret_cast<std::uintptr_t>(results[k].data()) % 64) % 64;
      try {
        model.bind_output(k, results[k].data() + skew, model.output(k).nbytes());
      } catch (const tether::Error& e) {   // an output that is a view of another buffer stays where it is
        if (e.status() != TETHER_RT_ERR_UNSUPPORTED) throw;
      }
    }
    model.run();
    for (int32_t k = 0; k < model.num_outputs(); k++) {
      tether::Tensor out = model.output(k);   // data() is the bound vector's memory
      std::printf("output %d '%s' %s (", static_cast<int>(k), out.name().c_str(), out.dtype_name().c_str());
      std::vector<int64_t> shape = out.shape();
      for (std::size_t d = 0; d < shape.size(); d++) std::printf("%s%lld", d ? ", " : "", (long long)shape[d]);
      std::printf(shape.size() == 1 ? ",):" : "):");
      if (out.dtype() == TETHER_RT_FLOAT32)
        for (std::size_t i = 0; i < out.size() && i < 6; i++) std::printf(" %.6g", out.data<float>()[i]);
      std::printf("%s\n", out.size() > 6 ? " ..." : "");
      if (!out_dir.empty()) {
        std::string path = out_dir + "/output_" + std::to_string(k) + ".raw";
        std::ofstream fh(path, std::ios::binary);
        fh.write(static_cast<const char*>(out.raw()), static_cast<std::streamsize>(out.nbytes()));
        if (!fh) throw std::runtime_error("cannot write " + path);
      }
    }
  } catch (const tether::Error& e) {
    std::fprintf(stderr, "error %s: %s\n", tether_rt_status_name(e.status()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
