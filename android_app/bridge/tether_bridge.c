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
