/* error.c: the calling thread's last error message, status names, and the dtype table
 * (tether_rpc/dtypes.py: the same names, DLPack codes and widths). */
#include "rt_internal.h"

#include <stdarg.h>
#include <string.h>


#define RT_ERROR_CAP 1024

/* thread-local: a failure on one thread never overwrites what another thread is about to read */
static _Thread_local char rt_error[RT_ERROR_CAP];

int rt_fail(int status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rt_error, sizeof rt_error, fmt, ap);
  va_end(ap);
  return status;
}

int rt_context(int status, const char* fmt, ...) {
  char prefix[RT_ERROR_CAP], rest[RT_ERROR_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(rest, rt_error, sizeof rest);
  snprintf(rt_error, sizeof rt_error, "%s: %s", prefix, rest);
  return status;
}

const char* tether_rt_last_error(void) { return rt_error; }

const char* tether_rt_version(void) { return TETHER_RT_VERSION; }

const char* tether_rt_status_name(int status) {
  static const char* const names[] = {"TETHER_RT_OK", "TETHER_RT_ERR_IO", "TETHER_RT_ERR_FORMAT",
                                      "TETHER_RT_ERR_MODULE", "TETHER_RT_ERR_ARCH", "TETHER_RT_ERR_UNSUPPORTED",
                                      "TETHER_RT_ERR_ARGUMENT", "TETHER_RT_ERR_KERNEL", "TETHER_RT_ERR_NOMEM",
                                      "TETHER_RT_ERR_LIMIT"};
  if (status < 0 || status >= (int)(sizeof names / sizeof names[0])) return "TETHER_RT_ERR_UNKNOWN";
  return names[status];
}

/* in the order of tether_rt_dtype */
const rt_dtype_row rt_dtypes[] = {
    {"bool", 6, 8},     {"int8", 0, 8},     {"uint8", 1, 8},    {"int16", 0, 16},    {"uint16", 1, 16},
    {"int32", 0, 32},   {"uint32", 1, 32},  {"int64", 0, 64},   {"uint64", 1, 64},   {"float16", 2, 16},
    {"bfloat16", 4, 16}, {"float32", 2, 32}, {"float64", 2, 64},
};
const int rt_num_dtypes = (int)(sizeof rt_dtypes / sizeof rt_dtypes[0]);

int rt_dtype_from_name(const char* name, size_t len) {
  for (int k = 0; k < rt_num_dtypes; k++)
    if (strlen(rt_dtypes[k].name) == len && memcmp(rt_dtypes[k].name, name, len) == 0) return k;
  return -1;
}

const char* tether_rt_dtype_name(tether_rt_dtype dtype) {
  return ((int)dtype >= 0 && (int)dtype < rt_num_dtypes) ? rt_dtypes[dtype].name : NULL;
}

size_t tether_rt_dtype_size(tether_rt_dtype dtype) {
  return ((int)dtype >= 0 && (int)dtype < rt_num_dtypes) ? rt_dtypes[dtype].bits / 8u : 0;
}
