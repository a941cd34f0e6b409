/* A module with a CPU-features word (docs/abi.md "CPU dispatch") and read_word(out): out[0] = the word, as the
 * runtime that loaded the module set it. CPU_DISPATCH is the metadata's "cpu_dispatch" JSON as a C string
 * (-DCPU_DISPATCH=...), so the bit names are the test's choice. */
#include "tether_abi.h"
#ifndef CPU_DISPATCH
#define CPU_DISPATCH "[\"asimddp\"]"
#endif

TETHER_META("{\"abi_version\": 1, \"tether_version\": \"0.1.0\", "
            "\"target\": {\"arch\": \"" TETHER_ARCH "\", \"preset\": \"test\"}, "
            "\"cpu_dispatch\": " CPU_DISPATCH ", \"functions\": ["
            "{\"name\": \"read_word\", \"args\": [{\"name\": \"out\", \"shape\": [1], \"dtype\": \"int64\"}], "
            "\"parallel\": false}]}");

TETHER_EXPORT uint32_t tether_cpu_features = 0;

TETHER_EXPORT int32_t read_word(const TetherValue* args, const int32_t* codes, int32_t num_args) {
  static const int64_t shape[1] = {1};
  CHECK_NARGS(1);
  CHECK(check_tensor(args, codes, 0, 1, shape, 0, 64));
  *DATA(0, int64_t) = (int64_t)*(volatile uint32_t*)&tether_cpu_features;
  return 0;
}
