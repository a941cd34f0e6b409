/* tether_module.h: the packed-function ABI (version 1) of modules built by tether.
 *
 * A tether module is a self-contained shared object (or object file / static archive) that exports one packed
 * function per kernel, tether_set_parallel_launcher, the tether_pool_* functions and __tether_metadata.
 * See docs/abi.md.
 *
 * Calling a kernel from C:
 *
 *     float a[1024], b[1024], c[1024];
 *     int64_t shape[1] = {1024};
 *     DLTensor ta = {a, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0}, tb = ..., tc = ...;
 *     TetherValue args[3] = {{.v_handle = &ta}, {.v_handle = &tb}, {.v_handle = &tc}};
 *     int32_t codes[3] = {TETHER_DLTENSOR, TETHER_DLTENSOR, TETHER_DLTENSOR};
 *     int32_t rc = vadd(args, codes, 3);   // 0 on success; tether_error_kind(rc) otherwise
 */
#ifndef TETHER_MODULE_H_
#define TETHER_MODULE_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TETHER_ABI_VERSION 1

/* ---- DLPack 0.x tensors ---------------------------------------------------------------------------------- */
#ifndef DLPACK_VERSION
typedef enum { kDLCPU = 1 } DLDeviceType;
typedef enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBool = 6 } DLDataTypeCode;
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;      /* NULL or compact row-major */
  uint64_t byte_offset;
} DLTensor;
#endif

/* ---- packed arguments ------------------------------------------------------------------------------------ */
typedef union {
  int64_t v_int64;
  double v_float64;
  void* v_handle;        /* a DLTensor* for TETHER_DLTENSOR */
  const char* v_str;
} TetherValue;

enum {
  TETHER_INT64 = 0, TETHER_FLOAT64 = 1, TETHER_HANDLE = 2, TETHER_DLTENSOR = 3, TETHER_STR = 4,
  TETHER_BYTES = 5, TETHER_NULL = 6
};

typedef int32_t (*TetherPackedFunc)(const TetherValue* args, const int32_t* type_codes, int32_t num_args);

/* ---- return codes ---------------------------------------------------------------------------------------- */
enum {
  TETHER_OK = 0,
  TETHER_ERR_NUM_ARGS = 1,     /* (1 << 24) | got                  */
  TETHER_ERR_TYPE_CODE = 2,    /* (2 << 24) | arg << 8             */
  TETHER_ERR_NDIM = 3,         /* (3 << 24) | arg << 8             */
  TETHER_ERR_DTYPE = 4,        /* (4 << 24) | arg << 8             */
  TETHER_ERR_SHAPE = 5,        /* (5 << 24) | arg << 8 | dim       */
  TETHER_ERR_STRIDES = 6,      /* (6 << 24) | arg << 8 | dim       */
  TETHER_ERR_NULL_DATA = 7,    /* (7 << 24) | arg << 8             */
  TETHER_ERR_PARALLEL = 8,     /* (8 << 24) | launcher code        */
  TETHER_ERR_HOST_CALL = 9     /* (9 << 24) | host function index  */
};
static inline int32_t tether_error_kind(int32_t rc) { return (int32_t)((uint32_t)rc >> 24); }
static inline int32_t tether_error_arg(int32_t rc) { return (rc >> 8) & 0xFFFF; }
static inline int32_t tether_error_dim(int32_t rc) { return rc & 0xFF; }

/* ---- parallel loops -------------------------------------------------------------------------------------- */
typedef int32_t (*TetherTask)(int32_t task_id, int32_t num_tasks, void* closure);
typedef int32_t (*TetherParallelLauncher)(TetherTask task, void* closure, int32_t num_tasks);
/* Without a launcher the module runs parallel loops serially in the calling thread. */
void tether_set_parallel_launcher(TetherParallelLauncher launcher);

/* The native pool every tether module carries (docs/abi.md "The native pool"): install tether_pool_launch as the
 * launcher, and call tether_pool_worker from each worker thread you own; no libc is used. */
int32_t tether_pool_launch(TetherTask task, void* closure, int32_t num_tasks);
void tether_pool_worker(void);            /* serve launches until tether_pool_shutdown() */
void tether_pool_shutdown(void);          /* every thread inside tether_pool_worker returns after its task */
void tether_pool_reset(void);             /* only while no thread is inside (e.g. in a fork child) */
void tether_pool_set_spin(int32_t n);     /* idle spin iterations before sleeping; 0 = sleep at once */
int32_t tether_pool_num_workers(void);    /* threads currently inside tether_pool_worker */

/* ---- host callbacks (docs/abi.md "Host callbacks") -------------------------------------------------------- */
/* A module whose metadata lists "host_functions" calls them by name through this caller; it exports
 * tether_set_host_caller only then (declared weak here so that other modules still link). */
typedef int32_t (*TetherHostCaller)(const char* name, const TetherValue* args, const int32_t* type_codes,
                                    int32_t num_args, TetherValue* ret, int32_t* ret_code);
void tether_set_host_caller(TetherHostCaller caller) __attribute__((weak));

/* NUL-terminated JSON: functions, argument shapes and dtypes, target, versions. */
extern const char __tether_metadata[];

#ifdef __cplusplus
}
#endif
#endif /* TETHER_MODULE_H_ */
