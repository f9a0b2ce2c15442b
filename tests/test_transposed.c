/* test_transposed.c — the transposed product dx = g W of the backward pass, for every weight type:
 * every set bit for bit against a transcription of kernels.h's order written here (chunks of
 * EMBER_MATMUL_T_CHUNK rows, product then add), on sizes that hit every tail of tokens, rows and
 * columns; within a rounding bound of the same sum in double; and ember_matmul_t identical on 1, 2
 * and 3 threads. The weights come from the project's quantizers over Gaussian rows. */
#include "kernels.h"
#include "quants.h"
#include "test_matmul.h"
#include "test_rng.h"
#include "test_support.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static ember_test_rng rng = {0x51ed270b7f1a3c5dull};
static float gaussian(void) { return ember_test_rng_gaussian(&rng, 6, 0.7f); }

typedef struct {
    ember_type type;
    void (*quantize)(const float *, void *, int64_t); /* NULL: f32, f16, bf16 (converted here) */
} ttype;

static void q8_0(const float *x, void *y, int64_t n) { ember_quantize_row_q8_0(x, y, n); }

static const ttype types[] = {
    {EMBER_TYPE_F32, NULL},
    {EMBER_TYPE_F16, NULL},
    {EMBER_TYPE_BF16, NULL},
    {EMBER_TYPE_Q8_0, q8_0},
    {EMBER_TYPE_Q4_0, ember_quantize_row_q4_0},
    {EMBER_TYPE_Q4_1, ember_quantize_row_q4_1},
    {EMBER_TYPE_Q5_0, ember_quantize_row_q5_0},
    {EMBER_TYPE_Q5_1, ember_quantize_row_q5_1},
    {EMBER_TYPE_Q2_K, ember_quantize_row_q2_k},
    {EMBER_TYPE_Q3_K, ember_quantize_row_q3_k},
    {EMBER_TYPE_Q4_K, ember_quantize_row_q4_k},
    {EMBER_TYPE_Q5_K, ember_quantize_row_q5_k},
    {EMBER_TYPE_Q6_K, ember_quantize_row_q6_k},
};
#define N_TYPES (sizeof types / sizeof types[0])

static const char *tname(ember_type t) { return ember_type_name((uint32_t)t); }

static ember_matrix make_matrix(const ttype *q, int64_t n_out, int64_t n_in, void **buf) {
    ember_matrix m = {.type = q->type, .n_in = n_in, .n_out = n_out, .row_bytes = ember_type_row_size(q->type, n_in)};
    uint8_t *p = malloc(m.row_bytes * (size_t)n_out + 64);
    float *row = malloc(sizeof(float) * (size_t)n_in);
    for (int64_t o = 0; o < n_out; o++) {
        uint8_t *r = p + (size_t)o * m.row_bytes;
        for (int64_t i = 0; i < n_in; i++) row[i] = gaussian() * (i % 37 == 5 ? 6.0f : 1.0f);
        if (q->quantize) q->quantize(row, r, n_in);
        else
            for (int64_t i = 0; i < n_in; i++) {
                const uint16_t h = q->type == EMBER_TYPE_F16 ? ember_f32_to_f16(row[i]) : ember_f32_to_bf16(row[i]);
                if (q->type == EMBER_TYPE_F32) memcpy(r + 4 * i, &row[i], 4);
                else memcpy(r + 2 * i, &h, 2);
            }
    }
    free(row);
    *buf = p;
    m.data = p;
    return m;
}

/* The order of kernels.h, written out: per chunk a partial from +0, product then add; the partials
 * folded in chunk order. The weights through the type's to_float. w_f32: (n_out, n_in) scratch. */
static void transcription(const ember_matrix *w, const float *g, float *dx, int64_t n_tok, float *w_f32) {
    const ember_type_traits *tr = ember_type_traits_get((uint32_t)w->type);
    for (int64_t o = 0; o < w->n_out; o++)
        tr->to_float((const uint8_t *)w->data + (size_t)o * w->row_bytes, w_f32 + o * w->n_in, w->n_in);
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < w->n_in; i++) {
            float total = 0.0f;
            for (int64_t o0 = 0; o0 < w->n_out; o0 += EMBER_MATMUL_T_CHUNK) {
                volatile float s = 0.0f; /* one rounding per product and per add */
                for (int64_t o = o0; o < w->n_out && o < o0 + EMBER_MATMUL_T_CHUNK; o++) {
                    volatile float prod = g[t * w->n_out + o] * w_f32[o * w->n_in + i];
                    s = s + prod;
                }
                total = o0 == 0 ? s : total + s;
            }
            dx[t * w->n_in + i] = total;
        }
}

/* max |dx - exact| / bound, where exact is the double sum and bound the sum's worst rounding:
 * (rows per chunk + chunks + 1) * eps * sum |g w|. <= 1 passes. */
static double rounding_ratio(const ember_matrix *w, const float *g, const float *dx, int64_t n_tok,
                             const float *w_f32) {
    const int64_t chunks = (w->n_out + EMBER_MATMUL_T_CHUNK - 1) / EMBER_MATMUL_T_CHUNK;
    double worst = 0.0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < w->n_in; i++) {
            double exact = 0.0, mag = 0.0;
            for (int64_t o = 0; o < w->n_out; o++) {
                const double p = (double)g[t * w->n_out + o] * (double)w_f32[o * w->n_in + i];
                exact += p;
                mag += fabs(p);
            }
            const double bound = (double)(EMBER_MATMUL_T_CHUNK + chunks + 1) * FLT_EPSILON * mag + 1e-30;
            const double r = fabs((double)dx[t * w->n_in + i] - exact) / bound;
            if (r > worst) worst = r;
        }
    return worst;
}

static const ember_kernel_ops *set_table(ember_kernels k) { return ember_kernels_table(k); }

/* One case: the matrix, random gradients, the transcription's dx and room for a set's. */
typedef struct {
    ember_matrix w;
    void *buf;
    float *g, *want, *got, *w_f32;
    size_t nx;
    int64_t n_tok;
} tcase;

static tcase case_new(const ttype *q, int64_t n_out, int64_t n_in, int64_t n_tok) {
    tcase c = {.n_tok = n_tok, .nx = (size_t)(n_tok * n_in)};
    c.w = make_matrix(q, n_out, n_in, &c.buf);
    c.g = malloc(sizeof(float) * (size_t)(n_tok * n_out));
    c.want = malloc(sizeof(float) * c.nx);
    c.got = malloc(sizeof(float) * c.nx);
    c.w_f32 = malloc(sizeof(float) * (size_t)(n_out * n_in));
    for (int64_t i = 0; i < n_tok * n_out; i++) c.g[i] = gaussian();
    transcription(&c.w, c.g, c.want, n_tok, c.w_f32);
    memset(c.got, 0xff, sizeof(float) * c.nx);
    return c;
}

static void case_free(tcase *c) {
    free(c->g);
    free(c->want);
    free(c->got);
    free(c->w_f32);
    free(c->buf);
}

static const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
#define N_SETS (sizeof sets / sizeof sets[0])

/* One (type, n_out, n_in, n_tok) case on every set this CPU runs. */
static void check_case(const ttype *q, int64_t n_out, int64_t n_in, int64_t n_tok) {
    tcase c = case_new(q, n_out, n_in, n_tok);
    const double ratio = rounding_ratio(&c.w, c.g, c.want, n_tok, c.w_f32);
    CHECK_MSG(ratio <= 1.0, "%s %lldx%lld, %lld tokens: %.3g of the rounding bound from the double sum", tname(q->type),
              (long long)n_out, (long long)n_in, (long long)n_tok, ratio);
    for (size_t s = 0; s < N_SETS; s++) {
        const ember_kernel_ops *ops = set_table(sets[s]);
        if (!ops) continue; /* a set this CPU cannot run (said once in main) */
        CHECK_MSG(ops->mm_t[q->type] != NULL, "%s has no transposed product for %s", ops->name, tname(q->type));
        if (!ops->mm_t[q->type]) continue;
        memset(c.got, 0xff, sizeof(float) * c.nx);
        ops->mm_t[q->type](&c.w, c.g, c.got, n_tok, 0, n_in);
        CHECK_MSG(memcmp(c.got, c.want, sizeof(float) * c.nx) == 0,
                  "%s %s %lldx%lld, %lld tokens: not the documented order", ops->name, tname(q->type), (long long)n_out,
                  (long long)n_in, (long long)n_tok);
    }
    case_free(&c);
}

/* ember_matmul_t on 1, 2 and 3 threads of each set: the transcription bit for bit. */
static void check_threads(const ttype *q, int64_t n_out, int64_t n_in, int64_t n_tok) {
    tcase c = case_new(q, n_out, n_in, n_tok);
    for (size_t s = 0; s < N_SETS; s++) {
        if (!set_table(sets[s])) continue;
        for (int threads = 1; threads <= 3; threads++) {
            ember_compute *cc = test_compute_new(sets[s], threads);
            if (!cc) continue;
            memset(c.got, 0xff, sizeof(float) * c.nx);
            CHECK(ember_matmul_t(cc, &c.w, c.g, c.got, n_tok));
            CHECK_MSG(memcmp(c.got, c.want, sizeof(float) * c.nx) == 0, "%s ember_matmul_t %s %lldx%lld on %d threads",
                      set_table(sets[s])->name, tname(q->type), (long long)n_out, (long long)n_in, threads);
            ember_compute_free(cc);
        }
    }
    case_free(&c);
}

int main(void) {
    if (!set_table(EMBER_KERNELS_AVX2)) fprintf(stderr, "note: this CPU cannot run avx2: reference only\n");
    if (!set_table(EMBER_KERNELS_AVX512))
        fprintf(stderr, "note: this CPU cannot run avx512: its table (the same shared code as avx2) is not run\n");
    static const int64_t outs[] = {1, 2, 3, 5, 7, 8, 15, 16, 17, 63, 64, 65, 130};
    static const int64_t toks[] = {1, 2, 3, 4, 5, 7, 9};
    static const int64_t blocks_small[] = {1, 2, 3, 5, 7, 9};
    static const int64_t f32_ins[] = {1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 129, 300};
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const ttype *q = &types[ti];
        const int64_t bs = ember_type_traits_get((uint32_t)q->type)->block_size;
        const size_t n_ins = bs == 1 ? sizeof f32_ins / sizeof f32_ins[0] : bs == 32 ? 6 : 3;
        for (size_t a = 0; a < n_ins; a++) {
            const int64_t n_in = bs == 1 ? f32_ins[a] : bs * blocks_small[a];
            for (size_t b = 0; b < sizeof outs / sizeof outs[0]; b++)
                check_case(q, outs[b], n_in, toks[(a + b) % (sizeof toks / sizeof toks[0])]);
        }
        check_case(q, 70, bs == 1 ? 33 : bs, 70); /* a token tile of the reference past 64 */
        check_threads(q, 150, bs == 1 ? 200 : (bs == 32 ? 8 : 2) * bs, 70);
    }
    return ember_test_finish();
}
