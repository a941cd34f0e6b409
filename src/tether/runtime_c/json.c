/* json.c: a strict JSON (RFC 8259) parser into a DOM held by one arena: deploy.json and module metadata.
 *
 * The text is untrusted: nesting is bounded (no stack overflow on "[[[[..."), every string escape and UTF-8
 * surrogate pair is checked, and the DOM never takes more than a small multiple of the text's size. Numbers keep
 * their exact int64 value when written as integers (all the sizes, shapes and ids tether writes). */
#include "rt_internal.h"

#include <stdlib.h>
#include <string.h>


#define RT_JSON_MAX_DEPTH 128
#define RT_ARENA_CHUNK (64u * 1024u)

typedef struct rt_chunk {
  struct rt_chunk* next;
  size_t used, cap;
  /* data follows, aligned for any node */
} rt_chunk;

struct rt_json_doc {
  rt_chunk* chunks;
  rt_json* root;
};

typedef struct {
  const char* p;
  const char* start;
  const char* end;
  const char* what;
  rt_json_doc* doc;
  int failed;
} rt_parser;

static void* arena_alloc(rt_json_doc* doc, size_t n) {
  n = (n + 15u) & ~(size_t)15u;
  rt_chunk* c = doc->chunks;
  if (c == NULL || c->cap - c->used < n) {
    size_t cap = n > RT_ARENA_CHUNK ? n : RT_ARENA_CHUNK;
    c = (rt_chunk*)malloc(sizeof(rt_chunk) + 16 + cap);
    if (c == NULL) return NULL;
    c->next = doc->chunks;
    c->used = 0;
    c->cap = cap;
    doc->chunks = c;
  }
  char* base = (char*)(c + 1);
  base += (16 - ((uintptr_t)base & 15u)) & 15u;
  void* out = base + c->used;
  c->used += n;
  return out;
}

static rt_json* fail_at(rt_parser* ps, const char* why) {
  if (!ps->failed)
    rt_fail(TETHER_RT_ERR_FORMAT, "%s is not valid JSON: %s at byte %ld", ps->what, why, (long)(ps->p - ps->start));
  ps->failed = 1;
  return NULL;
}

static rt_json* new_node(rt_parser* ps, rt_jtype type) {
  rt_json* n = (rt_json*)arena_alloc(ps->doc, sizeof(rt_json));
  if (n == NULL) {
    ps->failed = 1;
    rt_fail(TETHER_RT_ERR_NOMEM, "out of memory parsing %s", ps->what);
    return NULL;
  }
  memset(n, 0, sizeof *n);
  n->type = type;
  return n;
}

static void skip_ws(rt_parser* ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int hex4(const char* p, unsigned* out) {
  unsigned v = 0;
  for (int k = 0; k < 4; k++) {
    char c = p[k];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return 0;
  }
  *out = v;
  return 1;
}

static char* put_utf8(char* o, unsigned cp) {
  if (cp < 0x80) {
    *o++ = (char)cp;
  } else if (cp < 0x800) {
    *o++ = (char)(0xC0 | (cp >> 6));
    *o++ = (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *o++ = (char)(0xE0 | (cp >> 12));
    *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
    *o++ = (char)(0x80 | (cp & 0x3F));
  } else {
    *o++ = (char)(0xF0 | (cp >> 18));
    *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
    *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
    *o++ = (char)(0x80 | (cp & 0x3F));
  }
  return o;
}

/* ps->p at the opening quote; the decoded string goes to the arena */
static const char* parse_string(rt_parser* ps, size_t* len_out) {
  const char* q = ++ps->p;
  size_t raw = 0;
  while (q < ps->end && *q != '"') {
    if (*q == '\\') q++;
    q++;
  }
  if (q >= ps->end) {
    fail_at(ps, "unterminated string");
    return NULL;
  }
  raw = (size_t)(q - ps->p);
  char* out = (char*)arena_alloc(ps->doc, raw + 1);
  if (out == NULL) {
    ps->failed = 1;
    rt_fail(TETHER_RT_ERR_NOMEM, "out of memory parsing %s", ps->what);
    return NULL;
  }
  char* o = out;
  while (ps->p < q) {
    unsigned char c = (unsigned char)*ps->p;
    if (c < 0x20) {
      fail_at(ps, "control character in a string");
      return NULL;
    }
    if (c != '\\') {
      *o++ = (char)c;
      ps->p++;
      continue;
    }
    ps->p++;
    char e = *ps->p++;
    switch (e) {
      case '"': *o++ = '"'; break;
      case '\\': *o++ = '\\'; break;
      case '/': *o++ = '/'; break;
      case 'b': *o++ = '\b'; break;
      case 'f': *o++ = '\f'; break;
      case 'n': *o++ = '\n'; break;
      case 'r': *o++ = '\r'; break;
      case 't': *o++ = '\t'; break;
      case 'u': {
        unsigned cp, lo;
        if (q - ps->p < 4 || !hex4(ps->p, &cp)) {
          fail_at(ps, "bad \\u escape");
          return NULL;
        }
        ps->p += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (q - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u' || !hex4(ps->p + 2, &lo) || lo < 0xDC00 ||
              lo > 0xDFFF) {
            fail_at(ps, "unpaired UTF-16 surrogate");
            return NULL;
          }
          ps->p += 6;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          fail_at(ps, "unpaired UTF-16 surrogate");
          return NULL;
        }
        o = put_utf8(o, cp);   /* never longer than the 6 or 12 escape characters it replaces */
        break;
      }
      default:
        fail_at(ps, "bad escape in a string");
        return NULL;
    }
  }
  ps->p = q + 1;
  *o = '\0';
  *len_out = (size_t)(o - out);
  return out;
}

static rt_json* parse_number(rt_parser* ps) {
  rt_json* n = new_node(ps, RT_JNUM);
  if (n == NULL) return NULL;
  int neg = 0, overflow = 0, is_int = 1;
  uint64_t mag = 0;
  double d = 0.0;
  if (*ps->p == '-') {
    neg = 1;
    ps->p++;
  }
  if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail_at(ps, "bad number");
  if (*ps->p == '0' && ps->p + 1 < ps->end && ps->p[1] >= '0' && ps->p[1] <= '9')
    return fail_at(ps, "number with a leading zero");
  while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
    unsigned dig = (unsigned)(*ps->p - '0');
    if (mag > (UINT64_MAX - dig) / 10) overflow = 1;
    else mag = mag * 10 + dig;
    d = d * 10.0 + dig;
    ps->p++;
  }
  if (ps->p < ps->end && *ps->p == '.') {
    is_int = 0;
    ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail_at(ps, "bad fraction");
    double scale = 0.1;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
      d += (*ps->p - '0') * scale;
      scale *= 0.1;
      ps->p++;
    }
  }
  if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
    is_int = 0;
    ps->p++;
    int eneg = 0, ex = 0;
    if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) eneg = *ps->p++ == '-';
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail_at(ps, "bad exponent");
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
      if (ex < 10000) ex = ex * 10 + (*ps->p - '0');
      ps->p++;
    }
    for (int k = 0; k < ex && d != 0.0 && d < 1e308 && d > 1e-308; k++) d = eneg ? d / 10.0 : d * 10.0;
  }
  n->d = neg ? -d : d;
  if (is_int && !overflow && mag <= (uint64_t)INT64_MAX + (uint64_t)neg) {
    n->is_int = 1;
    n->i = neg ? (int64_t)(0 - mag) : (int64_t)mag;
  }
  return n;
}

static int literal(rt_parser* ps, const char* word) {
  size_t n = strlen(word);
  if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return 0;
  ps->p += n;
  return 1;
}

static rt_json* parse_value(rt_parser* ps, int depth) {
  skip_ws(ps);
  if (ps->p >= ps->end) return fail_at(ps, "unexpected end of input");
  if (depth > RT_JSON_MAX_DEPTH) return fail_at(ps, "nested too deeply");
  char c = *ps->p;
  if (c == '{' || c == '[') {
    int obj = c == '{';
    rt_json* n = new_node(ps, obj ? RT_JOBJ : RT_JARR);
    if (n == NULL) return NULL;
    rt_json** tail = &n->child;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == (obj ? '}' : ']')) {
      ps->p++;
      return n;
    }
    for (;;) {
      const char* key = NULL;
      size_t klen;
      if (obj) {
        skip_ws(ps);
        if (ps->p >= ps->end || *ps->p != '"') return fail_at(ps, "expected a string key");
        key = parse_string(ps, &klen);
        if (key == NULL) return NULL;
        skip_ws(ps);
        if (ps->p >= ps->end || *ps->p != ':') return fail_at(ps, "expected ':'");
        ps->p++;
      }
      rt_json* v = parse_value(ps, depth + 1);
      if (v == NULL) return NULL;
      v->key = key;
      *tail = v;
      tail = &v->next;
      n->count++;
      skip_ws(ps);
      if (ps->p >= ps->end) return fail_at(ps, "unexpected end of input");
      if (*ps->p == ',') {
        ps->p++;
        continue;
      }
      if (*ps->p == (obj ? '}' : ']')) {
        ps->p++;
        return n;
      }
      return fail_at(ps, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
  }
  if (c == '"') {
    rt_json* n = new_node(ps, RT_JSTR);
    if (n == NULL) return NULL;
    n->s = parse_string(ps, &n->len);
    return n->s ? n : NULL;
  }
  if (c == '-' || (c >= '0' && c <= '9')) return parse_number(ps);
  if (literal(ps, "true")) return new_node(ps, RT_JTRUE);
  if (literal(ps, "false")) return new_node(ps, RT_JFALSE);
  if (literal(ps, "null")) return new_node(ps, RT_JNULL);
  return fail_at(ps, "unexpected character");
}

void rt_json_free(rt_json_doc* doc) {
  if (doc == NULL) return;
  rt_chunk* c = doc->chunks;
  while (c) {
    rt_chunk* next = c->next;
    free(c);
    c = next;
  }
  free(doc);
}

rt_json_doc* rt_json_parse(const char* text, size_t len, const char* what) {
  rt_json_doc* doc = (rt_json_doc*)calloc(1, sizeof *doc);
  if (doc == NULL) {
    rt_fail(TETHER_RT_ERR_NOMEM, "out of memory parsing %s", what);
    return NULL;
  }
  rt_parser ps = {text, text, text + len, what, doc, 0};
  doc->root = parse_value(&ps, 0);
  if (doc->root != NULL) {
    skip_ws(&ps);
    if (ps.p != ps.end) {
      fail_at(&ps, "extra data after the value");
      doc->root = NULL;
    }
  }
  if (doc->root == NULL) {
    rt_json_free(doc);
    return NULL;
  }
  return doc;
}

rt_json* rt_json_root(rt_json_doc* doc) { return doc->root; }

rt_json* rt_json_get(const rt_json* obj, const char* key) {
  if (obj == NULL || obj->type != RT_JOBJ) return NULL;
  rt_json* found = NULL;
  size_t klen = strlen(key);
  for (rt_json* c = obj->child; c; c = c->next)   /* the last one wins, as in Python's json */
    if (strlen(c->key) == klen && memcmp(c->key, key, klen) == 0) found = c;
  return found;
}

rt_json* rt_json_at(const rt_json* arr, size_t index) {
  if (arr == NULL || (arr->type != RT_JARR && arr->type != RT_JOBJ) || index >= arr->count) return NULL;
  rt_json* c = arr->child;
  while (index--) c = c->next;
  return c;
}
