/* libtether_bridge.so: the JNI side of dev.tether.device.NativeBridge.
 *
 * Freestanding on purpose: it includes no libc header (only jni.h and clang's own stdint/stdarg), declares the
 * few libc functions it calls, and links against stub libraries, so the same source builds offline for bionic
 * (arm64-v8a, armeabi-v7a) and glibc (x86_64, aarch64) without an NDK or a sysroot (build.sh).
 *
 * Kernels follow the packed-function ABI of docs/abi.md; the pool threads started here call a module's
 * tether_pool_worker and stay parked in native code until tether_pool_shutdown.
 */
#include <stdint.h>
#include <jni.h>

/* -- the libc we use (same prototypes on glibc and bionic) ---------------------------------------------------- */
typedef unsigned long bridge_pthread_t;          /* pthread_t: unsigned long (glibc) or long (bionic) */
struct bridge_timespec { long tv_sec; long tv_nsec; };  /* time_t is long on every target we build */

extern void *dlopen(const char *path, int flags);
extern void *dlsym(void *lib, const char *name);
extern int dlclose(void *lib);
extern char *dlerror(void);
extern int pthread_create(bridge_pthread_t *thread, const void *attr, void *(*start)(void *), void *arg);
extern int pthread_join(bridge_pthread_t thread, void **ret);
extern int clock_gettime(int clock, struct bridge_timespec *ts);
extern void *calloc(unsigned long n, unsigned long size);
extern void free(void *p);
extern int dup(int fd);
extern int dup2(int fd, int fd2);
extern int sigaction(int sig, const void *act, void *old);   /* struct bridge_sigaction, below */
extern int raise(int sig);
extern long write(int fd, const void *buf, unsigned long n);
extern bridge_pthread_t pthread_self(void);
extern int getsockname(int fd, void *addr, unsigned int *len);
extern int getpeername(int fd, void *addr, unsigned int *len);

#if defined(__ANDROID__) && !defined(__LP64__)
#define BRIDGE_RTLD_NOW 0    /* 32-bit bionic: RTLD_NOW is 0 (2 would be RTLD_GLOBAL there) */
#else
#define BRIDGE_RTLD_NOW 2
#endif
#define BRIDGE_RTLD_LOCAL 0  /* 0 on glibc and bionic alike */
#define BRIDGE_CLOCK_MONOTONIC 1

typedef union { int64_t v_int64; double v_float64; void *v_handle; const char *v_str; } TetherValue;
typedef int32_t (*TetherPacked)(const TetherValue *args, const int32_t *codes, int32_t n);

static void *ptr(jlong v) { return (void *)(uintptr_t)v; }
static jlong from_ptr(const void *p) { return (jlong)(uintptr_t)p; }

static int64_t now_ns(void) {
  struct bridge_timespec ts;
  clock_gettime(BRIDGE_CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#define FN(name) JNICALL Java_dev_tether_device_NativeBridge_##name

JNIEXPORT jlong FN(dlopen)(JNIEnv *env, jclass cls, jstring path) {
  const char *p = (*env)->GetStringUTFChars(env, path, 0);
  if (!p) return 0;
  void *lib = dlopen(p, BRIDGE_RTLD_NOW | BRIDGE_RTLD_LOCAL);
  (*env)->ReleaseStringUTFChars(env, path, p);
  return from_ptr(lib);
}

JNIEXPORT jstring FN(dlerror)(JNIEnv *env, jclass cls) {
  const char *e = dlerror();
  return (*env)->NewStringUTF(env, e ? e : "unknown dlopen error");
}

JNIEXPORT jlong FN(dlsym)(JNIEnv *env, jclass cls, jlong lib, jstring name) {
  const char *n = (*env)->GetStringUTFChars(env, name, 0);
  if (!n) return 0;
  void *sym = dlsym(ptr(lib), n);
  (*env)->ReleaseStringUTFChars(env, name, n);
  return from_ptr(sym);
}

JNIEXPORT jint FN(dlclose)(JNIEnv *env, jclass cls, jlong lib) { return dlclose(ptr(lib)); }

/* A module's CPU-features word (docs/abi.md "CPU dispatch"): written once after dlopen, before any call. */
JNIEXPORT void FN(storeInt)(JNIEnv *env, jclass cls, jlong address, jint value) {
  *(volatile int32_t *)ptr(address) = value;
}

JNIEXPORT jlong FN(address)(JNIEnv *env, jclass cls, jobject buffer) {
  return from_ptr((*env)->GetDirectBufferAddress(env, buffer));
}

JNIEXPORT jint FN(pointerSize)(JNIEnv *env, jclass cls) { return (jint)sizeof(void *); }

/* -- crash report: in-process sessions (Android) ---------------------------------------------------------------
 * A fatal signal raised while a thread runs module code (a packed call, the timing loop, a pool worker) writes the
 * ERROR frame Java prepared for that signal (SessionCrashed) to the session's socket, then dies by the signal's
 * default action: the client learns why its connection drops. Any other fatal signal is the VM's own (HotSpot
 * and ART take SIGSEGV for implicit null checks, safepoint polls, stack banging) and goes to the handler that was
 * installed before ours, exactly as it would have. On Android ART's libsigchain intercepts sigaction: ours then
 * runs after ART's own fault handlers, which is what we want.
 *
 * "Runs module code" is a per-thread mark kept in a small table of pthread_self() values: the bridge is
 * freestanding, and TLS would need emutls on Android API < 29. */
#if defined(__ANDROID__) && defined(__LP64__)
struct bridge_sigaction { int flags; void *handler; unsigned long mask; void (*restorer)(void); char spare[64]; };
#elif defined(__ANDROID__)  /* 32-bit bionic uses the kernel's struct */
struct bridge_sigaction { void *handler; unsigned long mask; unsigned long flags; void (*restorer)(void);
                          char spare[64]; };
#else                       /* glibc: a 1024-bit sigset_t */
struct bridge_sigaction { void *handler; unsigned long mask[1024 / (8 * sizeof(long))]; int flags;
                          void (*restorer)(void); char spare[64]; };
#endif
#define BRIDGE_SA_SIGINFO 4
#define BRIDGE_SA_ONSTACK 0x08000000
#define BRIDGE_MAX_SIGNAL 32
#define BRIDGE_KERNEL_SLOTS 64

static const int fatal_signals[] = {4, 6, 7, 8, 11};   /* SIGILL SIGABRT SIGBUS SIGFPE SIGSEGV (x86_64 and ARM) */
static struct bridge_sigaction previous[BRIDGE_MAX_SIGNAL];
static int crash_handler_installed;
static bridge_pthread_t in_kernel[BRIDGE_KERNEL_SLOTS];   /* 0: a free slot */
static int report_fd = -1;
static const char *report_frame[BRIDGE_MAX_SIGNAL];
static int report_length[BRIDGE_MAX_SIGNAL];
static long chained;
static const struct bridge_sigaction default_action;   /* all zero: SIG_DFL, no flags, empty mask */

static int kernel_enter(void) {
  bridge_pthread_t self = pthread_self();
  for (int i = 0; i < BRIDGE_KERNEL_SLOTS; ++i) {
    bridge_pthread_t free_slot = 0;
    if (__atomic_compare_exchange_n(&in_kernel[i], &free_slot, self, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
      return i;
  }
  return -1;  /* table full: this thread's crash is a dropped connection, as without the handler */
}

static void kernel_leave(int slot) {
  if (slot >= 0) __atomic_store_n(&in_kernel[slot], 0, __ATOMIC_SEQ_CST);
}

static int this_thread_in_kernel(void) {
  bridge_pthread_t self = pthread_self();
  for (int i = 0; i < BRIDGE_KERNEL_SLOTS; ++i)
    if (__atomic_load_n(&in_kernel[i], __ATOMIC_SEQ_CST) == self) return 1;
  return 0;
}

static void on_fatal_signal(int sig, void *info, void *context) {
  if (sig > 0 && sig < BRIDGE_MAX_SIGNAL && this_thread_in_kernel()) {
    int fd = __atomic_exchange_n(&report_fd, -1, __ATOMIC_SEQ_CST);   /* one report, even if two threads fault */
    const char *frame = report_frame[sig];
    if (fd >= 0 && frame) {
      long done = 0, left = report_length[sig];
      for (int tries = 0; left > 0 && tries < 100; ++tries) {   /* write(2) only: async-signal-safe */
        long k = write(fd, frame + done, (unsigned long)left);
        if (k > 0) { done += k; left -= k; }
      }
    }
    sigaction(sig, &default_action, 0);   /* then die by the signal as before */
    raise(sig);   /* pending until this handler returns (the signal is blocked in it) */
    return;
  }
  __atomic_add_fetch(&chained, 1, __ATOMIC_SEQ_CST);
  struct bridge_sigaction *old = &previous[sig];
  if (old->flags & BRIDGE_SA_SIGINFO) {
    ((void (*)(int, void *, void *))old->handler)(sig, info, context);
  } else if (old->handler == (void *)1) {            /* SIG_IGN */
  } else if (old->handler == (void *)0) {            /* SIG_DFL: put it back and let the signal do its default */
    sigaction(sig, old, 0);
    raise(sig);
  } else {
    ((void (*)(int))old->handler)(sig);
  }
}

/* Once, after the VM is up (its handlers are the ones we chain to). Our handler runs with the previous one's mask
 * and flags (plus SA_SIGINFO and SA_ONSTACK), so a chained handler sees what it would have seen. */
JNIEXPORT jboolean FN(installCrashHandler)(JNIEnv *env, jclass cls) {
  if (crash_handler_installed) return JNI_TRUE;
  for (unsigned i = 0; i < sizeof(fatal_signals) / sizeof(fatal_signals[0]); ++i) {
    int sig = fatal_signals[i];
    if (sigaction(sig, 0, &previous[sig]) != 0) return JNI_FALSE;
  }
  for (unsigned i = 0; i < sizeof(fatal_signals) / sizeof(fatal_signals[0]); ++i) {
    int sig = fatal_signals[i];
    struct bridge_sigaction act;   /* a second copy of the previous action, read again (no memcpy here) */
    if (sigaction(sig, 0, &act) != 0) return JNI_FALSE;
    act.handler = (void *)on_fatal_signal;
    act.flags |= BRIDGE_SA_SIGINFO | BRIDGE_SA_ONSTACK;
    if (sigaction(sig, &act, 0) != 0) return JNI_FALSE;
  }
  crash_handler_installed = 1;
  return JNI_TRUE;
}

/* The frame to write when module code raises {@code sig}: {@code length} bytes at {@code frame} (0: none). */
JNIEXPORT void FN(setCrashFrame)(JNIEnv *env, jclass cls, jint sig, jlong frame, jint length) {
  if (sig <= 0 || sig >= BRIDGE_MAX_SIGNAL) return;
  report_frame[sig] = 0;
  __atomic_store_n(&report_length[sig], length, __ATOMIC_SEQ_CST);
  __atomic_store_n(&report_frame[sig], (const char *)ptr(frame), __ATOMIC_SEQ_CST);
}

/* The session's socket (-1: no session; a crash then only kills the process). */
JNIEXPORT void FN(setCrashFd)(JNIEnv *env, jclass cls, jint fd) { __atomic_store_n(&report_fd, fd, __ATOMIC_SEQ_CST); }

/* How many fatal signals went on to the previous handler (the VM's own uses of SIGSEGV): for tests. */
JNIEXPORT jlong FN(chainedSignals)(JNIEnv *env, jclass cls) { return __atomic_load_n(&chained, __ATOMIC_SEQ_CST); }

/* The descriptor of the connected TCP socket with these local and peer ports, or -1. Java cannot name a Socket's
 * descriptor without reflection into the platform's internals (different on HotSpot and ART); the ports can. */
static int socket_port(int fd, int peer) {
  unsigned char addr[128];
  unsigned int len = sizeof(addr);
  if ((peer ? getpeername(fd, addr, &len) : getsockname(fd, addr, &len)) != 0 || len < 4) return -1;
  int family = addr[0] | addr[1] << 8;   /* sa_family_t is little-endian u16 on every target we build */
  if (family != 2 && family != 10) return -1;   /* AF_INET, AF_INET6: the port follows, big-endian */
  return addr[2] << 8 | addr[3];
}

JNIEXPORT jint FN(socketFd)(JNIEnv *env, jclass cls, jint localPort, jint peerPort) {
  for (int fd = 0; fd < 4096; ++fd)
    if (socket_port(fd, 0) == localPort && socket_port(fd, 1) == peerPort) return fd;
  return -1;
}

JNIEXPORT jint FN(callPacked)(JNIEnv *env, jclass cls, jlong fn, jlong values, jlong codes, jint n) {
  int slot = kernel_enter();
  int32_t rc = ((TetherPacked)ptr(fn))((const TetherValue *)ptr(values), (const int32_t *)ptr(codes), n);
  kernel_leave(slot);
  return rc;
}

JNIEXPORT jlong FN(timeCalls)(JNIEnv *env, jclass cls, jlong fn, jlong values, jlong codes, jint n, jint number) {
  TetherPacked f = (TetherPacked)ptr(fn);
  const TetherValue *v = (const TetherValue *)ptr(values);
  const int32_t *c = (const int32_t *)ptr(codes);
  int slot = kernel_enter();
  int64_t t0 = now_ns();
  for (jint i = 0; i < number; ++i) {
    int32_t rc = f(v, c, n);
    if (rc) {
      kernel_leave(slot);
      return -1 - (jlong)(uint32_t)rc;
    }
  }
  int64_t elapsed = now_ns() - t0;
  kernel_leave(slot);
  return elapsed;
}

JNIEXPORT void FN(callWithPointer)(JNIEnv *env, jclass cls, jlong fn, jlong arg) {
  int slot = kernel_enter();
  ((void (*)(void *))ptr(fn))(ptr(arg));
  kernel_leave(slot);
}

JNIEXPORT void FN(callVoid)(JNIEnv *env, jclass cls, jlong fn) {
  int slot = kernel_enter();
  ((void (*)(void))ptr(fn))();
  kernel_leave(slot);
}

JNIEXPORT jint FN(callInt)(JNIEnv *env, jclass cls, jlong fn) {
  int slot = kernel_enter();
  int32_t r = ((int32_t (*)(void))ptr(fn))();
  kernel_leave(slot);
  return r;
}

/* Keeps the protocol stream away from anything else that writes to stdout (the JVM's fatal-error report, a
 * kernel's debug output): file descriptor 1 becomes a copy of 2, and the returned descriptor is the old stdout. */
JNIEXPORT jint FN(takeStdout)(JNIEnv *env, jclass cls) {
  int fd = dup(1);
  if (fd < 0) return -1;
  if (dup2(2, 1) < 0) return -1;
  return fd;
}

/* -- pool threads: borrowed by a module's tether_pool_worker until tether_pool_shutdown ----------------------- */
typedef struct {
  void (*worker)(void);
  int count;
  bridge_pthread_t threads[];
} Threads;

static void *run_worker(void *arg) {
  int slot = kernel_enter();   /* a pool thread runs nothing but module code */
  ((Threads *)arg)->worker();
  kernel_leave(slot);
  return 0;
}

JNIEXPORT jlong FN(startThreads)(JNIEnv *env, jclass cls, jlong worker, jint count) {
  if (count <= 0) return 0;
  Threads *t = (Threads *)calloc(1, sizeof(Threads) + sizeof(bridge_pthread_t) * (unsigned long)count);
  if (!t) return 0;
  t->worker = (void (*)(void))ptr(worker);
  for (jint i = 0; i < count; ++i) {
    if (pthread_create(&t->threads[t->count], 0, run_worker, t) != 0) break;
    t->count++;
  }
  if (t->count == 0) {
    free(t);
    return 0;
  }
  return from_ptr(t);
}

JNIEXPORT void FN(joinThreads)(JNIEnv *env, jclass cls, jlong threads) {
  Threads *t = (Threads *)ptr(threads);
  if (!t) return;
  for (int i = 0; i < t->count; ++i) pthread_join(t->threads[i], 0);
  free(t);
}

/* -- OpenCL: dlopened at run time, never linked -----------------------------------------------------------------
 * Phones without OpenCL must still load this library, so libOpenCL.so (or the vendor library holding OpenCL,
 * such as libGLES_mali.so) is opened by clLoad with the path Java picked (OpenCL.java: the same search as
 * tether_rpc/gpu/opencl.py) and its entry points resolved once. Every failing call throws
 * dev.tether.device.ClError(call, code, detail): Java names the CL error (its table is OpenCL.java's). Handles
 * travel as longs; buffers to and from the device are Java direct ByteBuffers. */
typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef void *cl_h;
typedef unsigned long cl_size;   /* size_t: unsigned long on every target we build (ILP32 and LP64) */

#define CL_FN_LIST(X) \
  X(clGetPlatformIDs, cl_int, (cl_uint, cl_h *, cl_uint *)) \
  X(clGetPlatformInfo, cl_int, (cl_h, cl_uint, cl_size, void *, cl_size *)) \
  X(clGetDeviceIDs, cl_int, (cl_h, cl_ulong, cl_uint, cl_h *, cl_uint *)) \
  X(clGetDeviceInfo, cl_int, (cl_h, cl_uint, cl_size, void *, cl_size *)) \
  X(clCreateContext, cl_h, (const void *, cl_uint, const cl_h *, void *, void *, cl_int *)) \
  X(clReleaseContext, cl_int, (cl_h)) \
  X(clCreateCommandQueue, cl_h, (cl_h, cl_h, cl_ulong, cl_int *)) \
  X(clReleaseCommandQueue, cl_int, (cl_h)) \
  X(clCreateBuffer, cl_h, (cl_h, cl_ulong, cl_size, void *, cl_int *)) \
  X(clReleaseMemObject, cl_int, (cl_h)) \
  X(clEnqueueWriteBuffer, cl_int, (cl_h, cl_h, cl_uint, cl_size, cl_size, const void *, cl_uint, void *, void *)) \
  X(clEnqueueReadBuffer, cl_int, (cl_h, cl_h, cl_uint, cl_size, cl_size, void *, cl_uint, void *, void *)) \
  X(clEnqueueCopyBuffer, cl_int, (cl_h, cl_h, cl_h, cl_size, cl_size, cl_size, cl_uint, void *, void *)) \
  X(clCreateProgramWithSource, cl_h, (cl_h, cl_uint, const char **, const cl_size *, cl_int *)) \
  X(clBuildProgram, cl_int, (cl_h, cl_uint, const cl_h *, const char *, void *, void *)) \
  X(clGetProgramBuildInfo, cl_int, (cl_h, cl_h, cl_uint, cl_size, void *, cl_size *)) \
  X(clReleaseProgram, cl_int, (cl_h)) \
  X(clCreateKernel, cl_h, (cl_h, const char *, cl_int *)) \
  X(clGetKernelInfo, cl_int, (cl_h, cl_uint, cl_size, void *, cl_size *)) \
  X(clGetKernelWorkGroupInfo, cl_int, (cl_h, cl_h, cl_uint, cl_size, void *, cl_size *)) \
  X(clSetKernelArg, cl_int, (cl_h, cl_uint, cl_size, const void *)) \
  X(clReleaseKernel, cl_int, (cl_h)) \
  X(clEnqueueNDRangeKernel, cl_int, (cl_h, cl_h, cl_uint, const cl_size *, const cl_size *, const cl_size *, \
                                     cl_uint, void *, cl_h *)) \
  X(clFinish, cl_int, (cl_h)) \
  X(clWaitForEvents, cl_int, (cl_uint, const cl_h *)) \
  X(clGetEventProfilingInfo, cl_int, (cl_h, cl_uint, cl_size, void *, cl_size *)) \
  X(clReleaseEvent, cl_int, (cl_h))

#define CL_DECLARE(name, ret, args) static ret (*p_##name) args;
CL_FN_LIST(CL_DECLARE)
static void *cl_library;

#define CL_PROGRAM_BUILD_LOG 0x1183
#define CL_KERNEL_NUM_ARGS 0x1191
#define CL_KERNEL_WORK_GROUP_SIZE 0x11B0
#define CL_KERNEL_COMPILE_WORK_GROUP_SIZE 0x11B1
#define CL_PROFILING_COMMAND_START 0x1282
#define CL_PROFILING_COMMAND_END 0x1283
#define CL_DEVICE_TYPE_CPU (1 << 1)
#define CL_DEVICE_TYPE_GPU (1 << 2)
#define CL_DEVICE_TYPE_ACCELERATOR (1 << 3)
#define CL_QUEUE_PROFILING_ENABLE (1 << 1)
#define CL_MEM_READ_WRITE 1
#define CL_TRUE 1

static jbyteArray bytes_of(JNIEnv *env, const void *p, cl_size n) {
  jbyteArray out = (*env)->NewByteArray(env, (jsize)n);
  if (out && n) (*env)->SetByteArrayRegion(env, out, 0, (jsize)n, (const jbyte *)p);
  return out;
}

/* Throws ClError(call, code, detail) and returns 0 when code is an error; 1 when it is CL_SUCCESS. */
static int cl_ok(JNIEnv *env, cl_int code, const char *call, jbyteArray detail) {
  if (code == 0) return 1;
  if ((*env)->ExceptionCheck(env)) return 0;
  jclass cls = (*env)->FindClass(env, "dev/tether/device/ClError");
  if (!cls) return 0;
  jmethodID init = (*env)->GetMethodID(env, cls, "<init>", "(Ljava/lang/String;I[B)V");
  jstring name = (*env)->NewStringUTF(env, call);
  if (!init || !name) return 0;
  jobject e = (*env)->NewObject(env, cls, init, name, (jint)code, detail);
  if (e) (*env)->Throw(env, (jthrowable)e);
  return 0;
}

static int cl_loaded(JNIEnv *env, const char *call) {
  if (cl_library) return 1;
  return cl_ok(env, -1002, call, 0);   /* not a CL code: ClError names it "the OpenCL library is not loaded" */
}

/* Opens the OpenCL library at path and resolves every entry point used here; null on success, else why not.
 * Once one is loaded, later calls return null at once (one library per process, as in opencl.py). */
JNIEXPORT jstring FN(clLoad)(JNIEnv *env, jclass cls, jstring path) {
  if (cl_library) return 0;
  const char *p = (*env)->GetStringUTFChars(env, path, 0);
  if (!p) return 0;
  void *lib = dlopen(p, BRIDGE_RTLD_NOW | BRIDGE_RTLD_LOCAL);
  (*env)->ReleaseStringUTFChars(env, path, p);
  if (!lib) {
    const char *e = dlerror();
    return (*env)->NewStringUTF(env, e ? e : "dlopen failed");
  }
#define CL_RESOLVE(name, ret, args) \
  p_##name = (ret (*) args)dlsym(lib, #name); \
  if (!p_##name) { dlclose(lib); return (*env)->NewStringUTF(env, "it does not export " #name); }
  CL_FN_LIST(CL_RESOLVE)
  cl_library = lib;
  return 0;
}

JNIEXPORT jboolean FN(clLoaded)(JNIEnv *env, jclass cls) { return cl_library ? JNI_TRUE : JNI_FALSE; }

/* Every device as {platform, device} pairs in tether's order: the GPUs and accelerators of every platform, then
 * the CPU devices (pocl's). No platform (CL_PLATFORM_NOT_FOUND_KHR): an empty array. */
JNIEXPORT jlongArray FN(clDevices)(JNIEnv *env, jclass cls) {
  if (!cl_loaded(env, "clGetPlatformIDs")) return 0;
  cl_uint np = 0;
  cl_int code = p_clGetPlatformIDs(0, 0, &np);
  if (code == -1001 || np == 0) return (*env)->NewLongArray(env, 0);
  if (!cl_ok(env, code, "clGetPlatformIDs", 0)) return 0;
  if (np > 64) np = 64;
  cl_h platforms[64];
  if (!cl_ok(env, p_clGetPlatformIDs(np, platforms, 0), "clGetPlatformIDs", 0)) return 0;
  jlong out[512];
  int n = 0;
  const cl_ulong kinds[2] = {CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR, CL_DEVICE_TYPE_CPU};
  for (int k = 0; k < 2; ++k) {
    for (cl_uint i = 0; i < np; ++i) {
      cl_uint nd = 0;
      code = p_clGetDeviceIDs(platforms[i], kinds[k], 0, 0, &nd);
      if (code == -1 || nd == 0) continue;   /* CL_DEVICE_NOT_FOUND */
      if (!cl_ok(env, code, "clGetDeviceIDs", 0)) return 0;
      cl_h devices[64];
      if (nd > 64) nd = 64;
      if (!cl_ok(env, p_clGetDeviceIDs(platforms[i], kinds[k], nd, devices, 0), "clGetDeviceIDs", 0)) return 0;
      for (cl_uint d = 0; d < nd && n + 2 <= 512; ++d) {
        out[n++] = from_ptr(platforms[i]);
        out[n++] = from_ptr(devices[d]);
      }
    }
  }
  jlongArray arr = (*env)->NewLongArray(env, n);
  if (arr && n) (*env)->SetLongArrayRegion(env, arr, 0, n, out);
  return arr;
}

/* The raw bytes of clGetDeviceInfo (device) or clGetPlatformInfo (platform) for param; Java decodes them. */
JNIEXPORT jbyteArray FN(clInfo)(JNIEnv *env, jclass cls, jboolean platform, jlong handle, jint param) {
  const char *call = platform ? "clGetPlatformInfo" : "clGetDeviceInfo";
  if (!cl_loaded(env, call)) return 0;
  cl_int (*fn)(cl_h, cl_uint, cl_size, void *, cl_size *) = platform ? p_clGetPlatformInfo : p_clGetDeviceInfo;
  cl_size size = 0;
  if (!cl_ok(env, fn(ptr(handle), (cl_uint)param, 0, 0, &size), call, 0)) return 0;
  void *buf = calloc(1, size + 1);
  if (!buf) return 0;
  cl_int code = fn(ptr(handle), (cl_uint)param, size, buf, 0);
  jbyteArray out = code == 0 ? bytes_of(env, buf, size) : 0;
  free(buf);
  cl_ok(env, code, call, 0);
  return out;
}

JNIEXPORT jlong FN(clCreateContext)(JNIEnv *env, jclass cls, jlong device) {
  if (!cl_loaded(env, "clCreateContext")) return 0;
  cl_int err = 0;
  cl_h dev = ptr(device);
  cl_h ctx = p_clCreateContext(0, 1, &dev, 0, 0, &err);
  return cl_ok(env, err, "clCreateContext", 0) ? from_ptr(ctx) : 0;
}

/* An in-order queue with profiling (timed launches read the events' clock). */
JNIEXPORT jlong FN(clCreateQueue)(JNIEnv *env, jclass cls, jlong context, jlong device) {
  if (!cl_loaded(env, "clCreateCommandQueue")) return 0;
  cl_int err = 0;
  cl_h q = p_clCreateCommandQueue(ptr(context), ptr(device), CL_QUEUE_PROFILING_ENABLE, &err);
  return cl_ok(env, err, "clCreateCommandQueue", 0) ? from_ptr(q) : 0;
}

/* Releases a handle: kind 0 cl_mem, 1 cl_kernel, 2 cl_program, 3 cl_command_queue, 4 cl_context. */
JNIEXPORT void FN(clRelease)(JNIEnv *env, jclass cls, jint kind, jlong handle) {
  if (!cl_library || !handle) return;
  switch (kind) {
    case 0: p_clReleaseMemObject(ptr(handle)); break;
    case 1: p_clReleaseKernel(ptr(handle)); break;
    case 2: p_clReleaseProgram(ptr(handle)); break;
    case 3: p_clReleaseCommandQueue(ptr(handle)); break;
    case 4: p_clReleaseContext(ptr(handle)); break;
  }
}

JNIEXPORT jlong FN(clAlloc)(JNIEnv *env, jclass cls, jlong context, jlong nbytes) {
  if (!cl_loaded(env, "clCreateBuffer")) return 0;
  cl_int err = 0;
  cl_h mem = p_clCreateBuffer(ptr(context), CL_MEM_READ_WRITE, (cl_size)nbytes, 0, &err);
  return cl_ok(env, err, "clCreateBuffer", 0) ? from_ptr(mem) : 0;
}

/* Blocking write of n bytes from a direct buffer (at byte position pos) into mem at offset. */
JNIEXPORT void FN(clWrite)(JNIEnv *env, jclass cls, jlong queue, jlong mem, jlong offset, jobject src, jlong pos,
                           jlong n) {
  if (!cl_loaded(env, "clEnqueueWriteBuffer") || n <= 0) return;
  char *p = (char *)(*env)->GetDirectBufferAddress(env, src);
  if (!p) { cl_ok(env, -30, "clEnqueueWriteBuffer", 0); return; }   /* not a direct buffer: CL_INVALID_VALUE */
  cl_ok(env, p_clEnqueueWriteBuffer(ptr(queue), ptr(mem), CL_TRUE, (cl_size)offset, (cl_size)n, p + pos, 0, 0, 0),
        "clEnqueueWriteBuffer", 0);
}

JNIEXPORT void FN(clRead)(JNIEnv *env, jclass cls, jlong queue, jlong mem, jlong offset, jobject dst, jlong pos,
                          jlong n) {
  if (!cl_loaded(env, "clEnqueueReadBuffer") || n <= 0) return;
  char *p = (char *)(*env)->GetDirectBufferAddress(env, dst);
  if (!p) { cl_ok(env, -30, "clEnqueueReadBuffer", 0); return; }
  cl_ok(env, p_clEnqueueReadBuffer(ptr(queue), ptr(mem), CL_TRUE, (cl_size)offset, (cl_size)n, p + pos, 0, 0, 0),
        "clEnqueueReadBuffer", 0);
}

JNIEXPORT void FN(clCopy)(JNIEnv *env, jclass cls, jlong queue, jlong dst, jlong src, jlong n) {
  if (!cl_loaded(env, "clEnqueueCopyBuffer") || n <= 0) return;
  cl_ok(env, p_clEnqueueCopyBuffer(ptr(queue), ptr(src), ptr(dst), 0, 0, (cl_size)n, 0, 0, 0), "clEnqueueCopyBuffer",
        0);
}

/* Builds OpenCL C source for one device; a failed build throws with the driver's build log as the detail. */
JNIEXPORT jlong FN(clBuild)(JNIEnv *env, jclass cls, jlong context, jlong device, jbyteArray source,
                            jstring options) {
  if (!cl_loaded(env, "clCreateProgramWithSource")) return 0;
  jsize n = (*env)->GetArrayLength(env, source);
  char *text = (char *)calloc(1, (unsigned long)n + 1);
  if (!text) { cl_ok(env, -6, "clCreateProgramWithSource", 0); return 0; }   /* CL_OUT_OF_HOST_MEMORY */
  (*env)->GetByteArrayRegion(env, source, 0, n, (jbyte *)text);
  cl_int err = 0;
  const char *strings[1] = {text};
  cl_size lengths[1] = {(cl_size)n};
  cl_h program = p_clCreateProgramWithSource(ptr(context), 1, strings, lengths, &err);
  free(text);
  if (!cl_ok(env, err, "clCreateProgramWithSource", 0)) return 0;
  const char *opts = (*env)->GetStringUTFChars(env, options, 0);
  if (!opts) { p_clReleaseProgram(program); return 0; }
  cl_h dev = ptr(device);
  cl_int code = p_clBuildProgram(program, 1, &dev, opts, 0, 0);
  (*env)->ReleaseStringUTFChars(env, options, opts);
  if (code == 0) return from_ptr(program);
  jbyteArray log = 0;
  cl_size size = 0;
  if (p_clGetProgramBuildInfo(program, dev, CL_PROGRAM_BUILD_LOG, 0, 0, &size) == 0 && size > 0) {
    char *buf = (char *)calloc(1, size + 1);
    if (buf && p_clGetProgramBuildInfo(program, dev, CL_PROGRAM_BUILD_LOG, size, buf, 0) == 0) {
      cl_size len = 0;
      while (len < size && buf[len]) ++len;
      log = bytes_of(env, buf, len);
    }
    free(buf);
  }
  p_clReleaseProgram(program);
  cl_ok(env, code, "clBuildProgram", log);
  return 0;
}

JNIEXPORT jlong FN(clKernel)(JNIEnv *env, jclass cls, jlong program, jstring name) {
  if (!cl_loaded(env, "clCreateKernel")) return 0;
  const char *n = (*env)->GetStringUTFChars(env, name, 0);
  if (!n) return 0;
  cl_int err = 0;
  cl_h kernel = p_clCreateKernel(ptr(program), n, &err);
  (*env)->ReleaseStringUTFChars(env, name, n);
  return cl_ok(env, err, "clCreateKernel", 0) ? from_ptr(kernel) : 0;
}

/* {CL_KERNEL_NUM_ARGS, CL_KERNEL_WORK_GROUP_SIZE, CL_KERNEL_COMPILE_WORK_GROUP_SIZE x, y, z} of a kernel. */
JNIEXPORT jlongArray FN(clKernelInfo)(JNIEnv *env, jclass cls, jlong kernel, jlong device) {
  if (!cl_loaded(env, "clGetKernelInfo")) return 0;
  cl_uint nargs = 0;
  cl_size wg = 0, required[3] = {0, 0, 0};
  if (!cl_ok(env, p_clGetKernelInfo(ptr(kernel), CL_KERNEL_NUM_ARGS, sizeof(nargs), &nargs, 0), "clGetKernelInfo", 0))
    return 0;
  if (!cl_ok(env, p_clGetKernelWorkGroupInfo(ptr(kernel), ptr(device), CL_KERNEL_WORK_GROUP_SIZE, sizeof(wg), &wg, 0),
             "clGetKernelWorkGroupInfo", 0))
    return 0;
  if (!cl_ok(env, p_clGetKernelWorkGroupInfo(ptr(kernel), ptr(device), CL_KERNEL_COMPILE_WORK_GROUP_SIZE,
                                             sizeof(required), required, 0), "clGetKernelWorkGroupInfo", 0))
    return 0;
  jlong out[5] = {(jlong)nargs, (jlong)wg, (jlong)required[0], (jlong)required[1], (jlong)required[2]};
  jlongArray arr = (*env)->NewLongArray(env, 5);
  if (arr) (*env)->SetLongArrayRegion(env, arr, 0, 5, out);
  return arr;
}

/* Sets the arguments (kinds[i]: 0 a cl_mem, 1 an int32, 2 a float32 whose bits are in values[i]) and enqueues the
 * kernel over global = grid * block with local = block in dims dimensions. Timed: waits for the launch's event
 * and returns END - START of its profiling info in nanoseconds (the device's clock); else 0, asynchronously. */
JNIEXPORT jlong FN(clLaunch)(JNIEnv *env, jclass cls, jlong queue, jlong kernel, jintArray kinds, jlongArray values,
                             jlongArray global, jlongArray local, jint dims, jboolean timed) {
  if (!cl_loaded(env, "clEnqueueNDRangeKernel")) return 0;
  jsize n = (*env)->GetArrayLength(env, kinds);
  if (n > 256 || dims < 1 || dims > 3) { cl_ok(env, -30, "clSetKernelArg", 0); return 0; }
  jint k[256];
  jlong v[256];
  jlong g[3], l[3];
  (*env)->GetIntArrayRegion(env, kinds, 0, n, k);
  (*env)->GetLongArrayRegion(env, values, 0, n, v);
  (*env)->GetLongArrayRegion(env, global, 0, dims, g);
  (*env)->GetLongArrayRegion(env, local, 0, dims, l);
  for (jsize i = 0; i < n; ++i) {
    cl_int code;
    if (k[i] == 0) {
      cl_h mem = ptr(v[i]);
      code = p_clSetKernelArg(ptr(kernel), (cl_uint)i, sizeof(mem), &mem);
    } else {
      int32_t word = (int32_t)v[i];   /* an int32, or a float32's bits */
      code = p_clSetKernelArg(ptr(kernel), (cl_uint)i, sizeof(word), &word);
    }
    if (!cl_ok(env, code, "clSetKernelArg", 0)) return 0;
  }
  cl_size gs[3], ls[3];
  for (int d = 0; d < dims; ++d) { gs[d] = (cl_size)g[d]; ls[d] = (cl_size)l[d]; }
  cl_h event = 0;
  if (!cl_ok(env, p_clEnqueueNDRangeKernel(ptr(queue), ptr(kernel), (cl_uint)dims, 0, gs, ls, 0, 0,
                                           timed ? &event : 0), "clEnqueueNDRangeKernel", 0))
    return 0;
  if (!timed) return 0;
  cl_ulong start = 0, end = 0;
  cl_int code = p_clWaitForEvents(1, &event);
  if (code == 0) code = p_clGetEventProfilingInfo(event, CL_PROFILING_COMMAND_START, sizeof(start), &start, 0);
  const char *call = code == 0 ? "clGetEventProfilingInfo" : "clWaitForEvents";
  if (code == 0) code = p_clGetEventProfilingInfo(event, CL_PROFILING_COMMAND_END, sizeof(end), &end, 0);
  p_clReleaseEvent(event);
  if (!cl_ok(env, code, call, 0)) return 0;
  return (jlong)(end - start);
}

JNIEXPORT void FN(clFinish)(JNIEnv *env, jclass cls, jlong queue) {
  if (!cl_loaded(env, "clFinish")) return;
  cl_ok(env, p_clFinish(ptr(queue)), "clFinish", 0);
}
