/* bench_kernels_main.c — `bench-kernels`: one kernel set's matrix product per weight type, in TSC
 * ticks per 256 weights of one row, weights in cache, pinned, min of N. Measures; never asserts.
 *
 *   bench-kernels [--kernels avx2] [--types q4_k,q5_k,q6_k,q4_0,q8_0] [--n-in 1024] [--n-out 256]
 *                 [--tokens 1] [--reps 200] [--mapped] [--json] [--llamacpp LIB.so]
 *
 * Per type: random weights (fixed seed) quantized by the type's quantizer, repacked as the loader
 * does (unless --mapped), and random activations. `prepare` is one token's activation preparation
 * (the type's act_prepare: Q8_K / Q8_0 quantization and layout) in ticks per 256 values; `product`
 * is the rows call for all n_out rows and the given tokens, in ticks per 256 weights of one row
 * and one token. The minimum over the repetitions is what a quiet core does; it is robust to load
 * but still not a speed claim (docs/kernels.md says how these figures are used). Under
 * `valgrind --tool=callgrind` the instruction counts of the kernel functions divided by the blocks
 * give instructions per block (`--reps` small there).
 *
 * --llamacpp LIB.so (one of llama.cpp's libggml-cpu-*.so) also times that library's one-token
 * products on the same shapes, called through dlopen: what its CPU backend runs for the type (the
 * repacked 8-row gemv for Q4_K and Q4_0, which llama-bench -lm none repacks on AVX2; vec_dot row by
 * row for the others, measured there with callgrind on llama-bench) with weights of a constant byte
 * (the timing does not depend on the values) and activations from its own quantizer, whose time
 * is reported as its `prepare`. One token only. */
#include "cpu.h"
#include "kernels.h"
#include "quants.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <x86intrin.h>

static uint64_t rng_state = 0x5eed5eedull;
static float rng_normal(void) { /* splitmix64, sum of 4 uniforms */
    float s = 0;
    for (int i = 0; i < 4; i++) {
        uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        s += (float)((z >> 40) * 0x1p-24) * 2.0f - 1.0f;
    }
    return s * 0.866f;
}

static void (*quantizer(ember_type t))(const float *, void *, int64_t) {
    switch (t) {
    case EMBER_TYPE_Q4_0: return ember_quantize_row_q4_0;
    case EMBER_TYPE_Q4_1: return ember_quantize_row_q4_1;
    case EMBER_TYPE_Q5_0: return ember_quantize_row_q5_0;
    case EMBER_TYPE_Q5_1: return ember_quantize_row_q5_1;
    case EMBER_TYPE_Q4_K: return ember_quantize_row_q4_k;
    case EMBER_TYPE_Q5_K: return ember_quantize_row_q5_k;
    case EMBER_TYPE_Q6_K: return ember_quantize_row_q6_k;
    default: return NULL;
    }
}

static void quantize_q8_0_rows(const float *x, void *y, int64_t n) { ember_quantize_row_q8_0(x, y, n); }

static bool type_by_name(const char *s, ember_type *out) {
    for (uint32_t t = 0; t < EMBER_TYPE_COUNT; t++) {
        const ember_type_traits *tr = ember_type_traits_get(t);
        if (tr && tr->name && strcasecmp(tr->name, s) == 0) {
            *out = (ember_type)t;
            return true;
        }
    }
    return false;
}

static uint64_t ticks(void) {
    _mm_lfence();
    const uint64_t t = __rdtsc();
    _mm_lfence();
    return t;
}

typedef struct {
    double prepare, product; /* ticks per 256 values (prepare: one token) / per row-block and token */
    size_t packed_bytes;
} result;

static bool bench_type(const ember_kernel_ops *ops, ember_type type, int64_t n_in, int64_t n_out, int64_t n_tok,
                       int reps, bool mapped, result *res) {
    const ember_type_kernels *mm = ember_kernels_mm(ops, type);
    void (*quant)(const float *, void *, int64_t) = type == EMBER_TYPE_Q8_0 ? quantize_q8_0_rows : quantizer(type);
    const size_t row_bytes = ember_type_row_size(type, n_in);
    if (!mm || !quant || row_bytes == 0) return false;
    float *wf = malloc(sizeof(float) * (size_t)n_in);
    uint8_t *wq = aligned_alloc(64, (row_bytes * (size_t)n_out + 63) / 64 * 64);
    float *x = malloc(sizeof(float) * (size_t)(n_in * n_tok)), *y = malloc(sizeof(float) * (size_t)(n_out * n_tok));
    const size_t stride = mm->act_size ? (mm->act_size(n_in) + 63) / 64 * 64 : 0;
    uint8_t *xa = stride ? aligned_alloc(64, stride * (size_t)n_tok) : NULL;
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t i = 0; i < n_in; i++) wf[i] = rng_normal();
        quant(wf, wq + (size_t)r * row_bytes, n_in);
    }
    for (int64_t i = 0; i < n_in * n_tok; i++) x[i] = rng_normal();
    ember_matrix w = {.type = type, .data = wq, .n_in = n_in, .n_out = n_out, .row_bytes = row_bytes};
    void *packed = NULL;
    res->packed_bytes = 0;
    if (!mapped && mm->pack) {
        res->packed_bytes = mm->pack_size(&w);
        packed = aligned_alloc(64, (res->packed_bytes + 63) / 64 * 64);
        mm->pack(&w, packed);
        w.packed = packed;
    }
    uint64_t best_prep = UINT64_MAX, best_prod = UINT64_MAX;
    for (int rep = 0; rep < reps + 2; rep++) { /* two unreported warm-up passes */
        const uint64_t t0 = ticks();
        if (xa) mm->act_prepare(x, xa, n_in);
        const uint64_t t1 = ticks();
        for (int64_t t = 1; xa && t < n_tok; t++) mm->act_prepare(x + t * n_in, xa + (size_t)t * stride, n_in);
        const uint64_t t2 = ticks();
        mm->rows(&w, x, xa, stride, y, n_tok, 0, n_out);
        const uint64_t t3 = ticks();
        if (rep >= 2) {
            if (t1 - t0 < best_prep) best_prep = t1 - t0;
            if (t3 - t2 < best_prod) best_prod = t3 - t2;
        }
    }
    const double blocks = (double)n_out * (double)n_in / 256.0 * (double)n_tok;
    res->prepare = xa ? (double)best_prep / ((double)n_in / 256.0) : 0.0;
    res->product = (double)best_prod / blocks;
    free(wf), free(wq), free(x), free(y), free(xa), free(packed);
    return true;
}

/* ---- llama.cpp's side (dlopen): gemv(n, s, bs, vx, vy, nr, nc) over its interleaved layouts ---- */
typedef void (*llama_gemv_fn)(int n, float *s, size_t bs, const void *vx, const void *vy, int nr, int nc);
typedef void (*llama_quant_fn)(const float *x, void *y, int64_t k);

typedef void (*llama_dot_fn)(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);

/* What llama.cpp's x86 CPU backend runs for one token (its repacked 8-row gemv where it repacks the
 * type on AVX2, else its vec_dot one row at a time), and its activation quantizer. */
typedef struct {
    const char *type, *fn, *quant;
    bool gemv;
    int rows;                    /* rows interleaved per group (gemv) */
    size_t w_bytes, a_bytes, qk; /* weight bytes per row and block, activation bytes per block, values per block */
} llama_product;

static const llama_product llama_products[] = {
    {"q4_k", "ggml_gemv_q4_K_8x8_q8_K", "quantize_row_q8_K", true, 8, 144, 292, 256},
    {"q5_k", "ggml_vec_dot_q5_K_q8_K", "quantize_row_q8_K", false, 1, 176, 292, 256},
    {"q6_k", "ggml_vec_dot_q6_K_q8_K", "quantize_row_q8_K", false, 1, 210, 292, 256},
    {"q4_0", "ggml_gemv_q4_0_8x8_q8_0", "quantize_row_q8_0", true, 8, 18, 34, 32},
    {"q8_0", "ggml_vec_dot_q8_0_q8_0", "quantize_row_q8_0", false, 1, 34, 34, 32},
};

static bool bench_llama(void *lib, const char *type, int64_t n_in, int64_t n_out, int reps, result *res) {
    const llama_product *lp = NULL;
    for (size_t i = 0; i < sizeof llama_products / sizeof llama_products[0]; i++)
        if (strcasecmp(llama_products[i].type, type) == 0) lp = &llama_products[i];
    if (!lp || n_out % lp->rows) return false;
    void *fn = dlsym(lib, lp->fn);
    llama_quant_fn quant = (llama_quant_fn)dlsym(lib, lp->quant);
    if (!fn || !quant) return false;
    const size_t nb = (size_t)n_in / lp->qk;
    uint8_t *vx = aligned_alloc(64, (lp->w_bytes * nb * (size_t)n_out + 63) / 64 * 64);
    uint8_t *vy = aligned_alloc(64, (lp->a_bytes * nb + 63) / 64 * 64);
    float *x = malloc(sizeof(float) * (size_t)n_in), *y = malloc(sizeof(float) * (size_t)n_out);
    memset(vx, 0x3c, lp->w_bytes * nb * (size_t)n_out); /* f16 scales 0x3c3c = 1.06, quants 0x3c */
    for (int64_t i = 0; i < n_in; i++) x[i] = rng_normal();
    uint64_t best_prep = UINT64_MAX, best_prod = UINT64_MAX;
    for (int rep = 0; rep < reps + 2; rep++) {
        const uint64_t t0 = ticks();
        quant(x, vy, n_in);
        const uint64_t t1 = ticks();
        if (lp->gemv) ((llama_gemv_fn)fn)((int)n_in, y, 0, vx, vy, 1, (int)n_out);
        else
            for (int64_t r = 0; r < n_out; r++)
                ((llama_dot_fn)fn)((int)n_in, y + r, 0, vx + lp->w_bytes * nb * (size_t)r, 0, vy, 0, 1);
        const uint64_t t2 = ticks();
        if (rep >= 2) {
            if (t1 - t0 < best_prep) best_prep = t1 - t0;
            if (t2 - t1 < best_prod) best_prod = t2 - t1;
        }
    }
    res->prepare = (double)best_prep / ((double)n_in / 256.0);
    res->product = (double)best_prod / ((double)n_out * (double)n_in / 256.0);
    res->packed_bytes = lp->w_bytes * nb * (size_t)n_out;
    free(vx), free(vy), free(x), free(y);
    return true;
}

static void usage(void) {
    fprintf(stderr, "usage: bench-kernels [--kernels avx2] [--types q4_k,q5_k,q6_k,q4_0,q8_0] [--n-in 1024]\n"
                    "                     [--n-out 256] [--tokens 1] [--reps 200] [--mapped] [--json]\n"
                    "                     [--llamacpp libggml-cpu-VARIANT.so]\n");
}

int main(int argc, char **argv) {
    const char *kernels_s = NULL, *types_s = "q4_k,q5_k,q6_k,q4_0,q8_0", *llama_s = NULL;
    int64_t n_in = 1024, n_out = 256, n_tok = 1;
    int reps = 200;
    bool json = false, mapped = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v && (i++, true))
        if (ARG("--kernels")) kernels_s = v;
        else if (ARG("--types")) types_s = v;
        else if (ARG("--n-in")) n_in = atoll(v);
        else if (ARG("--n-out")) n_out = atoll(v);
        else if (ARG("--tokens")) n_tok = atoll(v);
        else if (ARG("--reps")) reps = atoi(v);
        else if (ARG("--llamacpp")) llama_s = v;
        else if (strcmp(a, "--mapped") == 0) mapped = true;
        else if (strcmp(a, "--json") == 0) json = true;
        else {
            usage();
            return 2;
        }
#undef ARG
    }
    ember_kernels k = ember_kernels_best();
    if ((kernels_s && !ember_kernels_parse(kernels_s, &k)) || n_in < 256 || n_in % 256 || n_out < 1 || n_tok < 1 ||
        n_tok > EMBER_MATMUL_MAX_TOKENS || reps < 1) {
        usage();
        return 2;
    }
    if (!ember_kernels_supported(k)) {
        fprintf(stderr, "bench-kernels: this CPU cannot run the '%s' kernels\n", ember_kernels_name(k));
        return 2;
    }
    const ember_kernel_ops *ops = ember_kernels_table(k);
    void *lib = NULL;
    if (llama_s && !(lib = dlopen(llama_s, RTLD_NOW | RTLD_LOCAL))) {
        fprintf(stderr, "bench-kernels: --llamacpp: cannot load '%s': %s\n", llama_s, dlerror());
        return 2;
    }
    if (!json)
        printf("%-6s %-7s %12s %14s %12s   (TSC ticks per 256 values; n_in %lld, n_out %lld, %lld token(s), "
               "min of %d)\n",
               "type", "kernels", "prepare", "product", "packed KiB", (long long)n_in, (long long)n_out,
               (long long)n_tok, reps);
    char list[256];
    snprintf(list, sizeof list, "%s", types_s);
    bool first = true;
    if (json)
        printf("{\"kernels\": \"%s\", \"n_in\": %lld, \"n_out\": %lld, \"tokens\": %lld, \"results\": [",
               ember_kernels_name(k), (long long)n_in, (long long)n_out, (long long)n_tok);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        ember_type type;
        result r;
        if (!type_by_name(name, &type) || !bench_type(ops, type, n_in, n_out, n_tok, reps, mapped, &r)) {
            fprintf(stderr, "bench-kernels: no product to measure for type '%s' on '%s'\n", name, ops->name);
            return 2;
        }
        if (json)
            printf("%s{\"type\": \"%s\", \"prepare_ticks\": %.2f, \"product_ticks\": %.2f, \"packed_bytes\": %zu}",
                   first ? "" : ", ", name, r.prepare, r.product, r.packed_bytes);
        else
            printf("%-6s %-7s %12.2f %14.2f %12.1f\n", name, ops->name, r.prepare, r.product,
                   (double)r.packed_bytes / 1024.0);
        first = false;
        result lr;
        if (lib && n_tok == 1 && bench_llama(lib, name, n_in, n_out, reps, &lr)) {
            if (json)
                printf(", {\"type\": \"%s\", \"engine\": \"llama.cpp\", \"prepare_ticks\": %.2f, \"product_ticks\": "
                       "%.2f, \"packed_bytes\": %zu}",
                       name, lr.prepare, lr.product, lr.packed_bytes);
            else
                printf("%-6s %-7s %12.2f %14.2f %12.1f\n", name, "llama", lr.prepare, lr.product,
                       (double)lr.packed_bytes / 1024.0);
        }
    }
    if (json) printf("]}\n");
    return 0;
}
