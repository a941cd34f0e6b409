/* params.c: reading files: deploy.json whole, deploy.params as a stream of records (docs/params.md,
 * tether_rpc/params.py):
 *
 *     file    = magic "TTHRPRM\0"  version:u32  count:u32  record * count
 *     record  = name_len:u16 name  dtype_len:u8 dtype  ndim:u8 shape:ndim x i64  nbytes:u64
 *               zero padding to the next multiple of 64 from the start of the file  data:nbytes
 *
 * Each tensor's data is read straight into the model buffer that takes it: no copy of the whole file is held. */
#include "rt_internal.h"

#include <stdlib.h>
#include <string.h>

#define RT_PARAMS_MAX_NDIM 32
#define RT_PARAMS_ALIGN 64

int rt_read_file(const char* path, size_t max_bytes, const char* what, char** out, size_t* len) {
  FILE* fh = fopen(path, "rb");
  if (fh == NULL) return rt_fail(TETHER_RT_ERR_IO, "cannot open %s %s", what, path);
  if (fseeko(fh, 0, SEEK_END) != 0) {
    fclose(fh);
    return rt_fail(TETHER_RT_ERR_IO, "cannot read %s %s", what, path);
  }
  off_t size = ftello(fh);
  if (size < 0 || (uint64_t)size > max_bytes) {
    fclose(fh);
    return rt_fail(TETHER_RT_ERR_LIMIT, "%s %s has %lld bytes, above the %llu this runtime reads", what, path,
                   (long long)size, (unsigned long long)max_bytes);
  }
  char* buf = (char*)malloc((size_t)size + 1);
  if (buf == NULL) {
    fclose(fh);
    return rt_fail(TETHER_RT_ERR_NOMEM, "out of memory reading %s %s (%lld bytes)", what, path, (long long)size);
  }
  if (fseeko(fh, 0, SEEK_SET) != 0 || fread(buf, 1, (size_t)size, fh) != (size_t)size) {
    free(buf);
    fclose(fh);
    return rt_fail(TETHER_RT_ERR_IO, "cannot read %s %s", what, path);
  }
  fclose(fh);
  buf[size] = '\0';
  *out = buf;
  *len = (size_t)size;
  return TETHER_RT_OK;
}

typedef struct {
  FILE* fh;
  uint64_t pos, size;
  const char* path;
  uint32_t record, count;
} rt_stream;

static int take(rt_stream* s, void* buf, size_t n) {
  if (n > s->size - s->pos)
    return rt_fail(TETHER_RT_ERR_FORMAT, "params file %s truncated at byte %llu (record %u of %u)", s->path,
                   (unsigned long long)s->pos, s->record, s->count);
  if (n && fread(buf, 1, n, s->fh) != n) return rt_fail(TETHER_RT_ERR_IO, "cannot read params file %s", s->path);
  s->pos += n;
  return TETHER_RT_OK;
}

static uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; k--) v = v << 8 | p[k];
  return v;
}

int rt_params_read(const char* path, rt_param_sink sink, void* user) {
  rt_stream s = {NULL, 0, 0, path, 0, 0};
  s.fh = fopen(path, "rb");
  if (s.fh == NULL) return rt_fail(TETHER_RT_ERR_IO, "cannot open params file %s", path);
  int status = TETHER_RT_OK;
  char name[4097];
  int64_t shape[RT_PARAMS_MAX_NDIM];
  unsigned char head[16];
  if (fseeko(s.fh, 0, SEEK_END) != 0 || ftello(s.fh) < 0 || fseeko(s.fh, 0, SEEK_SET) != 0) {
    fclose(s.fh);
    return rt_fail(TETHER_RT_ERR_IO, "cannot read params file %s", path);
  }
  fseeko(s.fh, 0, SEEK_END);
  s.size = (uint64_t)ftello(s.fh);
  fseeko(s.fh, 0, SEEK_SET);
  if (s.size < 16) {
    status = rt_fail(TETHER_RT_ERR_FORMAT, "params file %s too short (%llu bytes) for its header", path,
                     (unsigned long long)s.size);
    goto done;
  }
  if ((status = take(&s, head, 16)) != TETHER_RT_OK) goto done;
  if (memcmp(head, "TTHRPRM\0", 8) != 0) {
    status = rt_fail(TETHER_RT_ERR_FORMAT, "%s is not a tether params file (wrong magic)", path);
    goto done;
  }
  if (le(head + 8, 4) != 1) {
    status = rt_fail(TETHER_RT_ERR_FORMAT, "params file %s has format version %u; this runtime reads version 1",
                     path, (unsigned)le(head + 8, 4));
    goto done;
  }
  s.count = (uint32_t)le(head + 12, 4);
  for (s.record = 0; s.record < s.count; s.record++) {
    unsigned char b[8];
    char dtype[256];
    if ((status = take(&s, b, 2)) != TETHER_RT_OK) goto done;
    size_t nlen = (size_t)le(b, 2);
    if (nlen > 4096) {
      status = rt_fail(TETHER_RT_ERR_FORMAT, "params file %s: record %u has a name of %zu bytes (limit 4096)", path,
                       s.record, nlen);
      goto done;
    }
    if ((status = take(&s, name, nlen)) != TETHER_RT_OK) goto done;
    name[nlen] = '\0';
    if ((status = take(&s, b, 1)) != TETHER_RT_OK) goto done;
    size_t dlen = b[0];
    if ((status = take(&s, dtype, dlen)) != TETHER_RT_OK) goto done;
    dtype[dlen] = '\0';
    int dt = rt_dtype_from_name(dtype, dlen);
    if (dt < 0) {
      status = rt_fail(TETHER_RT_ERR_FORMAT, "params file %s: param '%s' has unknown dtype '%s'", path, name, dtype);
      goto done;
    }
    if ((status = take(&s, b, 1)) != TETHER_RT_OK) goto done;
    int32_t ndim = b[0];
    if (ndim > RT_PARAMS_MAX_NDIM) {
      status = rt_fail(TETHER_RT_ERR_FORMAT, "params file %s: param '%s' has rank %d (limit %d)", path, name,
                       (int)ndim, RT_PARAMS_MAX_NDIM);
      goto done;
    }
    uint64_t expect = rt_dtypes[dt].bits / 8u;
    int overflow = 0;
    for (int32_t k = 0; k < ndim; k++) {
      if ((status = take(&s, b, 8)) != TETHER_RT_OK) goto done;
      shape[k] = (int64_t)le(b, 8);
      if (shape[k] < 0) {
        status = rt_fail(TETHER_RT_ERR_FORMAT, "params file %s: param '%s' has a negative extent", path, name);
        goto done;
      }
      if (!rt_mul_u64(expect, (uint64_t)shape[k], &expect)) overflow = 1;
    }
    if ((status = take(&s, b, 8)) != TETHER_RT_OK) goto done;
    uint64_t nbytes = le(b, 8);
    if (overflow || nbytes != expect) {
      status = rt_fail(TETHER_RT_ERR_FORMAT, "params file %s: param '%s' has %llu data bytes, its %s shape needs %s%llu",
                       path, name, (unsigned long long)nbytes, dtype, overflow ? "more than " : "",
                       (unsigned long long)(overflow ? UINT64_MAX : expect));
      goto done;
    }
    uint64_t pad = (RT_PARAMS_ALIGN - s.pos % RT_PARAMS_ALIGN) % RT_PARAMS_ALIGN;
    if (pad > s.size - s.pos || nbytes > s.size - s.pos - pad) {
      status = rt_fail(TETHER_RT_ERR_FORMAT, "params file %s: param '%s' data runs past the end of the file "
                       "(truncated)", path, name);
      goto done;
    }
    s.pos += pad;
    rt_param_record rec = {name, dt, ndim, shape, nbytes};
    void* dst = NULL;
    if ((status = sink(user, &rec, &dst)) != TETHER_RT_OK) goto done;
    if (fseeko(s.fh, (off_t)s.pos, SEEK_SET) != 0) {
      status = rt_fail(TETHER_RT_ERR_IO, "cannot read params file %s", path);
      goto done;
    }
    if (dst != NULL) {
      if ((status = take(&s, dst, (size_t)nbytes)) != TETHER_RT_OK) goto done;
    } else {
      s.pos += nbytes;
      if (fseeko(s.fh, (off_t)s.pos, SEEK_SET) != 0) {
        status = rt_fail(TETHER_RT_ERR_IO, "cannot read params file %s", path);
        goto done;
      }
    }
  }
done:
  fclose(s.fh);
  return status;
}
