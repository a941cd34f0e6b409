/* run_model.c: run an ahead-of-time tether model (docs/deploy.md "The AOT module") from C.
 *
 *   tether compile model.onnx --aot --name model -o out/     # out/model.h, out/libmodel.a, out/libmodel.so
 *   python -m ziglang cc -O2 -Iout examples/aot/run_model.c out/libmodel.a -o run_model
 *   ./run_model input0.bin -o output0.bin
 *
 * Inputs and outputs are raw little-endian files of exactly <PREFIX>_INPUTi_NBYTES bytes (numpy: a.tofile()).
 * Another prefix than "model" (tether compile --name digits): -DMODEL_PREFIX=digits -DMODEL_HEADER='"digits.h"'.
 *
 * Options: --params FILE   the params file of a model built with --params external (read into aligned memory)
 *          --workspace N   the caller's workspace of N bytes (0: <PREFIX>_WORKSPACE_SIZE); without it the
 *                          library's static workspace (if it was built with one)
 *          --repeat N      run N times and print the median time of one run in nanoseconds
 * Exit status: 0, or the TETHER_AOT_* code of the first failure (its message on stderr); 100 for usage errors. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model_select.h"  /* the generated model header and M(name) for its prefix */

static void* read_file(const char* path, uint64_t* size) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  /* 64-byte aligned, so that a params file meets the library's alignment */
  void* data = aligned_alloc(64, ((uint64_t)n + 64) / 64 * 64);
  if (data && n > 0 && fread(data, 1, (size_t)n, f) != (size_t)n) {
    free(data);
    data = NULL;
  }
  fclose(f);
  *size = (uint64_t)n;
  return data;
}

static int fail(int code, const char* what) {
  fprintf(stderr, "%s: error %d: %s\n", what, code, M(error_message)(code));
  if (code == TETHER_AOT_KERNEL)
    fprintf(stderr, "  node %s, kernel code 0x%08x\n", M(failed_node)(), (unsigned)M(kernel_code)());
  return code;
}

static int compare_u64(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  const char* params_path = NULL;
  const char* in_paths[64];
  const char* out_paths[64];
  int n_in = 0, n_out = 0, outputs_next = 0, repeat = 1;
  long long workspace_bytes = -1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--params") && i + 1 < argc) params_path = argv[++i];
    else if (!strcmp(argv[i], "--workspace") && i + 1 < argc) workspace_bytes = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-o")) outputs_next = 1;
    else if (outputs_next && n_out < 64) out_paths[n_out++] = argv[i];
    else if (!outputs_next && n_in < 64) in_paths[n_in++] = argv[i];
  }
  if (n_in != M(num_inputs)() || repeat < 1) {
    fprintf(stderr, "usage: %s [--params FILE] [--workspace N] [--repeat N] IN0.bin ... [-o OUT0.bin ...]\n"
            "this model takes %d input(s):\n", argv[0], M(num_inputs)());
    for (int i = 0; i < M(num_inputs)(); i++)
      fprintf(stderr, "  %s %s, %llu bytes\n", M(input_name)(i), M(input_dtype)(i),
              (unsigned long long)M(input_nbytes)(i));
    return 100;
  }

  if (params_path) {
    uint64_t size = 0;
    void* params = read_file(params_path, &size);
    if (!params) { perror(params_path); return 100; }
    int rc = M(load_params)(params, size);  /* params stay in use: not freed */
    if (rc) return fail(rc, params_path);
  }

  void* workspace = NULL;                   /* NULL: the library's static workspace */
  if (workspace_bytes >= 0) {
    uint64_t n = workspace_bytes ? (uint64_t)workspace_bytes : M(workspace_size)();
    workspace = aligned_alloc(64, (n + 63) / 64 * 64);
    int rc = M(workspace_init)(workspace, n);
    if (rc) return fail(rc, "workspace");
  }

  const void* inputs[64];
  uint64_t input_nbytes[64];
  for (int i = 0; i < n_in; i++) {
    void* data = read_file(in_paths[i], &input_nbytes[i]);
    if (!data) { perror(in_paths[i]); return 100; }
    inputs[i] = data;
  }
  void* outputs[64];
  uint64_t output_nbytes[64];
  for (int i = 0; i < M(num_outputs)(); i++) {
    output_nbytes[i] = M(output_nbytes)(i);
    outputs[i] = malloc(output_nbytes[i] ? output_nbytes[i] : 1);
  }

  uint64_t* times = malloc(sizeof(uint64_t) * (size_t)repeat);
  for (int r = 0; r < repeat; r++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* the sizes are checked against the model's: a file of the wrong size is an error code, never a crash */
    int rc = M(run_arrays)(inputs, input_nbytes, outputs, output_nbytes, workspace);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc) return fail(rc, "run");
    times[r] = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000u + (uint64_t)(t1.tv_nsec - t0.tv_nsec);
  }
  if (repeat > 1) {
    qsort(times, (size_t)repeat, sizeof(uint64_t), compare_u64);
    printf("median_ns %llu\n", (unsigned long long)times[repeat / 2]);
  }

  for (int i = 0; i < M(num_outputs)(); i++) {
    printf("output %d %s %s, %llu bytes\n", i, M(output_name)(i), M(output_dtype)(i),
           (unsigned long long)output_nbytes[i]);
    if (i < n_out) {
      FILE* f = fopen(out_paths[i], "wb");
      if (!f || fwrite(outputs[i], 1, output_nbytes[i], f) != output_nbytes[i]) { perror(out_paths[i]); return 100; }
      fclose(f);
    }
  }
  return 0;
}
