/* test_simd_parity.c — the parity fixtures (../shared/fixtures/parity/ and parity-quant/) on every kernel set.
 * For each case: prefill prompt_ids, then teacher-force greedy_ids one by one, and compare every
 * row of logits with rel = max|ember - ref| / max|ref| over all rows:
 *   reference kernels: rel <= exact_rel against exact_logits.npy and <= llamacpp_rel against llamacpp_logits.npy;
 *   avx2 and avx512:   rel <= llamacpp_rel against both (the fast path quantizes activations like llama.cpp);
 *   f16 KV cache, every set: rel <= max(llamacpp_rel, TOL_f16) against both, where TOL_f16 is the
 *                      llamacpp_rel of the f16-weight cases (the bound for rounding to f16 once).
 * The ids and tolerances are read from case.json with a purpose-built scan, not a JSON parser. */
#include "ember.h"
#include "test_support.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The integers of the array after "key": [ ... ] (at most cap). Returns the count, -1 if absent. */
static int scan_ids(const char *json, const char *key, int32_t *out, int cap) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(json, pat);
    if (!p || !(p = strchr(p, '['))) return -1;
    int n = 0;
    for (p++; *p && *p != ']';) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        if (n < cap) out[n] = (int32_t)v;
        n++;
        p = end;
    }
    return n;
}

static double scan_number(const char *json, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(json, pat);
    if (!p || !(p = strchr(p, ':'))) return NAN;
    return strtod(p + 1, NULL);
}

typedef struct {
    double max_diff, max_ref;
} rel_acc;

static void rel_add(rel_acc *r, const float *got, const float *ref, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (d > r->max_diff || isnan(d)) r->max_diff = isnan(d) ? INFINITY : d;
        if (fabs(ref[i]) > r->max_ref) r->max_ref = fabs(ref[i]);
    }
}

static double rel_of(const rel_acc *r) { return r->max_ref > 0 ? r->max_diff / r->max_ref : r->max_diff; }

/* Runs one case on one kernel set; fills the two rels. Returns false when something failed to run. */
static bool run_case(const char *dir, ember_kernels kernels, ember_kv_type kv, const int32_t *prompt, int n_prompt,
                     const int32_t *greedy, int n_greedy, const npy_f32 *exact, const npy_f32 *lcpp, double *rel_exact,
                     double *rel_lcpp, const char **used) {
    char path[2048];
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    ember_model_params mp = {.path = path, .kernels = kernels, .n_threads = 2, .kv_cache = kv};
    ember_model *m = NULL;
    ember_session *s = NULL;
    ember_error err = {0};
    bool ok = false;
    if (ember_model_load(&mp, &m, &err) != EMBER_OK ||
        ember_session_new(m, n_prompt + n_greedy + 1, &s, &err) != EMBER_OK) {
        CHECK_MSG(false, "%.300s: %.300s", dir, err.msg);
        goto done;
    }
    const int64_t nv = ember_model_get_info(m)->n_vocab;
    *used = ember_model_get_info(m)->kernels; /* a static string */
    if (nv != exact->cols || nv != lcpp->cols || exact->rows < n_prompt + n_greedy ||
        lcpp->rows < n_prompt + n_greedy) {
        CHECK_MSG(false, "%.300s: logits files do not match the model (%lld vocab)", dir, (long long)nv);
        goto done;
    }
    rel_acc ae = {0}, al = {0};
    if (ember_session_prefill(s, prompt, n_prompt, NULL, &err) != EMBER_OK) {
        CHECK_MSG(false, "%.300s: prefill: %.300s", dir, err.msg);
        goto done;
    }
    int64_t row = n_prompt - 1;
    rel_add(&ae, ember_session_logits(s), exact->data + row * nv, nv);
    rel_add(&al, ember_session_logits(s), lcpp->data + row * nv, nv);
    for (int k = 0; k < n_greedy; k++) {
        if (ember_session_decode(s, greedy[k], NULL, &err) != EMBER_OK) {
            CHECK_MSG(false, "%.300s: decode %d: %.300s", dir, k, err.msg);
            goto done;
        }
        row = n_prompt + k;
        rel_add(&ae, ember_session_logits(s), exact->data + row * nv, nv);
        rel_add(&al, ember_session_logits(s), lcpp->data + row * nv, nv);
    }
    *rel_exact = rel_of(&ae);
    *rel_lcpp = rel_of(&al);
    ok = true;
done:
    ember_session_free(s);
    ember_model_free(m);
    return ok;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* One folder of cases. parity: the reference and auto sets; parity-quant (the 4- to 6-bit types,
 * whose fast products are each set's own integer kernels): the reference set and every SIMD set
 * this CPU runs, each within llamacpp_rel of both references. Returns the cases run, -1 when the
 * folder is absent. */
static int run_folder(const char *folder) {
    char root[1024];
    if (!ember_fixture_path(folder, root, sizeof root)) return -1;
    DIR *d = opendir(root);
    if (!d) return -1;
    char *names[64];
    int n_names = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n_names < 64)
        if (e->d_name[0] != '.') names[n_names++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n_names, sizeof names[0], cmp_str);

    /* TOL_f16: the bound the fixtures give for values rounded to f16 (the f16-weight cases) */
    double tol_f16 = NAN;
    for (int i = 0; i < n_names; i++) {
        size_t len = strlen(names[i]);
        if (len < 4 || strcmp(names[i] + len - 4, "-f16") != 0) continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s/case.json", root, names[i]);
        char *json = ember_read_file(path, NULL);
        double t = json ? scan_number(json, "llamacpp_rel") : NAN;
        free(json);
        if (!isnan(t) && (isnan(tol_f16) || t > tol_f16)) tol_f16 = t;
    }
    if (isnan(tol_f16)) printf("no f16-weight case to take TOL_f16 from: the f16 KV cache runs are skipped\n");
    else printf("TOL_f16 = %.3g (llamacpp_rel of the f16-weight cases)\n", tol_f16);

    static const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    printf("%-18s %-6s %-9s %10s %10s   %s\n", "case", "kv", "kernels", "vs exact", "vs llama",
           "bound (exact / llama)");
    int cases = 0;
    for (int i = 0; i < n_names; i++) {
        char dir[1536], path[2048];
        snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
        snprintf(path, sizeof path, "%s/case.json", dir);
        char *json = ember_read_file(path, NULL);
        if (!json) continue;
        int32_t prompt[512], greedy[64];
        int n_prompt = scan_ids(json, "prompt_ids", prompt, 512), n_greedy = scan_ids(json, "greedy_ids", greedy, 64);
        double tol_exact = scan_number(json, "exact_rel"), tol_lcpp = scan_number(json, "llamacpp_rel");
        free(json);
        npy_f32 exact = {0}, lcpp = {0};
        char pe[2048], pl[2048];
        snprintf(pe, sizeof pe, "%s/exact_logits.npy", dir);
        snprintf(pl, sizeof pl, "%s/llamacpp_logits.npy", dir);
        if (n_prompt < 1 || n_prompt > 512 || n_greedy < 0 || n_greedy > 64 || isnan(tol_exact) || isnan(tol_lcpp) ||
            !npy_load_f32(pe, &exact) || !npy_load_f32(pl, &lcpp)) {
            CHECK_MSG(false, "%s: unreadable case", names[i]);
            npy_free(&exact);
            npy_free(&lcpp);
            continue;
        }
        const double tol_f16kv = tol_lcpp > tol_f16 ? tol_lcpp : tol_f16;
        for (int kv = 0; kv < 2; kv++) {
            if (kv == 1 && isnan(tol_f16)) break;
            for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
                if (!ember_kernels_supported(sets[k])) continue;
                double re = NAN, rl = NAN;
                const char *used = "?";
                if (!run_case(dir, sets[k], kv ? EMBER_KV_F16 : EMBER_KV_F32, prompt, n_prompt, greedy, n_greedy,
                              &exact, &lcpp, &re, &rl, &used))
                    continue;
                /* the reference path with the exact cache must meet the exact bound; everything else
                 * the llama.cpp bound (widened to TOL_f16 for the f16 cache) against both */
                const double be = kv ? tol_f16kv : k == 0 ? tol_exact : tol_lcpp, bl = kv ? tol_f16kv : tol_lcpp;
                printf("%-18s %-6s %-9s %10.2e %10.2e   %.2g / %.2g\n", names[i], kv ? "f16" : "f32", used, re, rl, be,
                       bl);
                CHECK_MSG(re <= be, "%s %s, %s KV: rel %.3g vs exact > %.3g", names[i], used, kv ? "f16" : "f32", re,
                          be);
                CHECK_MSG(rl <= bl, "%s %s, %s KV: rel %.3g vs llama.cpp > %.3g", names[i], used, kv ? "f16" : "f32",
                          rl, bl);
            }
        }
        cases++;
        npy_free(&exact);
        npy_free(&lcpp);
    }
    for (int i = 0; i < n_names; i++) free(names[i]);
    return cases;
}

int main(void) {
    const int a = run_folder("parity"), b = run_folder("parity-quant");
    if (a < 0 && b < 0) return ember_test_skip("no parity fixtures");
    if (a <= 0 && b <= 0) return ember_test_skip("no parity cases found");
    return ember_test_finish();
}
