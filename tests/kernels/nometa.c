/* A well-formed shared library without tether metadata: load_module must refuse it. */
#include <stdint.h>
__attribute__((visibility("default"))) int32_t vadd(const void* args, const int32_t* codes, int32_t n) {
  (void)args; (void)codes; return n;
}
