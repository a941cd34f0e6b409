/* pool.c: the parallel launcher of every loaded module (docs/abi.md "The native pool", docs/parallel.md), as
 * tether_rpc/parallel.py and bindings/go/pool.go do it: the first loaded module with "thread_pool": 1 becomes the
 * provider; its tether_pool_launch is installed in every module through tether_set_parallel_launcher, and
 * num_threads - 1 pthreads park inside its tether_pool_worker. At one thread every module gets NULL and runs its
 * own serial loop. A launch is native code from start to end. */
#include "rt_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RT_NATIVE_POOL_VERSION 1
#define RT_WORKERS_READY_NS (10LL * 1000 * 1000 * 1000)

typedef void (*rt_setter_fn)(TetherParallelLauncher);

typedef struct {
  void* handle;
  rt_setter_fn setter;
  int64_t version;
} rt_pool_module;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static rt_pool_module* mods;
static int num_mods, cap_mods;
static int32_t num_threads;   /* 0: not chosen yet */

static struct {
  void* handle;
  TetherParallelLauncher launch;
  void (*worker)(void);
  void (*shutdown)(void);
  void (*set_spin)(int32_t);
  int32_t (*num_workers)(void);
  pthread_t* threads;
  int running;
} provider;

static int32_t default_threads(void) {
  const char* env = getenv("TETHER_NUM_THREADS");
  if (env && *env) {
    char* end;
    long n = strtol(env, &end, 10);
    if (*end == '\0' && n >= 1 && n <= 4096) return (int32_t)n;
  }
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 1) return (int32_t)CPU_COUNT(&set);
#endif
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n >= 1 ? (int32_t)n : 1;
}

static int32_t current_threads(void) {
  if (num_threads == 0) num_threads = default_threads();
  return num_threads;
}

static void* worker_main(void* arg) {
  (void)arg;
  provider.worker();   /* serves launches until tether_pool_shutdown */
  return NULL;
}

static void start_workers(void) {
  int want = current_threads() - 1;
  if (provider.handle == NULL || want <= 0) return;
  provider.threads = (pthread_t*)calloc((size_t)want, sizeof(pthread_t));
  if (provider.threads == NULL) return;   /* launches then run serially in the caller */
  for (int k = 0; k < want; k++) {
    if (pthread_create(&provider.threads[k], NULL, worker_main, NULL) != 0) break;
    provider.running++;
  }
  struct timespec nap = {0, 500 * 1000};
  for (long long waited = 0; provider.num_workers() < provider.running && waited < RT_WORKERS_READY_NS;
       waited += nap.tv_nsec)
    nanosleep(&nap, NULL);
}

static void stop_workers(void) {
  if (provider.handle == NULL || provider.running == 0) return;
  provider.shutdown();
  for (int k = 0; k < provider.running; k++) pthread_join(provider.threads[k], NULL);
  free(provider.threads);
  provider.threads = NULL;
  provider.running = 0;
}

static void install_all(void) {
  TetherParallelLauncher l = (provider.handle && current_threads() > 1) ? provider.launch : NULL;
  for (int k = 0; k < num_mods; k++)
    if (mods[k].setter) mods[k].setter(l);
}

static void adopt(void* handle) {
  memset(&provider, 0, sizeof provider);
  void* syms[5] = {dlsym(handle, "tether_pool_launch"), dlsym(handle, "tether_pool_worker"),
                   dlsym(handle, "tether_pool_shutdown"), dlsym(handle, "tether_pool_set_spin"),
                   dlsym(handle, "tether_pool_num_workers")};
  for (int k = 0; k < 5; k++)
    if (syms[k] == NULL) return;   /* a module that declares a pool but lacks it: not a provider */
  provider.handle = handle;
  provider.launch = (TetherParallelLauncher)syms[0];
  provider.worker = (void (*)(void))syms[1];
  provider.shutdown = (void (*)(void))syms[2];
  provider.set_spin = (void (*)(int32_t))syms[3];
  provider.num_workers = (int32_t(*)(void))syms[4];
  const char* spin = getenv("TETHER_POOL_SPIN");
  if (spin && *spin) {
    char* end;
    long n = strtol(spin, &end, 10);
    if (*end == '\0' && n >= 0 && n <= INT32_MAX) provider.set_spin((int32_t)n);
  }
  start_workers();
}

void rt_pool_add(void* handle, void* setter, int64_t version) {
  pthread_mutex_lock(&pool_lock);
  if (num_mods == cap_mods) {
    int cap = cap_mods ? 2 * cap_mods : 8;
    rt_pool_module* grown = (rt_pool_module*)realloc(mods, (size_t)cap * sizeof *mods);
    if (grown == NULL) {   /* not registered: the module keeps its serial loops */
      pthread_mutex_unlock(&pool_lock);
      return;
    }
    mods = grown;
    cap_mods = cap;
  }
  mods[num_mods].handle = handle;
  mods[num_mods].setter = (rt_setter_fn)setter;
  mods[num_mods].version = version;
  num_mods++;
  if (provider.handle == NULL && setter && version == RT_NATIVE_POOL_VERSION) adopt(handle);
  install_all();
  pthread_mutex_unlock(&pool_lock);
}

void rt_pool_remove(void* handle) {
  pthread_mutex_lock(&pool_lock);
  int others = 0;
  for (int k = 0; k < num_mods; k++)
    if (mods[k].handle == handle) {
      mods[k] = mods[--num_mods];
      break;
    }
  for (int k = 0; k < num_mods; k++) others += mods[k].handle == handle;
  if (provider.handle == handle && others == 0) {   /* the library is about to be unmapped: hand over */
    stop_workers();
    memset(&provider, 0, sizeof provider);
    for (int k = 0; k < num_mods && provider.handle == NULL; k++)
      if (mods[k].setter && mods[k].version == RT_NATIVE_POOL_VERSION) adopt(mods[k].handle);
  }
  install_all();
  pthread_mutex_unlock(&pool_lock);
}

int tether_rt_set_num_threads(int32_t n) {
  if (n < 1 || n > 4096)
    return rt_fail(TETHER_RT_ERR_ARGUMENT, "tether_rt_set_num_threads needs 1 to 4096 threads, got %d", (int)n);
  pthread_mutex_lock(&pool_lock);
  num_threads = n;
  if (provider.handle) {
    for (int k = 0; k < num_mods; k++)   /* no module launches into the pool while it restarts */
      if (mods[k].setter) mods[k].setter(NULL);
    stop_workers();
    start_workers();
  }
  install_all();
  pthread_mutex_unlock(&pool_lock);
  return TETHER_RT_OK;
}

int32_t tether_rt_get_num_threads(void) {
  pthread_mutex_lock(&pool_lock);
  int32_t n = current_threads();
  pthread_mutex_unlock(&pool_lock);
  return n;
}
