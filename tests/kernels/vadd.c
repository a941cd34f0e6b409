/* vadd(A, B, C): C = A + B over float32[N]; probe(out, i, f, s, b): echoes scalar arguments. */
#include "tether_abi.h"
#ifndef N
#define N 1024
#endif
#define STR_(x) #x
#define STR(x) STR_(x)

TETHER_META("{\"abi_version\": 1, \"tether_version\": \"0.1.0\", "
            "\"target\": {\"arch\": \"" TETHER_ARCH "\", \"preset\": \"test\"}, \"functions\": ["
            "{\"name\": \"vadd\", \"args\": [{\"name\": \"A\", \"shape\": [" STR(N) "], \"dtype\": \"float32\"}, "
            "{\"name\": \"B\", \"shape\": [" STR(N) "], \"dtype\": \"float32\"}, "
            "{\"name\": \"C\", \"shape\": [" STR(N) "], \"dtype\": \"float32\"}], \"parallel\": false}, "
            "{\"name\": \"probe\", \"args\": [{\"name\": \"out\", \"shape\": [4], \"dtype\": \"int64\"}, "
            "{\"name\": \"i\"}, {\"name\": \"f\"}, {\"name\": \"s\"}, {\"name\": \"b\"}], \"parallel\": false}]}");

TETHER_EXPORT int32_t vadd(const TetherValue* args, const int32_t* codes, int32_t num_args) {
  static const int64_t shape[1] = {N};
  CHECK_NARGS(3);
  for (int i = 0; i < 3; ++i) CHECK(check_tensor(args, codes, i, 1, shape, 2, 32));
  const float* a = DATA(0, float);
  const float* b = DATA(1, float);
  float* c = DATA(2, float);
  for (int64_t k = 0; k < N; ++k) c[k] = a[k] + b[k];
  return 0;
}

/* out[0] = i, out[1] = round(f * 1000) (|f| < 2e6), out[2] = strlen(s), out[3] = sum of the bytes of b * 1000 + len(b). */
TETHER_EXPORT int32_t probe(const TetherValue* args, const int32_t* codes, int32_t num_args) {
  static const int64_t shape[1] = {4};
  CHECK_NARGS(5);
  CHECK(check_tensor(args, codes, 0, 1, shape, 0, 64));
  if (codes[1] != TETHER_INT64) return ERR(2, 1, 0);
  if (codes[2] != TETHER_FLOAT64) return ERR(2, 2, 0);
  if (codes[3] != TETHER_STR) return ERR(2, 3, 0);
  if (codes[4] != TETHER_BYTES) return ERR(2, 4, 0);
  int64_t* out = DATA(0, int64_t);
  out[0] = args[1].v_int64;
  double f = args[2].v_float64 * 1000.0;
  /* via int32: a double -> int64 conversion needs a runtime helper on 32-bit ARM */
  out[1] = (int32_t)(f < 0 ? f - 0.5 : f + 0.5);
  int64_t n = 0;
  for (const char* s = args[3].v_str; *s; ++s) ++n;
  out[2] = n;
  const TetherBytes* b = (const TetherBytes*)args[4].v_handle;
  int64_t sum = 0;
  for (uint64_t k = 0; k < b->size; ++k) sum += ((const uint8_t*)b->data)[k];
  out[3] = sum * 1000 + (int64_t)b->size;
  return 0;
}
