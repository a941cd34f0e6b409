/* tether_runtime.h: run a model folder written by tether.build_graph (deploy.json + deploy.so + deploy.params)
 * from C, without Python. The same executor as the Python device runtime (tether_rpc.graph_executor) and the Go
 * runtime (bindings/go/graph): the same memory plan (storages at 64-byte alignment, entries at byte offsets),
 * the same kernel calls, so the same outputs bit for bit. See docs/deploy.md.
 *
 *     tether_rt_model* m;
 *     if (tether_rt_load("model_dir", NULL, &m) != TETHER_RT_OK) { puts(tether_rt_last_error()); return 1; }
 *     tether_rt_set_input(m, 0, pixels, sizeof pixels);
 *     if (tether_rt_run(m) != TETHER_RT_OK) { ... }
 *     tether_rt_tensor out; tether_rt_output(m, 0, &out);   // out.data, out.shape, out.dtype
 *     tether_rt_free(m);
 *
 * Every function returns a status; on failure tether_rt_last_error() holds one line naming the thing and what was
 * expected (thread-local: it describes the last failure of the calling thread). Nothing here aborts or exits on bad
 * input: folder contents are untrusted and every count, size and offset is checked before it is used.
 *
 * Threads: a model is used by one thread at a time (its buffers are shared between runs); different models may
 * run on different threads. tether_rt_set_num_threads sets the threads a parallel kernel uses, process-wide. */
#ifndef TETHER_RUNTIME_H_
#define TETHER_RUNTIME_H_

#include <stddef.h>
#include <stdint.h>

#include "tether_module.h"

#ifdef __cplusplus
extern "C" {
#endif
/* the API stays visible when the library is built with -fvisibility=hidden (everything else is internal) */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define TETHER_RT_VERSION "0.1.0"

typedef enum {
  TETHER_RT_OK = 0,
  TETHER_RT_ERR_IO = 1,          /* a file is missing or unreadable */
  TETHER_RT_ERR_FORMAT = 2,      /* deploy.json, deploy.params or the module's metadata is malformed */
  TETHER_RT_ERR_MODULE = 3,      /* deploy.so is not a loadable tether module (not ELF, no metadata, dlopen) */
  TETHER_RT_ERR_ARCH = 4,        /* deploy.so was built for another architecture, float ABI or CPU */
  TETHER_RT_ERR_UNSUPPORTED = 5, /* the model needs what this runtime lacks (numpy nodes, a host function) */
  TETHER_RT_ERR_ARGUMENT = 6,    /* a bad argument: index, name, size, shape, dtype, alignment, NULL */
  TETHER_RT_ERR_KERNEL = 7,      /* a kernel returned an error while running */
  TETHER_RT_ERR_NOMEM = 8,       /* an allocation failed */
  TETHER_RT_ERR_LIMIT = 9        /* the model needs more memory than the load options allow */
} tether_rt_status;

/* Element types, named as tether names them (the DLPack code and width follow from the name). */
typedef enum {
  TETHER_RT_BOOL = 0, TETHER_RT_INT8, TETHER_RT_UINT8, TETHER_RT_INT16, TETHER_RT_UINT16, TETHER_RT_INT32,
  TETHER_RT_UINT32, TETHER_RT_INT64, TETHER_RT_UINT64, TETHER_RT_FLOAT16, TETHER_RT_BFLOAT16, TETHER_RT_FLOAT32,
  TETHER_RT_FLOAT64
} tether_rt_dtype;

typedef struct tether_rt_model tether_rt_model;

/* A view of one input, output or param buffer of a loaded model (valid until the model is freed; `data` moves
 * when the buffer is bound to caller memory). */
typedef struct {
  const char* name;
  tether_rt_dtype dtype;
  const char* dtype_name;   /* "float32", ... */
  int32_t ndim;
  const int64_t* shape;
  size_t size;              /* number of elements */
  size_t nbytes;
  void* data;
} tether_rt_tensor;

typedef struct {
  /* the most bytes the model's storages may take together (0: the default, 4 GiB or what size_t holds) */
  uint64_t max_storage_bytes;
  /* 1: skip deploy.params (load params later with tether_rt_load_params) */
  int32_t skip_params;
} tether_rt_options;

/* ---- errors and version ---------------------------------------------------------------------------------- */
const char* tether_rt_last_error(void);           /* "" when the calling thread had no failure yet */
const char* tether_rt_status_name(int status);    /* "TETHER_RT_ERR_IO", ... */
const char* tether_rt_version(void);

/* ---- threads (process-wide, for every loaded model) ------------------------------------------------------ */
/* n >= 1 threads run a parallel kernel, the caller included (1: serial). The default is TETHER_NUM_THREADS if
 * set to a positive integer, else the CPUs this process may run on. Call it while no model is running. */
int tether_rt_set_num_threads(int32_t n);
int32_t tether_rt_get_num_threads(void);

/* ---- loading ----------------------------------------------------------------------------------------------- */
/* Load `folder`/deploy.json, the library it names (default deploy.so) and deploy.params (if present). The module
 * is vetted before any of its code runs: ELF machine, word size, float ABI, tether metadata, ABI version, the CPU
 * features its code needs. `options` may be NULL. */
int tether_rt_load(const char* folder, const tether_rt_options* options, tether_rt_model** out);
/* The same from explicit paths (`params_path` may be NULL). */
int tether_rt_load_files(const char* graph_path, const char* lib_path, const char* params_path,
                         const tether_rt_options* options, tether_rt_model** out);
/* Copy every param the graph needs from a deploy.params file (missing or mismatched params are errors). */
int tether_rt_load_params(tether_rt_model* m, const char* params_path);
void tether_rt_free(tether_rt_model* m);           /* NULL is fine */

/* ---- describing ---------------------------------------------------------------------------------------------- */
int32_t tether_rt_num_inputs(const tether_rt_model* m);
int32_t tether_rt_num_outputs(const tether_rt_model* m);
int32_t tether_rt_num_nodes(const tether_rt_model* m);
uint64_t tether_rt_storage_bytes(const tether_rt_model* m);   /* the memory plan's total */
/* index of input/output `name`, or -1 (and the last error set) */
int32_t tether_rt_input_index(const tether_rt_model* m, const char* name);
int32_t tether_rt_output_index(const tether_rt_model* m, const char* name);
int tether_rt_input(const tether_rt_model* m, int32_t index, tether_rt_tensor* out);
int tether_rt_output(const tether_rt_model* m, int32_t index, tether_rt_tensor* out);
const char* tether_rt_dtype_name(tether_rt_dtype dtype);       /* NULL for an unknown value */
size_t tether_rt_dtype_size(tether_rt_dtype dtype);            /* bytes per element, 0 for an unknown value */

/* ---- inputs ---------------------------------------------------------------------------------------------------- */
/* Copy `nbytes` bytes (exactly the input's size) into input `index`. */
int tether_rt_set_input(tether_rt_model* m, int32_t index, const void* data, size_t nbytes);
/* The same for an input or a param named `name`. */
int tether_rt_set_input_by_name(tether_rt_model* m, const char* name, const void* data, size_t nbytes);
/* Copy a typed array: the dtype must be the input's and the shape the input's, dimensions of 1 aside (as the
 * Python executor accepts (1, 3, 8, 8) for (3, 8, 8)). */
int tether_rt_set_input_tensor(tether_rt_model* m, int32_t index, tether_rt_dtype dtype, int32_t ndim,
                               const int64_t* shape, const void* data);
/* Zero copy: the kernels read input `index` from `data` (nbytes exactly the input's size, aligned to its element
 * size) from now on, until it is bound again; NULL returns to the model's own buffer. The memory must stay valid
 * while the model runs; the runtime never writes into it. */
int tether_rt_bind_input(tether_rt_model* m, int32_t index, const void* data, size_t nbytes);

/* ---- running and outputs ------------------------------------------------------------------------------------------ */
/* Run every node once, in order, except those whose run-time branch ("when") is not taken. */
int tether_rt_run(tether_rt_model* m);
/* Copy output `index` into `dst` (`nbytes` at least its size). */
int tether_rt_get_output(const tether_rt_model* m, int32_t index, void* dst, size_t nbytes);
/* Zero copy: the kernels write output `index` straight into `data` (as tether_rt_bind_input; NULL unbinds). */
int tether_rt_bind_output(tether_rt_model* m, int32_t index, void* data, size_t nbytes);

/* ---- host functions (docs/abi.md "Host callbacks") ---------------------------------------------------------------- */
/* A function a module calls by name at run time: store one result in *ret and its type code (TETHER_INT64,
 * TETHER_FLOAT64 or TETHER_NULL) in *ret_code and return 0; nonzero fails the kernel. Register before loading a
 * module that names it; it may run on any thread of the pool. */
typedef int32_t (*tether_rt_host_function)(void* user, const TetherValue* args, const int32_t* type_codes,
                                           int32_t num_args, TetherValue* ret, int32_t* ret_code);
int tether_rt_register_host_function(const char* name, tether_rt_host_function fn, void* user);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif
#endif /* TETHER_RUNTIME_H_ */
