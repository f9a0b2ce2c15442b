/* gguf_writer.c — serializes metadata and tensors into a GGUF v3 file, atomically.
 * Must not know about model families; it writes what it is given and checks only the format. */
#include "gguf_writer.h"

#include "kernels.h"
#include "quants.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* GGUF is little-endian; values are copied from host memory as they are. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf_writer.c writes host byte order and needs a little-endian host"
#endif

#define GW_DEFAULT_ALIGNMENT 32
#define GW_MAX_NAME 63 /* ggml keeps tensor names in 64-byte buffers (NUL included) */

typedef struct {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} wbuf;

struct ember_gguf_wvalue {
    gguf_value_type type;
    wbuf payload; /* the value as on disk, without its u32 type tag */
};

typedef struct {
    char *key;
    gguf_value_type type;
    wbuf payload;
} wkv;

typedef struct {
    char *name;
    uint32_t n_dims, type;
    int64_t ne[4];
    uint8_t *data; /* (size) owned copy */
    size_t size;
} wtensor;

struct ember_gguf_writer {
    uint32_t version;
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
    ember_status status; /* first failure, sticky */
    ember_error err;
};

static void buf_put(wbuf *b, const void *src, size_t n) {
    if (b->oom) return;
    if (n > b->cap - b->len) {
        const size_t cap = n <= SIZE_MAX - b->len ? ember_grow_cap(b->cap, 64, b->len + n) : 0;
        uint8_t *p = cap ? realloc(b->p, cap) : NULL;
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void buf_u32(wbuf *b, uint32_t v) { buf_put(b, &v, 4); }
static void buf_u64(wbuf *b, uint64_t v) { buf_put(b, &v, 8); }

/* Size of one scalar on disk; 0 for strings, arrays and unknown types. */
static size_t scalar_size(gguf_value_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static ember_status record(ember_gguf_writer *w, ember_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ember_status record(ember_gguf_writer *w, ember_status code, const char *fmt, ...) {
    if (w->status == EMBER_OK) { /* keep the first failure: later ones are usually its echo */
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->err.msg, sizeof w->err.msg, fmt, ap);
        va_end(ap);
        w->err.code = code;
        w->status = code;
    }
    return code;
}

ember_gguf_writer *ember_gguf_writer_new(void) {
    ember_gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->version = 3;
    return w;
}

void ember_gguf_writer_free(ember_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].payload.p);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->kv);
    free(w->t);
    free(w);
}

void ember_gguf_writer_set_version(ember_gguf_writer *w, uint32_t version) { w->version = version; }

ember_status ember_gguf_writer_status(const ember_gguf_writer *w, ember_error *err) {
    if (w->status != EMBER_OK && err) *err = w->err;
    return w->status;
}

/* ---- values ---------------------------------------------------------------------------------- */

static ember_gguf_wvalue *wvalue_new(gguf_value_type t) {
    ember_gguf_wvalue *v = calloc(1, sizeof *v);
    if (v) v->type = t;
    return v;
}

/* Returns v, or NULL (freeing v) when its buffer ran out of memory. */
static ember_gguf_wvalue *wvalue_done(ember_gguf_wvalue *v) {
    if (v && v->payload.oom) {
        ember_gguf_wvalue_free(v);
        return NULL;
    }
    return v;
}

ember_gguf_wvalue *ember_gguf_wvalue_scalar(gguf_value_type t, const void *src) {
    size_t n = scalar_size(t);
    if (n == 0 || !src) return NULL;
    ember_gguf_wvalue *v = wvalue_new(t);
    if (!v) return NULL;
    buf_put(&v->payload, src, n);
    return wvalue_done(v);
}

ember_gguf_wvalue *ember_gguf_wvalue_string(const char *s, size_t len) {
    if (!s && len) return NULL;
    ember_gguf_wvalue *v = wvalue_new(GGUF_TYPE_STRING);
    if (!v) return NULL;
    buf_u64(&v->payload, len);
    buf_put(&v->payload, s, len);
    return wvalue_done(v);
}

ember_gguf_wvalue *ember_gguf_wvalue_array(gguf_value_type elem_type, const void *elems, uint64_t count) {
    size_t es = scalar_size(elem_type);
    if (es == 0 || (!elems && count) || count > SIZE_MAX / es) return NULL;
    ember_gguf_wvalue *v = wvalue_new(GGUF_TYPE_ARRAY);
    if (!v) return NULL;
    buf_u32(&v->payload, elem_type);
    buf_u64(&v->payload, count);
    buf_put(&v->payload, elems, (size_t)count * es);
    return wvalue_done(v);
}

ember_gguf_wvalue *ember_gguf_wvalue_array_of(gguf_value_type elem_type, ember_gguf_wvalue *const *items,
                                              uint64_t count) {
    if (elem_type != GGUF_TYPE_STRING && elem_type != GGUF_TYPE_ARRAY) return NULL;
    for (uint64_t i = 0; i < count; i++)
        if (!items[i] || items[i]->type != elem_type) return NULL;
    ember_gguf_wvalue *v = wvalue_new(GGUF_TYPE_ARRAY);
    if (!v) return NULL;
    buf_u32(&v->payload, elem_type);
    buf_u64(&v->payload, count);
    /* Array elements carry no type tag of their own: only their payloads follow. */
    for (uint64_t i = 0; i < count; i++) buf_put(&v->payload, items[i]->payload.p, items[i]->payload.len);
    return wvalue_done(v);
}

gguf_value_type ember_gguf_wvalue_type(const ember_gguf_wvalue *v) { return v->type; }

void ember_gguf_wvalue_free(ember_gguf_wvalue *v) {
    if (!v) return;
    free(v->payload.p);
    free(v);
}

/* ---- metadata -------------------------------------------------------------------------------- */

static wkv *find_kv(ember_gguf_writer *w, const char *key) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) return &w->kv[i];
    return NULL;
}

ember_status ember_gguf_writer_set(ember_gguf_writer *w, const char *key, const ember_gguf_wvalue *v) {
    if (!key || !*key) return record(w, EMBER_ERR_ARG, "gguf writer: empty metadata key");
    if (!v) return record(w, EMBER_ERR_ARG, "gguf writer: no value for '%s' (bad value or out of memory)", key);
    if (find_kv(w, key)) return record(w, EMBER_ERR_ARG, "gguf writer: metadata key '%s' set twice", key);
    if (strcmp(key, "general.alignment") == 0) {
        uint32_t a = 0;
        if (v->type == GGUF_TYPE_UINT32) memcpy(&a, v->payload.p, 4);
        /* 64 KiB bounds the padding written and matches what the reader accepts. */
        if (v->type != GGUF_TYPE_UINT32 || a == 0 || (a & (a - 1)) != 0 || a > 65536)
            return record(w, EMBER_ERR_ARG, "gguf writer: general.alignment must be a u32 power of two <= 65536");
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        wkv *p = realloc(w->kv, cap * sizeof *p);
        if (!p) return record(w, EMBER_ERR_NOMEM, "gguf writer: out of memory");
        w->kv = p;
        w->cap_kv = cap;
    }
    wkv kv = {.key = strdup(key), .type = v->type};
    buf_put(&kv.payload, v->payload.p, v->payload.len);
    if (!kv.key || kv.payload.oom) {
        free(kv.key);
        free(kv.payload.p);
        return record(w, EMBER_ERR_NOMEM, "gguf writer: out of memory");
    }
    w->kv[w->n_kv++] = kv;
    return EMBER_OK;
}

/* Builds a value, sets it, frees it: the shorthands below are all this. */
static ember_status set_owned(ember_gguf_writer *w, const char *key, ember_gguf_wvalue *v) {
    ember_status st = ember_gguf_writer_set(w, key, v);
    ember_gguf_wvalue_free(v);
    return st;
}

ember_status ember_gguf_writer_set_u32(ember_gguf_writer *w, const char *key, uint32_t v) {
    return set_owned(w, key, ember_gguf_wvalue_scalar(GGUF_TYPE_UINT32, &v));
}
ember_status ember_gguf_writer_set_i32(ember_gguf_writer *w, const char *key, int32_t v) {
    return set_owned(w, key, ember_gguf_wvalue_scalar(GGUF_TYPE_INT32, &v));
}
ember_status ember_gguf_writer_set_u64(ember_gguf_writer *w, const char *key, uint64_t v) {
    return set_owned(w, key, ember_gguf_wvalue_scalar(GGUF_TYPE_UINT64, &v));
}
ember_status ember_gguf_writer_set_f32(ember_gguf_writer *w, const char *key, float v) {
    return set_owned(w, key, ember_gguf_wvalue_scalar(GGUF_TYPE_FLOAT32, &v));
}
ember_status ember_gguf_writer_set_bool(ember_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return set_owned(w, key, ember_gguf_wvalue_scalar(GGUF_TYPE_BOOL, &b));
}
ember_status ember_gguf_writer_set_string(ember_gguf_writer *w, const char *key, const char *s) {
    return set_owned(w, key, s ? ember_gguf_wvalue_string(s, strlen(s)) : NULL);
}
ember_status ember_gguf_writer_set_array(ember_gguf_writer *w, const char *key, gguf_value_type elem_type,
                                         const void *elems, uint64_t count) {
    return set_owned(w, key, ember_gguf_wvalue_array(elem_type, elems, count));
}

ember_status ember_gguf_writer_set_strings(ember_gguf_writer *w, const char *key, const char *const *s,
                                           uint64_t count) {
    /* Serialized directly: a 100k-token vocabulary should not become 100k small allocations. */
    ember_gguf_wvalue *v = wvalue_new(GGUF_TYPE_ARRAY);
    if (v) {
        buf_u32(&v->payload, GGUF_TYPE_STRING);
        buf_u64(&v->payload, count);
        for (uint64_t i = 0; i < count; i++) {
            if (!s[i]) {
                ember_gguf_wvalue_free(v);
                return record(w, EMBER_ERR_ARG, "gguf writer: string %llu of '%s' is NULL", (unsigned long long)i, key);
            }
            size_t n = strlen(s[i]);
            buf_u64(&v->payload, n);
            buf_put(&v->payload, s[i], n);
        }
    }
    return set_owned(w, key, wvalue_done(v));
}

bool ember_gguf_writer_remove_key(ember_gguf_writer *w, const char *key) {
    wkv *kv = find_kv(w, key);
    if (!kv) return false;
    free(kv->key);
    free(kv->payload.p);
    size_t i = (size_t)(kv - w->kv);
    memmove(kv, kv + 1, (w->n_kv - i - 1) * sizeof *kv); /* keep the order of the rest */
    w->n_kv--;
    return true;
}

/* ---- tensors --------------------------------------------------------------------------------- */

static wtensor *find_tensor(ember_gguf_writer *w, const char *name) {
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) return &w->t[i];
    return NULL;
}

bool ember_gguf_writer_remove_tensor(ember_gguf_writer *w, const char *name) {
    wtensor *t = find_tensor(w, name);
    if (!t) return false;
    free(t->name);
    free(t->data);
    size_t i = (size_t)(t - w->t);
    memmove(t, t + 1, (w->n_t - i - 1) * sizeof *t);
    w->n_t--;
    return true;
}

/* Checks name and dims; on success *n_elements is their product. */
static ember_status check_tensor(ember_gguf_writer *w, const char *name, uint32_t n_dims, const int64_t *ne,
                                 int64_t *n_elements) {
    if (!name || !*name || strlen(name) > GW_MAX_NAME)
        return record(w, EMBER_ERR_ARG, "gguf writer: tensor name '%s' is empty or longer than %d bytes",
                      name ? name : "", GW_MAX_NAME);
    if (find_tensor(w, name)) return record(w, EMBER_ERR_ARG, "gguf writer: tensor '%s' added twice", name);
    if (n_dims < 1 || n_dims > 4)
        return record(w, EMBER_ERR_ARG, "gguf writer: tensor '%s' has %u dims (1..4 allowed)", name, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        if (ne[d] < 1)
            return record(w, EMBER_ERR_ARG, "gguf writer: tensor '%s' dim %u = %lld is out of range", name, d,
                          (long long)ne[d]);
    if (!ember_shape_count(ne, (int)n_dims, INT64_MAX, n_elements))
        return record(w, EMBER_ERR_ARG, "gguf writer: tensor '%s' has more than 2^63-1 elements", name);
    return EMBER_OK;
}

static ember_status push_tensor(ember_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                const int64_t *ne, uint8_t *data, size_t size) {
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 32;
        wtensor *p = realloc(w->t, cap * sizeof *p);
        if (!p) {
            free(data);
            return record(w, EMBER_ERR_NOMEM, "gguf writer: out of memory");
        }
        w->t = p;
        w->cap_t = cap;
    }
    wtensor t = {.name = strdup(name), .n_dims = n_dims, .type = type, .ne = {1, 1, 1, 1}, .data = data, .size = size};
    if (!t.name) {
        free(data);
        return record(w, EMBER_ERR_NOMEM, "gguf writer: out of memory");
    }
    for (uint32_t d = 0; d < n_dims; d++) t.ne[d] = ne[d];
    w->t[w->n_t++] = t;
    return EMBER_OK;
}

void ember_quantize_q8_0(const float *x, ember_block_q8_0 *out, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK8_0; b++) {
        const float *xb = x + b * EMBER_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < EMBER_QK8_0; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f;
        out[b].d = ember_f32_to_f16(d);
        for (int j = 0; j < EMBER_QK8_0; j++) {
            float q = d > 0.0f ? roundf(xb[j] / d) : 0.0f;
            /* |x| <= amax keeps q within 127; the clamp only guards float rounding at the edge. */
            q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
            out[b].qs[j] = (int8_t)q;
        }
    }
}

/* The project's quantizer for a 4- to 6-bit weight type (quants.h: ggml's reference bytes), or NULL. */
static void (*weight_quantizer(ember_type t))(const float *, void *, int64_t) {
    switch (t) {
    case EMBER_TYPE_Q4_0: return ember_quantize_row_q4_0;
    case EMBER_TYPE_Q4_1: return ember_quantize_row_q4_1;
    case EMBER_TYPE_Q5_0: return ember_quantize_row_q5_0;
    case EMBER_TYPE_Q5_1: return ember_quantize_row_q5_1;
    case EMBER_TYPE_Q2_K: return ember_quantize_row_q2_k;
    case EMBER_TYPE_Q3_K: return ember_quantize_row_q3_k;
    case EMBER_TYPE_Q4_K: return ember_quantize_row_q4_k;
    case EMBER_TYPE_Q5_K: return ember_quantize_row_q5_k;
    case EMBER_TYPE_Q6_K: return ember_quantize_row_q6_k;
    default: return NULL;
    }
}

ember_status ember_gguf_writer_add_tensor(ember_gguf_writer *w, const char *name, ember_type type, uint32_t n_dims,
                                          const int64_t *ne, const float *values) {
    int64_t n;
    ember_status st = check_tensor(w, name, n_dims, ne, &n);
    if (st != EMBER_OK) return st;
    size_t row = ember_type_row_size(type, ne[0]);
    if (row == 0)
        return record(w, EMBER_ERR_ARG, "gguf writer: tensor '%s': %s rows of %lld values are not possible", name,
                      ember_type_name(type), (long long)ne[0]);
    void (*quantize)(const float *, void *, int64_t) = weight_quantizer(type);
    if (type != EMBER_TYPE_F32 && type != EMBER_TYPE_F16 && type != EMBER_TYPE_BF16 && type != EMBER_TYPE_Q8_0 &&
        !quantize)
        return record(w, EMBER_ERR_ARG, "gguf writer: tensor '%s': no encoder for type %s", name,
                      ember_type_name(type));
    int64_t rows = n / ne[0];
    if ((uint64_t)rows > SIZE_MAX / row) return record(w, EMBER_ERR_ARG, "gguf writer: tensor '%s' is too large", name);
    size_t size = row * (size_t)rows;
    uint8_t *data = malloc(size ? size : 1);
    if (!data) return record(w, EMBER_ERR_NOMEM, "gguf writer: out of memory for tensor '%s'", name);
    switch (type) {
    case EMBER_TYPE_F32: memcpy(data, values, size); break;
    case EMBER_TYPE_F16:
    case EMBER_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = type == EMBER_TYPE_F16 ? ember_f32_to_f16(values[i]) : ember_f32_to_bf16(values[i]);
            memcpy(data + 2 * i, &h, 2);
        }
        break;
    case EMBER_TYPE_Q8_0:
        /* Built in an aligned array, then copied: the byte buffer has no struct alignment to rely on. */
        for (int64_t r = 0; r < rows; r++) {
            ember_block_q8_0 blk;
            for (int64_t b = 0; b < ne[0] / EMBER_QK8_0; b++) {
                ember_quantize_q8_0(values + r * ne[0] + b * EMBER_QK8_0, &blk, EMBER_QK8_0);
                memcpy(data + (size_t)r * row + (size_t)b * sizeof blk, &blk, sizeof blk);
            }
        }
        break;
    default: /* row by row: each row is whole blocks */
        for (int64_t r = 0; r < rows; r++) quantize(values + r * ne[0], data + (size_t)r * row, ne[0]);
        break;
    }
    return push_tensor(w, name, type, n_dims, ne, data, size);
}

ember_status ember_gguf_writer_add_tensor_raw(ember_gguf_writer *w, const char *name, uint32_t ggml_type,
                                              uint32_t n_dims, const int64_t *ne, const void *src, size_t size) {
    int64_t n;
    ember_status st = check_tensor(w, name, n_dims, ne, &n);
    if (st != EMBER_OK) return st;
    uint8_t *data = malloc(size ? size : 1);
    if (!data) return record(w, EMBER_ERR_NOMEM, "gguf writer: out of memory for tensor '%s'", name);
    if (size) memcpy(data, src, size);
    return push_tensor(w, name, ggml_type, n_dims, ne, data, size);
}

/* ---- output ---------------------------------------------------------------------------------- */

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static uint64_t alignment_of(ember_gguf_writer *w) {
    wkv *kv = find_kv(w, "general.alignment");
    uint32_t a = GW_DEFAULT_ALIGNMENT;
    if (kv) memcpy(&a, kv->payload.p, 4); /* validated as a u32 power of two when set */
    return a;
}

static void put_str(wbuf *b, const char *s) {
    size_t n = strlen(s);
    buf_u64(b, n);
    buf_put(b, s, n);
}

static const uint8_t zeros[65536];

/* Everything before the data section, in one buffer: header, metadata, tensor infos, padding. */
static void encode_head(const ember_gguf_writer *w, uint64_t align, wbuf *head) {
    buf_put(head, "GGUF", 4);
    buf_u32(head, w->version);
    buf_u64(head, w->n_t);
    buf_u64(head, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        put_str(head, w->kv[i].key);
        buf_u32(head, w->kv[i].type);
        buf_put(head, w->kv[i].payload.p, w->kv[i].payload.len);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        put_str(head, t->name);
        buf_u32(head, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) buf_u64(head, (uint64_t)t->ne[d]);
        buf_u32(head, t->type);
        buf_u64(head, offset);
        offset = align_up(offset + t->size, align);
    }
    size_t pad = (size_t)(align_up(head->len, align) - head->len);
    buf_put(head, zeros, pad);
}

/* A temporary file beside path (so the rename is atomic), with the mode a plain fopen gives. */
static ember_status open_temporary(const char *path, char **tmp_out, FILE **f_out, ember_error *err) {
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) return ember_error_set(err, EMBER_ERR_NOMEM, "%s: out of memory while writing", path);
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd >= 0) {
        /* mkstemp makes the file 0600; give it the mode a plain fopen would have. */
        mode_t mask = umask(0);
        umask(mask);
        fchmod(fd, 0666 & ~mask);
    }
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        int e = errno;
        /* the usual cause is a directory that is not there: name it rather than the temporary file */
        const char *slash = strrchr(path, '/');
        ember_status st =
            e == ENOENT && slash
                ? ember_error_set(err, EMBER_ERR_IO, "%s: directory '%.*s' does not exist", path,
                                  (int)(slash == path ? 1 : slash - path), path)
                : ember_error_set(err, EMBER_ERR_IO, "%s: cannot create a temporary file: %s", path, strerror(e));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        free(tmp);
        return st;
    }
    *tmp_out = tmp;
    *f_out = f;
    return EMBER_OK;
}

ember_status ember_gguf_writer_write(ember_gguf_writer *w, const char *path, ember_error *err) {
    if (w->status != EMBER_OK) return ember_gguf_writer_status(w, err);
    const uint64_t align = alignment_of(w);
    wbuf head = {0};
    encode_head(w, align, &head);
    if (head.oom) {
        free(head.p);
        return ember_error_set(err, EMBER_ERR_NOMEM, "%s: out of memory while writing", path);
    }
    char *tmp = NULL;
    FILE *f = NULL;
    ember_status st = open_temporary(path, &tmp, &f, err);
    if (st != EMBER_OK) {
        free(head.p);
        return st;
    }
    bool ok = fwrite(head.p, 1, head.len, f) == head.len;
    for (size_t i = 0; ok && i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        ok = fwrite(t->data, 1, t->size, f) == t->size;
        size_t tpad = (size_t)(align_up(t->size, align) - t->size);
        ok = ok && fwrite(zeros, 1, tpad, f) == tpad;
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    ok = (fclose(f) == 0) && ok;
    free(head.p);
    if (ok && rename(tmp, path) != 0) {
        saved = errno;
        ok = false;
    }
    if (!ok) {
        unlink(tmp);
        free(tmp);
        return ember_error_set(err, EMBER_ERR_IO, "%s: write failed: %s", path, strerror(saved ? saved : EIO));
    }
    free(tmp);
    return EMBER_OK;
}
