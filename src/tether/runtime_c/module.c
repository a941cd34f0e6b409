/* module.c: vet and load a tether module (docs/abi.md), as tether_rpc/module.py and bindings/go/module.go do.
 *
 * Before any of its code runs: the ELF header (machine, word size, byte order, shared object, ARM float ABI), then
 * the JSON metadata of section .tether_meta (ABI version, target arch agreeing with the header, functions, the CPU
 * features its code needs, host functions it calls). Only then dlopen, the CPU-dispatch word, the host caller and
 * the parallel launcher (pool.c). */
#include "rt_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>


#define RT_MAX_META_BYTES (16u << 20)

struct rt_module {
  void* handle;
  rt_json_doc* meta;
  const rt_json* functions;
  char label[256];
};

/* ---- ELF ------------------------------------------------------------------------------------------------------ */
static uint64_t rd(const unsigned char* p, int n) {   /* little-endian */
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; k--) v = v << 8 | p[k];
  return v;
}

static const char* machine_name(unsigned m) {
  switch (m) {
    case 62: return "x86_64";
    case 183: return "aarch64";
    case 40: return "armv7";
    case 3: return "x86";
    case 243: return "riscv";
    default: return NULL;
  }
}

static unsigned host_machine(void) {
#if defined(__x86_64__)
  return 62;
#elif defined(__aarch64__)
  return 183;
#elif defined(__arm__)
  return 40;
#else
  return 0;
#endif
}

static int read_at(FILE* fh, uint64_t off, void* buf, size_t n) {
  if (off > (uint64_t)0x7fffffffffffffffLL || fseeko(fh, (off_t)off, SEEK_SET) != 0) return 0;
  return fread(buf, 1, n, fh) == n;
}

/* The metadata text of `path` (NUL-terminated, malloc'ed) after the ELF checks. */
static int vet_elf(const char* path, const char* label, char** meta_out) {
  FILE* fh = fopen(path, "rb");
  if (fh == NULL) return rt_fail(TETHER_RT_ERR_IO, "cannot open module %s", path);
  unsigned char h[64];
  int status = TETHER_RT_OK;
  char* meta = NULL;
  unsigned char* shdrs = NULL;
  char* names = NULL;
  if (fseeko(fh, 0, SEEK_END) != 0) {
    status = rt_fail(TETHER_RT_ERR_IO, "cannot read module %s", path);
    goto done;
  }
  uint64_t size = (uint64_t)ftello(fh);
  if (size < 52 || !read_at(fh, 0, h, size < 64 ? 52 : 64) || memcmp(h, "\177ELF", 4) != 0) {
    status = rt_fail(TETHER_RT_ERR_MODULE, "%s is not an ELF shared library (no ELF header): export modules with "
                     "tether.build_graph(...).export", label);
    goto done;
  }
  int bits = h[4] == 2 ? 64 : h[4] == 1 ? 32 : 0;
  if (bits == 0 || (bits == 64 && size < 64) || h[5] != 1) {
    unsigned m = (unsigned)(h[5] == 2 ? (h[18] << 8 | h[19]) : rd(h + 18, 2));
    const char* built = machine_name(m);
    status = rt_fail(TETHER_RT_ERR_ARCH, "%s was built for %s (%s) but this device is %s: rebuild it with the "
                     "target for this device", label, built ? built : "another machine",
                     h[5] == 2 ? "big-endian" : "unknown ELF class", rt_host_arch());
    goto done;
  }
  unsigned type = (unsigned)rd(h + 16, 2), machine = (unsigned)rd(h + 18, 2);
  int here_bits = (int)(sizeof(void*) * 8);
  if (machine != host_machine() || bits != here_bits) {
    const char* built = machine_name(machine);
    char what[64];
    snprintf(what, sizeof what, "%s%s", built ? built : "machine ", built ? "" : "?");
    if (built == NULL) snprintf(what, sizeof what, "ELF machine %u", machine);
    status = rt_fail(TETHER_RT_ERR_ARCH, "%s was built for %s (%d-bit ELF) but this device is %s: rebuild it with "
                     "the target for this device", label, what, bits, rt_host_arch());
    goto done;
  }
  if (type != 3) {
    status = rt_fail(TETHER_RT_ERR_MODULE, "%s is not a shared library (ELF type %u); export modules with "
                     "export_library", label, type);
    goto done;
  }
  uint64_t flags = bits == 64 ? rd(h + 48, 4) : rd(h + 36, 4);
#if defined(__arm__)
#if defined(__ARM_PCS_VFP)
  const char* mine = "hard";
#else
  const char* mine = "soft";
#endif
  const char* theirs = (flags & 0x400) ? "hard" : (flags & 0x200) ? "soft" : NULL;
  if (theirs && strcmp(theirs, mine) != 0) {
    status = rt_fail(TETHER_RT_ERR_ARCH, "%s uses the %s-float ARM ABI but this program is %s-float: rebuild it "
                     "for a %s-float target", label, theirs, mine, mine);
    goto done;
  }
#endif
  (void)flags;
  uint64_t shoff = bits == 64 ? rd(h + 40, 8) : rd(h + 32, 4);
  unsigned shentsize = (unsigned)(bits == 64 ? rd(h + 58, 2) : rd(h + 46, 2));
  unsigned shnum = (unsigned)(bits == 64 ? rd(h + 60, 2) : rd(h + 48, 2));
  unsigned shstrndx = (unsigned)(bits == 64 ? rd(h + 62, 2) : rd(h + 50, 2));
  unsigned need = bits == 64 ? 64 : 40;
  if (shnum == 0 || shentsize < need || shstrndx >= shnum || shoff > size ||
      (uint64_t)shnum * shentsize > size - shoff) {
    status = rt_fail(TETHER_RT_ERR_MODULE, "%s: the ELF section table is missing or runs past the end of the file "
                     "(corrupt module)", label);
    goto done;
  }
  shdrs = (unsigned char*)malloc((size_t)shnum * shentsize);
  if (shdrs == NULL || !read_at(fh, shoff, shdrs, (size_t)shnum * shentsize)) {
    status = rt_fail(shdrs ? TETHER_RT_ERR_IO : TETHER_RT_ERR_NOMEM, "cannot read the section table of %s", label);
    goto done;
  }
#define SH_OFF(i) (bits == 64 ? rd(shdrs + (size_t)(i) * shentsize + 24, 8) : rd(shdrs + (size_t)(i) * shentsize + 16, 4))
#define SH_SIZE(i) (bits == 64 ? rd(shdrs + (size_t)(i) * shentsize + 32, 8) : rd(shdrs + (size_t)(i) * shentsize + 20, 4))
#define SH_NAME(i) rd(shdrs + (size_t)(i) * shentsize, 4)
  uint64_t noff = SH_OFF(shstrndx), nsize = SH_SIZE(shstrndx);
  if (noff > size || nsize > size - noff || nsize > RT_MAX_META_BYTES) {
    status = rt_fail(TETHER_RT_ERR_MODULE, "%s: the section name table runs past the end of the file (corrupt "
                     "module)", label);
    goto done;
  }
  names = (char*)malloc((size_t)nsize + 1);
  if (names == NULL || !read_at(fh, noff, names, (size_t)nsize)) {
    status = rt_fail(names ? TETHER_RT_ERR_IO : TETHER_RT_ERR_NOMEM, "cannot read the section names of %s", label);
    goto done;
  }
  names[nsize] = '\0';
  unsigned meta_index = 0;
  for (unsigned i = 1; i < shnum; i++) {
    uint64_t at = SH_NAME(i);
    if (at < nsize && strcmp(names + at, ".tether_meta") == 0) meta_index = i;
  }
  if (meta_index == 0) {
    status = rt_fail(TETHER_RT_ERR_MODULE, "%s has no .tether_meta section: it is not a tether module (build it "
                     "with tether.build_graph and export it)", label);
    goto done;
  }
  uint64_t moff = SH_OFF(meta_index), msize = SH_SIZE(meta_index);
  if (moff > size || msize > size - moff || msize > RT_MAX_META_BYTES) {
    status = rt_fail(TETHER_RT_ERR_MODULE, "%s: the .tether_meta section runs past the end of the file or is "
                     "larger than %u bytes (corrupt module)", label, RT_MAX_META_BYTES);
    goto done;
  }
  meta = (char*)malloc((size_t)msize + 1);
  if (meta == NULL || !read_at(fh, moff, meta, (size_t)msize)) {
    status = rt_fail(meta ? TETHER_RT_ERR_IO : TETHER_RT_ERR_NOMEM, "cannot read the metadata of %s", label);
    goto done;
  }
  if (memchr(meta, 0, (size_t)msize) == NULL) {
    status = rt_fail(TETHER_RT_ERR_MODULE, "%s: metadata in .tether_meta is not NUL-terminated (corrupt module)",
                     label);
    goto done;
  }
  meta[msize] = '\0';
#undef SH_OFF
#undef SH_SIZE
#undef SH_NAME
done:
  fclose(fh);
  free(shdrs);
  free(names);
  if (status != TETHER_RT_OK) {
    free(meta);
    return status;
  }
  *meta_out = meta;
  return TETHER_RT_OK;
}

/* ---- host functions ------------------------------------------------------------------------------------------- */
#define RT_MAX_HOST_FUNCS 64
static struct {
  char name[128];
  tether_rt_host_function fn;
  void* user;
} host_funcs[RT_MAX_HOST_FUNCS];
static int num_host_funcs;
static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;
static char host_error[256];   /* process-wide: a failing call may run on a pool thread */

int tether_rt_register_host_function(const char* name, tether_rt_host_function fn, void* user) {
  if (name == NULL || fn == NULL || name[0] == '\0' || strlen(name) >= sizeof host_funcs[0].name)
    return rt_fail(TETHER_RT_ERR_ARGUMENT, "tether_rt_register_host_function needs a name (1 to %u bytes) and a "
                   "function", (unsigned)sizeof host_funcs[0].name - 1);
  int status = TETHER_RT_OK;
  pthread_mutex_lock(&host_lock);
  for (int k = 0; k < num_host_funcs; k++)
    if (strcmp(host_funcs[k].name, name) == 0) status = rt_fail(TETHER_RT_ERR_ARGUMENT,
                                                               "host function '%s' is already registered", name);
  if (status == TETHER_RT_OK && num_host_funcs == RT_MAX_HOST_FUNCS)
    status = rt_fail(TETHER_RT_ERR_LIMIT, "at most %d host functions can be registered", RT_MAX_HOST_FUNCS);
  if (status == TETHER_RT_OK) {
    strcpy(host_funcs[num_host_funcs].name, name);
    host_funcs[num_host_funcs].fn = fn;
    host_funcs[num_host_funcs].user = user;
    num_host_funcs++;
  }
  pthread_mutex_unlock(&host_lock);
  return status;
}

static int find_host(const char* name, tether_rt_host_function* fn, void** user) {
  int found = 0;
  pthread_mutex_lock(&host_lock);
  for (int k = 0; k < num_host_funcs && !found; k++)
    if (strcmp(host_funcs[k].name, name) == 0) {
      *fn = host_funcs[k].fn;
      *user = host_funcs[k].user;
      found = 1;
    }
  pthread_mutex_unlock(&host_lock);
  return found;
}

int rt_host_function_known(const char* name) {
  tether_rt_host_function fn;
  void* user;
  return find_host(name, &fn, &user);
}

static int32_t host_caller(const char* name, const TetherValue* args, const int32_t* codes, int32_t n,
                           TetherValue* ret, int32_t* ret_code) {
  tether_rt_host_function fn;
  void* user;
  if (!find_host(name, &fn, &user)) {
    pthread_mutex_lock(&host_lock);
    snprintf(host_error, sizeof host_error, "host function '%s' is not registered", name);
    pthread_mutex_unlock(&host_lock);
    return 1;
  }
  int32_t rc = fn(user, args, codes, n, ret, ret_code);
  if (rc != 0) {
    pthread_mutex_lock(&host_lock);
    snprintf(host_error, sizeof host_error, "host function '%s' failed with code %d", name, (int)rc);
    pthread_mutex_unlock(&host_lock);
  }
  return rc;
}

void* rt_host_caller(void) { return (void*)host_caller; }

const char* rt_host_take_error(void) {
  static _Thread_local char taken[256];
  pthread_mutex_lock(&host_lock);
  snprintf(taken, sizeof taken, "%s", host_error[0] ? host_error : "a host function failed");
  host_error[0] = '\0';
  pthread_mutex_unlock(&host_lock);
  return taken;
}

/* ---- loading ---------------------------------------------------------------------------------------------------- */
static int check_metadata(rt_module* mod, const rt_json* meta) {
  const char* label = mod->label;
  if (meta->type != RT_JOBJ)
    return rt_fail(TETHER_RT_ERR_MODULE, "%s: metadata must be a JSON object", label);
  const rt_json* v = rt_json_get(meta, "abi_version");
  if (v == NULL || !v->is_int || v->i != TETHER_ABI_VERSION)
    return rt_fail(TETHER_RT_ERR_MODULE, "%s uses tether ABI version %lld but this runtime speaks version %d: rebuild "
                   "the module with a matching tether", label, v && v->is_int ? (long long)v->i : -1LL,
                   TETHER_ABI_VERSION);
  const rt_json* target = rt_json_get(meta, "target");
  const rt_json* arch = rt_json_get(target, "arch");
  if (arch && arch->type == RT_JSTR && strcmp(arch->s, rt_host_arch()) != 0)
    return rt_fail(TETHER_RT_ERR_MODULE, "%s: metadata says arch '%s' but the ELF header says %s (corrupt or "
                   "mislabelled module)", label, arch->s, rt_host_arch());
  const rt_json* funcs = rt_json_get(meta, "functions");
  if (funcs == NULL || funcs->type != RT_JARR)
    return rt_fail(TETHER_RT_ERR_MODULE, "%s: metadata 'functions' must be a list of objects with a 'name'", label);
  for (const rt_json* f = funcs->child; f; f = f->next) {
    const rt_json* name = rt_json_get(f, "name");
    if (name == NULL || name->type != RT_JSTR)
      return rt_fail(TETHER_RT_ERR_MODULE, "%s: metadata 'functions' must be a list of objects with a 'name'",
                     label);
  }
  mod->functions = funcs;
  char lacking[512];
  rt_cpu_missing(rt_json_get(meta, "requires"), lacking, sizeof lacking);
  if (lacking[0]) {
    const rt_json* preset = rt_json_get(target, "preset");
    const rt_json* cpu = rt_json_get(target, "cpu");
    const char* built = preset && preset->type == RT_JSTR ? preset->s
                        : cpu && cpu->type == RT_JSTR     ? cpu->s
                                                          : "another CPU";
    const char* suggest = rt_cpu_suggested_target();
    return rt_fail(TETHER_RT_ERR_ARCH, "%s was built for %s and needs %s, which this device's CPU (%s) lacks: %s%s%s",
                   label, built, lacking, rt_cpu_isa(), suggest[0] ? "rebuild it with target='" :
                   "rebuild it for this device's CPU", suggest, suggest[0] ? "'" : "");
  }
  const rt_json* host = rt_json_get(meta, "host_functions");
  if (host && host->type == RT_JARR) {
    for (const rt_json* h = host->child; h; h = h->next)
      if (h->type != RT_JSTR || !rt_host_function_known(h->s))
        return rt_fail(TETHER_RT_ERR_UNSUPPORTED, "%s needs host function '%s', which is not registered in this "
                       "process: register it with tether_rt_register_host_function before loading", label,
                       h->type == RT_JSTR ? h->s : "?");
  }
  return TETHER_RT_OK;
}

int rt_module_load(const char* path, rt_module** out) {
  rt_module* mod = (rt_module*)calloc(1, sizeof *mod);
  if (mod == NULL) return rt_fail(TETHER_RT_ERR_NOMEM, "out of memory loading %s", path);
  const char* base = strrchr(path, '/');
  snprintf(mod->label, sizeof mod->label, "%s", base ? base + 1 : path);
  char* text = NULL;
  int status = vet_elf(path, mod->label, &text);
  if (status != TETHER_RT_OK) {
    free(mod);
    return status;
  }
  char what[300];
  snprintf(what, sizeof what, "%s: metadata in .tether_meta", mod->label);
  mod->meta = rt_json_parse(text, strlen(text), what);
  free(text);
  if (mod->meta == NULL) {
    free(mod);
    return TETHER_RT_ERR_MODULE;
  }
  const rt_json* meta = rt_json_root(mod->meta);
  if ((status = check_metadata(mod, meta)) != TETHER_RT_OK) {
    rt_json_free(mod->meta);
    free(mod);
    return status;
  }
  mod->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (mod->handle == NULL) {
    const char* err = dlerror();
    status = rt_fail(TETHER_RT_ERR_MODULE, "dlopen failed for %s: %s", mod->label, err ? err : "unknown error");
    rt_json_free(mod->meta);
    free(mod);
    return status;
  }
  for (const rt_json* f = mod->functions->child; f; f = f->next) {
    const char* name = rt_json_get(f, "name")->s;
    if (dlsym(mod->handle, name) == NULL) {
      status = rt_fail(TETHER_RT_ERR_MODULE, "%s: metadata lists %s but the library does not export it", mod->label,
                       name);
      dlclose(mod->handle);
      rt_json_free(mod->meta);
      free(mod);
      return status;
    }
  }
  /* kernels compiled twice pick their version from the features this CPU reports (metadata "cpu_dispatch") */
  const rt_json* dispatch = rt_json_get(meta, "cpu_dispatch");
  if (dispatch && dispatch->type == RT_JARR && dispatch->count > 0) {
    uint32_t* word = (uint32_t*)dlsym(mod->handle, "tether_cpu_features");
    if (word) *word = rt_cpu_dispatch_word(dispatch);   /* absent: every kernel stays on its base version */
  }
  const rt_json* host = rt_json_get(meta, "host_functions");
  if (host && host->type == RT_JARR && host->count > 0) {
    void (*set_caller)(TetherHostCaller) = (void (*)(TetherHostCaller))dlsym(mod->handle, "tether_set_host_caller");
    if (set_caller == NULL) {
      status = rt_fail(TETHER_RT_ERR_MODULE, "%s lists host functions but does not export tether_set_host_caller",
                       mod->label);
      dlclose(mod->handle);
      rt_json_free(mod->meta);
      free(mod);
      return status;
    }
    set_caller((TetherHostCaller)rt_host_caller());
  }
  const rt_json* pool = rt_json_get(meta, "thread_pool");
  rt_pool_add(mod->handle, dlsym(mod->handle, "tether_set_parallel_launcher"), pool && pool->is_int ? pool->i : 0);
  *out = mod;
  return TETHER_RT_OK;
}

void rt_module_free(rt_module* mod) {
  if (mod == NULL) return;
  rt_pool_remove(mod->handle);
  dlclose(mod->handle);
  rt_json_free(mod->meta);
  free(mod);
}

int rt_module_function(rt_module* mod, const char* name, TetherPackedFunc* fn, const rt_json** info) {
  for (const rt_json* f = mod->functions->child; f; f = f->next)
    if (strcmp(rt_json_get(f, "name")->s, name) == 0) {
      *fn = (TetherPackedFunc)dlsym(mod->handle, name);
      *info = f;
      if (*fn) return TETHER_RT_OK;
    }
  return rt_fail(TETHER_RT_ERR_FORMAT, "%s has no function '%s'", mod->label, name);
}

static void shape_text(const rt_json* shape, char* out, size_t cap) {
  size_t used = (size_t)snprintf(out, cap, "(");
  int k = 0;
  for (const rt_json* d = shape ? shape->child : NULL; d && used < cap; d = d->next, k++)
    used += (size_t)snprintf(out + used, cap - used, "%s%lld", k ? ", " : "", (long long)d->i);
  if (used < cap) snprintf(out + used, cap - used, k == 1 ? ",)" : ")");
}

void rt_module_describe_rc(rt_module* mod, const rt_json* info, int32_t rc, char* out, size_t cap) {
  uint32_t u = (uint32_t)rc;
  unsigned kind = u >> 24, i = (u >> 8) & 0xFFFF, d = u & 0xFF, low24 = u & 0xFFFFFF;
  const char* name = rt_json_get(info, "name")->s;
  const rt_json* args = rt_json_get(info, "args");
  const rt_json* arg = rt_json_at(args, i);
  const rt_json* aname = rt_json_get(arg, "name");
  char ename[160] = "", eshape[128] = "?";
  if (aname && aname->type == RT_JSTR) snprintf(ename, sizeof ename, " '%s'", aname->s);
  if (rt_json_get(arg, "shape")) shape_text(rt_json_get(arg, "shape"), eshape, sizeof eshape);
  const rt_json* dt = rt_json_get(arg, "dtype");
  (void)mod;
  switch (kind) {
    case 1: snprintf(out, cap, "%s: expected %zu arguments, got %u", name, args ? args->count : 0, low24); break;
    case 2: snprintf(out, cap, "%s: argument %u%s must be an array", name, i, ename); break;
    case 3: snprintf(out, cap, "%s: argument %u%s has the wrong number of dimensions, expected shape %s", name, i,
                     ename, eshape); break;
    case 4: snprintf(out, cap, "%s: argument %u%s has the wrong dtype, expected %s", name, i, ename,
                     dt && dt->type == RT_JSTR ? dt->s : "another dtype"); break;
    case 5: snprintf(out, cap, "%s: argument %u%s has the wrong shape, expected %s (dimension %u differs)", name, i,
                     ename, eshape, d); break;
    case 6: snprintf(out, cap, "%s: argument %u%s is not a compact row-major array (dimension %u)", name, i, ename, d);
      break;
    case 7: snprintf(out, cap, "%s: argument %u%s has a NULL data pointer", name, i, ename); break;
    case 8: snprintf(out, cap, "%s: a parallel task failed with code %u", name, low24); break;
    case 9: snprintf(out, cap, "%s: %s", name, rt_host_take_error()); break;
    default: snprintf(out, cap, "%s: failed with return code %d (0x%08x)", name, (int)rc, u); break;
  }
}
