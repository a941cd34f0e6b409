/* Test-only C mirror of docs/abi.md (ABI version 1): the structures, argument checks with the documented
 * return codes, and the parallel launcher slot. Kernels built from it with gcc -nostdlib are real,
 * self-contained modules for the runtime tests until the compiler produces its own. */
#ifndef TETHER_TEST_ABI_H
#define TETHER_TEST_ABI_H
#include <stdint.h>

typedef union { int64_t v_int64; double v_float64; void* v_handle; const char* v_str; } TetherValue;
enum { TETHER_INT64 = 0, TETHER_FLOAT64 = 1, TETHER_HANDLE = 2, TETHER_DLTENSOR = 3, TETHER_STR = 4,
       TETHER_BYTES = 5, TETHER_NULL = 6 };
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct { void* data; DLDevice device; int32_t ndim; DLDataType dtype;
                 int64_t* shape; int64_t* strides; uint64_t byte_offset; } DLTensor;
typedef struct { const void* data; uint64_t size; } TetherBytes;

typedef int32_t (*TetherTask)(int32_t task_id, int32_t num_tasks, void* closure);
typedef int32_t (*TetherParallelLauncher)(TetherTask task, void* closure, int32_t num_tasks);

#define TETHER_EXPORT __attribute__((visibility("default")))
#define TETHER_META(json) \
  TETHER_EXPORT __attribute__((section(".tether_meta"), used)) const char __tether_metadata[] = json

#if defined(__x86_64__)
#define TETHER_ARCH "x86_64"
#elif defined(__aarch64__)
#define TETHER_ARCH "aarch64"
#elif defined(__arm__)
#define TETHER_ARCH "armv7"
#endif

#define ERR(kind, i, d) ((int32_t)(((kind) << 24) | ((i) << 8) | (d)))

__attribute__((unused)) static int32_t check_tensor(const TetherValue* args, const int32_t* codes, int i, int ndim,
                            const int64_t* shape, uint8_t code, uint8_t bits) {
  if (codes[i] != TETHER_DLTENSOR) return ERR(2, i, 0);
  const DLTensor* t = (const DLTensor*)args[i].v_handle;
  if (t->ndim != ndim) return ERR(3, i, 0);
  if (t->dtype.code != code || t->dtype.bits != bits || t->dtype.lanes != 1) return ERR(4, i, 0);
  for (int d = 0; d < ndim; ++d)
    if (t->shape[d] != shape[d]) return ERR(5, i, d);
  if (t->strides) {
    int64_t expect = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (shape[d] != 1 && t->strides[d] != expect) return ERR(6, i, d);
      expect *= shape[d];
    }
  }
  if (!t->data) return ERR(7, i, 0);
  return 0;
}

#define CHECK_NARGS(n) do { if (num_args != (n)) return ERR(1, 0, 0) | num_args; } while (0)
#define CHECK(expr) do { int32_t rc_ = (expr); if (rc_) return rc_; } while (0)
#define DATA(i, T) ((T*)((char*)((DLTensor*)args[i].v_handle)->data + ((DLTensor*)args[i].v_handle)->byte_offset))

static TetherParallelLauncher tether_launcher;

TETHER_EXPORT void tether_set_parallel_launcher(TetherParallelLauncher launcher) { tether_launcher = launcher; }

/* The ABI's fallback: with no launcher installed the tasks run serially in the calling thread. */
__attribute__((unused)) static int32_t tether_parallel(TetherTask task, void* closure, int32_t num_tasks) {
  if (tether_launcher) {
    int32_t rc = tether_launcher(task, closure, num_tasks);
    return rc ? ERR(8, 0, 0) | (rc & 0xFFFFFF) : 0;
  }
  for (int32_t i = 0; i < num_tasks; ++i) {
    int32_t rc = task(i, num_tasks, closure);
    if (rc) return ERR(8, 0, 0) | (rc & 0xFFFFFF);
  }
  return 0;
}
#endif
