/* compute.c — a model's compute context (kernel table, thread pool, activation scratch), the
 * threaded matrix products and the threaded attention (chunked and fused, and in two scalar
 * passes for the attention_pattern stage). Must not hold model knowledge or change what a kernel
 * computes: it only decides which thread computes which output rows or heads. */
#include "kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Activations are prepared (quantized) for at most this many tokens at a time; longer batches are
 * processed in chunks, so the scratch stays bounded (act_size * EMBER_ACT_CHUNK bytes). */
#define EMBER_ACT_CHUNK EMBER_MATMUL_MAX_TOKENS
/* Output rows are handed out in multiples of this (a multiple of every kernel's row tile). */
#define EMBER_ROW_GRAIN 16

struct ember_compute {
    const ember_kernel_ops *ops;
    ember_kernels kernels;
    ember_pool *pool;
    pthread_mutex_t mu; /* guards xa: one product at a time per model */
    uint8_t *xa;        /* (EMBER_ACT_CHUNK, act_size) prepared activations, grown during warm-up */
    size_t xa_cap;
    void **packs;       /* (n_packs) arena chunks holding the repacked weight copies */
    size_t *pack_sizes; /* (n_packs) */
    int64_t n_packs, cap_packs;
    uint8_t *arena_next; /* free space at the end of the last chunk */
    size_t arena_left;
    size_t packed_bytes;
    bool no_packing; /* EMBER_WEIGHTS=mapped */
};

ember_status ember_compute_new(ember_kernels want, int n_threads, ember_compute **out, ember_error *err) {
    *out = NULL;
    ember_kernels chosen;
    const ember_kernel_ops *ops;
    ember_status st = ember_kernels_resolve(want, &chosen, &ops, err);
    if (st != EMBER_OK) return st;
    ember_compute *c = calloc(1, sizeof *c);
    if (!c) return ember_error_set(err, EMBER_ERR_NOMEM, "ember_compute_new: out of memory");
    c->ops = ops;
    c->kernels = chosen;
    const char *wenv = getenv("EMBER_WEIGHTS");
    c->no_packing = wenv && strcmp(wenv, "mapped") == 0;
    pthread_mutex_init(&c->mu, NULL);
    st = ember_pool_new(n_threads < 1 ? 1 : n_threads, &c->pool, err);
    if (st != EMBER_OK) {
        ember_compute_free(c);
        return st;
    }
    *out = c;
    return EMBER_OK;
}

void ember_compute_free(ember_compute *c) {
    if (!c) return;
    for (int64_t i = 0; i < c->n_packs; i++) munmap(c->packs[i], c->pack_sizes[i]);
    free(c->packs);
    free(c->pack_sizes);
    ember_pool_free(c->pool);
    pthread_mutex_destroy(&c->mu);
    free(c->xa);
    free(c);
}

static ember_status grow(ember_compute *c, size_t need, ember_error *err) {
    if (need <= c->xa_cap) return EMBER_OK;
    uint8_t *p = realloc(c->xa, need);
    if (!p)
        return ember_error_set(err, EMBER_ERR_NOMEM,
                               "ember_compute_reserve: cannot allocate %zu bytes of activation scratch", need);
    c->xa = p;
    c->xa_cap = need;
    return EMBER_OK;
}

/* Bytes of one prepared token for products with mm (0: the f32 rows are used as they are). */
static size_t act_stride(const ember_type_kernels *mm, int64_t n_in) { return mm->act_size ? mm->act_size(n_in) : 0; }

ember_status ember_compute_reserve(ember_compute *c, ember_type type, int64_t n_in, ember_error *err) {
    const ember_type_kernels *mm = ember_kernels_mm(c->ops, type);
    if (!mm)
        return ember_error_set(err, EMBER_ERR_UNSUPPORTED, "kernels '%s' have no matrix product for weights of type %s",
                               c->ops->name, ember_type_name((uint32_t)type));
    pthread_mutex_lock(&c->mu);
    ember_status st = grow(c, act_stride(mm, n_in) * EMBER_ACT_CHUNK, err);
    pthread_mutex_unlock(&c->mu);
    return st;
}

typedef struct {
    const ember_type_kernels *mm;
    const ember_matrix *w;
    uint8_t *dst;
    size_t group_bytes;
} pack_job;

static void pack_groups(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const pack_job *j = arg;
    ember_matrix sub = *j->w;
    sub.data = (const uint8_t *)j->w->data + (size_t)(4 * begin) * j->w->row_bytes;
    sub.n_out = (4 * end < j->w->n_out ? 4 * end : j->w->n_out) - 4 * begin;
    j->mm->pack(&sub, j->dst + (size_t)begin * j->group_bytes);
}

/* Repacked weights live in large anonymous mappings ("arena chunks"), 2 MiB aligned with
 * transparent huge pages requested, filled in the order the loader packs the matrices: consecutive
 * products then read consecutive memory, and few TLB entries cover all of it. (One mapping per
 * matrix left most small matrices, and the unaligned ends of the others, on 4 KiB pages.) */
#define EMBER_ARENA_CHUNK ((size_t)256 << 20)
#define EMBER_HUGE_PAGE ((size_t)2 << 20)

static ember_status arena_chunk(ember_compute *c, size_t want, ember_error *err) {
    if (c->n_packs == c->cap_packs) {
        int64_t cap = c->cap_packs ? 2 * c->cap_packs : 16;
        void **p = realloc(c->packs, (size_t)cap * sizeof *p);
        if (p) c->packs = p;
        size_t *q = p ? realloc(c->pack_sizes, (size_t)cap * sizeof *q) : NULL;
        if (q) c->pack_sizes = q;
        if (!p || !q) return ember_error_set(err, EMBER_ERR_NOMEM, "ember_compute_pack: out of memory");
        c->cap_packs = cap;
    }
    const size_t size = (want + EMBER_HUGE_PAGE - 1) / EMBER_HUGE_PAGE * EMBER_HUGE_PAGE;
    uint8_t *raw = mmap(NULL, size + EMBER_HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return ember_error_set(err, EMBER_ERR_NOMEM,
                               "ember_compute_pack: cannot allocate %zu bytes for repacked weights", size);
    /* keep the 2 MiB aligned part, give back the rest */
    uint8_t *start = (uint8_t *)(((uintptr_t)raw + EMBER_HUGE_PAGE - 1) & ~(uintptr_t)(EMBER_HUGE_PAGE - 1));
    if (start > raw) munmap(raw, (size_t)(start - raw));
    if (raw + size + EMBER_HUGE_PAGE > start + size)
        munmap(start + size, (size_t)(raw + size + EMBER_HUGE_PAGE - (start + size)));
#ifdef MADV_HUGEPAGE
    madvise(start, size, MADV_HUGEPAGE);
#endif
    c->packs[c->n_packs] = start;
    c->pack_sizes[c->n_packs++] = size;
    c->arena_next = start;
    c->arena_left = size;
    return EMBER_OK;
}

ember_status ember_compute_pack(ember_compute *c, ember_matrix *w, bool release_source, ember_error *err) {
    const ember_type_kernels *mm = ember_kernels_mm(c->ops, w->type);
    if (c->no_packing || !mm || !mm->pack || w->packed || !w->data) return EMBER_OK;
    const size_t bytes = mm->pack_size(w);
    if (bytes == 0) return EMBER_OK;
    const size_t reserved = (bytes + 4095) & ~(size_t)4095; /* page-aligned starts */
    if (reserved > c->arena_left) {
        ember_status st = arena_chunk(c, reserved > EMBER_ARENA_CHUNK ? reserved : EMBER_ARENA_CHUNK, err);
        if (st != EMBER_OK) return st;
    }
    uint8_t *dst = c->arena_next;
    c->arena_next += reserved;
    c->arena_left -= reserved;
    /* Pack 4-row groups in parallel: the layout is one run per group, so a sub-matrix of whole
     * groups packs into its own slice. (The first touch of mapped pages dominates the cost.) */
    pack_job j = {.mm = mm, .w = w, .dst = dst};
    ember_matrix four = *w;
    four.n_out = 4;
    j.group_bytes = mm->pack_size(&four);
    ember_pool_for(c->pool, (w->n_out + 3) / 4, 8, pack_groups, &j);
    c->packed_bytes += bytes;
    if (release_source) {
        /* Drop the source pages (whole pages inside the tensor only) from this process: the copy
         * is what the fast path reads. A read-only file mapping's pages stay in the page cache
         * and fault back in from the file if anything reads `data` again. */
        const size_t page = (size_t)sysconf(_SC_PAGESIZE), src_bytes = w->row_bytes * (size_t)w->n_out;
        uintptr_t b = ((uintptr_t)w->data + page - 1) & ~(uintptr_t)(page - 1);
        uintptr_t e = ((uintptr_t)w->data + src_bytes) & ~(uintptr_t)(page - 1);
        if (e > b) madvise((void *)b, e - b, MADV_DONTNEED);
    }
    w->packed = dst;
    return EMBER_OK;
}

size_t ember_compute_packed_bytes(const ember_compute *c) { return c->packed_bytes; }

const ember_kernel_ops *ember_compute_ops(const ember_compute *c) { return c->ops; }
ember_kernels ember_compute_kernels(const ember_compute *c) { return c->kernels; }
int ember_compute_threads(const ember_compute *c) { return ember_pool_threads(c->pool); }

void ember_compute_for(ember_compute *c, int64_t n, int64_t grain, ember_pool_fn fn, void *arg) {
    ember_pool_for(c->pool, n, grain, fn, arg);
}

typedef struct {
    const ember_type_kernels *mm;
    const ember_matrix *w;
    const float *x; /* (n_tok, n_in) */
    uint8_t *xa;    /* (n_tok, xa_stride) or NULL */
    size_t xa_stride;
    float *y; /* (n_tok, n_out) */
    int64_t n_tok;
} matmul_job;

static void prepare_tokens(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    matmul_job *j = arg;
    for (int64_t t = begin; t < end; t++)
        j->mm->act_prepare(j->x + t * j->w->n_in, j->xa + (size_t)t * j->xa_stride, j->w->n_in);
}

static void product_rows(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    matmul_job *j = arg;
    j->mm->rows(j->w, j->x, j->xa, j->xa_stride, j->y, j->n_tok, begin, end);
}

/* Several matrices sharing one input: their output rows are laid end to end, each matrix's
 * segment starting at a multiple of EMBER_ROW_GRAIN (so every local o0 a chunk produces is one
 * too), and one pool job covers them all. */
typedef struct {
    const ember_type_kernels *mm; /* the one type's product */
    int n;
    const ember_matrix *const *w;
    float *const *y;
    const int64_t *start; /* (n + 1) row offsets of the segments; start[n] = total */
    const float *x;
    const uint8_t *xa;
    size_t xa_stride;
    int64_t t0, n_tok; /* this chunk of tokens: x, xa and y rows t0.. */
} multi_job;

static void multi_rows(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const multi_job *j = arg;
    for (int i = 0; i < j->n && j->start[i] < end; i++) {
        const ember_matrix *w = j->w[i];
        int64_t o0 = begin - j->start[i], o1 = end - j->start[i];
        if (o0 < 0) o0 = 0;
        if (o1 > w->n_out) o1 = w->n_out;
        if (o0 >= o1) continue;
        j->mm->rows(w, j->x + j->t0 * w->n_in, j->xa, j->xa_stride, j->y[i] + j->t0 * w->n_out, j->n_tok, o0, o1);
    }
}

/* Failing here cannot be reported from inside a forward pass; both are ember bugs (the loader
 * calls ember_compute_reserve for every matrix, which checks the type and sizes the scratch). */
static void die(const char *what) {
    fprintf(stderr, "ember: %s\n", what);
    abort();
}

static const ember_type_kernels *product_for(const ember_compute *c, const ember_matrix *w) {
    const ember_type_kernels *mm = ember_kernels_mm(c->ops, w->type);
    if (!mm)
        die("a matrix product with a weight type the kernel set has no product for (ember_compute_reserve was "
            "skipped)");
    return mm;
}

static void ensure_scratch(ember_compute *c, size_t stride) {
    if (stride * EMBER_ACT_CHUNK > c->xa_cap) {
        /* Only when the caller skipped ember_compute_reserve for this width (tests do): grow once. */
        ember_error e;
        if (grow(c, stride * EMBER_ACT_CHUNK, &e) != EMBER_OK) die(e.msg);
    }
}

void ember_matmul(ember_compute *c, const ember_matrix *w, const float *x, float *y, int64_t n_tok) {
    const ember_type_kernels *mm = product_for(c, w);
    const size_t stride = act_stride(mm, w->n_in);
    if (stride == 0) {
        matmul_job j = {.mm = mm, .w = w, .x = x, .y = y, .n_tok = n_tok};
        ember_pool_for(c->pool, w->n_out, EMBER_ROW_GRAIN, product_rows, &j);
        return;
    }
    pthread_mutex_lock(&c->mu);
    ensure_scratch(c, stride);
    for (int64_t t0 = 0; t0 < n_tok; t0 += EMBER_ACT_CHUNK) {
        const int64_t nt = n_tok - t0 < EMBER_ACT_CHUNK ? n_tok - t0 : EMBER_ACT_CHUNK;
        matmul_job j = {.mm = mm,
                        .w = w,
                        .x = x + t0 * w->n_in,
                        .xa = c->xa,
                        .xa_stride = stride,
                        .y = y + t0 * w->n_out,
                        .n_tok = nt};
        ember_pool_for(c->pool, nt, 4, prepare_tokens, &j);
        ember_pool_for(c->pool, w->n_out, EMBER_ROW_GRAIN, product_rows, &j);
    }
    pthread_mutex_unlock(&c->mu);
}

void ember_matmul_multi(ember_compute *c, int n, const ember_matrix *const w[], const float *x, float *const y[],
                        int64_t n_tok) {
    if (n <= 0) return;
    bool shared = n <= EMBER_MATMUL_MULTI_MAX;
    for (int i = 1; i < n && shared; i++) shared = w[i]->type == w[0]->type && w[i]->n_in == w[0]->n_in;
    if (!shared) { /* inputs prepared differently: one product each */
        for (int i = 0; i < n; i++) ember_matmul(c, w[i], x, y[i], n_tok);
        return;
    }
    const ember_type_kernels *mm = product_for(c, w[0]);
    const size_t stride = act_stride(mm, w[0]->n_in);
    int64_t start[EMBER_MATMUL_MULTI_MAX + 1];
    start[0] = 0;
    for (int i = 0; i < n; i++)
        start[i + 1] = start[i] + (w[i]->n_out + EMBER_ROW_GRAIN - 1) / EMBER_ROW_GRAIN * EMBER_ROW_GRAIN;
    multi_job j = {.mm = mm, .n = n, .w = w, .y = y, .start = start, .x = x, .xa_stride = stride};
    if (stride == 0) {
        j.n_tok = n_tok;
        ember_pool_for(c->pool, start[n], EMBER_ROW_GRAIN, multi_rows, &j);
        return;
    }
    pthread_mutex_lock(&c->mu);
    ensure_scratch(c, stride);
    j.xa = c->xa;
    for (int64_t t0 = 0; t0 < n_tok; t0 += EMBER_ACT_CHUNK) {
        const int64_t nt = n_tok - t0 < EMBER_ACT_CHUNK ? n_tok - t0 : EMBER_ACT_CHUNK;
        matmul_job p = {.mm = mm, .w = w[0], .x = x + t0 * w[0]->n_in, .xa = c->xa, .xa_stride = stride, .n_tok = nt};
        ember_pool_for(c->pool, nt, 4, prepare_tokens, &p);
        j.t0 = t0;
        j.n_tok = nt;
        ember_pool_for(c->pool, start[n], EMBER_ROW_GRAIN, multi_rows, &j);
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- attention: chunks of keys, each chunk's partials folded in chunk order ----
 *
 * Every query row (one query head of one token) is computed the same way whatever the thread
 * count or the grouping of rows: its visible keys are cut at multiples of EMBER_ATTN_CHUNK
 * (absolute positions), ops->attn_chunk gives each chunk's (max, sum, weighted values), and the
 * chunks are folded in increasing order (attn_fold). So results are identical for every thread
 * count and for either way of splitting the work below, and avx2 = avx512 as long as their
 * attn_chunk agree (they do bit for bit; docs/kernels.md). */

/* Floats of per-thread scratch: one call's scores, its partials and the running fold, for up to
 * EMBER_ATTN_MAX_ROWS rows of hd values. */
static int64_t attn_thread_floats(int64_t hd) { return (int64_t)EMBER_ATTN_MAX_ROWS * (EMBER_ATTN_CHUNK + 2 * hd + 4); }

int64_t ember_attention_scratch_floats(int n_threads, int64_t n_ctx, int64_t n_head, int64_t hd_max) {
    const int64_t chunks = (n_ctx + EMBER_ATTN_CHUNK - 1) / EMBER_ATTN_CHUNK;
    return (int64_t)n_threads * attn_thread_floats(hd_max) + n_head * chunks * (hd_max + 2);
}

/* A row's running fold before its first chunk: M = -inf, L = 0, A = 0. A row no chunk reaches
 * then comes out as 0 / 0 = NaN, never as whatever the scratch held. */
static void attn_fold_init(float *M, float *L, float *A, int64_t hd) {
    *M = -INFINITY;
    *L = 0.0f;
    memset(A, 0, (size_t)hd * sizeof(float));
}

/* Folds one chunk's partial (mc, lc, ac) into a row's running (M, L, A). A chunk without visible
 * keys (mc = -inf) changes nothing; the first one is taken as it is. A non-finite chunk (mc = NaN,
 * kernels.h) makes the row NaN for good: NaN propagates, it is never skipped as "no keys". */
static void attn_fold(float *M, float *L, float *A, float mc, float lc, const float *ac, int64_t hd) {
    if (mc == -INFINITY) return;
    if (isnan(mc) || isnan(*M)) {
        *M = *L = NAN;
        for (int64_t d = 0; d < hd; d++) A[d] = NAN;
        return;
    }
    if (*M == -INFINITY) {
        *M = mc;
        *L = lc;
        memcpy(A, ac, (size_t)hd * sizeof(float));
        return;
    }
    const float mn = mc > *M ? mc : *M, a = expf(*M - mn), b = expf(mc - mn);
    *L = *L * a + lc * b;
    for (int64_t d = 0; d < hd; d++) A[d] = A[d] * a + ac[d] * b;
    *M = mn;
}

typedef struct {
    const ember_kernel_ops *ops;
    const ember_attention_args *a;
    int64_t group; /* query heads per KV head */
    int64_t heads; /* query heads per item (a row group of one KV head) */
    int64_t n_rg;  /* row groups per KV head */
    int64_t tile;  /* tokens per item (tiled path) */
    int64_t n_tiles;
    int64_t n_chunks;         /* chunks of the whole cache (split path: partial slots per head) */
    int64_t c_first, c_count; /* split path: the chunks the single token sees */
    size_t esize;             /* bytes per cache element */
    float *part;              /* split path: (n_head, n_chunks, hd + 2) partials */
} attn_job;

/* The rows of item (g, rg) for tokens [t0, t0 + nt): query head-major within a token. */
static void attn_rows_of(const attn_job *j, int64_t g, int64_t rg, int64_t t0, int64_t nt, ember_attn_rows *r) {
    const ember_attention_args *a = j->a;
    const int64_t hd = a->hd, h0 = g * j->group + rg * j->heads;
    r->n_rows = 0;
    r->k = (const uint8_t *)a->k + (size_t)(g * a->kv_head_stride) * j->esize;
    r->v = (const uint8_t *)a->v + (size_t)(g * a->kv_head_stride) * j->esize;
    r->kv_stride = a->kv_stride;
    r->kv_type = a->kv_type;
    r->hd = hd;
    r->scale = a->scale;
    r->softcap = a->softcap;
    for (int64_t t = t0; t < t0 + nt; t++) {
        const int64_t p = a->pos0 + t, first = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        for (int64_t h = h0; h < h0 + j->heads; h++) {
            r->q[r->n_rows] = a->q + (t * a->n_head + h) * hd;
            r->lo[r->n_rows] = first;
            r->hi[r->n_rows] = p + 1;
            r->n_rows++;
        }
    }
}

/* Tiled path: an item is (KV head, row group, tile of tokens); it walks its chunks in order and
 * folds them as it goes. Tiles are taken from both ends alternately (0, last, 1, last-1, ...) so
 * that a thread's contiguous share of items holds about as much causal work as another's. */
static void attn_tiled_items(void *arg, int64_t begin, int64_t end, int tid) {
    const attn_job *j = arg;
    const ember_attention_args *a = j->a;
    const int64_t hd = a->hd;
    float *scores = a->scratch + (int64_t)tid * attn_thread_floats(hd),
          *m = scores + EMBER_ATTN_MAX_ROWS * EMBER_ATTN_CHUNK, *l = m + EMBER_ATTN_MAX_ROWS,
          *acc = l + EMBER_ATTN_MAX_ROWS, *M = acc + EMBER_ATTN_MAX_ROWS * hd, *L = M + EMBER_ATTN_MAX_ROWS,
          *A = L + EMBER_ATTN_MAX_ROWS;
    for (int64_t it = begin; it < end; it++) {
        const int64_t per_kv = j->n_rg * j->n_tiles, g = it / per_kv, rg = it % per_kv / j->n_tiles;
        const int64_t z = it % j->n_tiles, tile = z % 2 == 0 ? z / 2 : j->n_tiles - 1 - z / 2;
        const int64_t t0 = tile * j->tile, nt = a->n - t0 < j->tile ? a->n - t0 : j->tile;
        ember_attn_rows rows;
        attn_rows_of(j, g, rg, t0, nt, &rows);
        int64_t lo = rows.lo[0], hi = 0;
        for (int r = 0; r < rows.n_rows; r++) {
            attn_fold_init(&M[r], &L[r], A + r * hd, hd);
            if (rows.lo[r] < lo) lo = rows.lo[r];
            if (rows.hi[r] > hi) hi = rows.hi[r];
        }
        for (int64_t k0 = lo / EMBER_ATTN_CHUNK * EMBER_ATTN_CHUNK; k0 < hi; k0 += EMBER_ATTN_CHUNK) {
            j->ops->attn_chunk(&rows, k0, k0 + EMBER_ATTN_CHUNK, scores, m, l, acc);
            for (int r = 0; r < rows.n_rows; r++) attn_fold(&M[r], &L[r], A + r * hd, m[r], l[r], acc + r * hd, hd);
        }
        for (int r = 0; r < rows.n_rows; r++) {
            float *out = a->out + (rows.q[r] - a->q);
            for (int64_t d = 0; d < hd; d++) out[d] = A[r * hd + d] / L[r];
        }
    }
}

/* Split path, for one token when KV heads are too few to keep every thread busy: an item is
 * (KV head, row group, chunk); its partials go to their slots, folded afterwards per head. */
static void attn_split_items(void *arg, int64_t begin, int64_t end, int tid) {
    const attn_job *j = arg;
    const ember_attention_args *a = j->a;
    const int64_t hd = a->hd;
    float *scores = a->scratch + (int64_t)tid * attn_thread_floats(hd),
          *m = scores + EMBER_ATTN_MAX_ROWS * EMBER_ATTN_CHUNK, *l = m + EMBER_ATTN_MAX_ROWS,
          *acc = l + EMBER_ATTN_MAX_ROWS;
    for (int64_t it = begin; it < end; it++) {
        const int64_t c = j->c_first + it % j->c_count, grp = it / j->c_count, g = grp / j->n_rg, rg = grp % j->n_rg;
        ember_attn_rows rows;
        attn_rows_of(j, g, rg, 0, 1, &rows);
        j->ops->attn_chunk(&rows, c * EMBER_ATTN_CHUNK, (c + 1) * EMBER_ATTN_CHUNK, scores, m, l, acc);
        for (int r = 0; r < rows.n_rows; r++) {
            const int64_t h = g * j->group + rg * j->heads + r;
            float *slot = j->part + (h * j->n_chunks + c) * (hd + 2);
            if (m[r] == -INFINITY) { /* no visible key: l and acc were not written */
                attn_fold_init(&slot[0], &slot[1], slot + 2, hd);
                continue;
            }
            slot[0] = m[r];
            slot[1] = l[r];
            memcpy(slot + 2, acc + r * hd, (size_t)hd * sizeof(float));
        }
    }
}

static void attn_split_fold(void *arg, int64_t begin, int64_t end, int tid) {
    const attn_job *j = arg;
    const ember_attention_args *a = j->a;
    const int64_t hd = a->hd;
    float *M = a->scratch + (int64_t)tid * attn_thread_floats(hd), *L = M + 1, *A = L + 1;
    for (int64_t h = begin; h < end; h++) {
        attn_fold_init(M, L, A, hd);
        for (int64_t c = j->c_first; c < j->c_first + j->c_count; c++) {
            const float *slot = j->part + (h * j->n_chunks + c) * (hd + 2);
            attn_fold(M, L, A, slot[0], slot[1], slot + 2, hd);
        }
        float *out = a->out + h * hd;
        for (int64_t d = 0; d < hd; d++) out[d] = A[d] / *L;
    }
}

void ember_compute_attention(ember_compute *c, const ember_attention_args *a) {
    const int threads = ember_pool_threads(c->pool);
    attn_job j = {.ops = c->ops, .a = a, .group = a->n_head / a->n_head_kv};
    j.heads = j.group < EMBER_ATTN_MAX_ROWS ? j.group : EMBER_ATTN_MAX_ROWS;
    while (j.group % j.heads) j.heads--; /* row groups split a KV head's query heads evenly */
    j.n_rg = j.group / j.heads;
    j.tile = EMBER_ATTN_MAX_ROWS / j.heads;
    j.n_tiles = (a->n + j.tile - 1) / j.tile;
    j.esize = ember_type_row_size(a->kv_type, 1);
    const int64_t groups = a->n_head_kv * j.n_rg;
    if (a->n == 1 && groups < 2 * (int64_t)threads) {
        const int64_t p = a->pos0, first = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        j.c_first = first / EMBER_ATTN_CHUNK;
        j.c_count = p / EMBER_ATTN_CHUNK - j.c_first + 1;
        if (j.c_count > 1) {
            j.n_chunks = a->n_chunks_cap;
            j.part = a->scratch + (int64_t)threads * attn_thread_floats(a->hd);
            ember_pool_for(c->pool, groups * j.c_count, 1, attn_split_items, &j);
            ember_pool_for(c->pool, a->n_head, 1, attn_split_fold, &j);
            return;
        }
    }
    ember_pool_for(c->pool, groups * j.n_tiles, 1, attn_tiled_items, &j);
}

/* ---- the attention_pattern stage: attention in two passes, the pattern in memory ----
 * Plain scalar C, the same for every kernel set: scores and softmax into the pattern, then the
 * pattern times V. Each (head, token) item is computed by the same code whatever thread takes it,
 * so the result is identical for every set and thread count. It is a second implementation beside
 * the chunked fused path (not its order), used only when a hook wrote the pattern. */

typedef struct {
    const ember_attention_args *a;
    size_t esize;       /* bytes of one cache element (kv_type) */
    float *fill;        /* probs pass: the pattern it writes */
    const float *mixed; /* mix pass: the pattern it reads */
} pattern_job;

/* Key or value j of KV head g in the head-major cache. */
static const uint8_t *pattern_kv_row(const pattern_job *j, const void *base, int64_t g, int64_t key) {
    const ember_attention_args *a = j->a;
    return (const uint8_t *)base + (size_t)(g * a->kv_head_stride + key * a->kv_stride) * j->esize;
}

/* The keys query t sees: first..p (p = pos0 + t; a window keeps the last `window` of them). */
static void visible_keys(const ember_attention_args *a, int64_t t, int64_t *first, int64_t *p) {
    *p = a->pos0 + t;
    *first = a->window > 0 && *p - a->window + 1 > 0 ? *p - a->window + 1 : 0;
}

/* Items are (head, token) pairs in head-major order. */
static void probs_items(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const pattern_job *j = arg;
    const ember_attention_args *a = j->a;
    const int64_t hd = a->hd, group = a->n_head / a->n_head_kv, n_keys = a->pos0 + a->n;
    for (int64_t it = begin; it < end; it++) {
        const int64_t h = it / a->n, t = it % a->n, g = h / group;
        int64_t first, p;
        visible_keys(a, t, &first, &p);
        float *row = j->fill + (h * a->n + t) * n_keys;
        const float *q = a->q + (t * a->n_head + h) * hd;
        for (int64_t k = 0; k < first; k++) row[k] = 0.0f; /* masked keys are exactly 0 */
        for (int64_t k = p + 1; k < n_keys; k++) row[k] = 0.0f;
        for (int64_t k = first; k <= p; k++) {
            const uint8_t *kr = pattern_kv_row(j, a->k, g, k);
            float dot = 0.0f;
            for (int64_t i = 0; i < hd; i++) dot += q[i] * ember_kv_element(a->kv_type, kr, i);
            row[k] = dot * a->scale;
        }
        if (a->softcap > 0.0f) ember_attn_softcap(row + first, p + 1 - first, a->softcap);
        ember_softmax(row + first, p + 1 - first);
    }
}

/* Mixes the values with the row as it now is. The visible range is always mixed; a masked key
 * counts only if a hook wrote something other than 0 there, and then the range grows to reach it. */
static void mix_items(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const pattern_job *j = arg;
    const ember_attention_args *a = j->a;
    const int64_t hd = a->hd, group = a->n_head / a->n_head_kv, n_keys = a->pos0 + a->n;
    for (int64_t it = begin; it < end; it++) {
        const int64_t h = it / a->n, t = it % a->n, g = h / group;
        int64_t lo, hi;
        visible_keys(a, t, &lo, &hi);
        const float *row = j->mixed + (h * a->n + t) * n_keys;
        for (int64_t k = 0; k < lo; k++)
            if (row[k] != 0.0f) {
                lo = k;
                break;
            }
        for (int64_t k = n_keys - 1; k > hi; k--)
            if (row[k] != 0.0f) {
                hi = k;
                break;
            }
        float *out = a->out + (t * a->n_head + h) * hd;
        memset(out, 0, (size_t)hd * sizeof(float));
        for (int64_t k = lo; k <= hi; k++) {
            const uint8_t *vr = pattern_kv_row(j, a->v, g, k);
            for (int64_t d = 0; d < hd; d++) out[d] += row[k] * ember_kv_element(a->kv_type, vr, d);
        }
    }
}

void ember_compute_attention_probs(ember_compute *c, const ember_attention_args *a, float *pattern) {
    pattern_job j = {.a = a, .esize = ember_type_row_size(a->kv_type, 1), .fill = pattern};
    ember_pool_for(c->pool, a->n * a->n_head, 1, probs_items, &j);
}

void ember_compute_attention_mix(ember_compute *c, const ember_attention_args *a, const float *pattern) {
    pattern_job j = {.a = a, .esize = ember_type_row_size(a->kv_type, 1), .mixed = pattern};
    ember_pool_for(c->pool, a->n * a->n_head, 1, mix_items, &j);
}
