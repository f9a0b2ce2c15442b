/* gguf.c — maps a GGUF file and validates every byte it will later trust.
 * Must not know about models or families; it reports what the file says, or why it cannot. */
#include "gguf.h"
#include "escape.h"
#include "file.h"
#include "mapguard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32
/* Nesting deeper than this is not a real file; it only guards the recursion. */
#define GGUF_MAX_ARRAY_DEPTH 8
/* Bytes of a key or tensor name shown in a message (escaped). */
#define GGUF_NAME_SHOWN 200

/* A cursor over the mapping; every read is checked against the end. */
typedef struct {
    const uint8_t *base;
    size_t size, pos;
    const char *path;
    ember_error *err;
} reader;

static ember_status fail(reader *r, const char *what) {
    return ember_error_set(r->err, EMBER_ERR_FORMAT, "%s: %s (at byte %zu of %zu)", r->path, what, r->pos, r->size);
}

static bool rd(reader *r, void *dst, size_t n) {
    if (n > r->size - r->pos) return false;
    memcpy(dst, r->base + r->pos, n);
    r->pos += n;
    return true;
}

static bool rd_u32(reader *r, uint32_t *v) { return rd(r, v, 4); }
static bool rd_u64(reader *r, uint64_t *v) { return rd(r, v, 8); }

static bool rd_str(reader *r, gguf_str *s) {
    uint64_t len;
    if (!rd_u64(r, &len) || len > r->size - r->pos) return false;
    s->ptr = (const char *)r->base + r->pos;
    s->len = len;
    r->pos += len;
    return true;
}

static const size_t scalar_size[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = 1,  [GGUF_TYPE_INT8] = 1,  [GGUF_TYPE_UINT16] = 2,  [GGUF_TYPE_INT16] = 2,
    [GGUF_TYPE_UINT32] = 4, [GGUF_TYPE_INT32] = 4, [GGUF_TYPE_FLOAT32] = 4, [GGUF_TYPE_BOOL] = 1,
    [GGUF_TYPE_UINT64] = 8, [GGUF_TYPE_INT64] = 8, [GGUF_TYPE_FLOAT64] = 8,
};

bool gguf_str_eq(gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

static void value_free(gguf_value *v) {
    if (v->type != GGUF_TYPE_ARRAY) return;
    free(v->v.arr.str_off);
    v->v.arr.str_off = NULL;
    if (!v->v.arr.items) return;
    if (v->v.arr.elem_type == GGUF_TYPE_ARRAY)
        for (uint64_t i = 0; i < v->v.arr.count; i++) value_free(&v->v.arr.items[i]);
    free(v->v.arr.items);
    v->v.arr.items = NULL;
}

static ember_status read_value(reader *r, gguf_value_type type, gguf_value *out, int depth);

static ember_status read_array(reader *r, gguf_value *out, int depth) {
    uint32_t et;
    uint64_t count;
    if (!rd_u32(r, &et) || !rd_u64(r, &count)) return fail(r, "truncated array header");
    if (et >= GGUF_TYPE_COUNT) return fail(r, "array of unknown value type");
    if (depth >= GGUF_MAX_ARRAY_DEPTH) return fail(r, "arrays nested too deeply");
    out->v.arr.elem_type = (gguf_value_type)et;
    out->v.arr.count = count;
    out->v.arr.data = r->base + r->pos;
    out->v.arr.items = NULL;
    out->v.arr.str_off = NULL;
    if (et != GGUF_TYPE_STRING && et != GGUF_TYPE_ARRAY) {
        size_t es = scalar_size[et];
        if (count > (r->size - r->pos) / es) return fail(r, "array count runs past the end of the file");
        r->pos += (size_t)(count * es);
        return EMBER_OK;
    }
    /* Each string needs at least its 8-byte length: a cheap bound before allocating. */
    if (count > (r->size - r->pos) / (et == GGUF_TYPE_STRING ? 8 : 12))
        return fail(r, "array count runs past the end of the file");
    if (et == GGUF_TYPE_STRING) {
        /* only where each string starts: a parsed item each would cost 40 bytes */
        out->v.arr.str_off = malloc((count ? count : 1) * sizeof *out->v.arr.str_off);
        if (!out->v.arr.str_off) return ember_error_set(r->err, EMBER_ERR_NOMEM, "%s: out of memory", r->path);
        for (uint64_t i = 0; i < count; i++) {
            gguf_str str;
            out->v.arr.str_off[i] = (uint64_t)(r->base + r->pos - out->v.arr.data);
            if (!rd_str(r, &str)) return fail(r, "truncated string");
        }
        return EMBER_OK;
    }
    out->v.arr.items = calloc(count ? count : 1, sizeof(gguf_value));
    if (!out->v.arr.items) return ember_error_set(r->err, EMBER_ERR_NOMEM, "%s: out of memory", r->path);
    for (uint64_t i = 0; i < count; i++) {
        ember_status st = read_value(r, (gguf_value_type)et, &out->v.arr.items[i], depth + 1);
        if (st != EMBER_OK) {
            out->v.arr.count = i + 1; /* free what was read, including item i's own items */
            return st;
        }
    }
    return EMBER_OK;
}

static ember_status read_value(reader *r, gguf_value_type type, gguf_value *out, int depth) {
    out->type = type;
    uint8_t b1;
    uint16_t b2;
    uint32_t b4;
    uint64_t b8;
    switch (type) {
    case GGUF_TYPE_UINT8:
        if (!rd(r, &b1, 1)) break;
        out->v.u64 = b1;
        return EMBER_OK;
    case GGUF_TYPE_INT8:
        if (!rd(r, &b1, 1)) break;
        out->v.i64 = (int8_t)b1;
        return EMBER_OK;
    case GGUF_TYPE_UINT16:
        if (!rd(r, &b2, 2)) break;
        out->v.u64 = b2;
        return EMBER_OK;
    case GGUF_TYPE_INT16:
        if (!rd(r, &b2, 2)) break;
        out->v.i64 = (int16_t)b2;
        return EMBER_OK;
    case GGUF_TYPE_UINT32:
        if (!rd(r, &b4, 4)) break;
        out->v.u64 = b4;
        return EMBER_OK;
    case GGUF_TYPE_INT32:
        if (!rd(r, &b4, 4)) break;
        out->v.i64 = (int32_t)b4;
        return EMBER_OK;
    case GGUF_TYPE_UINT64:
        if (!rd(r, &b8, 8)) break;
        out->v.u64 = b8;
        return EMBER_OK;
    case GGUF_TYPE_INT64:
        if (!rd(r, &b8, 8)) break;
        out->v.i64 = (int64_t)b8;
        return EMBER_OK;
    case GGUF_TYPE_FLOAT32: {
        float f;
        if (!rd(r, &f, 4)) break;
        out->v.f64 = f;
        return EMBER_OK;
    }
    case GGUF_TYPE_FLOAT64:
        if (!rd(r, &out->v.f64, 8)) break;
        return EMBER_OK;
    case GGUF_TYPE_BOOL:
        if (!rd(r, &b1, 1)) break;
        if (b1 > 1) return fail(r, "bool value is neither 0 nor 1");
        out->v.b = b1;
        return EMBER_OK;
    case GGUF_TYPE_STRING:
        if (!rd_str(r, &out->v.str)) return fail(r, "truncated string");
        return EMBER_OK;
    case GGUF_TYPE_ARRAY: return read_array(r, out, depth);
    default: return fail(r, "unknown value type");
    }
    return fail(r, "truncated value");
}

const char *gguf_value_type_name(gguf_value_type t) {
    static const char *names[GGUF_TYPE_COUNT] = {
        [GGUF_TYPE_UINT8] = "u8",    [GGUF_TYPE_INT8] = "i8",    [GGUF_TYPE_UINT16] = "u16",
        [GGUF_TYPE_INT16] = "i16",   [GGUF_TYPE_UINT32] = "u32", [GGUF_TYPE_INT32] = "i32",
        [GGUF_TYPE_FLOAT32] = "f32", [GGUF_TYPE_BOOL] = "bool",  [GGUF_TYPE_STRING] = "string",
        [GGUF_TYPE_ARRAY] = "array", [GGUF_TYPE_UINT64] = "u64", [GGUF_TYPE_INT64] = "i64",
        [GGUF_TYPE_FLOAT64] = "f64",
    };
    return (unsigned)t < GGUF_TYPE_COUNT ? names[t] : "unknown";
}

/* A type ember can read (its traits have a to_float); whether a kernel set multiplies by it is
 * checked when the model's matrices are prepared. */
static bool type_supported(uint32_t t) {
    const ember_type_traits *tr = ember_type_traits_get(t);
    return tr && tr->to_float;
}

/* "f32, f16, q8_0 and bf16": the types type_supported accepts, from the traits table. */
static void supported_list(char *buf, size_t cap) {
    uint32_t ids[EMBER_TYPE_COUNT];
    int n = 0;
    for (uint32_t t = 0; t < EMBER_TYPE_COUNT; t++)
        if (type_supported(t)) ids[n++] = t;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        const char *sep = i == 0 ? "" : i == n - 1 ? " and " : ", ";
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%s%s", sep, ember_type_name(ids[i]));
    }
}

/* "blk.N." -> N (at most 9 digits), else -1. */
static int64_t block_number(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    int64_t n = 0;
    int digits = 0;
    const char *p = name + 4;
    for (; *p >= '0' && *p <= '9' && digits < 10; p++, digits++) n = n * 10 + (*p - '0');
    return digits >= 1 && digits <= 9 && *p == '.' ? n : -1;
}

static ember_status read_tensor_info(reader *r, gguf_tensor *t) {
    gguf_str name;
    char q[GGUF_NAME_SHOWN * 4 + 8];
    if (!rd_str(r, &name)) return fail(r, "truncated tensor name");
    if (name.len == 0 || name.len > 256) return fail(r, "tensor name is empty or longer than 256 bytes");
    t->name = malloc(name.len + 1);
    if (!t->name) return ember_error_set(r->err, EMBER_ERR_NOMEM, "%s: out of memory", r->path);
    memcpy(t->name, name.ptr, name.len);
    t->name[name.len] = 0;
    if (memchr(t->name, 0, name.len)) return fail(r, "tensor name contains a NUL byte");
    ember_escape(q, sizeof q, t->name, name.len, GGUF_NAME_SHOWN);
    if (!rd_u32(r, &t->n_dims)) return fail(r, "truncated tensor info");
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return ember_error_set(r->err, EMBER_ERR_FORMAT, "%s: tensor '%s' has %u dimensions (1..%d allowed)", r->path,
                               q, t->n_dims, GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        if (d < t->n_dims && !rd_u64(r, &ne)) return fail(r, "truncated tensor dimensions");
        if (ne == 0 || ne > (uint64_t)INT64_MAX)
            return ember_error_set(r->err, EMBER_ERR_FORMAT, "%s: tensor '%s' has an absurd dimension %llu", r->path, q,
                                   (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    uint32_t type;
    if (!rd_u32(r, &type) || !rd_u64(r, &t->offset)) return fail(r, "truncated tensor info");
    if (!type_supported(type)) {
        char list[256];
        supported_list(list, sizeof list);
        return ember_error_set(r->err, EMBER_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s (%u); ember supports %s",
                               r->path, q, ember_type_name(type), type, list);
    }
    t->type = (ember_type)type;
    /* Blocks run along rows, so the row must hold whole blocks; then the element count (every
     * product checked) goes through the kernels' one conversion to bytes, which checks the rest. */
    const ember_type_traits *tr = ember_type_traits_get(type);
    if (t->ne[0] % tr->block_size)
        return ember_error_set(r->err, EMBER_ERR_FORMAT,
                               "%s: tensor '%s': row length %lld is not a multiple of the %s block size", r->path, q,
                               (long long)t->ne[0], ember_type_name(type));
    if (!ember_shape_count(t->ne, GGUF_MAX_DIMS, INT64_MAX, &t->n_elements) ||
        !ember_type_nbytes(t->type, t->n_elements, &t->size))
        return ember_error_set(r->err, EMBER_ERR_FORMAT,
                               "%s: tensor '%s' has dimensions [%lld, %lld, %lld, %lld] whose size as %s overflows",
                               r->path, q, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                               (long long)t->ne[3], ember_type_name(type));
    return EMBER_OK;
}

/* ---- name index ------------------------------------------------------------------------------ */

static uint64_t name_hash(const char *s, size_t len) {
    /* FNV-1a, then a final mix so the low bits (the slot) depend on every byte */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
}

static bool index_init(gguf_index *ix, uint64_t n) {
    const size_t cap = ember_grow_cap(16, 16, 2 * (size_t)n); /* n is bounded by the file size */
    ix->slots = cap ? calloc(cap, sizeof *ix->slots) : NULL;
    ix->cap = ix->slots ? cap : 0;
    return ix->slots != NULL;
}

static gguf_str kv_name(const ember_gguf *g, uint32_t i) { return g->kv[i].key; }
static gguf_str tensor_name(const ember_gguf *g, uint32_t i) {
    return (gguf_str){.ptr = g->tensors[i].name, .len = strlen(g->tensors[i].name)};
}

/* The index of s, or -1; with insert, adds `self` when absent (returns -1) or returns the earlier one. */
static int64_t index_probe(const ember_gguf *g, const gguf_index *ix, gguf_str (*name_of)(const ember_gguf *, uint32_t),
                           const char *s, size_t len, bool insert, uint32_t self) {
    if (!ix->cap) return -1;
    size_t mask = ix->cap - 1;
    for (size_t i = name_hash(s, len) & mask;; i = (i + 1) & mask) {
        uint32_t v = ix->slots[i];
        if (v == 0) {
            if (insert) ix->slots[i] = self + 1;
            return -1;
        }
        gguf_str other = name_of(g, v - 1);
        if (other.len == len && memcmp(other.ptr, s, len) == 0) return v - 1;
    }
}

/* The file mapped read-only into a new, guarded ember_gguf (nothing parsed yet). */
static ember_status map_file(const char *path, ember_gguf **out, ember_error *err) {
    int fd;
    struct stat st;
    ember_status s = ember_file_open_regular(path, &fd, &st, err);
    if (s != EMBER_OK) return s;
    if (st.st_size < 24) {
        close(fd);
        return ember_error_set(err, EMBER_ERR_FORMAT, "%s: file is %lld bytes, too short for a GGUF header", path,
                               (long long)st.st_size);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return ember_error_set(err, EMBER_ERR_FORMAT, "%s: file is too large to map", path);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        close(fd);
        return ember_error_set(err, EMBER_ERR_IO, "%s: cannot map: %s", path, strerror(e));
    }

    ember_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        munmap(map, (size_t)st.st_size);
        close(fd);
        return ember_error_set(err, EMBER_ERR_NOMEM, "%s: out of memory", path);
    }
    g->base = map;
    g->size = (size_t)st.st_size;
    g->fd = fd;
    g->st_dev = (uint64_t)st.st_dev;
    g->st_ino = (uint64_t)st.st_ino;
    g->st_mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    /* guarded from the start: a file truncated while the header is parsed reads as zeros */
    g->guard = ember_mapguard_add(g->base, g->size);
    *out = g;
    return EMBER_OK;
}

/* Magic, version and the two counts; the key, tensor and index arrays allocated for them. */
static ember_status read_header(ember_gguf *g, reader *r) {
    const char *path = r->path;
    uint32_t magic = 0; /* map_file's size check guarantees the 24 header bytes */
    rd_u32(r, &magic);
    if (memcmp(&magic, "GGUF", 4) != 0)
        return ember_error_set(r->err, EMBER_ERR_FORMAT, "%s: not a GGUF file (bad magic)", path);
    rd_u32(r, &g->version);
    if (g->version != 2 && g->version != 3)
        return ember_error_set(r->err, EMBER_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (2 and 3 are)",
                               path, g->version);
    rd_u64(r, &g->n_tensors);
    rd_u64(r, &g->n_kv);
    /* Each key/value needs >= 13 bytes, each tensor info >= 29: reject counts the file can't hold.
     * The name indexes store 32-bit positions, far beyond any real file. */
    if (g->n_kv > (g->size - r->pos) / 13 || g->n_tensors > (g->size - r->pos) / 29 || g->n_kv >= UINT32_MAX ||
        g->n_tensors >= UINT32_MAX) {
        ember_status s =
            ember_error_set(r->err, EMBER_ERR_FORMAT,
                            "%s: header claims %llu tensors and %llu metadata keys, more than the file can hold", path,
                            (unsigned long long)g->n_tensors, (unsigned long long)g->n_kv);
        g->n_kv = g->n_tensors = 0;
        return s;
    }
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors || !index_init(&g->kv_index, g->n_kv) || !index_init(&g->tensor_index, g->n_tensors))
        return ember_error_set(r->err, EMBER_ERR_NOMEM, "%s: out of memory", path);
    return EMBER_OK;
}

/* The metadata keys and values, each key once; general.alignment read on the way. */
static ember_status read_metadata(ember_gguf *g, reader *r) {
    const char *path = r->path;
    char q[GGUF_NAME_SHOWN * 4 + 8];
    ember_status s;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        uint32_t type;
        if (!rd_str(r, &kv->key)) return fail(r, "truncated metadata key");
        ember_escape(q, sizeof q, kv->key.ptr, (size_t)kv->key.len, GGUF_NAME_SHOWN);
        if (!rd_u32(r, &type)) return fail(r, "truncated metadata value type");
        if (type >= GGUF_TYPE_COUNT)
            return ember_error_set(r->err, EMBER_ERR_FORMAT, "%s: metadata key '%s' has unknown value type %u", path, q,
                                   type);
        if (index_probe(g, &g->kv_index, kv_name, kv->key.ptr, (size_t)kv->key.len, true, (uint32_t)i) >= 0)
            return ember_error_set(r->err, EMBER_ERR_FORMAT, "%s: metadata key '%s' appears twice", path, q);
        if ((s = read_value(r, (gguf_value_type)type, &kv->value, 0)) != EMBER_OK) return s;
        if (gguf_str_eq(kv->key, "general.alignment")) {
            uint64_t a = kv->value.v.u64;
            if (type != GGUF_TYPE_UINT32 || a == 0 || (a & (a - 1)) != 0 || a > 65536)
                return ember_error_set(r->err, EMBER_ERR_FORMAT, "%s: general.alignment must be a u32 power of two",
                                       path);
            g->alignment = a;
        }
    }
    return EMBER_OK;
}

/* The tensor infos, each name once; the largest extent and the run of layers 0..n_blocks-1 that
 * all have tensors (a layer count beyond it cannot be backed by the file, however high a stray
 * "blk.N." name goes). */
static ember_status read_tensor_infos(ember_gguf *g, reader *r) {
    char q[GGUF_NAME_SHOWN * 4 + 8];
    bool *have_block = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *have_block); /* some tensor is "blk.N." */
    if (!have_block) return ember_error_set(r->err, EMBER_ERR_NOMEM, "%s: out of memory", r->path);
    ember_status s = EMBER_OK;
    for (uint64_t i = 0; i < g->n_tensors && s == EMBER_OK; i++) {
        gguf_tensor *t = &g->tensors[i];
        if ((s = read_tensor_info(r, t)) != EMBER_OK) break;
        if (index_probe(g, &g->tensor_index, tensor_name, t->name, strlen(t->name), true, (uint32_t)i) >= 0) {
            s = ember_error_set(r->err, EMBER_ERR_FORMAT, "%s: tensor '%s' appears twice", r->path,
                                ember_escape(q, sizeof q, t->name, strlen(t->name), GGUF_NAME_SHOWN));
            break;
        }
        int64_t blk = block_number(t->name);
        if (blk >= 0 && (uint64_t)blk < g->n_tensors) have_block[blk] = true;
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            if (t->ne[d] > g->max_extent) g->max_extent = t->ne[d];
    }
    while (s == EMBER_OK && (uint64_t)g->n_blocks < g->n_tensors && have_block[g->n_blocks]) g->n_blocks++;
    free(have_block);
    return s;
}

/* The data section at the next multiple of the alignment, and every tensor's data in it. */
static ember_status place_tensors(ember_gguf *g, const reader *r) {
    const char *path = r->path;
    char q[GGUF_NAME_SHOWN * 4 + 8];
    g->data_offset = (r->pos + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors > 0 && g->data_offset > g->size)
        return ember_error_set(r->err, EMBER_ERR_FORMAT, "%s: truncated before the tensor data section", path);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        ember_escape(q, sizeof q, t->name, strlen(t->name), GGUF_NAME_SHOWN);
        if (t->offset % g->alignment != 0)
            return ember_error_set(r->err, EMBER_ERR_FORMAT, "%s: tensor '%s' offset %llu is not aligned to %llu", path,
                                   q, (unsigned long long)t->offset, (unsigned long long)g->alignment);
        uint64_t avail = g->size - g->data_offset;
        if (t->offset > avail || t->size > avail - t->offset)
            return ember_error_set(r->err, EMBER_ERR_FORMAT,
                                   "%s: tensor '%s' (%zu bytes at offset %llu) runs past the end of the file "
                                   "(truncated?)",
                                   path, q, t->size, (unsigned long long)t->offset);
        t->data = g->base + g->data_offset + t->offset;
    }
    return EMBER_OK;
}

ember_status ember_gguf_open(const char *path, ember_gguf **out, ember_error *err) {
    *out = NULL;
    ember_gguf *g = NULL;
    ember_status s = map_file(path, &g, err);
    if (s != EMBER_OK) return s;
    reader r = {.base = g->base, .size = g->size, .pos = 0, .path = path, .err = err};
    if ((s = read_header(g, &r)) == EMBER_OK && (s = read_metadata(g, &r)) == EMBER_OK &&
        (s = read_tensor_infos(g, &r)) == EMBER_OK && (s = place_tensors(g, &r)) == EMBER_OK &&
        ember_mapguard_faulted(g->guard))
        s = ember_error_set(err, EMBER_ERR_IO, "%s: the file was truncated while it was being read", path);
    if (s != EMBER_OK) {
        ember_gguf_close(g);
        return s;
    }
    *out = g;
    return EMBER_OK;
}

void ember_gguf_close(ember_gguf *g) {
    if (!g) return;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) value_free(&g->kv[i].value);
    if (g->tensors)
        for (uint64_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    free(g->kv_index.slots);
    free(g->tensor_index.slots);
    if (g->base) {
        ember_mapguard_remove(g->guard);
        munmap((void *)g->base, g->size);
    }
    if (g->fd >= 0) close(g->fd);
    free(g->path);
    free(g);
}

ember_status ember_gguf_check_unchanged(const ember_gguf *g, ember_error *err) {
    if (ember_mapguard_faulted(g->guard))
        return ember_error_set(err, EMBER_ERR_IO,
                               "%s: the model file was truncated while in use (weights past its new end read as "
                               "zeros); reload the model",
                               g->path);
    struct stat st;
    if (fstat(g->fd, &st) != 0)
        return ember_error_set(err, EMBER_ERR_IO, "%s: cannot stat the model file: %s", g->path, strerror(errno));
    int64_t mtime = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    if ((uint64_t)st.st_size != g->size || mtime != g->st_mtime_ns)
        return ember_error_set(err, EMBER_ERR_IO,
                               "%s: the model file changed after it was loaded (%zu bytes then, %lld now%s); "
                               "reload the model",
                               g->path, g->size, (long long)st.st_size,
                               (uint64_t)st.st_size == g->size ? ", rewritten in place" : "");
    return EMBER_OK;
}

const gguf_kv *ember_gguf_find(const ember_gguf *g, const char *key) {
    int64_t i = index_probe(g, &g->kv_index, kv_name, key, strlen(key), false, 0);
    return i >= 0 ? &g->kv[i] : NULL;
}

const gguf_tensor *ember_gguf_find_tensor(const ember_gguf *g, const char *name) {
    int64_t i = index_probe(g, &g->tensor_index, tensor_name, name, strlen(name), false, 0);
    return i >= 0 ? &g->tensors[i] : NULL;
}

static bool value_is_signed(gguf_value_type t) {
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}
static bool value_is_unsigned(gguf_value_type t) {
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}

bool ember_gguf_get_int(const ember_gguf *g, const char *key, int64_t *out) {
    const gguf_kv *kv = ember_gguf_find(g, key);
    if (!kv) return false;
    if (value_is_signed(kv->value.type)) {
        *out = kv->value.v.i64;
        return true;
    }
    if (value_is_unsigned(kv->value.type) && kv->value.v.u64 <= (uint64_t)INT64_MAX) {
        *out = (int64_t)kv->value.v.u64;
        return true;
    }
    return false;
}

bool ember_gguf_get_float(const ember_gguf *g, const char *key, double *out) {
    const gguf_kv *kv = ember_gguf_find(g, key);
    if (!kv) return false;
    if (kv->value.type == GGUF_TYPE_FLOAT32 || kv->value.type == GGUF_TYPE_FLOAT64) *out = kv->value.v.f64;
    else if (value_is_signed(kv->value.type)) *out = (double)kv->value.v.i64;
    else if (value_is_unsigned(kv->value.type)) *out = (double)kv->value.v.u64;
    else return false;
    return true;
}

bool ember_gguf_get_bool(const ember_gguf *g, const char *key, bool *out) {
    const gguf_kv *kv = ember_gguf_find(g, key);
    if (!kv || kv->value.type != GGUF_TYPE_BOOL) return false;
    *out = kv->value.v.b;
    return true;
}

char *ember_gguf_get_string(const ember_gguf *g, const char *key) {
    const gguf_kv *kv = ember_gguf_find(g, key);
    if (!kv || kv->value.type != GGUF_TYPE_STRING) return NULL;
    char *s = malloc(kv->value.v.str.len + 1);
    if (!s) return NULL;
    memcpy(s, kv->value.v.str.ptr, kv->value.v.str.len);
    s[kv->value.v.str.len] = 0;
    return s;
}

bool ember_gguf_array_number(const gguf_value *a, uint64_t i, double *out) {
    if (a->type != GGUF_TYPE_ARRAY || i >= a->v.arr.count) return false;
    gguf_value_type t = a->v.arr.elem_type;
    if (t == GGUF_TYPE_STRING || t == GGUF_TYPE_ARRAY) return false;
    const uint8_t *p = a->v.arr.data + i * scalar_size[t];
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
        float f32;
        double f64;
    } u;
    memcpy(&u, p, scalar_size[t]);
    switch (t) {
    case GGUF_TYPE_UINT8: *out = u.u8; break;
    case GGUF_TYPE_INT8: *out = u.i8; break;
    case GGUF_TYPE_UINT16: *out = u.u16; break;
    case GGUF_TYPE_INT16: *out = u.i16; break;
    case GGUF_TYPE_UINT32: *out = u.u32; break;
    case GGUF_TYPE_INT32: *out = u.i32; break;
    case GGUF_TYPE_UINT64: *out = (double)u.u64; break;
    case GGUF_TYPE_INT64: *out = (double)u.i64; break;
    case GGUF_TYPE_FLOAT32: *out = u.f32; break;
    case GGUF_TYPE_FLOAT64: *out = u.f64; break;
    case GGUF_TYPE_BOOL: *out = u.u8 != 0; break;
    default: return false;
    }
    return true;
}

bool ember_gguf_array_string(const gguf_value *a, uint64_t i, gguf_str *out) {
    if (a->type != GGUF_TYPE_ARRAY || a->v.arr.elem_type != GGUF_TYPE_STRING || i >= a->v.arr.count) return false;
    /* read_array checked every length against the file when it recorded the offsets */
    const uint8_t *p = a->v.arr.data + a->v.arr.str_off[i];
    memcpy(&out->len, p, sizeof out->len);
    out->ptr = (const char *)p + sizeof out->len;
    return true;
}

void ember_gguf_advise_willneed(const ember_gguf *g) {
    if (!g->base || g->data_offset >= g->size) return;
    /* madvise wants a page-aligned start: round the data section's start down to its page */
    long page = sysconf(_SC_PAGESIZE);
    size_t start = page > 0 ? g->data_offset / (size_t)page * (size_t)page : 0;
    madvise((void *)(g->base + start), g->size - start, MADV_WILLNEED);
}

void ember_gguf_read(const ember_gguf *g, const void *p, void *dst, size_t n) {
    const size_t off = (size_t)((const uint8_t *)p - g->base);
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(g->fd, (uint8_t *)dst + got, n - got, (off_t)(off + got));
        if (k > 0) {
            got += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        break;
    }
    if (got == n) return;
    /* The file shrank: the mapping's guard gives what an evaluation reading it would see (zeros),
     * and the check after the evaluation reports the change. A read error: the mapping's bytes. */
    memcpy((uint8_t *)dst + got, (const uint8_t *)p + got, n - got);
}
