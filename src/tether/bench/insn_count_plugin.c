/* Guest instruction counts by class, for qemu-user's TCG plugin interface (tether bench --count-instructions).
 *
 * Loaded as `qemu-aarch64 -plugin libinsncount.so,out=FILE[,ranges=FILE] ...`. At translation time every
 * instruction of a translation block (TB) is classified by decoding its bytes, and attributed to a region (a
 * guest address range named in the ranges file, e.g. one kernel of a compiled model) or to none; the TB then gets
 * one inline "add N to this counter" per (region, class) pair it holds. Inline per-TB counters were chosen over
 * per-instruction exec callbacks for speed: no helper call per instruction, one add per pair per TB execution.
 * A TB that is left midway (a guest fault) still counts whole; in user mode TBs end at every syscall, so that
 * happens only on a fault, which benchmarks do not take.
 *
 * Counters are plain (not atomic) 64-bit adds: counts are exact for a single guest thread only, which is how
 * tether runs the counted programs (one thread, see tether/bench/insn_count.py).
 *
 * ranges=FILE is read lazily: the guest program writes it (atomically, by rename) once it has loaded the code to
 * attribute, before running it; until it exists every TB is attributed to no region. A line is
 * "START END NAME" (hex guest addresses, END exclusive). Code first translated before the file exists is never
 * re-attributed, which is why the program writes it before the first call into the ranges.
 *
 * Marks: a guest that makes the (otherwise unused) system call MARK_SYSCALL (e.g. Python's
 * `ctypes.CDLL(None).syscall(0x74e7)`) records a snapshot of the totals at that point, up to MAX_MARKS of them.
 * The difference of two marks counts what ran between them in one process, for programs whose start-up does not
 * repeat exactly from run to run (a runtime whose initialisation allocates in a varying order), where the
 * difference of two whole runs would not be exact. qemu answers the call itself with ENOSYS.
 *
 * At exit the counts are written as JSON to out=FILE:
 *   {"arch": "...", "classes": [...], "total": {class: n}, "regions": {name: {class: n}}, "tbs": n,
 *    "marks": [{class: n}, ...]}
 *
 * No qemu header is included: the few declarations below follow qemu's public plugin API, version 1
 * (qemu-plugin.h of qemu 4.2 to 7.x: the types and functions as documented there), declared here so the plugin
 * builds with any C compiler and no qemu source tree.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- qemu's public plugin API, version 1 (declarations only) ---------------------------------------------- */
#define PLUGIN_EXPORT __attribute__((visibility("default")))

typedef uint64_t qemu_plugin_id_t;
typedef struct {
    const char *target_name;
    int min_version;
    int cur_version;
    bool system_emulation;
    union {
        struct {
            int smp_vcpus;
            int max_vcpus;
        } system;
    };
} qemu_info_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_vcpu_syscall_cb_t)(qemu_plugin_id_t id, unsigned int vcpu_index, int64_t num,
                                              uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5,
                                              uint64_t a6, uint64_t a7, uint64_t a8);
void qemu_plugin_register_vcpu_syscall_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_syscall_cb_t cb);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op, void *ptr,
                                              uint64_t imm);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *insn);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn *insn);
char *qemu_plugin_insn_disas(const struct qemu_plugin_insn *insn);

PLUGIN_EXPORT int qemu_plugin_version = 1;
PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv);

/* ---- classes ---------------------------------------------------------------------------------------------- */
enum {
    C_VFMA,         /* vector floating multiply-accumulate: FMLA/FMLS (vector, by element), VFMA/VFMS, VMLA/VMLS.F */
    C_DOT,          /* dot product: SDOT/UDOT/USDOT/SUDOT (vector, by element), VSDOT/VUDOT */
    C_VLOAD,        /* loads into SIMD&FP registers: LD1..LD4, LDR q/d/s, LDP q, VLD1..4, VLDR, VLDM */
    C_VSTORE,       /* stores from SIMD&FP registers */
    C_LOAD,         /* loads into general registers (incl. load multiple, pop) */
    C_STORE,        /* stores from general registers (incl. store multiple, push) */
    C_BRANCH,       /* branches: B, BL, B.cond, CBZ, TBZ, BR, BLR, RET, BX, BLX, TBB/TBH */
    C_SIMD,         /* other SIMD&FP data processing (vector and scalar FP arithmetic, moves, conversions) */
    C_OTHER,        /* everything else (integer arithmetic, moves, system) */
    N_CLASSES
};
static const char *const CLASS_NAMES[N_CLASSES] = {"vfma", "dot", "vload", "vstore", "load", "store", "branch",
                                                   "simd", "other"};

/* AArch64 (A64), w = the 32-bit instruction word. Masks from the Arm ARM's encoding tables. */
static int classify_a64(uint32_t w)
{
    if ((w & 0x9FE0FC00u) == 0x0E809400u) return C_DOT;     /* SDOT/UDOT (vector): 0 Q U 01110 10 0 Rm 100101 */
    if ((w & 0xBFE0FC00u) == 0x0E809C00u) return C_DOT;     /* USDOT (vector): 0 Q 0 01110 10 0 Rm 100111 */
    if ((w & 0x9FC0F400u) == 0x0F80E000u) return C_DOT;     /* SDOT/UDOT (by element): size=10 opcode=1110 */
    if ((w & 0xBF40F400u) == 0x0F00F000u) return C_DOT;     /* SUDOT/USDOT (by element): opcode=1111 */
    if ((w & 0xBF20FC00u) == 0x0E20CC00u) return C_VFMA;    /* FMLA/FMLS (vector, single/double) */
    if ((w & 0xBF60FC00u) == 0x0E400C00u) return C_VFMA;    /* FMLA/FMLS (vector, half): a 10 Rm 00 x001 */
    if ((w & 0xBF00B400u) == 0x0F001000u) return C_VFMA;    /* FMLA/FMLS (by element): U=0 opcode=0x01 */
    if ((w & 0x7C000000u) == 0x14000000u) return C_BRANCH;  /* B, BL */
    if ((w & 0xFF000010u) == 0x54000000u) return C_BRANCH;  /* B.cond */
    if ((w & 0x7C000000u) == 0x34000000u) return C_BRANCH;  /* CBZ/CBNZ, TBZ/TBNZ */
    if ((w & 0xFE000000u) == 0xD6000000u) return C_BRANCH;  /* BR, BLR, RET (unconditional branch, register) */
    if ((w & 0x0A000000u) == 0x08000000u) {                 /* loads and stores: op0 = x1x0 */
        bool simd = (w >> 26) & 1;                          /* V: SIMD&FP register */
        bool load;
        if ((w & 0xBF000000u) == 0x0C000000u || (w & 0xBF000000u) == 0x0D000000u)
            load = (w >> 22) & 1;                           /* LD1..4/ST1..4 (multiple or single structure): L */
        else if ((w & 0x3B000000u) == 0x18000000u)
            load = true;                                    /* load register (literal) */
        else if ((w & 0x3A000000u) == 0x28000000u)
            load = (w >> 22) & 1;                           /* load/store pair: L */
        else if ((w & 0x3F000000u) == 0x08000000u)
            load = (w >> 22) & 1;                           /* load/store exclusive: L */
        else if ((w & 0x3B000000u) == 0x38000000u || (w & 0x3B000000u) == 0x39000000u)
            /* load/store register: SIMD&FP loads have opc<0> = 1 (opc<1> selects 128 bits); general registers
             * load (or prefetch) for every opc but 00 */
            load = simd ? (w >> 22) & 1 : ((w >> 22) & 3) != 0;
        else
            load = (w >> 22) & 1;
        if (simd) return load ? C_VLOAD : C_VSTORE;
        return load ? C_LOAD : C_STORE;
    }
    if ((w & 0x0E000000u) == 0x0E000000u) return C_SIMD;    /* data processing, SIMD&FP: op0 = x111 */
    return C_OTHER;
}

/* A32 (ARM state), w = the 32-bit instruction word. Also used for the T32 SIMD&FP encodings, converted first. */
static int classify_a32(uint32_t w)
{
    uint32_t cond = w >> 28;
    if (cond == 0xF) {
        if ((w & 0xFFB00F00u) == 0xFC200D00u) return C_DOT;     /* VSDOT/VUDOT (vector) */
        if ((w & 0xFFB00F00u) == 0xFE200D00u) return C_DOT;     /* VSDOT/VUDOT (by element) */
        if ((w & 0xFF800F10u) == 0xF2000C10u) return C_VFMA;    /* VFMA/VFMS (Advanced SIMD) */
        if ((w & 0xFF800F10u) == 0xF2000D10u) return C_VFMA;    /* VMLA/VMLS.F32 (Advanced SIMD, vector) */
        if ((w & 0xFE800B50u) == 0xF2800140u && (w & 0x00300000u) != 0x00300000u)
            return C_VFMA;                                      /* VMLA/VMLS.F32 (by scalar) */
        if ((w & 0xFF300000u) == 0xF4200000u) return C_VLOAD;   /* VLD1..4 (element or structure): L=1 */
        if ((w & 0xFF300000u) == 0xF4000000u) return C_VSTORE;  /* VST1..4 */
        if ((w & 0xFE000000u) == 0xF2000000u) return C_SIMD;    /* other Advanced SIMD data processing */
        if ((w & 0xFE000000u) == 0xFA000000u) return C_BRANCH; /* BLX (immediate) */
        if ((w & 0xFD300000u) == 0xF5100000u || (w & 0xFF700000u) == 0xF4500000u)
            return C_LOAD;                                      /* PLD, PLDW, PLI: prefetches count as loads */
        if ((w & 0x0E000000u) == 0x0C000000u || (w & 0x0F000000u) == 0x0E000000u)
            return C_SIMD;                                      /* unconditional coprocessor space (VSEL, VRINT..) */
        return C_OTHER;
    }
    if ((w & 0x0E000000u) == 0x0A000000u) return C_BRANCH;     /* B, BL */
    if ((w & 0x0FFFFFD0u) == 0x012FFF10u) return C_BRANCH;     /* BX, BLX (register) */
    if ((w & 0x0FE00E00u) == 0x0C400A00u) return C_SIMD;       /* VMOV between two core and a SIMD&FP register */
    if ((w & 0x0E000E00u) == 0x0C000A00u)                      /* VLDR/VSTR/VLDM/VSTM/VPUSH/VPOP: L = bit 20 */
        return ((w >> 20) & 1) ? C_VLOAD : C_VSTORE;
    if ((w & 0x0F000E00u) == 0x0E000A00u) return C_SIMD;       /* VFP data processing, core<->SIMD&FP moves */
    if ((w & 0x0C000000u) == 0x04000000u) {                    /* LDR/STR (word, byte) */
        if ((w & 0x02000010u) == 0x02000010u) return C_OTHER;  /* media instructions share this space */
        return ((w >> 20) & 1) ? C_LOAD : C_STORE;
    }
    if ((w & 0x0E000000u) == 0x08000000u)                      /* LDM/STM (incl. PUSH/POP) */
        return ((w >> 20) & 1) ? C_LOAD : C_STORE;
    if ((w & 0x0E000090u) == 0x00000090u && (w & 0x60u) != 0) /* LDRH/STRH/LDRSB/LDRSH/LDRD/STRD */
        return (((w >> 20) & 1) || ((w >> 5) & 3) == 2) ? C_LOAD : C_STORE;
    return C_OTHER;
}

/* T32 (Thumb state), 16-bit instruction h. */
static int classify_t16(uint32_t h)
{
    if ((h & 0xF000u) == 0xD000u && ((h >> 8) & 0xF) < 0xE) return C_BRANCH;  /* B<c> (not UDF/SVC) */
    if ((h & 0xF800u) == 0xE000u) return C_BRANCH;                           /* B */
    if ((h & 0xF500u) == 0xB100u) return C_BRANCH;                           /* CBZ/CBNZ */
    if ((h & 0xFF00u) == 0x4700u) return C_BRANCH;                           /* BX, BLX (register) */
    if ((h & 0xF800u) == 0x4800u) return C_LOAD;                             /* LDR (literal) */
    if ((h & 0xF000u) == 0x5000u) return ((h >> 9) & 7) >= 3 ? C_LOAD : C_STORE; /* register offset */
    if ((h & 0xE000u) == 0x6000u || (h & 0xF000u) == 0x8000u || (h & 0xF000u) == 0x9000u ||
        (h & 0xF000u) == 0xC000u)                                            /* imm offset, SP-relative, LDM/STM */
        return ((h >> 11) & 1) ? C_LOAD : C_STORE;
    if ((h & 0xFE00u) == 0xB400u) return C_STORE;                            /* PUSH */
    if ((h & 0xFE00u) == 0xBC00u) return C_LOAD;                             /* POP */
    return C_OTHER;
}

/* T32, 32-bit instruction: hw1 the first halfword, hw2 the second. */
static int classify_t32(uint32_t hw1, uint32_t hw2)
{
    uint32_t t = (hw1 << 16) | hw2;
    if ((hw1 & 0xEF00u) == 0xEF00u)                    /* Advanced SIMD data processing: 111U 1111 -> 1111 001U */
        return classify_a32(0xF2000000u | (((hw1 >> 12) & 1) << 24) | (t & 0x00FFFFFFu));
    if ((hw1 & 0xFF10u) == 0xF900u)                    /* Advanced SIMD element/structure load/store */
        return classify_a32(0xF4000000u | (t & 0x00FFFFFFu));
    if ((hw1 & 0xEC00u) == 0xEC00u)                    /* coprocessor / VFP space: the A32 word with cond 1110/1111 */
        return classify_a32(t);
    if ((hw1 & 0xF800u) == 0xF000u && (hw2 & 0x8000u)) {   /* branches and miscellaneous control */
        if ((hw2 & 0x5000u) != 0) return C_BRANCH;         /* B, BL, BLX */
        if ((hw1 & 0x0380u) != 0x0380u) return C_BRANCH;   /* B<c> */
        return C_OTHER;
    }
    if ((hw1 & 0xFE00u) == 0xF800u || ((hw1 & 0xFF00u) == 0xF900u && (hw1 & 0x10u)))
        return (hw1 & 0x10u) ? C_LOAD : C_STORE;           /* load/store single */
    if ((hw1 & 0xFE40u) == 0xE800u) return (hw1 & 0x10u) ? C_LOAD : C_STORE;  /* LDM/STM */
    if ((hw1 & 0xFE40u) == 0xE840u) {                      /* dual, exclusive, table branch */
        if ((hw1 & 0xFFF0u) == 0xE8D0u && (hw2 & 0xFFE0u) == 0xF000u) return C_BRANCH;   /* TBB/TBH */
        return (hw1 & 0x10u) ? C_LOAD : C_STORE;
    }
    return C_OTHER;
}

/* ---- state ------------------------------------------------------------------------------------------------ */
#define MAX_REGIONS 8192
typedef struct {
    uint64_t start, end;
    char *name;
} region_t;

static bool is_a64;
static char target_name[32];
static char *out_path;
static char *ranges_path;
static FILE *disas_fh;            /* disas=FILE: "class<TAB>mode<TAB>hex<TAB>qemu's disassembly" per translated insn */
static bool ranges_loaded;
static region_t *regions;
static int n_regions;
/* counts[0] is "no region", counts[1 + i] region i */
static uint64_t (*counts)[N_CLASSES];
static uint64_t n_tbs;
/* marks: snapshots of the totals taken when the guest makes the system call MARK_SYSCALL */
#define MARK_SYSCALL 0x74e7
#define MAX_MARKS 16
static uint64_t marks[MAX_MARKS][N_CLASSES];
static int n_marks;

static int cmp_region(const void *a, const void *b)
{
    const region_t *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static void load_ranges(void)
{
    FILE *fh = fopen(ranges_path, "r");
    if (!fh) return;                 /* not written yet */
    char line[1024];
    while (n_regions < MAX_REGIONS && fgets(line, sizeof line, fh)) {
        unsigned long long s, e;
        char name[900];
        if (sscanf(line, "%llx %llx %899s", &s, &e, name) != 3 || e <= s) continue;
        regions[n_regions].start = s;
        regions[n_regions].end = e;
        regions[n_regions].name = strdup(name);
        n_regions++;
    }
    fclose(fh);
    qsort(regions, n_regions, sizeof *regions, cmp_region);
    ranges_loaded = true;
}

static int region_of(uint64_t pc)
{
    int lo = 0, hi = n_regions - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (pc < regions[mid].start) hi = mid - 1;
        else if (pc >= regions[mid].end) lo = mid + 1;
        else return mid + 1;
    }
    return 0;
}

/* A 16-bit T32 instruction is one whose first halfword is not a 32-bit prefix (0b11101, 0b11110, 0b11111). */
static bool t16(uint32_t hw1)
{
    return (hw1 & 0xF800u) < 0xE800u;
}

static int classify_t(const uint8_t *d, size_t size)
{
    uint32_t hw1 = (uint32_t)d[0] | (uint32_t)d[1] << 8;
    return size == 2 || t16(hw1) ? classify_t16(hw1) : classify_t32(hw1, (uint32_t)d[2] | (uint32_t)d[3] << 8);
}

static uint32_t word_of(const uint8_t *d)
{
    return (uint32_t)d[0] | (uint32_t)d[1] << 8 | (uint32_t)d[2] << 16 | (uint32_t)d[3] << 24;
}

/* A TB is in one instruction set: a switch between A32 and T32 is a branch, which ends the TB. qemu's plugin API
 * does not say which, so it is inferred. A 2-byte instruction or a 2 mod 4 address means T32; a first halfword
 * that is no 32-bit T32 prefix means A32 (qemu 7.2 reports a 16-bit T32 instruction just before a page end with
 * the next halfword appended, size 4; classify_t sees it as the 16-bit one it is). When every instruction reads
 * as either, the TB is taken in the set in which its last instruction is a branch (TBs end at branches: a lone
 * A32 `bx lr` and a lone T32 `blx` both come out right); when that does not decide, as T32 unless every word reads
 * as an unconditional A32 instruction (cond 0b1110), which T32 second halfwords rarely all do. */
static bool tb_is_thumb(struct qemu_plugin_tb *tb, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        if (qemu_plugin_insn_size(insn) == 2 || (qemu_plugin_insn_vaddr(insn) & 2)) return true;
        const uint8_t *d = qemu_plugin_insn_data(insn);
        if (t16((uint32_t)d[0] | (uint32_t)d[1] << 8)) return false;
    }
    if (n == 0) return false;
    struct qemu_plugin_insn *last = qemu_plugin_tb_get_insn(tb, n - 1);
    const uint8_t *d = qemu_plugin_insn_data(last);
    bool t_branch = classify_t(d, qemu_plugin_insn_size(last)) == C_BRANCH;
    bool a_branch = classify_a32(word_of(d)) == C_BRANCH;
    if (t_branch != a_branch) return t_branch;
    bool all_al = true;
    for (size_t i = 0; i < n; i++)
        if ((((const uint8_t *)qemu_plugin_insn_data(qemu_plugin_tb_get_insn(tb, i)))[3] >> 4) != 0xE) all_al = false;
    return !all_al;
}

static void flush_pairs(struct qemu_plugin_tb *tb, const int *region, const int *cls, const uint64_t *n, int n_pairs)
{
    for (int k = 0; k < n_pairs; k++)
        qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &counts[region[k]][cls[k]], n[k]);
}

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    if (ranges_path && !ranges_loaded) load_ranges();
    size_t n = qemu_plugin_tb_n_insns(tb);
    bool thumb = !is_a64 && tb_is_thumb(tb, n);
    /* (region, class) pairs of this TB, usually one region */
    enum { MAX_PAIRS = 64 };
    int pair_region[MAX_PAIRS], pair_class[MAX_PAIRS];
    uint64_t pair_n[MAX_PAIRS];
    int n_pairs = 0;
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        const uint8_t *d = qemu_plugin_insn_data(insn);
        size_t size = qemu_plugin_insn_size(insn);
        int cls;
        if (is_a64) cls = classify_a64(word_of(d));
        else if (thumb) cls = classify_t(d, size);
        else cls = classify_a32(word_of(d));
        int region = n_regions ? region_of(qemu_plugin_insn_vaddr(insn)) : 0;
        int k;
        for (k = 0; k < n_pairs; k++)
            if (pair_region[k] == region && pair_class[k] == cls) break;
        if (k == n_pairs) {
            if (n_pairs == MAX_PAIRS) {   /* a TB spanning many regions: hand over what we have, start afresh */
                flush_pairs(tb, pair_region, pair_class, pair_n, n_pairs);
                n_pairs = k = 0;
            }
            pair_region[k] = region;
            pair_class[k] = cls;
            pair_n[k] = 0;
            n_pairs++;
        }
        pair_n[k]++;
        if (disas_fh) {
            char *text = qemu_plugin_insn_disas(insn);
            uint32_t word = 0;
            memcpy(&word, d, size < 4 ? size : 4);
            fprintf(disas_fh, "%s\t%s\t%0*x\t%s\n", CLASS_NAMES[cls], is_a64 ? "a64" : thumb ? "t32" : "a32",
                    (int)(2 * size), word, text ? text : "?");
            free(text);
        }
    }
    flush_pairs(tb, pair_region, pair_class, pair_n, n_pairs);
    n_tbs++;
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu_index, int64_t num, uint64_t a1, uint64_t a2,
                       uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8)
{
    (void)id; (void)vcpu_index; (void)a1; (void)a2; (void)a3; (void)a4; (void)a5; (void)a6; (void)a7; (void)a8;
    if (num != MARK_SYSCALL || n_marks == MAX_MARKS) return;
    /* the TB holding the call was counted on entry, so a mark includes its own svc: the same for every mark */
    for (int r = 0; r <= n_regions; r++)
        for (int k = 0; k < N_CLASSES; k++) marks[n_marks][k] += counts[r][k];
    n_marks++;
}

static void write_counts(FILE *fh, const uint64_t *c)
{
    fputc('{', fh);
    for (int k = 0; k < N_CLASSES; k++) fprintf(fh, "%s\"%s\": %llu", k ? ", " : "", CLASS_NAMES[k],
                                                (unsigned long long)c[k]);
    fputc('}', fh);
}

static void at_exit(qemu_plugin_id_t id, void *userdata)
{
    (void)id;
    (void)userdata;
    uint64_t total[N_CLASSES] = {0};
    for (int r = 0; r <= n_regions; r++)
        for (int k = 0; k < N_CLASSES; k++) total[k] += counts[r][k];
    size_t len = strlen(out_path);
    char *tmp = malloc(len + 8);
    snprintf(tmp, len + 8, "%s.part", out_path);
    FILE *fh = fopen(tmp, "w");
    if (!fh) {
        fputs("insncount: cannot write the counts file\n", stderr);
        free(tmp);
        return;
    }
    fprintf(fh, "{\"arch\": \"%s\", \"classes\": [", target_name);
    for (int k = 0; k < N_CLASSES; k++) fprintf(fh, "%s\"%s\"", k ? ", " : "", CLASS_NAMES[k]);
    fprintf(fh, "], \"tbs\": %llu, \"ranges_loaded\": %s, \"total\": ", (unsigned long long)n_tbs,
            ranges_loaded ? "true" : "false");
    write_counts(fh, total);
    fprintf(fh, ", \"unattributed\": ");
    write_counts(fh, counts[0]);
    fprintf(fh, ", \"regions\": {");
    for (int r = 0; r < n_regions; r++) {
        fprintf(fh, "%s\"%s\": ", r ? ", " : "", regions[r].name);
        write_counts(fh, counts[r + 1]);
    }
    fprintf(fh, "}, \"marks\": [");
    for (int m = 0; m < n_marks; m++) {
        if (m) fputs(", ", fh);
        write_counts(fh, marks[m]);
    }
    fprintf(fh, "]}\n");
    fclose(fh);
    rename(tmp, out_path);     /* the file appears complete or not at all */
    if (disas_fh) fclose(disas_fh);
    free(tmp);
}

/* Errors go to stderr: qemu_plugin_outs writes to qemu's log, which only `-d plugin` shows. */
PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv)
{
    if (info->system_emulation) {
        fputs("insncount: for qemu-user only\n", stderr);
        return -1;
    }
    snprintf(target_name, sizeof target_name, "%s", info->target_name);
    if (strcmp(info->target_name, "aarch64") == 0) is_a64 = true;
    else if (strcmp(info->target_name, "arm") != 0) {
        fputs("insncount: decodes aarch64 and arm guests only\n", stderr);
        return -1;
    }
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) out_path = strdup(argv[i] + 4);
        else if (strncmp(argv[i], "ranges=", 7) == 0) ranges_path = strdup(argv[i] + 7);
        else if (strncmp(argv[i], "disas=", 6) == 0) {
            disas_fh = fopen(argv[i] + 6, "w");
            if (!disas_fh) {
                fputs("insncount: cannot open the disas file\n", stderr);
                return -1;
            }
        }
        else {
            fputs("insncount: unknown argument (expected out=FILE, ranges=FILE, disas=FILE)\n", stderr);
            return -1;
        }
    }
    if (!out_path) {
        fputs("insncount: missing out=FILE\n", stderr);
        return -1;
    }
    regions = calloc(MAX_REGIONS, sizeof *regions);
    counts = calloc(MAX_REGIONS + 1, sizeof *counts);
    if (!regions || !counts) return -1;
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
    qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
    qemu_plugin_register_atexit_cb(id, at_exit, NULL);
    return 0;
}
