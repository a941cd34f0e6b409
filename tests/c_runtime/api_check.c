/* api_check.c: the C runtime's API on one model folder (tests/test_c_runtime.py): names, typed inputs, zero-copy
 * binding against the copying path, and the argument errors (each an error code plus a message, never a crash).
 * Prints one "ok NAME" or "FAIL NAME: why" line per check; exit status 0 only if every check passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tether_runtime.h"

static int failures;

static void check(int cond, const char* name, const char* why) {
  if (cond) printf("ok %s\n", name);
  else {
    printf("FAIL %s: %s\n", name, why);
    failures++;
  }
}

/* the call failed with `status` and left a message naming `word` */
static void refused(int got, int status, const char* word, const char* name) {
  const char* msg = tether_rt_last_error();
  printf("  %s -> %s: %s\n", name, tether_rt_status_name(got), msg);
  check(got == status && strstr(msg, word) != NULL, name, msg);
}

static void* aligned(size_t n) {
  void* p = NULL;
  return posix_memalign(&p, 64, n ? n : 1) == 0 ? p : NULL;
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  tether_rt_model* m = NULL;
  int st = tether_rt_load(argv[1], NULL, &m);
  if (st != TETHER_RT_OK) {
    printf("FAIL load: %s\n", tether_rt_last_error());
    return 1;
  }
  tether_rt_tensor in, out;
  tether_rt_input(m, 0, &in);
  tether_rt_output(m, 0, &out);
  check(tether_rt_input_index(m, in.name) == 0 && tether_rt_output_index(m, out.name) == 0, "names", "index");
  refused(tether_rt_input_index(m, "no-such-input") < 0 ? TETHER_RT_ERR_ARGUMENT : 0, TETHER_RT_ERR_ARGUMENT,
          "no-such-input", "unknown input name");
  check(tether_rt_num_nodes(m) > 0 && tether_rt_storage_bytes(m) >= in.nbytes + out.nbytes, "describe", "sizes");

  /* a fixed input through the copying path: the reference for the zero-copy path */
  float* x = (float*)aligned(in.nbytes);
  for (size_t k = 0; k < in.size; k++) x[k] = (float)((int)(k % 17) - 8) / 8.0f;
  check(tether_rt_set_input(m, 0, x, in.nbytes) == TETHER_RT_OK && tether_rt_run(m) == TETHER_RT_OK, "run", "run");
  void* ref = malloc(out.nbytes);
  check(tether_rt_get_output(m, 0, ref, out.nbytes) == TETHER_RT_OK, "get_output", tether_rt_last_error());

  /* a typed input whose shape differs only by dimensions of 1 is accepted, as the Python executor accepts it */
  int64_t shape[70];
  shape[0] = 1;
  memcpy(shape + 1, in.shape, (size_t)in.ndim * sizeof(int64_t));
  check(tether_rt_set_input_tensor(m, 0, in.dtype, in.ndim + 1, shape, x) == TETHER_RT_OK, "squeezable shape",
        tether_rt_last_error());
  int64_t wrong[70];
  memcpy(wrong, in.shape, (size_t)in.ndim * sizeof(int64_t));
  wrong[in.ndim - 1] += 1;
  refused(tether_rt_set_input_tensor(m, 0, in.dtype, in.ndim, wrong, x), TETHER_RT_ERR_ARGUMENT, "expects",
          "wrong shape");
  refused(tether_rt_set_input_tensor(m, 0, TETHER_RT_INT32, in.ndim, in.shape, x), TETHER_RT_ERR_ARGUMENT, "int32",
          "wrong dtype");
  refused(tether_rt_set_input(m, 0, x, in.nbytes - 4), TETHER_RT_ERR_ARGUMENT, "bytes", "wrong size");
  refused(tether_rt_set_input(m, 7, x, in.nbytes), TETHER_RT_ERR_ARGUMENT, "out of range", "input index");
  refused(tether_rt_output(m, -1, &out), TETHER_RT_ERR_ARGUMENT, "out of range", "output index");
  refused(tether_rt_get_output(m, 0, ref, out.nbytes - 1), TETHER_RT_ERR_ARGUMENT, "too small", "small buffer");
  refused(tether_rt_set_input_by_name(m, "nope", x, in.nbytes), TETHER_RT_ERR_ARGUMENT, "nope", "input by name");
  refused(tether_rt_run(NULL), TETHER_RT_ERR_ARGUMENT, "NULL", "NULL model");
  refused(tether_rt_set_num_threads(0), TETHER_RT_ERR_ARGUMENT, "threads", "zero threads");
  refused(tether_rt_bind_input(m, 0, (char*)x + 1, in.nbytes), TETHER_RT_ERR_ARGUMENT, "aligned", "misaligned bind");

  /* zero copy: the kernels read the caller's input and write the caller's output; the same bytes come out */
  float* x2 = (float*)aligned(in.nbytes);
  memcpy(x2, x, in.nbytes);
  void* y = aligned(out.nbytes);
  memset(y, 0xAB, out.nbytes);
  memset(x, 0, in.nbytes);   /* the model's own input buffer would now give another result */
  tether_rt_set_input(m, 0, x, in.nbytes);
  check(tether_rt_bind_input(m, 0, x2, in.nbytes) == TETHER_RT_OK &&
        tether_rt_bind_output(m, 0, y, out.nbytes) == TETHER_RT_OK && tether_rt_run(m) == TETHER_RT_OK,
        "bind", tether_rt_last_error());
  tether_rt_tensor bound;
  tether_rt_output(m, 0, &bound);
  check(memcmp(y, ref, out.nbytes) == 0 && bound.data == y, "bound output equals copied", "bytes differ");
  /* unbinding returns to the model's buffers (its input holds zeros now: another result) */
  check(tether_rt_bind_input(m, 0, NULL, 0) == TETHER_RT_OK && tether_rt_bind_output(m, 0, NULL, 0) == TETHER_RT_OK &&
        tether_rt_run(m) == TETHER_RT_OK, "unbind", tether_rt_last_error());
  tether_rt_output(m, 0, &bound);
  check(bound.data != y && memcmp(y, ref, out.nbytes) == 0, "unbound output is the model's", "moved");

  /* the thread count changes nothing in the results */
  tether_rt_set_input(m, 0, x2, in.nbytes);
  int ok = tether_rt_set_num_threads(1) == TETHER_RT_OK && tether_rt_run(m) == TETHER_RT_OK;
  ok = ok && memcmp(bound.data, ref, out.nbytes) == 0;
  ok = ok && tether_rt_set_num_threads(3) == TETHER_RT_OK && tether_rt_get_num_threads() == 3 &&
       tether_rt_run(m) == TETHER_RT_OK && memcmp(bound.data, ref, out.nbytes) == 0;
  check(ok, "threads", tether_rt_last_error());

  /* a second model of the same folder runs beside the first, and freeing one leaves the other working */
  tether_rt_model* m2 = NULL;
  ok = tether_rt_load(argv[1], NULL, &m2) == TETHER_RT_OK && tether_rt_set_input(m2, 0, x2, in.nbytes) == 0 &&
       tether_rt_run(m2) == TETHER_RT_OK;
  tether_rt_free(m);
  tether_rt_tensor out2;
  ok = ok && tether_rt_run(m2) == TETHER_RT_OK && tether_rt_output(m2, 0, &out2) == 0 &&
       memcmp(out2.data, ref, out.nbytes) == 0;
  check(ok, "two models", tether_rt_last_error());
  tether_rt_free(m2);
  tether_rt_free(NULL);
  free(x);
  free(x2);
  free(y);
  free(ref);
  printf("%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
