/* cpu.c: what this process's CPU can execute, and what of a module's metadata "requires" it lacks: the rules of
 * tether_rpc/cpu_features.py and bindings/go/cpufeatures.go (same names, same outcome). On ARM the auxiliary
 * vector comes first (qemu-user shows the host's /proc/cpuinfo but emulates the auxiliary vector); on x86_64 the
 * "flags" of /proc/cpuinfo. When nothing is known of the CPU, no module is refused for its features. */
#include "rt_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#if defined(__linux__)
#include <sys/auxv.h>
#endif


#define RT_MAX_FEATURES 256
#define RT_FEATURE_LEN 24

typedef struct {
  const char* isa;
  int known;              /* features were read from somewhere */
  int count;
  char features[RT_MAX_FEATURES][RT_FEATURE_LEN];
  char suggested[24];
} rt_caps;

static rt_caps caps;
static pthread_once_t caps_once = PTHREAD_ONCE_INIT;

const char* rt_host_arch(void) {
#if defined(__x86_64__)
  return "x86_64";
#elif defined(__aarch64__)
  return "aarch64";
#elif defined(__arm__)
  return "armv7";
#else
  return "unknown";
#endif
}

static int has(const char* f) {
  for (int k = 0; k < caps.count; k++)
    if (strcmp(caps.features[k], f) == 0) return 1;
  return 0;
}

static void add(const char* f, size_t n) {
  if (n == 0 || n >= RT_FEATURE_LEN || caps.count >= RT_MAX_FEATURES) return;
  char w[RT_FEATURE_LEN];
  for (size_t k = 0; k < n; k++) w[k] = (char)((f[k] >= 'A' && f[k] <= 'Z') ? f[k] - 'A' + 'a' : f[k]);
  w[n] = '\0';
  if (!has(w)) strcpy(caps.features[caps.count++], w);
}

typedef struct {
  const char* features_key;   /* "features" (ARM), "flags" (x86) or NULL */
  char architecture[16];
  int armv8_core;
} rt_cpuinfo;

/* Cores whose /proc/cpuinfo says "CPU architecture: 7" under a 32-bit kernel although they are ARMv8
 * (device_info._PARTS_BY_IMPLEMENTER: every ARMv8 core it names). */
static int is_armv8_part(long implementer, long part) {
  static const long arm_parts[] = {0xd02, 0xd03, 0xd04, 0xd05, 0xd06, 0xd07, 0xd08, 0xd09, 0xd0a, 0xd0b, 0xd0c,
                                   0xd0d, 0xd0e, 0xd40, 0xd41, 0xd44, 0xd46, 0xd47, 0xd48, 0xd49, 0xd4d, 0xd4e,
                                   0xd4f, 0xd80, 0xd81, 0xd82};
  if (implementer == 0x51) return part >= 0x800 && part <= 0x805;
  if (implementer != 0x41) return 0;
  for (size_t k = 0; k < sizeof arm_parts / sizeof arm_parts[0]; k++)
    if (arm_parts[k] == part) return 1;
  return 0;
}

static void read_cpuinfo(rt_cpuinfo* ci, int take_features) {
  FILE* fh = fopen("/proc/cpuinfo", "r");
  if (fh == NULL) return;
  char line[4096];
  long implementer = -1;
  int arch_set = 0;
  while (fgets(line, sizeof line, fh)) {
    char* colon = strchr(line, ':');
    if (colon == NULL) continue;
    char* kend = colon;
    while (kend > line && (kend[-1] == ' ' || kend[-1] == '\t')) kend--;
    size_t klen = (size_t)(kend - line);
    char* v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    size_t vlen = strlen(v);
    while (vlen && (v[vlen - 1] == '\n' || v[vlen - 1] == ' ')) v[--vlen] = '\0';
#define KEY(s) (klen == sizeof(s) - 1 && strncasecmp(line, s, klen) == 0)
    if (KEY("features") || KEY("flags")) {
      ci->features_key = KEY("features") ? "features" : "flags";
      if (!take_features) continue;
      char* p = v;
      while (*p) {
        while (*p == ' ' || *p == '\t') p++;
        char* w = p;
        while (*p && *p != ' ' && *p != '\t') p++;
        add(w, (size_t)(p - w));
      }
    } else if (KEY("cpu architecture")) {
      if (!arch_set) {
        snprintf(ci->architecture, sizeof ci->architecture, "%s", v);
        arch_set = 1;
      }
    } else if (KEY("cpu implementer")) {
      implementer = strtol(v, NULL, 0);
    } else if (KEY("cpu part")) {
      if (is_armv8_part(implementer, strtol(v, NULL, 0))) ci->armv8_core = 1;
    }
#undef KEY
  }
  fclose(fh);
}

#if defined(__aarch64__) || defined(__arm__)
static void add_bits(unsigned long value, const char* const* names, int n) {
  for (int bit = 0; bit < n; bit++)
    if (names[bit] && (value >> bit & 1ul)) add(names[bit], strlen(names[bit]));
}
#endif

static void compute_caps(void) {
  rt_cpuinfo ci;
  memset(&ci, 0, sizeof ci);
#if defined(__x86_64__)
  read_cpuinfo(&ci, 1);
  caps.isa = "x86_64";
  caps.known = caps.count > 0;
  strcpy(caps.suggested, "host");
#elif defined(__aarch64__) || defined(__arm__)
  unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
  const char* platform = (const char*)getauxval(AT_PLATFORM);
#if defined(__aarch64__)
  static const char* const t1[32] = {"fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32", "atomics",
                                     "fphp", "asimdhp", "cpuid", "asimdrdm", "jscvt", "fcma", "lrcpc", "dcpop",
                                     "sha3", "sm3", "sm4", "asimddp", "sha512", "sve", "asimdfhm", "dit", "uscat",
                                     "ilrcpc", "flagm", "ssbs", "sb", "paca", "pacg"};
  static const char* const t2[15] = {"dcpodp", "sve2", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, "i8mm", "bf16"};
#else
  static const char* const t1[22] = {0, "half", "thumb", 0, "fastmult", 0, "vfp", "edsp", 0, 0, 0, 0, "neon",
                                     "vfpv3", "vfpv3d16", "tls", "vfpv4", "idiva", "idivt", "vfpd32", "lpae",
                                     "evtstrm"};
  static const char* const t2[5] = {"aes", "pmull", "sha1", "sha2", "crc32"};
#endif
  read_cpuinfo(&ci, 0);
  if (hwcap) {
    add_bits(hwcap, t1, (int)(sizeof t1 / sizeof t1[0]));
    add_bits(hwcap2, t2, (int)(sizeof t2 / sizeof t2[0]));
    caps.known = 1;
  } else if (ci.features_key && strcmp(ci.features_key, "features") == 0) {   /* ARM's own cpuinfo */
    memset(&ci, 0, sizeof ci);
    read_cpuinfo(&ci, 1);
    caps.known = 1;
  }
#if defined(__aarch64__)
  caps.isa = "armv8";
  if (getenv("ANDROID_ROOT") || getenv("ANDROID_DATA")) strcpy(caps.suggested, "android-arm64");
  else if (has("atomics") && has("lrcpc") && has("asimddp") && has("fphp") && has("asimdhp"))
    strcpy(caps.suggested, "rasp5");
  else strcpy(caps.suggested, "rasp4b");
#else
  int v8 = (platform && strncmp(platform, "v8", 2) == 0) || has("crc32") || strcmp(ci.architecture, "8") == 0 ||
           ci.armv8_core;
  caps.isa = v8 ? "armv8" : "armv7";
  if (v8) strcpy(caps.suggested, "rasp3b");
  else if (has("neon") && has("vfpv4") && has("idiva")) strcpy(caps.suggested, "armv7-a7");
#endif
  (void)platform;
#else
  caps.isa = rt_host_arch();
#endif
}

static void ensure_caps(void) { pthread_once(&caps_once, compute_caps); }

const char* rt_cpu_isa(void) {
  ensure_caps();
  return caps.isa;
}

const char* rt_cpu_suggested_target(void) {
  ensure_caps();
  return caps.suggested;
}

static int isa_level(const char* isa) {
  if (isa == NULL) return -1;
  if (strcmp(isa, "armv7") == 0) return 0;
  if (strcmp(isa, "armv8") == 0) return 1;
  return -1;
}

static void append(char* out, size_t cap, const char* word) {
  size_t used = strlen(out);
  snprintf(out + used, cap - used, "%s%s", used ? ", " : "", word);
}

void rt_cpu_missing(const rt_json* requires, char* out, size_t cap) {
  out[0] = '\0';
  ensure_caps();
  if (requires == NULL || requires->type != RT_JOBJ || !caps.known) return;
  const rt_json* isa = rt_json_get(requires, "isa");
  int need = isa_level(isa && isa->type == RT_JSTR ? isa->s : NULL), have = isa_level(caps.isa);
  if (need >= 0 && have >= 0 && need > have)
    append(out, cap, need == 1 ? "ARMv8-A instructions (lda/stl acquire-release, vsel, vrint, vmaxnm)" : isa->s);
  const rt_json* feats = rt_json_get(requires, "features");
  if (feats == NULL || feats->type != RT_JARR) return;
  for (const rt_json* f = feats->child; f; f = f->next)
    if (f->type == RT_JSTR && !has(f->s)) append(out, cap, f->s);
}

uint32_t rt_cpu_dispatch_word(const rt_json* names) {
  ensure_caps();
  if (names == NULL || names->type != RT_JARR || !caps.known) return 0;
  uint32_t word = 0;
  int i = 0;
  for (const rt_json* n = names->child; n && i < 32; n = n->next, i++)
    if (n->type == RT_JSTR && has(n->s)) word |= 1u << i;
  return word;
}
