/* bench_engine_main.c — `bench-engine`: prefill and decode speed of one model on one kernel set, the
 * machine's memory read bandwidth, and the decode ceiling it implies. Measures; never asserts.
 *
 *   bench-engine --model M [--prompt-tokens 52] [--gen-tokens 32] [--threads N] [--kernels K]
 *                [--kv-cache f32|f16|bf16] [--repeat R] [--warmup W] [--json]
 *   bench-engine --membw [--threads N] [--membw-mib 1024]     (bandwidth only)
 *
 * Each repeat: a fresh session position, prefill of P pseudo-random ids (fixed seed), then G greedy
 * decode steps. Reported: medians over the repeats (after W unreported warm-up runs, which also
 * fault the mapped weights in), load time, peak RSS, and, with --model, bytes of weights read per
 * decoded token and the ceiling bandwidth / bytes. */
#include "ember.h"
#include "kernels.h"
#include "model.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* ru_maxrss is in KiB on Linux */
}

/* ---- memory bandwidth: threads sum their slices of a large array, started together ----
 * Persistent threads wait at a barrier, so thread start-up is not timed; AVX2 loads (when the CPU
 * has AVX2; chosen at run time) with 4 independent accumulators keep the loop memory-bound. */

typedef struct {
    const uint64_t *data;
    size_t n;
    int rounds;
    pthread_barrier_t *bar;
    uint64_t sum;
} bw_slice;

__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint64_t *d, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, e = a;
    for (size_t i = 0; i + 16 <= n; i += 16) {
        a = _mm256_add_epi64(a, _mm256_loadu_si256((const __m256i *)(d + i)));
        b = _mm256_add_epi64(b, _mm256_loadu_si256((const __m256i *)(d + i + 4)));
        c = _mm256_add_epi64(c, _mm256_loadu_si256((const __m256i *)(d + i + 8)));
        e = _mm256_add_epi64(e, _mm256_loadu_si256((const __m256i *)(d + i + 12)));
    }
    a = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, e));
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)v, a);
    return v[0] + v[1] + v[2] + v[3];
}

static uint64_t sum_scalar(const uint64_t *d, size_t n) {
    uint64_t a = 0, b = 0, c = 0, e = 0;
    for (size_t i = 0; i + 4 <= n; i += 4) {
        a += d[i];
        b += d[i + 1];
        c += d[i + 2];
        e += d[i + 3];
    }
    return a + b + c + e;
}

static void *bw_thread(void *arg) {
    bw_slice *s = arg;
    const bool avx2 = ember_cpu()->avx2;
    for (int r = 0; r < s->rounds; r++) {
        pthread_barrier_wait(s->bar); /* start together */
        s->sum += avx2 ? sum_avx2(s->data, s->n) : sum_scalar(s->data, s->n);
        pthread_barrier_wait(s->bar); /* all done */
    }
    return NULL;
}

/* A bandwidth probe: n_threads threads and their array, kept for `rounds` passes run on demand
 * (between passes the threads sleep at a barrier, so the caller can run other work). */
typedef struct {
    uint64_t *data;
    size_t n; /* values per thread */
    int nt;
    pthread_t th[64];
    bw_slice sl[64];
    pthread_barrier_t bar;
} bw_probe;

static bool probe_start(bw_probe *p, int n_threads, size_t mib, int rounds) {
    p->nt = n_threads < 64 ? n_threads : 64;
    size_t total = mib * 1024 * 1024 / sizeof(uint64_t);
    p->n = total / (size_t)p->nt;
    p->data = malloc(total * sizeof *p->data);
    if (!p->data) return false;
    for (size_t i = 0; i < total; i++) p->data[i] = i * 0x9e3779b97f4a7c15ull; /* touch every page */
    pthread_barrier_init(&p->bar, NULL, (unsigned)p->nt + 1);
    for (int i = 0; i < p->nt; i++) {
        p->sl[i] = (bw_slice){.data = p->data + p->n * (size_t)i, .n = p->n, .rounds = rounds, .bar = &p->bar};
        pthread_create(&p->th[i], NULL, bw_thread, &p->sl[i]);
    }
    return true;
}

/* One pass: GB/s (1e9 bytes) read by all threads together. */
static double probe_pass(bw_probe *p) {
    pthread_barrier_wait(&p->bar);
    double t0 = now_s();
    pthread_barrier_wait(&p->bar);
    return (double)(p->n * (size_t)p->nt * sizeof *p->data) / (now_s() - t0) / 1e9;
}

/* After exactly `rounds` passes. */
static void probe_stop(bw_probe *p) {
    uint64_t sink = 0;
    for (int i = 0; i < p->nt; i++) {
        pthread_join(p->th[i], NULL);
        sink += p->sl[i].sum;
    }
    pthread_barrier_destroy(&p->bar);
    free(p->data);
    if (sink == 42) fprintf(stderr, " "); /* keeps the sums alive */
}

/* The best of `passes` passes of a started probe, in GB/s. */
static double probe_best(bw_probe *p, int passes) {
    double best = 0;
    for (int r = 0; r < passes; r++) {
        double gbs = probe_pass(p);
        if (gbs > best) best = gbs;
    }
    return best;
}

/* Read bandwidth in GB/s: best of `rounds` passes over `mib` MiB with n_threads threads. */
static double membw(int n_threads, size_t mib, int rounds) {
    bw_probe p;
    if (!probe_start(&p, n_threads, mib, rounds)) return 0;
    double best = probe_best(&p, rounds);
    probe_stop(&p);
    return best;
}

static void usage(void) {
    fprintf(stderr,
            "usage: bench-engine --model M [--prompt-tokens 52] [--gen-tokens 32] [--threads N]\n"
            "                    [--kernels auto|reference|avx2|avx512] [--kv-cache f32|f16|bf16] [--repeat R]\n"
            "                    [--warmup W] [--json]\n"
            "                    [--membw] [--membw-mib 1024]\n");
}

/* The command line. */
typedef struct {
    const char *model_path, *kernels_s, *kv_s;
    int prompt_tokens, gen_tokens, threads, repeat, warmup;
    bool json, bw;
    size_t bw_mib;
    ember_kernels kernels;
    ember_kv_type kv_type;
} options;

/* false: a usage error. */
static bool parse_options(int argc, char **argv, options *o) {
    *o = (options){.kernels_s = "auto",
                   .kv_s = "f32",
                   .prompt_tokens = 52,
                   .gen_tokens = 32,
                   .repeat = 5,
                   .warmup = 1,
                   .bw_mib = 1024};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v && (i++, true))
        if (ARG("--model")) o->model_path = v;
        else if (ARG("--prompt-tokens")) o->prompt_tokens = atoi(v);
        else if (ARG("--gen-tokens")) o->gen_tokens = atoi(v);
        else if (ARG("--threads")) o->threads = atoi(v);
        else if (ARG("--kernels")) o->kernels_s = v;
        else if (ARG("--kv-cache")) o->kv_s = v;
        else if (ARG("--repeat")) o->repeat = atoi(v);
        else if (ARG("--warmup")) o->warmup = atoi(v);
        else if (ARG("--membw-mib")) o->bw_mib = (size_t)atoi(v);
        else if (strcmp(a, "--membw") == 0) o->bw = true;
        else if (strcmp(a, "--json") == 0) o->json = true;
        else return false;
#undef ARG
    }
    return ember_kernels_parse(o->kernels_s, &o->kernels) && ember_kv_type_parse(o->kv_s, &o->kv_type) &&
           o->prompt_tokens >= 1 && o->gen_tokens >= 0 && o->repeat >= 1 && o->warmup >= 0 && (o->model_path || o->bw);
}

/* What the runs measured. */
typedef struct {
    double load_s, pre_med, dec_med, pre_min, pre_max, dec_min, dec_max, rss, bytes, gbs;
    int n_pairs;
    double pair_share, pair_dec, pair_bw;
    char *pair_list; /* JSON: [[decode tok/s, GB/s], ...] */
} results;

/* warmup + repeat runs of a prefill and gen_tokens decodes: tokens per second into pre[r] / dec[r]. */
static ember_status timed_runs(const options *o, ember_session *s, const int32_t *ids, int64_t n_vocab, double *pre,
                               double *dec, ember_error *err) {
    for (int r = -o->warmup; r < o->repeat; r++) {
        ember_session_reset(s);
        double a = now_s();
        if (ember_session_prefill(s, ids, o->prompt_tokens, NULL, err) != EMBER_OK) return err->code;
        double b = now_s();
        for (int k = 0; k < o->gen_tokens; k++) {
            int32_t next = (int32_t)ember_argmax(ember_session_logits(s), n_vocab);
            if (ember_session_decode(s, next, NULL, err) != EMBER_OK) return err->code;
        }
        double c = now_s();
        if (r >= 0) {
            pre[r] = o->prompt_tokens / (b - a);
            dec[r] = o->gen_tokens > 0 ? o->gen_tokens / (c - b) : 0;
        }
    }
    return EMBER_OK;
}

/* Paired: the machine's bandwidth can change within seconds (a shared host), so a decode median and
 * a separate probe may see different states. Here each decoded token is timed right before one
 * probe pass, and the share of the ceiling is taken per pair. false: out of memory or failed (the
 * message printed). */
static bool paired_runs(const options *o, ember_session *s, const int32_t *ids, int64_t n_vocab, bw_probe *p,
                        bool probing, results *res) {
    const int n_pairs = res->n_pairs;
    double *share = malloc((size_t)n_pairs * sizeof(double)), *pd = malloc((size_t)n_pairs * sizeof(double)),
           *pb = malloc((size_t)n_pairs * sizeof(double));
    if (!share || !pd || !pb || !probing) {
        fprintf(stderr, "bench-engine: out of memory for the paired bandwidth probe\n");
        return false;
    }
    ember_error err = {0};
    int k = 0;
    for (int r = 0; r < o->repeat && err.code == EMBER_OK; r++) {
        ember_session_reset(s);
        if (ember_session_prefill(s, ids, o->prompt_tokens, NULL, &err) != EMBER_OK) break;
        for (int g = 0; g < o->gen_tokens; g++, k++) {
            int32_t next = (int32_t)ember_argmax(ember_session_logits(s), n_vocab);
            double a = now_s();
            if (ember_session_decode(s, next, NULL, &err) != EMBER_OK) break;
            pd[k] = 1.0 / (now_s() - a);
            pb[k] = probe_pass(p);
            share[k] = pd[k] * res->bytes / (pb[k] * 1e9);
        }
    }
    for (int rest = k; rest < n_pairs; rest++) probe_pass(p); /* lets the probe threads finish */
    if (err.code != EMBER_OK) {
        fprintf(stderr, "bench-engine: %s\n", err.msg);
        return false;
    }
    if (o->json) { /* the pairs themselves, in order (median() sorts) */
        res->pair_list = malloc((size_t)n_pairs * 24 + 64);
        if (res->pair_list) {
            size_t len = 0;
            for (int i = 0; i < n_pairs; i++)
                len += (size_t)sprintf(res->pair_list + len, "%s[%.2f, %.2f]", i ? ", " : "", pd[i], pb[i]);
        }
    }
    res->pair_share = median(share, n_pairs);
    res->pair_dec = median(pd, n_pairs);
    res->pair_bw = median(pb, n_pairs);
    free(share);
    free(pd);
    free(pb);
    return true;
}

static void print_json(const options *o, const ember_model_info *info, const results *r) {
    printf("{\"model\": \"%s\", \"kernels\": \"%s\", \"kv_cache\": \"%s\", \"threads\": %d, \"prompt_tokens\": %d, "
           "\"gen_tokens\": %d, "
           "\"repeat\": %d, \"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"prefill_min\": %.2f, "
           "\"prefill_max\": %.2f, \"decode_min\": %.2f, \"decode_max\": %.2f, \"load_s\": %.3f, "
           "\"peak_rss_mib\": %.1f, \"repacked_mb\": %.1f, \"weight_mb_per_token\": %.1f",
           o->model_path, info->kernels, info->kv_cache, info->n_threads, o->prompt_tokens, o->gen_tokens, o->repeat,
           r->pre_med, r->dec_med, r->pre_min, r->pre_max, r->dec_min, r->dec_max, r->load_s, r->rss,
           (double)info->repacked_bytes / 1e6, r->bytes / 1e6);
    if (o->bw) printf(", \"membw_gbs\": %.2f, \"decode_ceiling_tok_s\": %.2f", r->gbs, r->gbs * 1e9 / r->bytes);
    if (r->n_pairs > 0)
        printf(", \"pairs\": %d, \"paired_share\": %.4f, \"paired_decode_tok_s\": %.2f, \"paired_membw_gbs\": %.2f",
               r->n_pairs, r->pair_share, r->pair_dec, r->pair_bw);
    if (r->pair_list) printf(", \"pair_values\": [%s]", r->pair_list);
    printf("}\n");
}

static void print_text(const options *o, const ember_model_info *info, const results *r) {
    printf("model      %s (%s, %s)\n", o->model_path, info->family, info->dtype_summary);
    printf("kernels    %s, %d threads, %s KV cache\n", info->kernels, info->n_threads, info->kv_cache);
    printf("prefill    %.1f tok/s median of %d (min %.1f, max %.1f), %d-token prompt\n", r->pre_med, o->repeat,
           r->pre_min, r->pre_max, o->prompt_tokens);
    printf("decode     %.2f tok/s median of %d (min %.2f, max %.2f), %d tokens\n", r->dec_med, o->repeat, r->dec_min,
           r->dec_max, o->gen_tokens);
    printf("load       %.3f s; peak RSS %.1f MiB; %.1f MB of weights repacked\n", r->load_s, r->rss,
           (double)info->repacked_bytes / 1e6);
    printf("weights    %.1f MB read per decoded token\n", r->bytes / 1e6);
    if (o->bw)
        printf("bandwidth  %.1f GB/s -> decode ceiling %.1f tok/s (decode reaches %.0f%%)\n", r->gbs,
               r->gbs * 1e9 / r->bytes, 100.0 * r->dec_med / (r->gbs * 1e9 / r->bytes));
    if (r->n_pairs > 0)
        printf("paired     decode reaches %.0f%% of the ceiling: median over %d pairs of one decoded token and\n"
               "           one probe pass right after it (medians: decode %.1f tok/s, bandwidth %.1f GB/s)\n",
               100.0 * r->pair_share, r->n_pairs, r->pair_dec, r->pair_bw);
}

/* --membw without a model: the bandwidth alone. */
static int bandwidth_only(const options *o, int bw_threads) {
    const double gbs = membw(bw_threads, o->bw_mib, 10);
    if (o->json) printf("{\"membw_gbs\": %.2f, \"threads\": %d, \"mib\": %zu}\n", gbs, bw_threads, o->bw_mib);
    else
        printf("memory read bandwidth: %.1f GB/s (%d threads, %zu MiB array, best of 10)\n", gbs, bw_threads,
               o->bw_mib);
    return 0;
}

int main(int argc, char **argv) {
    options o;
    if (!parse_options(argc, argv, &o)) {
        usage();
        return 2;
    }
    const int bw_threads = o.threads > 0 ? o.threads : ember_cpu_physical_cores();
    if (o.bw && !o.model_path) return bandwidth_only(&o, bw_threads);

    ember_error err = {0};
    ember_model *m = NULL;
    ember_model_params mp = {.path = o.model_path, .kernels = o.kernels, .n_threads = o.threads, .kv_cache = o.kv_type};
    results res = {0};
    double t0 = now_s();
    if (ember_model_load(&mp, &m, &err) != EMBER_OK) {
        fprintf(stderr, "bench-engine: %s\n", err.msg);
        return 1;
    }
    res.load_s = now_s() - t0;
    const ember_model_info *info = ember_model_get_info(m);
    ember_session *s = NULL;
    if (ember_session_new(m, o.prompt_tokens + o.gen_tokens + 1, &s, &err) != EMBER_OK) {
        fprintf(stderr, "bench-engine: %s\n", err.msg);
        ember_model_free(m);
        return 1;
    }
    int32_t *ids = malloc((size_t)o.prompt_tokens * sizeof *ids);
    uint64_t rng = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < o.prompt_tokens; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        ids[i] = (int32_t)(rng % (uint64_t)info->n_vocab);
    }
    double *pre = malloc((size_t)o.repeat * sizeof(double)), *dec = malloc((size_t)o.repeat * sizeof(double));
    if (timed_runs(&o, s, ids, info->n_vocab, pre, dec, &err) != EMBER_OK) {
        fprintf(stderr, "bench-engine: %s\n", err.msg);
        return 1;
    }
    res.pre_med = median(pre, o.repeat), res.dec_med = median(dec, o.repeat);
    res.rss = peak_rss_mib(); /* before the bandwidth probe allocates its array */
    res.bytes = (double)ember_model_weight_bytes_per_token(m);
    /* One probe (one array) serves the best-of-10 figure and then the pairs. */
    res.n_pairs = o.bw ? o.gen_tokens * o.repeat : 0;
    bw_probe p;
    const bool probing = o.bw && probe_start(&p, bw_threads, o.bw_mib, 10 + res.n_pairs);
    if (probing) res.gbs = probe_best(&p, 10);
    if (res.n_pairs > 0 && !paired_runs(&o, s, ids, info->n_vocab, &p, probing, &res)) return 1;
    if (probing) probe_stop(&p);
    res.pre_min = pre[0], res.pre_max = pre[o.repeat - 1], res.dec_min = dec[0], res.dec_max = dec[o.repeat - 1];
    if (o.json) print_json(&o, info, &res);
    else print_text(&o, info, &res);
    free(res.pair_list);
    free(ids);
    free(pre);
    free(dec);
    ember_session_free(s);
    ember_model_free(m);
    return 0;
}
