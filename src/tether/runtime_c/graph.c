/* graph.c: the graph executor (tether_rpc/graph_executor.py, bindings/go/graph/executor.go) behind the public API.
 *
 * deploy.json (docs/graph.md) lists storages (byte sizes), entries (a typed view of a storage at a byte offset),
 * the input/output/param entries and the nodes (a packed function of the module and its argument entries, inputs
 * then output, with optional "shapes": the kernel's own view of the same bytes, and "when": the flags of a run-time
 * If branch). Storages are 64-byte aligned and zeroed, as the Python executor allocates them; at load every node is
 * bound once to DLTensors over its entries, so a run is one call per node. */
#include "rt_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define RT_ALIGN 64
#define RT_MAX_RANK 64
#define RT_MAX_GRAPH_BYTES ((size_t)1 << 30)
#define RT_DEFAULT_MAX_STORAGE ((uint64_t)4 << 30)

enum { ROLE_INPUT = 1, ROLE_OUTPUT = 2, ROLE_PARAM = 4 };

typedef struct {
  const char* name;
  int dtype;
  int32_t ndim;
  int64_t* shape;
  uint64_t numel;
  size_t nbytes;
  int32_t storage;
  size_t offset;
  uint8_t* data;   /* where the kernels see it now: its storage, or caller memory it is bound to */
  int roles;
} rt_entry;

typedef struct {
  const char* name;
  const rt_json* info;   /* the function's metadata entry (argument names and shapes for error messages) */
  TetherPackedFunc fn;
  int32_t nargs;
  int32_t* arg_entry;
  DLTensor* tensors;
  int64_t* shapes;
  TetherValue* values;
  int32_t* codes;
  int32_t nwhen;
  int32_t* when_entry;
  uint8_t* when_truth;
} rt_node;

struct tether_rt_model {
  rt_module* module;
  rt_json_doc* graph;
  int32_t nstorages;
  uint8_t** storages;
  uint64_t* storage_size;
  uint64_t total_bytes;
  int32_t nentries;
  rt_entry* entries;
  int32_t ninputs, noutputs, nparams;
  int32_t *inputs, *outputs, *params;
  int32_t nnodes;
  rt_node* nodes;
};

/* ---- reading the graph JSON --------------------------------------------------------------------------------------- */
static int get_int(const rt_json* v, int64_t lo, int64_t hi, int64_t* out) {
  if (v == NULL || v->type != RT_JNUM || !v->is_int || v->i < lo || v->i > hi) return 0;
  *out = v->i;
  return 1;
}

static const char* entry_label(const rt_json* e) {
  const rt_json* n = rt_json_get(e, "name");
  return n && n->type == RT_JSTR ? n->s : "?";
}

static int read_storages(tether_rt_model* m, const rt_json* g, uint64_t max_bytes) {
  const rt_json* st = rt_json_get(g, "storages");
  if (st == NULL || st->type != RT_JARR)
    return rt_fail(TETHER_RT_ERR_FORMAT, "malformed graph JSON: \"storages\" must be a list of byte sizes");
  m->nstorages = (int32_t)st->count;
  m->storages = (uint8_t**)calloc(st->count ? st->count : 1, sizeof(uint8_t*));
  m->storage_size = (uint64_t*)calloc(st->count ? st->count : 1, sizeof(uint64_t));
  if (m->storages == NULL || m->storage_size == NULL)
    return rt_fail(TETHER_RT_ERR_NOMEM, "out of memory for %zu storages", st->count);
  int32_t k = 0;
  uint64_t total = 0;
  for (const rt_json* s = st->child; s; s = s->next, k++) {
    int64_t n;
    if (!get_int(s, 0, INT64_MAX, &n))
      return rt_fail(TETHER_RT_ERR_FORMAT, "malformed graph JSON: storage %d must be a byte size >= 0", (int)k);
    m->storage_size[k] = (uint64_t)n;
    if ((uint64_t)n > max_bytes - total)
      return rt_fail(TETHER_RT_ERR_LIMIT, "graph storages need more than %llu bytes together (the limit; "
                     "tether_rt_options.max_storage_bytes raises it)", (unsigned long long)max_bytes);
    total += (uint64_t)n;
  }
  m->total_bytes = total;
  for (k = 0; k < m->nstorages; k++) {
    size_t n = m->storage_size[k] ? (size_t)m->storage_size[k] : 1;
    void* p = NULL;
    if (posix_memalign(&p, RT_ALIGN, n) != 0)
      return rt_fail(TETHER_RT_ERR_NOMEM, "out of memory for storage %d (%zu bytes)", (int)k, n);
    memset(p, 0, n);
    m->storages[k] = (uint8_t*)p;
  }
  return TETHER_RT_OK;
}

/* The graph JSON's list `key` and a zeroed array of `elem`-sized records, one per item (entries, nodes). */
static int alloc_list(const rt_json* g, const char* key, size_t elem, const rt_json** list, void** array) {
  *list = rt_json_get(g, key);
  if (*list == NULL || (*list)->type != RT_JARR)
    return rt_fail(TETHER_RT_ERR_FORMAT, "malformed graph JSON: \"%s\" must be a list of objects", key);
  *array = calloc((*list)->count ? (*list)->count : 1, elem);
  if (*array == NULL) return rt_fail(TETHER_RT_ERR_NOMEM, "out of memory for %zu %s", (*list)->count, key);
  return TETHER_RT_OK;
}

static int read_entries(tether_rt_model* m, const rt_json* g) {
  const rt_json* es;
  void* array;
  int status = alloc_list(g, "entries", sizeof(rt_entry), &es, &array);
  if (status != TETHER_RT_OK) return status;
  m->entries = (rt_entry*)array;
  m->nentries = (int32_t)es->count;
  int32_t k = 0;
  for (const rt_json* e = es->child; e; e = e->next, k++) {
    rt_entry* en = &m->entries[k];
    const char* label = entry_label(e);
    const rt_json* name = rt_json_get(e, "name");
    const rt_json* dtype = rt_json_get(e, "dtype");
    const rt_json* shape = rt_json_get(e, "shape");
    int64_t storage, offset = 0;
    if (e->type != RT_JOBJ || name == NULL || name->type != RT_JSTR)
      return rt_fail(TETHER_RT_ERR_FORMAT, "malformed graph JSON: entry %d needs a \"name\"", (int)k);
    en->name = name->s;
    en->dtype = dtype && dtype->type == RT_JSTR ? rt_dtype_from_name(dtype->s, dtype->len) : -1;
    if (en->dtype < 0)
      return rt_fail(TETHER_RT_ERR_FORMAT, "graph entry %d (%s) has dtype %.40s (allowed: bfloat16, bool, float16, "
                     "float32, float64, int16, int32, int64, int8, uint16, uint32, uint64, uint8)", (int)k, label,
                     dtype && dtype->type == RT_JSTR ? dtype->s : "(none)");
    if (shape == NULL || shape->type != RT_JARR || shape->count > RT_MAX_RANK)
      return rt_fail(TETHER_RT_ERR_FORMAT, "graph entry %d (%s): \"shape\" must be a list of at most %d sizes",
                     (int)k, label, RT_MAX_RANK);
    en->ndim = (int32_t)shape->count;
    en->shape = (int64_t*)calloc(shape->count ? shape->count : 1, sizeof(int64_t));
    if (en->shape == NULL) return rt_fail(TETHER_RT_ERR_NOMEM, "out of memory for entry %d", (int)k);
    uint64_t numel = 1, nbytes;
    int32_t d = 0;
    for (const rt_json* s = shape->child; s; s = s->next, d++) {
      if (!get_int(s, 0, INT64_MAX, &en->shape[d]) || !rt_mul_u64(numel, (uint64_t)en->shape[d], &numel))
        return rt_fail(TETHER_RT_ERR_FORMAT, "graph entry %d (%s): shape sizes must be >= 0 and their product "
                       "must fit 64 bits", (int)k, label);
    }
    size_t item = rt_dtypes[en->dtype].bits / 8u;
    if (!rt_mul_u64(numel, item, &nbytes))
      return rt_fail(TETHER_RT_ERR_FORMAT, "graph entry %d (%s) is larger than 2^64 bytes", (int)k, label);
    if (!get_int(rt_json_get(e, "storage"), 0, m->nstorages - 1, &storage))
      return rt_fail(TETHER_RT_ERR_FORMAT, "graph entry %d (%s) names no storage of the %d", (int)k, label,
                     (int)m->nstorages);
    if (rt_json_get(e, "offset") && !get_int(rt_json_get(e, "offset"), 0, INT64_MAX, &offset))
      return rt_fail(TETHER_RT_ERR_FORMAT, "graph entry %d (%s): offset must be an integer >= 0", (int)k, label);
    /* kernels assume element alignment only (docs/abi.md), so an offset must be a whole element */
    if (offset % (int64_t)item)
      return rt_fail(TETHER_RT_ERR_FORMAT, "graph entry %d (%s): offset %lld is not a multiple of its element "
                     "size %zu", (int)k, label, (long long)offset, item);
    uint64_t have = m->storage_size[storage];
    if ((uint64_t)offset > have || nbytes > have - (uint64_t)offset)
      return rt_fail(TETHER_RT_ERR_FORMAT, "graph entry %d (%s) needs bytes %lld..%llu, its storage has %llu",
                     (int)k, label, (long long)offset, (unsigned long long)offset + nbytes,
                     (unsigned long long)have);
    en->numel = numel;
    en->nbytes = (size_t)nbytes;
    en->storage = (int32_t)storage;
    en->offset = (size_t)offset;
    en->data = m->storages[storage] + offset;
  }
  return TETHER_RT_OK;
}

static int read_ids(tether_rt_model* m, const rt_json* g, const char* key, int role, int32_t* n, int32_t** ids) {
  const rt_json* arr = rt_json_get(g, key);
  if (arr == NULL || arr->type != RT_JARR)
    return rt_fail(TETHER_RT_ERR_FORMAT, "malformed graph JSON: \"%s\" must be a list of entry ids", key);
  *n = (int32_t)arr->count;
  *ids = (int32_t*)calloc(arr->count ? arr->count : 1, sizeof(int32_t));
  if (*ids == NULL) return rt_fail(TETHER_RT_ERR_NOMEM, "out of memory for %s", key);
  int32_t k = 0;
  for (const rt_json* v = arr->child; v; v = v->next, k++) {
    int64_t id;
    if (!get_int(v, 0, m->nentries - 1, &id))
      return rt_fail(TETHER_RT_ERR_FORMAT, "malformed graph JSON: %s id %d is not an entry of the %d", key, (int)k,
                     (int)m->nentries);
    (*ids)[k] = (int32_t)id;
    m->entries[id].roles |= role;
  }
  return TETHER_RT_OK;
}

static int read_node(tether_rt_model* m, const rt_json* nj, int32_t k) {
  rt_node* nd = &m->nodes[k];
  const rt_json* name = rt_json_get(nj, "name");
  nd->name = name && name->type == RT_JSTR ? name->s : "?";
  const rt_json* func = rt_json_get(nj, "func");
  const rt_json* args = rt_json_get(nj, "args");
  const rt_json* shapes = rt_json_get(nj, "shapes");
  if (func == NULL || func->type != RT_JSTR || args == NULL || args->type != RT_JARR)
    return rt_fail(TETHER_RT_ERR_FORMAT, "malformed graph JSON: node %d (%s) needs \"func\" and \"args\"", (int)k,
                   nd->name);
  int status = rt_module_function(m->module, func->s, &nd->fn, &nd->info);
  if (status != TETHER_RT_OK) return rt_context(status, "node %d (%s)", (int)k, nd->name);
  if (shapes && (shapes->type != RT_JARR || shapes->count != args->count))
    return rt_fail(TETHER_RT_ERR_FORMAT, "node %d (%s) has %zu shapes for %zu args", (int)k, nd->name,
                   shapes->type == RT_JARR ? shapes->count : 0, args->count);
  size_t n = args->count ? args->count : 1;
  nd->nargs = (int32_t)args->count;
  nd->arg_entry = (int32_t*)calloc(n, sizeof(int32_t));
  nd->tensors = (DLTensor*)calloc(n, sizeof(DLTensor));
  nd->shapes = (int64_t*)calloc(n * RT_MAX_RANK, sizeof(int64_t));
  nd->values = (TetherValue*)calloc(n, sizeof(TetherValue));
  nd->codes = (int32_t*)calloc(n, sizeof(int32_t));
  if (!nd->arg_entry || !nd->tensors || !nd->shapes || !nd->values || !nd->codes)
    return rt_fail(TETHER_RT_ERR_NOMEM, "out of memory for node %d", (int)k);
  int32_t j = 0;
  const rt_json* shp = shapes ? shapes->child : NULL;
  for (const rt_json* a = args->child; a; a = a->next, j++, shp = shp ? shp->next : NULL) {
    int64_t id;
    if (!get_int(a, 0, m->nentries - 1, &id))
      return rt_fail(TETHER_RT_ERR_FORMAT, "malformed graph JSON: node %d (%s) argument %d is not an entry of the %d",
                     (int)k, nd->name, (int)j, (int)m->nentries);
    const rt_entry* en = &m->entries[id];
    int64_t* sh = nd->shapes + (size_t)j * RT_MAX_RANK;
    int32_t ndim;
    if (shp) {   /* same bytes, the kernel's view (e.g. an NCHW conv input as a matrix) */
      uint64_t numel = 1;
      int32_t d = 0;
      if (shp->type != RT_JARR || shp->count > RT_MAX_RANK)
        return rt_fail(TETHER_RT_ERR_FORMAT, "node %d (%s) argument %d: \"shapes\" item must be a list of sizes",
                       (int)k, nd->name, (int)j);
      for (const rt_json* s = shp->child; s; s = s->next, d++)
        if (!get_int(s, 0, INT64_MAX, &sh[d]) || !rt_mul_u64(numel, (uint64_t)sh[d], &numel))
          return rt_fail(TETHER_RT_ERR_FORMAT, "node %d (%s) argument %d: bad size in \"shapes\"", (int)k, nd->name,
                         (int)j);
      if (numel != en->numel)
        return rt_fail(TETHER_RT_ERR_FORMAT, "node %d (%s) argument %d: shape of %llu elements does not cover entry "
                       "%s of %llu", (int)k, nd->name, (int)j, (unsigned long long)numel, en->name,
                       (unsigned long long)en->numel);
      ndim = d;
    } else if (en->ndim == 0) {   /* kernels never take rank-0 tensors: a scalar travels as shape (1,) */
      sh[0] = 1;
      ndim = 1;
    } else {
      memcpy(sh, en->shape, (size_t)en->ndim * sizeof(int64_t));
      ndim = en->ndim;
    }
    nd->arg_entry[j] = (int32_t)id;
    DLTensor* t = &nd->tensors[j];
    t->data = en->data;
    t->device.device_type = kDLCPU;
    t->device.device_id = 0;
    t->ndim = ndim;
    t->dtype.code = rt_dtypes[en->dtype].dl_code;
    t->dtype.bits = rt_dtypes[en->dtype].bits;
    t->dtype.lanes = 1;
    t->shape = sh;
    t->strides = NULL;
    t->byte_offset = 0;
    nd->values[j].v_handle = t;
    nd->codes[j] = TETHER_DLTENSOR;
  }
  /* run-time If branches: [[flag entry, true|false], ...], each flag one element */
  const rt_json* when = rt_json_get(nj, "when");
  if (when && when->type == RT_JARR && when->count > 0) {
    nd->when_entry = (int32_t*)calloc(when->count, sizeof(int32_t));
    nd->when_truth = (uint8_t*)calloc(when->count, 1);
    if (!nd->when_entry || !nd->when_truth) return rt_fail(TETHER_RT_ERR_NOMEM, "out of memory for node %d", (int)k);
    for (const rt_json* w = when->child; w; w = w->next) {
      const rt_json* flag = rt_json_at(w, 0);
      const rt_json* truth = rt_json_at(w, 1);
      int64_t id;
      if (w->type != RT_JARR || w->count != 2 || !get_int(flag, 0, m->nentries - 1, &id) ||
          (truth->type != RT_JTRUE && truth->type != RT_JFALSE))
        return rt_fail(TETHER_RT_ERR_FORMAT, "node %s: malformed \"when\" item (expected [entry id, true|false])",
                       nd->name);
      if (m->entries[id].numel != 1)
        return rt_fail(TETHER_RT_ERR_FORMAT, "node %s: \"when\" flag entry %d has %llu elements (one expected)",
                       nd->name, (int)id, (unsigned long long)m->entries[id].numel);
      nd->when_entry[nd->nwhen] = (int32_t)id;
      nd->when_truth[nd->nwhen] = truth->type == RT_JTRUE;
      nd->nwhen++;
    }
  } else if (when && when->type != RT_JARR && when->type != RT_JNULL) {
    return rt_fail(TETHER_RT_ERR_FORMAT, "node %s: \"when\" must be a list", nd->name);
  }
  return TETHER_RT_OK;
}

static int read_graph(tether_rt_model* m, const rt_json* g) {
  int status;
  if ((status = read_entries(m, g)) != TETHER_RT_OK) return status;
  if ((status = read_ids(m, g, "inputs", ROLE_INPUT, &m->ninputs, &m->inputs)) != TETHER_RT_OK) return status;
  if ((status = read_ids(m, g, "outputs", ROLE_OUTPUT, &m->noutputs, &m->outputs)) != TETHER_RT_OK) return status;
  if ((status = read_ids(m, g, "params", ROLE_PARAM, &m->nparams, &m->params)) != TETHER_RT_OK) return status;
  const rt_json* nodes;
  void* array;
  if ((status = alloc_list(g, "nodes", sizeof(rt_node), &nodes, &array)) != TETHER_RT_OK) return status;
  m->nodes = (rt_node*)array;
  m->nnodes = (int32_t)nodes->count;
  int32_t k = 0;
  for (const rt_json* nj = nodes->child; nj; nj = nj->next, k++) {
    if (nj->type != RT_JOBJ)
      return rt_fail(TETHER_RT_ERR_FORMAT, "malformed graph JSON: node %d is not an object", (int)k);
    if ((status = read_node(m, nj, k)) != TETHER_RT_OK) return status;
  }
  return TETHER_RT_OK;
}

/* Refuse what only the Python runtime runs, before anything is loaded. */
static int check_graph_kind(const rt_json* g, const char* path) {
  const rt_json* format = rt_json_get(g, "format");
  if (g->type != RT_JOBJ || format == NULL || format->type != RT_JSTR || strcmp(format->s, "tether-graph") != 0)
    return rt_fail(TETHER_RT_ERR_FORMAT, "%s is not a tether graph JSON (format \"tether-graph\" expected)", path);
  int64_t version;
  if (!get_int(rt_json_get(g, "version"), 1, 3, &version))
    return rt_fail(TETHER_RT_ERR_FORMAT, "%s: graph JSON version is not one this runtime reads (1, 2, 3): update "
                   "the runtime", path);
  const rt_json* nodes = rt_json_get(g, "nodes");
  if (nodes && nodes->type == RT_JARR)
    for (const rt_json* n = nodes->child; n; n = n->next) {
      const rt_json* op = rt_json_get(n, "numpy");
      if (op) {
        const rt_json* name = rt_json_get(n, "name");
        return rt_fail(TETHER_RT_ERR_UNSUPPORTED, "node '%s' runs numpy op '%s' (graph JSON version %lld), which only "
                       "the Python device runtime (tether_rpc) implements; the C runtime runs compiled kernels only",
                       name && name->type == RT_JSTR ? name->s : "?", op->type == RT_JSTR ? op->s : "?",
                       (long long)version);
      }
    }
  return TETHER_RT_OK;
}

/* ---- params --------------------------------------------------------------------------------------------------------- */
typedef struct {
  tether_rt_model* m;
  uint8_t* seen;
} rt_param_load;

static int param_sink(void* user, const rt_param_record* rec, void** dst) {
  rt_param_load* pl = (rt_param_load*)user;
  tether_rt_model* m = pl->m;
  for (int32_t k = 0; k < m->nparams; k++) {
    rt_entry* en = &m->entries[m->params[k]];
    if (strcmp(en->name, rec->name) != 0) continue;
    int same = rec->dtype == en->dtype && rec->ndim == en->ndim;
    for (int32_t d = 0; same && d < en->ndim; d++) same = rec->shape[d] == en->shape[d];
    if (!same) {
      char got[256], want[256];
      size_t a = (size_t)snprintf(got, sizeof got, "%s (", rt_dtypes[rec->dtype].name);
      for (int32_t d = 0; d < rec->ndim && a < sizeof got; d++)
        a += (size_t)snprintf(got + a, sizeof got - a, "%s%lld", d ? ", " : "", (long long)rec->shape[d]);
      if (a < sizeof got) snprintf(got + a, sizeof got - a, ")");
      a = (size_t)snprintf(want, sizeof want, "%s (", rt_dtypes[en->dtype].name);
      for (int32_t d = 0; d < en->ndim && a < sizeof want; d++)
        a += (size_t)snprintf(want + a, sizeof want - a, "%s%lld", d ? ", " : "", (long long)en->shape[d]);
      if (a < sizeof want) snprintf(want + a, sizeof want - a, ")");
      return rt_fail(TETHER_RT_ERR_FORMAT, "param '%s' is %s, the graph expects %s", rec->name, got, want);
    }
    pl->seen[k] = 1;
    *dst = m->storages[en->storage] + en->offset;   /* params own their storage: never bound */
    return TETHER_RT_OK;
  }
  return TETHER_RT_OK;
}

int tether_rt_load_params(tether_rt_model* m, const char* path) {
  if (m == NULL || path == NULL) return rt_fail(TETHER_RT_ERR_ARGUMENT, "tether_rt_load_params: NULL argument");
  rt_param_load pl = {m, (uint8_t*)calloc(m->nparams ? (size_t)m->nparams : 1, 1)};
  if (pl.seen == NULL) return rt_fail(TETHER_RT_ERR_NOMEM, "out of memory loading params");
  int status = rt_params_read(path, param_sink, &pl);
  if (status == TETHER_RT_OK) {
    int32_t missing = 0;
    char names[512] = "";
    for (int32_t k = 0; k < m->nparams; k++)
      if (!pl.seen[k]) {
        if (missing++ < 10) {
          size_t used = strlen(names);
          snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", m->entries[m->params[k]].name);
        }
      }
    if (missing)
      status = rt_fail(TETHER_RT_ERR_FORMAT, "params file %s lacks %d tensor(s) the graph needs: %s", path,
                       (int)missing, names);
  }
  free(pl.seen);
  return status;
}

/* ---- loading ----------------------------------------------------------------------------------------------------- */
void tether_rt_free(tether_rt_model* m) {
  if (m == NULL) return;
  for (int32_t k = 0; m->nodes && k < m->nnodes; k++) {
    rt_node* nd = &m->nodes[k];
    free(nd->arg_entry);
    free(nd->tensors);
    free(nd->shapes);
    free(nd->values);
    free(nd->codes);
    free(nd->when_entry);
    free(nd->when_truth);
  }
  free(m->nodes);
  for (int32_t k = 0; m->entries && k < m->nentries; k++) free(m->entries[k].shape);
  free(m->entries);
  for (int32_t k = 0; m->storages && k < m->nstorages; k++) free(m->storages[k]);
  free(m->storages);
  free(m->storage_size);
  free(m->inputs);
  free(m->outputs);
  free(m->params);
  rt_module_free(m->module);
  rt_json_free(m->graph);
  free(m);
}

int tether_rt_load_files(const char* graph_path, const char* lib_path, const char* params_path,
                         const tether_rt_options* options, tether_rt_model** out) {
  if (out) *out = NULL;
  if (graph_path == NULL || lib_path == NULL || out == NULL)
    return rt_fail(TETHER_RT_ERR_ARGUMENT, "tether_rt_load_files needs a graph path, a library path and an output");
  uint64_t max_bytes = options && options->max_storage_bytes ? options->max_storage_bytes : RT_DEFAULT_MAX_STORAGE;
  if (max_bytes > (uint64_t)SIZE_MAX / 2) max_bytes = (uint64_t)SIZE_MAX / 2;   /* what a 32-bit process addresses */
  tether_rt_model* m = (tether_rt_model*)calloc(1, sizeof *m);
  if (m == NULL) return rt_fail(TETHER_RT_ERR_NOMEM, "out of memory loading %s", graph_path);
  char* text = NULL;
  size_t len = 0;
  int status = rt_read_file(graph_path, RT_MAX_GRAPH_BYTES, "graph JSON", &text, &len);
  if (status == TETHER_RT_OK) {
    m->graph = rt_json_parse(text, len, graph_path);
    free(text);
    if (m->graph == NULL) status = TETHER_RT_ERR_FORMAT;
  }
  const rt_json* g = m->graph ? rt_json_root(m->graph) : NULL;
  if (status == TETHER_RT_OK) status = check_graph_kind(g, graph_path);
  if (status == TETHER_RT_OK) status = rt_module_load(lib_path, &m->module);
  if (status == TETHER_RT_OK) status = read_storages(m, g, max_bytes);
  if (status == TETHER_RT_OK) status = read_graph(m, g);
  if (status == TETHER_RT_OK && params_path && !(options && options->skip_params)) {
    struct stat st;
    if (stat(params_path, &st) == 0) status = tether_rt_load_params(m, params_path);
    else if (m->nparams > 0)
      status = rt_fail(TETHER_RT_ERR_IO, "the graph needs %d param tensor(s) but %s is missing", (int)m->nparams,
                       params_path);
  }
  if (status != TETHER_RT_OK) {
    tether_rt_free(m);
    return status;
  }
  *out = m;
  return TETHER_RT_OK;
}

int tether_rt_load(const char* folder, const tether_rt_options* options, tether_rt_model** out) {
  if (out) *out = NULL;
  if (folder == NULL || out == NULL) return rt_fail(TETHER_RT_ERR_ARGUMENT, "tether_rt_load needs a folder and an output");
  size_t n = strlen(folder);
  char* graph = (char*)malloc(n + 16), *params = (char*)malloc(n + 16), *lib = NULL;
  if (graph == NULL || params == NULL) {
    free(graph);
    free(params);
    return rt_fail(TETHER_RT_ERR_NOMEM, "out of memory");
  }
  snprintf(graph, n + 16, "%s/deploy.json", folder);
  snprintf(params, n + 16, "%s/deploy.params", folder);
  struct stat st;
  int status = TETHER_RT_OK;
  if (stat(folder, &st) != 0 || !S_ISDIR(st.st_mode)) {
    status = rt_fail(TETHER_RT_ERR_IO, "%s is not a folder: pass the folder tether.build_graph(...).export wrote",
                     folder);
  } else if (stat(graph, &st) != 0) {
    status = rt_fail(TETHER_RT_ERR_IO, "%s has no deploy.json: export a model there with "
                     "tether.build_graph(...).export()", folder);
  }
  /* the library deploy.json names ("lib"), inside the folder */
  char* text = NULL;
  size_t len = 0;
  if (status == TETHER_RT_OK) status = rt_read_file(graph, RT_MAX_GRAPH_BYTES, "graph JSON", &text, &len);
  if (status == TETHER_RT_OK) {
    rt_json_doc* doc = rt_json_parse(text, len, graph);
    free(text);
    if (doc == NULL) {
      status = TETHER_RT_ERR_FORMAT;
    } else {
      const rt_json* name = rt_json_get(rt_json_root(doc), "lib");
      const char* libname = name && name->type == RT_JSTR ? name->s : "deploy.so";
      if (libname[0] == '\0' || strchr(libname, '/') || strcmp(libname, ".") == 0 || strcmp(libname, "..") == 0 ||
          strlen(libname) != (name && name->type == RT_JSTR ? name->len : strlen(libname))) {
        status = rt_fail(TETHER_RT_ERR_FORMAT, "%s names library '%s' outside its folder", graph, libname);
      } else if ((lib = (char*)malloc(n + strlen(libname) + 2)) == NULL) {
        status = rt_fail(TETHER_RT_ERR_NOMEM, "out of memory");
      } else {
        snprintf(lib, n + strlen(libname) + 2, "%s/%s", folder, libname);
      }
      rt_json_free(doc);
    }
  }
  if (status == TETHER_RT_OK) status = tether_rt_load_files(graph, lib, params, options, out);
  free(graph);
  free(params);
  free(lib);
  return status;
}

/* ---- describing ---------------------------------------------------------------------------------------------------- */
int32_t tether_rt_num_inputs(const tether_rt_model* m) { return m ? m->ninputs : 0; }
int32_t tether_rt_num_outputs(const tether_rt_model* m) { return m ? m->noutputs : 0; }
int32_t tether_rt_num_nodes(const tether_rt_model* m) { return m ? m->nnodes : 0; }
uint64_t tether_rt_storage_bytes(const tether_rt_model* m) { return m ? m->total_bytes : 0; }

static int32_t find(const tether_rt_model* m, const int32_t* ids, int32_t n, const char* name, const char* what) {
  if (m == NULL || name == NULL) {
    rt_fail(TETHER_RT_ERR_ARGUMENT, "tether_rt_%s_index: NULL argument", what);
    return -1;
  }
  for (int32_t k = 0; k < n; k++)
    if (strcmp(m->entries[ids[k]].name, name) == 0) return k;
  char names[512] = "";
  for (int32_t k = 0; k < n; k++) {
    size_t used = strlen(names);
    snprintf(names + used, sizeof names - used, "%s%s", k ? ", " : "", m->entries[ids[k]].name);
  }
  rt_fail(TETHER_RT_ERR_ARGUMENT, "the model has no %s '%s' (%ss: %s)", what, name, what, names);
  return -1;
}

int32_t tether_rt_input_index(const tether_rt_model* m, const char* name) {
  return find(m, m ? m->inputs : NULL, m ? m->ninputs : 0, name, "input");
}

int32_t tether_rt_output_index(const tether_rt_model* m, const char* name) {
  return find(m, m ? m->outputs : NULL, m ? m->noutputs : 0, name, "output");
}

static void describe(const rt_entry* en, tether_rt_tensor* out) {
  out->name = en->name;
  out->dtype = (tether_rt_dtype)en->dtype;
  out->dtype_name = rt_dtypes[en->dtype].name;
  out->ndim = en->ndim;
  out->shape = en->shape;
  out->size = (size_t)en->numel;
  out->nbytes = en->nbytes;
  out->data = en->data;
}

static int check_index(const tether_rt_model* m, int32_t index, int32_t n, const char* what, const void* out) {
  if (m == NULL || out == NULL) return rt_fail(TETHER_RT_ERR_ARGUMENT, "%s: NULL argument", what);
  if (index < 0 || index >= n)
    return rt_fail(TETHER_RT_ERR_ARGUMENT, "%s index %d out of range: the model has %d", what, (int)index, (int)n);
  return TETHER_RT_OK;
}

int tether_rt_input(const tether_rt_model* m, int32_t index, tether_rt_tensor* out) {
  int status = check_index(m, index, m ? m->ninputs : 0, "input", out);
  if (status == TETHER_RT_OK) describe(&m->entries[m->inputs[index]], out);
  return status;
}

int tether_rt_output(const tether_rt_model* m, int32_t index, tether_rt_tensor* out) {
  int status = check_index(m, index, m ? m->noutputs : 0, "output", out);
  if (status == TETHER_RT_OK) describe(&m->entries[m->outputs[index]], out);
  return status;
}

/* ---- inputs ----------------------------------------------------------------------------------------------------- */
static int copy_in(rt_entry* en, const void* data, size_t nbytes) {
  if (data == NULL && nbytes) return rt_fail(TETHER_RT_ERR_ARGUMENT, "input '%s': NULL data", en->name);
  if (nbytes != en->nbytes)
    return rt_fail(TETHER_RT_ERR_ARGUMENT, "input '%s': got %zu bytes, the model expects %zu (%s, %llu elements)",
                   en->name, nbytes, en->nbytes, rt_dtypes[en->dtype].name, (unsigned long long)en->numel);
  if (nbytes) memcpy(en->data, data, nbytes);
  return TETHER_RT_OK;
}

int tether_rt_set_input(tether_rt_model* m, int32_t index, const void* data, size_t nbytes) {
  int status = check_index(m, index, m ? m->ninputs : 0, "input", m);
  return status == TETHER_RT_OK ? copy_in(&m->entries[m->inputs[index]], data, nbytes) : status;
}

int tether_rt_set_input_by_name(tether_rt_model* m, const char* name, const void* data, size_t nbytes) {
  if (m == NULL || name == NULL) return rt_fail(TETHER_RT_ERR_ARGUMENT, "tether_rt_set_input_by_name: NULL argument");
  for (int32_t k = 0; k < m->ninputs; k++)
    if (strcmp(m->entries[m->inputs[k]].name, name) == 0) return copy_in(&m->entries[m->inputs[k]], data, nbytes);
  for (int32_t k = 0; k < m->nparams; k++)
    if (strcmp(m->entries[m->params[k]].name, name) == 0) return copy_in(&m->entries[m->params[k]], data, nbytes);
  return find(m, m->inputs, m->ninputs, name, "input") < 0 ? TETHER_RT_ERR_ARGUMENT : TETHER_RT_OK;
}

static int shape_matches(const rt_entry* en, int32_t ndim, const int64_t* shape) {
  /* equal, or equal once the dimensions of 1 are dropped (the Python executor's rule) */
  int32_t a = 0, b = 0;
  for (;;) {
    while (a < ndim && shape[a] == 1) a++;
    while (b < en->ndim && en->shape[b] == 1) b++;
    if (a == ndim || b == en->ndim) return a == ndim && b == en->ndim;
    if (shape[a++] != en->shape[b++]) return 0;
  }
}

int tether_rt_set_input_tensor(tether_rt_model* m, int32_t index, tether_rt_dtype dtype, int32_t ndim,
                               const int64_t* shape, const void* data) {
  int status = check_index(m, index, m ? m->ninputs : 0, "input", m);
  if (status != TETHER_RT_OK) return status;
  rt_entry* en = &m->entries[m->inputs[index]];
  if ((int)dtype < 0 || (int)dtype >= rt_num_dtypes || (int)dtype != en->dtype)
    return rt_fail(TETHER_RT_ERR_ARGUMENT, "input '%s': got dtype %s, the model expects %s", en->name,
                   tether_rt_dtype_name(dtype) ? tether_rt_dtype_name(dtype) : "(unknown)",
                   rt_dtypes[en->dtype].name);
  if (ndim < 0 || ndim > RT_MAX_RANK || (ndim > 0 && shape == NULL))
    return rt_fail(TETHER_RT_ERR_ARGUMENT, "input '%s': ndim %d without a shape, or above %d", en->name, (int)ndim,
                   RT_MAX_RANK);
  uint64_t numel = 1;
  int ok = 1;
  for (int32_t d = 0; d < ndim; d++) ok = ok && shape[d] >= 0 && rt_mul_u64(numel, (uint64_t)shape[d], &numel);
  if (!ok || numel != en->numel || !shape_matches(en, ndim, shape)) {
    char got[256], want[256];
    size_t a = (size_t)snprintf(got, sizeof got, "(");
    for (int32_t d = 0; d < ndim && a < sizeof got; d++)
      a += (size_t)snprintf(got + a, sizeof got - a, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (a < sizeof got) snprintf(got + a, sizeof got - a, ")");
    a = (size_t)snprintf(want, sizeof want, "(");
    for (int32_t d = 0; d < en->ndim && a < sizeof want; d++)
      a += (size_t)snprintf(want + a, sizeof want - a, "%s%lld", d ? ", " : "", (long long)en->shape[d]);
    if (a < sizeof want) snprintf(want + a, sizeof want - a, ")");
    return rt_fail(TETHER_RT_ERR_ARGUMENT, "input '%s': got shape %s, the model expects %s %s", en->name, got,
                   rt_dtypes[en->dtype].name, want);
  }
  return copy_in(en, data, en->nbytes);
}

/* Point entry `id` (and every entry in its storage: its reshape views) at `data`, or back at the storage. Only an
 * entry whose storage holds nothing else of the model (no param, no other input or output, nothing outside its
 * bytes) can be bound: the memory planner gives inputs and outputs storages of their own. */
static int bind(tether_rt_model* m, int32_t id, const void* data, size_t nbytes, const char* what) {
  rt_entry* en = &m->entries[id];
  size_t item = rt_dtypes[en->dtype].bits / 8u;
  if (data != NULL && (nbytes != en->nbytes || ((uintptr_t)data % item) != 0))
    return rt_fail(TETHER_RT_ERR_ARGUMENT, "%s '%s': binding needs exactly %zu bytes aligned to %zu, got %zu at %p",
                   what, en->name, en->nbytes, item, nbytes, data);
  for (int32_t k = 0; k < m->nentries; k++) {
    const rt_entry* o = &m->entries[k];
    if (k == id || o->storage != en->storage) continue;
    int inside = o->offset >= en->offset && o->offset - en->offset <= en->nbytes &&
                 o->nbytes <= en->nbytes - (o->offset - en->offset);
    if (!inside || o->roles != 0)   /* a value with a role of its own (each value has one entry) */
      return rt_fail(TETHER_RT_ERR_UNSUPPORTED, "%s '%s' shares its buffer with entry '%s': copy it instead of "
                     "binding", what, en->name, o->name);
  }
  uint8_t* base = data ? (uint8_t*)(uintptr_t)data : m->storages[en->storage] + en->offset;
  for (int32_t k = 0; k < m->nentries; k++) {
    rt_entry* o = &m->entries[k];
    if (o->storage == en->storage) o->data = base + (o->offset - en->offset);
  }
  for (int32_t k = 0; k < m->nnodes; k++)
    for (int32_t j = 0; j < m->nodes[k].nargs; j++)
      m->nodes[k].tensors[j].data = m->entries[m->nodes[k].arg_entry[j]].data;
  return TETHER_RT_OK;
}

int tether_rt_bind_input(tether_rt_model* m, int32_t index, const void* data, size_t nbytes) {
  int status = check_index(m, index, m ? m->ninputs : 0, "input", m);
  return status == TETHER_RT_OK ? bind(m, m->inputs[index], data, nbytes, "input") : status;
}

int tether_rt_bind_output(tether_rt_model* m, int32_t index, void* data, size_t nbytes) {
  int status = check_index(m, index, m ? m->noutputs : 0, "output", m);
  return status == TETHER_RT_OK ? bind(m, m->outputs[index], data, nbytes, "output") : status;
}

/* ---- running ---------------------------------------------------------------------------------------------------------- */
/* Python's bool() of a one-element entry: nonzero; for a float the sign bit alone (-0.0) is zero, a NaN is true.
 * bfloat16 entries are uint16 bit patterns there, so every bit counts. */
static int is_true(const rt_entry* en) {
  size_t n = en->nbytes;
  int fl = en->dtype == TETHER_RT_FLOAT16 || en->dtype == TETHER_RT_FLOAT32 || en->dtype == TETHER_RT_FLOAT64;
  for (size_t k = 0; k < n; k++) {
    uint8_t v = en->data[k];
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    if (fl && k == 0) v &= 0x7f;
#else
    if (fl && k == n - 1) v &= 0x7f;
#endif
    if (v) return 1;
  }
  return 0;
}

int tether_rt_run(tether_rt_model* m) {
  if (m == NULL) return rt_fail(TETHER_RT_ERR_ARGUMENT, "tether_rt_run: NULL model");
  for (int32_t k = 0; k < m->nnodes; k++) {
    rt_node* nd = &m->nodes[k];
    int run = 1;
    for (int32_t w = 0; w < nd->nwhen && run; w++) run = is_true(&m->entries[nd->when_entry[w]]) == nd->when_truth[w];
    if (!run) continue;
    int32_t rc = nd->fn(nd->values, nd->codes, nd->nargs);
    if (rc != 0) {
      char msg[512];
      rt_module_describe_rc(m->module, nd->info, rc, msg, sizeof msg);
      return rt_fail(TETHER_RT_ERR_KERNEL, "node %d (%s): %s", (int)k, nd->name, msg);
    }
  }
  return TETHER_RT_OK;
}

int tether_rt_get_output(const tether_rt_model* m, int32_t index, void* dst, size_t nbytes) {
  int status = check_index(m, index, m ? m->noutputs : 0, "output", dst);
  if (status != TETHER_RT_OK) return status;
  const rt_entry* en = &m->entries[m->outputs[index]];
  if (nbytes < en->nbytes)
    return rt_fail(TETHER_RT_ERR_ARGUMENT, "output '%s': a buffer of %zu bytes is too small for its %zu", en->name,
                   nbytes, en->nbytes);
  if (en->nbytes) memcpy(dst, en->data, en->nbytes);
  return TETHER_RT_OK;
}
