/* Parallel test kernels that use the runtime's launcher (or the serial fallback).
 *   mark(counts int32[T], tids int64[T], wait_for_other int):
 *        task t adds 1 to counts[t] and stores its thread pointer in tids[t]; with wait_for_other != 0,
 *        task 0 spins (bounded) until some other task has finished, so a working pool must use 2 threads.
 *   noop(counts int32[T], num_tasks int): launches num_tasks empty tasks (launch-overhead benchmark).
 *   heavy(x float32[N], y float32[N], num_tasks int): compute-bound y = f(x), split into num_tasks chunks.
 *   fail(counts int32[T]): task 5 returns 42, the others count themselves. */
#include "tether_abi.h"
#ifndef T
#define T 64
#endif
#ifndef N
#define N 65536
#endif
#define STR_(x) #x
#define STR(x) STR_(x)

TETHER_META("{\"abi_version\": 1, \"tether_version\": \"0.1.0\", "
            "\"target\": {\"arch\": \"" TETHER_ARCH "\", \"preset\": \"test\"}, \"functions\": ["
            "{\"name\": \"mark\", \"args\": [{\"name\": \"counts\", \"shape\": [" STR(T) "], \"dtype\": \"int32\"}, "
            "{\"name\": \"tids\", \"shape\": [" STR(T) "], \"dtype\": \"int64\"}, {\"name\": \"wait_for_other\"}], "
            "\"parallel\": true}, "
            "{\"name\": \"noop\", \"args\": [{\"name\": \"counts\", \"shape\": [" STR(T) "], \"dtype\": \"int32\"}, "
            "{\"name\": \"num_tasks\"}], \"parallel\": true}, "
            "{\"name\": \"heavy\", \"args\": [{\"name\": \"x\", \"shape\": [" STR(N) "], \"dtype\": \"float32\"}, "
            "{\"name\": \"y\", \"shape\": [" STR(N) "], \"dtype\": \"float32\"}, {\"name\": \"num_tasks\"}], "
            "\"parallel\": true}, "
            "{\"name\": \"fail\", \"args\": [{\"name\": \"counts\", \"shape\": [" STR(T) "], \"dtype\": \"int32\"}], "
            "\"parallel\": true}]}");

/* The thread pointer identifies the OS thread running a task (no libc needed to ask). */
static int64_t thread_id(void) {
#if defined(__arm__)
  uint32_t tp;
  __asm__ __volatile__("mrc p15, 0, %0, c13, c0, 3" : "=r"(tp)); /* TPIDRURO; avoids __aeabi_read_tp */
  return (int64_t)tp;
#else
  return (int64_t)(intptr_t)__builtin_thread_pointer();
#endif
}

static const int64_t SHAPE_T[1] = {T};
static const int64_t SHAPE_N[1] = {N};

/* The (tensor, tensor, int) arguments of mark and heavy: 1-d tensors of `shape`, dtypes (code0, bits0) and
   (code1, bits1); 0 or the ABI error code. */
static int32_t check_two_tensors_and_int(const TetherValue* args, const int32_t* codes, int32_t num_args,
                                         const int64_t* shape, uint8_t code0, uint8_t bits0, uint8_t code1,
                                         uint8_t bits1) {
  CHECK_NARGS(3);
  CHECK(check_tensor(args, codes, 0, 1, shape, code0, bits0));
  CHECK(check_tensor(args, codes, 1, 1, shape, code1, bits1));
  if (codes[2] != TETHER_INT64) return ERR(2, 2, 0);
  return 0;
}

typedef struct { int32_t* counts; int64_t* tids; int64_t wait; volatile int32_t finished; } MarkClosure;

static int32_t mark_task(int32_t t, int32_t n, void* p) {
  MarkClosure* c = (MarkClosure*)p;
  (void)n;
  __atomic_add_fetch(&c->counts[t], 1, __ATOMIC_RELAXED);
  c->tids[t] = thread_id();
  if (t == 0 && c->wait) {
    /* Bounded: ~1e9 pause iterations is seconds, far above any sane wake-up latency. */
    for (int64_t spin = 0; spin < 1000000000LL && !__atomic_load_n(&c->finished, __ATOMIC_ACQUIRE); ++spin)
      __asm__ __volatile__("" ::: "memory");
  }
  if (t != 0) __atomic_add_fetch(&c->finished, 1, __ATOMIC_RELEASE);
  return 0;
}

TETHER_EXPORT int32_t mark(const TetherValue* args, const int32_t* codes, int32_t num_args) {
  CHECK(check_two_tensors_and_int(args, codes, num_args, SHAPE_T, 0, 32, 0, 64));
  MarkClosure c = {DATA(0, int32_t), DATA(1, int64_t), args[2].v_int64, 0};
  return tether_parallel(mark_task, &c, T);
}

static int32_t noop_task(int32_t t, int32_t n, void* p) { (void)t; (void)n; (void)p; return 0; }

TETHER_EXPORT int32_t noop(const TetherValue* args, const int32_t* codes, int32_t num_args) {
  CHECK_NARGS(2);
  CHECK(check_tensor(args, codes, 0, 1, SHAPE_T, 0, 32));
  if (codes[1] != TETHER_INT64) return ERR(2, 1, 0);
  return tether_parallel(noop_task, 0, (int32_t)args[1].v_int64);
}

typedef struct { const float* x; float* y; } HeavyClosure;

static int32_t heavy_task(int32_t t, int32_t n, void* p) {
  HeavyClosure* c = (HeavyClosure*)p;
  /* 32-bit arithmetic: 64-bit division would need a libgcc/compiler-rt helper on 32-bit ARM. */
  int32_t chunk = N / n, rem = N % n;
  int32_t begin = chunk * t + (t < rem ? t : rem);
  int32_t end = begin + chunk + (t < rem ? 1 : 0);
  for (int32_t k = begin; k < end; ++k) {
    float v = c->x[k];
    for (int r = 0; r < 256; ++r) v = v * 0.999f + 0.001f;  /* a dependent chain: compute-bound */
    c->y[k] = v;
  }
  return 0;
}

TETHER_EXPORT int32_t heavy(const TetherValue* args, const int32_t* codes, int32_t num_args) {
  CHECK(check_two_tensors_and_int(args, codes, num_args, SHAPE_N, 2, 32, 2, 32));
  HeavyClosure c = {DATA(0, float), DATA(1, float)};
  return tether_parallel(heavy_task, &c, (int32_t)args[2].v_int64);
}

static int32_t fail_task(int32_t t, int32_t n, void* p) {
  (void)n;
  if (t == 5) return 42;
  __atomic_add_fetch(&((int32_t*)p)[t], 1, __ATOMIC_RELAXED);
  return 0;
}

TETHER_EXPORT int32_t fail(const TetherValue* args, const int32_t* codes, int32_t num_args) {
  CHECK_NARGS(1);
  CHECK(check_tensor(args, codes, 0, 1, SHAPE_T, 0, 32));
  return tether_parallel(fail_task, DATA(0, int32_t), T);
}
