/* run_model.c: run a model folder (deploy.json + deploy.so + deploy.params) with the C runtime.
 *
 *     run_model MODEL_DIR [-i INPUT.raw]... [-o OUT_DIR] [-t THREADS]
 *
 * Each -i file holds the raw bytes of one input, in order (e.g. float32 little-endian, C order: what numpy's
 * x.astype("float32").tofile(path) writes). Inputs without a file get a fixed pattern. Prints every output's
 * shape and a few values; with -o, writes output k to OUT_DIR/output_K.raw.
 *
 * Build (docs/deploy.md), e.g. for a Raspberry Pi 4 after `tether runtime --target rasp4b -o rt`:
 *     zig cc -target aarch64-linux-gnu -O2 -Irt/include run_model.c rt/lib/libtether_runtime.a -ldl -lpthread \
 *         -o run_model */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tether_runtime.h"

static void* read_raw(const char* path, size_t* size) {
  FILE* fh = fopen(path, "rb");
  if (fh == NULL) return NULL;
  fseek(fh, 0, SEEK_END);
  long n = ftell(fh);
  fseek(fh, 0, SEEK_SET);
  void* buf = malloc(n > 0 ? (size_t)n : 1);
  if (buf && n > 0 && fread(buf, 1, (size_t)n, fh) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(fh);
  *size = n > 0 ? (size_t)n : 0;
  return buf;
}

/* a fixed input, the same in every build: small values in [-1, 1) (bytes for non-float inputs) */
static void fill_pattern(const tether_rt_tensor* in, void* data) {
  if (in->dtype != TETHER_RT_FLOAT32 && in->dtype != TETHER_RT_FLOAT64) {
    for (size_t b = 0; b < in->nbytes; b++) ((unsigned char*)data)[b] = (unsigned char)(b & 0x3F);
    return;
  }
  for (size_t k = 0; k < in->size; k++) {
    float v = (float)((int)(((uint32_t)k * 2654435761u) >> 20 & 0xFF) - 128) / 128.0f;
    if (in->dtype == TETHER_RT_FLOAT32) ((float*)data)[k] = v;
    else ((double*)data)[k] = v;
  }
}

static void print_values(const tether_rt_tensor* t) {
  size_t show = t->size < 6 ? t->size : 6;
  for (size_t k = 0; k < show; k++) {
    if (t->dtype == TETHER_RT_FLOAT32) printf(" %.6g", ((const float*)t->data)[k]);
    else if (t->dtype == TETHER_RT_INT64) printf(" %lld", (long long)((const int64_t*)t->data)[k]);
    else if (t->dtype == TETHER_RT_INT32) printf(" %d", ((const int32_t*)t->data)[k]);
    else if (t->dtype == TETHER_RT_UINT8 || t->dtype == TETHER_RT_BOOL) printf(" %u", ((const uint8_t*)t->data)[k]);
    else if (t->dtype == TETHER_RT_INT8) printf(" %d", ((const int8_t*)t->data)[k]);
  }
  printf("%s\n", show < t->size ? " ..." : "");
}

int main(int argc, char** argv) {
  const char *folder = NULL, *out_dir = NULL, *inputs[64];
  int num_files = 0, threads = 0;
  for (int k = 1; k < argc; k++) {
    if (strcmp(argv[k], "-i") == 0 && k + 1 < argc && num_files < 64) inputs[num_files++] = argv[++k];
    else if (strcmp(argv[k], "-o") == 0 && k + 1 < argc) out_dir = argv[++k];
    else if (strcmp(argv[k], "-t") == 0 && k + 1 < argc) threads = atoi(argv[++k]);
    else if (folder == NULL && argv[k][0] != '-') folder = argv[k];
    else {
      fprintf(stderr, "usage: %s MODEL_DIR [-i INPUT.raw]... [-o OUT_DIR] [-t THREADS]\n", argv[0]);
      return 2;
    }
  }
  if (folder == NULL) {
    fprintf(stderr, "usage: %s MODEL_DIR [-i INPUT.raw]... [-o OUT_DIR] [-t THREADS]\n", argv[0]);
    return 2;
  }
  if (threads > 0 && tether_rt_set_num_threads(threads) != TETHER_RT_OK) {
    fprintf(stderr, "error: %s\n", tether_rt_last_error());
    return 2;
  }
  tether_rt_model* model = NULL;
  int status = tether_rt_load(folder, NULL, &model);
  if (status != TETHER_RT_OK) {
    fprintf(stderr, "error %s: %s\n", tether_rt_status_name(status), tether_rt_last_error());
    return 1;
  }
  for (int32_t k = 0; k < tether_rt_num_inputs(model); k++) {
    tether_rt_tensor in;
    tether_rt_input(model, k, &in);
    size_t size = in.nbytes;
    void* data = k < num_files ? read_raw(inputs[k], &size) : malloc(in.nbytes ? in.nbytes : 1);
    if (data == NULL) {
      fprintf(stderr, "error: cannot read input file %s\n", inputs[k]);
      tether_rt_free(model);
      return 1;
    }
    if (k >= num_files) fill_pattern(&in, data);
    status = tether_rt_set_input(model, k, data, size);   /* copies; tether_rt_bind_input would not */
    free(data);
    if (status != TETHER_RT_OK) {
      fprintf(stderr, "error %s: %s\n", tether_rt_status_name(status), tether_rt_last_error());
      tether_rt_free(model);
      return 1;
    }
  }
  status = tether_rt_run(model);
  if (status != TETHER_RT_OK) {
    fprintf(stderr, "error %s: %s\n", tether_rt_status_name(status), tether_rt_last_error());
    tether_rt_free(model);
    return 1;
  }
  for (int32_t k = 0; k < tether_rt_num_outputs(model); k++) {
    tether_rt_tensor out;
    tether_rt_output(model, k, &out);
    printf("output %d '%s' %s (", (int)k, out.name, out.dtype_name);
    for (int32_t d = 0; d < out.ndim; d++) printf("%s%lld", d ? ", " : "", (long long)out.shape[d]);
    printf(out.ndim == 1 ? ",):" : "):");
    print_values(&out);
    if (out_dir) {
      char path[4096];
      snprintf(path, sizeof path, "%s/output_%d.raw", out_dir, (int)k);
      FILE* fh = fopen(path, "wb");
      if (fh == NULL || fwrite(out.data, 1, out.nbytes, fh) != out.nbytes) {
        fprintf(stderr, "error: cannot write %s\n", path);
        if (fh) fclose(fh);
        tether_rt_free(model);
        return 1;
      }
      fclose(fh);
    }
  }
  tether_rt_free(model);
  return 0;
}
