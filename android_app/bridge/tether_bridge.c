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

JNIEXPORT jlong FN(address)(JNIEnv *env, jclass cls, jobject buffer) {
  return from_ptr((*env)->GetDirectBufferAddress(env, buffer));
}

JNIEXPORT jint FN(pointerSize)(JNIEnv *env, jclass cls) { return (jint)sizeof(void *); }

JNIEXPORT jint FN(callPacked)(JNIEnv *env, jclass cls, jlong fn, jlong values, jlong codes, jint n) {
  return ((TetherPacked)ptr(fn))((const TetherValue *)ptr(values), (const int32_t *)ptr(codes), n);
}

JNIEXPORT jlong FN(timeCalls)(JNIEnv *env, jclass cls, jlong fn, jlong values, jlong codes, jint n, jint number) {
  TetherPacked f = (TetherPacked)ptr(fn);
  const TetherValue *v = (const TetherValue *)ptr(values);
  const int32_t *c = (const int32_t *)ptr(codes);
  int64_t t0 = now_ns();
  for (jint i = 0; i < number; ++i) {
    int32_t rc = f(v, c, n);
    if (rc) return -1 - (jlong)(uint32_t)rc;
  }
  return now_ns() - t0;
}

JNIEXPORT void FN(callWithPointer)(JNIEnv *env, jclass cls, jlong fn, jlong arg) {
  ((void (*)(void *))ptr(fn))(ptr(arg));
}

JNIEXPORT void FN(callVoid)(JNIEnv *env, jclass cls, jlong fn) { ((void (*)(void))ptr(fn))(); }

JNIEXPORT jint FN(callInt)(JNIEnv *env, jclass cls, jlong fn) { return ((int32_t (*)(void))ptr(fn))(); }

/* -- pool threads: borrowed by a module's tether_pool_worker until tether_pool_shutdown ----------------------- */
typedef struct {
  void (*worker)(void);
  int count;
  bridge_pthread_t threads[];
} Threads;

static void *run_worker(void *arg) {
  ((Threads *)arg)->worker();
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
