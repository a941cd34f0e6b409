/* rt_internal.h: what the parts of libtether_runtime share (not installed for users). */
#ifndef TETHER_RT_INTERNAL_H_
#define TETHER_RT_INTERNAL_H_

/* first in every source file: fseeko/ftello on 64-bit offsets, getauxval, sched_getaffinity */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifndef _FILE_OFFSET_BITS
#define _FILE_OFFSET_BITS 64
#endif

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tether_runtime.h"

#if defined(__GNUC__)
#define RT_HIDDEN __attribute__((visibility("hidden")))
#define RT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define RT_HIDDEN
#define RT_PRINTF(a, b)
#endif

/* ---- errors (error.c): the calling thread's last failure ------------------------------------------------- */
RT_HIDDEN int rt_fail(int status, const char* fmt, ...) RT_PRINTF(2, 3);
/* prefix the current message with "what: " (keeps the status) */
RT_HIDDEN int rt_context(int status, const char* fmt, ...) RT_PRINTF(2, 3);

/* ---- dtypes (error.c) ---------------------------------------------------------------------------------------- */
typedef struct {
  const char* name;
  uint8_t dl_code;
  uint8_t bits;
} rt_dtype_row;
RT_HIDDEN extern const rt_dtype_row rt_dtypes[];
RT_HIDDEN extern const int rt_num_dtypes;
RT_HIDDEN int rt_dtype_from_name(const char* name, size_t len);   /* -1 when unknown */

/* ---- checked arithmetic ---------------------------------------------------------------------------------------- */
/* *out = a * b; 0 when it overflows uint64 */
static inline int rt_mul_u64(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > UINT64_MAX / a) return 0;
  *out = a * b;
  return 1;
}

/* ---- JSON (json.c): a DOM over one arena, for deploy.json and module metadata -------------------------------- */
typedef enum { RT_JNULL, RT_JFALSE, RT_JTRUE, RT_JNUM, RT_JSTR, RT_JARR, RT_JOBJ } rt_jtype;

typedef struct rt_json rt_json;
struct rt_json {
  rt_jtype type;
  int is_int;          /* a number written without fraction or exponent that fits int64 */
  int64_t i;
  double d;
  const char* s;       /* RT_JSTR: decoded UTF-8, NUL-terminated (may hold NULs: see len) */
  size_t len;
  const char* key;     /* a member of an object: its key (decoded) */
  size_t count;        /* RT_JARR / RT_JOBJ: number of children */
  rt_json* child;      /* first child */
  rt_json* next;       /* next sibling */
};

typedef struct rt_json_doc rt_json_doc;
/* Parse `len` bytes; NULL on failure with the error set (TETHER_RT_ERR_FORMAT, naming `what` and the byte). */
RT_HIDDEN rt_json_doc* rt_json_parse(const char* text, size_t len, const char* what);
RT_HIDDEN rt_json* rt_json_root(rt_json_doc* doc);
RT_HIDDEN void rt_json_free(rt_json_doc* doc);
RT_HIDDEN rt_json* rt_json_get(const rt_json* obj, const char* key);      /* the last member named key, or NULL */
RT_HIDDEN rt_json* rt_json_at(const rt_json* arr, size_t index);          /* NULL when out of range */

/* ---- files (params.c) -------------------------------------------------------------------------------------------- */
/* Read a whole file (at most max_bytes) into a NUL-terminated buffer. */
RT_HIDDEN int rt_read_file(const char* path, size_t max_bytes, const char* what, char** out, size_t* len);

/* One record of a params file, offered to the reader's callback before its data is read. */
typedef struct {
  const char* name;    /* NUL-terminated */
  int dtype;           /* tether_rt_dtype */
  int32_t ndim;
  const int64_t* shape;
  uint64_t nbytes;
} rt_param_record;
/* Called per record: return a status (nonzero stops the read) and set *dst to where its nbytes go (NULL: skip). */
typedef int (*rt_param_sink)(void* user, const rt_param_record* rec, void** dst);
/* Stream deploy.params (docs/params.md) through `sink`: every header is checked against the file's size before
 * anything is read into a destination, so a forged size never allocates or overruns. */
RT_HIDDEN int rt_params_read(const char* path, rt_param_sink sink, void* user);

/* ---- CPU (cpu.c) ----------------------------------------------------------------------------------------------- */
RT_HIDDEN const char* rt_host_arch(void);    /* "x86_64", "aarch64", "armv7" or another name */
/* What of a module's metadata "requires" this CPU lacks: writes a comma-separated list (empty: nothing). */
RT_HIDDEN void rt_cpu_missing(const rt_json* requires, char* out, size_t cap);
RT_HIDDEN const char* rt_cpu_isa(void);
RT_HIDDEN const char* rt_cpu_suggested_target(void);    /* "" when none fits */
/* The CPU-features word of a module's metadata "cpu_dispatch" (docs/abi.md "CPU dispatch"). */
RT_HIDDEN uint32_t rt_cpu_dispatch_word(const rt_json* names);

/* ---- modules (module.c) ---------------------------------------------------------------------------------------- */
typedef struct rt_module rt_module;
RT_HIDDEN int rt_module_load(const char* path, rt_module** out);
RT_HIDDEN void rt_module_free(rt_module* mod);
/* the packed function `name` and its metadata entry; error (naming the function) when it has none */
RT_HIDDEN int rt_module_function(rt_module* mod, const char* name, TetherPackedFunc* fn, const rt_json** info);
/* the message of a nonzero kernel return code */
RT_HIDDEN void rt_module_describe_rc(rt_module* mod, const rt_json* info, int32_t rc, char* out, size_t cap);

/* ---- the thread pool (pool.c) ---------------------------------------------------------------------------------- */
/* Register a loaded module's launcher slot (setter may be NULL: nothing to do); `pool_version` its "thread_pool". */
RT_HIDDEN void rt_pool_add(void* handle, void* setter, int64_t pool_version);
RT_HIDDEN void rt_pool_remove(void* handle);

/* ---- host functions (module.c) ---------------------------------------------------------------------------------- */
RT_HIDDEN int rt_host_function_known(const char* name);
RT_HIDDEN void* rt_host_caller(void);   /* the TetherHostCaller installed in modules */
RT_HIDDEN const char* rt_host_take_error(void);

#endif /* TETHER_RT_INTERNAL_H_ */
