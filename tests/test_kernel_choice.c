/* test_kernel_choice.c — the one rule for which kernel sets a CPU runs (cpu.h) on simulated CPU
 * features, the strict EMBER_KERNELS parser, the feature table and the traits table's sizes. The
 * expectations are written out by hand from the sets' compile flags (CMakeLists.txt). */
#include "kernels.h"
#include "test_support.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *label;
    ember_cpu_features f;
    ember_kernels best;
    const char *avx2_missing, *avx512_missing;
} combo;

static const combo combos[] = {
    {"none", {0}, EMBER_KERNELS_REFERENCE, "avx2 fma f16c", "avx2 fma f16c avx512f avx512bw avx512vl avx512vnni"},
    {"avx2 without fma",
     {.avx2 = true, .f16c = true},
     EMBER_KERNELS_REFERENCE,
     "fma",
     "fma avx512f avx512bw avx512vl avx512vnni"},
    {"avx2+fma+f16c",
     {.avx2 = true, .fma = true, .f16c = true},
     EMBER_KERNELS_AVX2,
     "",
     "avx512f avx512bw avx512vl avx512vnni"},
    {"avx512 without vnni",
     {.avx2 = true, .fma = true, .f16c = true, .avx512f = true, .avx512bw = true, .avx512vl = true, .avx512bf16 = true},
     EMBER_KERNELS_AVX2,
     "",
     "avx512vnni"},
    {"avx512 without f16c",
     {.avx2 = true, .fma = true, .avx512f = true, .avx512bw = true, .avx512vl = true, .avx512vnni = true},
     EMBER_KERNELS_REFERENCE,
     "f16c",
     "f16c"},
    {"full avx512",
     {.avx2 = true,
      .fma = true,
      .f16c = true,
      .avx512f = true,
      .avx512bw = true,
      .avx512vl = true,
      .avx512vnni = true,
      .avx512bf16 = true},
     EMBER_KERNELS_AVX512,
     "",
     ""},
};

static void test_best(void) {
    for (size_t i = 0; i < sizeof combos / sizeof combos[0]; i++) {
        const combo *c = &combos[i];
        const ember_kernels best = ember_kernels_best_for(&c->f);
        CHECK_MSG(best == c->best, "%s: best is %s, expected %s", c->label, ember_kernels_name(best),
                  ember_kernels_name(c->best));
        /* best is the most capable set that is supported: every set up to it runs, none after */
        const ember_kernels order[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
        bool past = false;
        for (int k = 0; k < 3; k++) {
            CHECK_MSG(ember_kernels_supported_for(order[k], &c->f) == !past, "%s: %s supported = %d", c->label,
                      ember_kernels_name(order[k]), !past);
            if (order[k] == best) past = true;
        }
        CHECK(ember_kernels_supported_for(EMBER_KERNELS_AUTO, &c->f));
        char buf[128];
        ember_kernels_missing(EMBER_KERNELS_AVX2, &c->f, buf, sizeof buf);
        CHECK_MSG(strcmp(buf, c->avx2_missing) == 0, "%s: avx2 lacks '%s', expected '%s'", c->label, buf,
                  c->avx2_missing);
        ember_kernels_missing(EMBER_KERNELS_AVX512, &c->f, buf, sizeof buf);
        CHECK_MSG(strcmp(buf, c->avx512_missing) == 0, "%s: avx512 lacks '%s', expected '%s'", c->label, buf,
                  c->avx512_missing);
    }
    /* this machine: auto (without EMBER_KERNELS) resolves to the best set */
    unsetenv("EMBER_KERNELS");
    ember_kernels chosen;
    const ember_kernel_ops *ops = ember_kernels_select(EMBER_KERNELS_AUTO, &chosen);
    CHECK(ops != NULL && chosen == ember_kernels_best() && strcmp(ops->name, ember_kernels_name(chosen)) == 0);
}

static void test_env(void) {
    ember_kernels k;
    ember_error err = {0};
    unsetenv("EMBER_KERNELS");
    CHECK(ember_kernels_env(&k, &err) == EMBER_OK && k == EMBER_KERNELS_AUTO);
    setenv("EMBER_KERNELS", "", 1);
    CHECK(ember_kernels_env(&k, &err) == EMBER_OK && k == EMBER_KERNELS_AUTO);
    setenv("EMBER_KERNELS", "reference", 1);
    CHECK(ember_kernels_env(&k, &err) == EMBER_OK && k == EMBER_KERNELS_REFERENCE);
    const ember_kernel_ops *ops;
    CHECK(ember_kernels_resolve(EMBER_KERNELS_AUTO, &k, &ops, &err) == EMBER_OK && k == EMBER_KERNELS_REFERENCE);
    const char *bad[] = {"AVX2", "avx", "fast", " reference"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("EMBER_KERNELS", bad[i], 1);
        memset(&err, 0, sizeof err);
        CHECK_MSG(ember_kernels_env(&k, &err) == EMBER_ERR_ARG && strstr(err.msg, "EMBER_KERNELS"),
                  "EMBER_KERNELS='%s' must be an error naming the variable: %.300s", bad[i], err.msg);
        memset(&err, 0, sizeof err);
        ember_compute *c = NULL;
        CHECK_MSG(ember_compute_new(EMBER_KERNELS_AUTO, 1, &c, &err) == EMBER_ERR_ARG && !c &&
                      strstr(err.msg, "EMBER_KERNELS"),
                  "ember_compute_new with EMBER_KERNELS='%s': %.300s", bad[i], err.msg);
    }
    unsetenv("EMBER_KERNELS");
}

static void test_sizes(void) {
    size_t b = 0;
    CHECK(ember_type_nbytes(EMBER_TYPE_Q8_0, 64, &b) && b == 68);
    CHECK(ember_type_nbytes(EMBER_TYPE_BF16, 3, &b) && b == 6);
    CHECK(ember_type_nbytes(EMBER_TYPE_Q6_K, 512, &b) && b == 420);
    CHECK(!ember_type_nbytes(EMBER_TYPE_Q8_0, 33, &b)); /* not a whole block */
    CHECK(!ember_type_nbytes(EMBER_TYPE_F32, -4, &b));
    CHECK(!ember_type_nbytes(EMBER_TYPE_F32, INT64_MAX, &b)); /* 4 * INT64_MAX bytes overflow */
    CHECK(!ember_type_nbytes((ember_type)16, 32, &b));        /* iq2_xxs: named, no traits */
    CHECK(ember_type_row_size(EMBER_TYPE_F16, 10) == 20 && ember_type_row_size(EMBER_TYPE_Q8_0, 31) == 0);
    /* the one shape product: checked against the limit before multiplying, never wrapping */
    int64_t n = -1;
    const int64_t big[2] = {(int64_t)1 << 32, (int64_t)1 << 32}, fits[3] = {3, 5, 7}, neg[2] = {4, -1};
    CHECK(!ember_shape_count(big, 2, INT64_MAX, &n) && n == -1); /* 2^64 wraps to 0 in int64 arithmetic */
    CHECK(ember_shape_count(fits, 3, 105, &n) && n == 105 && !ember_shape_count(fits, 3, 104, &n));
    CHECK(!ember_shape_count(neg, 2, INT64_MAX, &n));
    CHECK(ember_shape_count(big, 1, (int64_t)1 << 32, &n) && n == (int64_t)1 << 32);
    const int64_t edge[2] = {INT64_MAX, 1}, zero[3] = {(int64_t)1 << 62, 0, (int64_t)1 << 62};
    CHECK(ember_shape_count(edge, 2, INT64_MAX, &n) && n == INT64_MAX);
    CHECK(ember_shape_count(zero, 3, 10, &n) && n == 0);
    CHECK(ember_shape_count(fits, 0, 1, &n) && n == 1 && !ember_shape_count(fits, 0, 0, &n));
    CHECK(strcmp(ember_type_name(EMBER_TYPE_Q4_K), "q4_K") == 0 && strcmp(ember_type_name(16), "iq2_xxs") == 0 &&
          strcmp(ember_type_name(1000), "unknown") == 0);
    CHECK(ember_type_traits_get(1000) == NULL && ember_type_traits_get(EMBER_TYPE_COUNT) == NULL);
    /* every type a set multiplies by has traits with a to_float; the reference multiplies exactly
     * those, by the reference product; the weight types are the 13 of docs/kernels.md's table */
    const ember_kernel_ops *sets[] = {&ember_kernels_reference, &ember_kernels_avx2, &ember_kernels_avx512};
    int weight_types = 0;
    for (uint32_t t = 0; t < EMBER_TYPE_COUNT; t++) {
        const ember_type_traits *tr = ember_type_traits_get(t);
        const bool readable = tr && tr->to_float;
        weight_types += readable;
        for (int s = 0; s < 3; s++)
            if (ember_kernels_mm(sets[s], (ember_type)t))
                CHECK_MSG(readable, "%s has a product for %s without a to_float", sets[s]->name, ember_type_name(t));
        const ember_type_kernels *ref = ember_kernels_mm(&ember_kernels_reference, (ember_type)t);
        CHECK_MSG(readable ? ref && ref->rows == ember_rows_reference && !ref->act_size && !ref->pack : !ref,
                  "the reference product of %s", ember_type_name(t));
    }
    CHECK(weight_types == 13);
}

/* The doubling rule of buffers, against hand-computed capacities. */
static void test_grow_cap(void) {
    CHECK(ember_grow_cap(0, 16, 0) == 16 && ember_grow_cap(0, 16, 16) == 16 && ember_grow_cap(0, 16, 17) == 32);
    CHECK(ember_grow_cap(64, 16, 65) == 128 && ember_grow_cap(64, 16, 1000) == 1024 && ember_grow_cap(64, 16, 3) == 64);
    CHECK(ember_grow_cap((size_t)1 << 40, 1, ((size_t)1 << 41) + 1) == (size_t)1 << 42);
    CHECK(ember_grow_cap(SIZE_MAX / 2 + 1, 1, SIZE_MAX) == 0); /* doubling would wrap */
}

/* A weight type a set has no product for is an explicit error at reserve time, on every set. */
static void test_unsupported_product(void) {
    const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    for (int s = 0; s < 3; s++) {
        if (!ember_kernels_supported(sets[s])) continue;
        ember_compute *c = NULL;
        ember_error err = {0};
        CHECK(ember_compute_new(sets[s], 1, &c, &err) == EMBER_OK);
        CHECK(ember_compute_reserve(c, EMBER_TYPE_Q8_0, 64, &err) == EMBER_OK);
        memset(&err, 0, sizeof err);
        /* q8_1: named, with a block geometry, but no product on any set */
        CHECK_MSG(ember_compute_reserve(c, EMBER_TYPE_Q8_1, 64, &err) == EMBER_ERR_UNSUPPORTED &&
                      strstr(err.msg, "q8_1") && strstr(err.msg, ember_kernels_name(sets[s])),
                  "%s: reserve for q8_1: %.300s", ember_kernels_name(sets[s]), err.msg);
        CHECK(ember_compute_reserve(c, EMBER_TYPE_Q4_K, 256, &err) == EMBER_OK);
        CHECK(ember_compute_reserve(c, (ember_type)1000, 64, &err) == EMBER_ERR_UNSUPPORTED);
        ember_compute_free(c);
    }
}

/* The feature table: its names, in the order of ember_cpu_features' fields, each read from its own
 * field; the sets' requirements as their compile flags say (CMakeLists.txt). */
static void test_feature_table(void) {
    static const char *const names[] = {"avx2",     "fma",      "f16c",       "avx512f",
                                        "avx512bw", "avx512vl", "avx512vnni", "avx512bf16"};
    const int n = (int)(sizeof names / sizeof names[0]);
    CHECK(ember_cpu_feature_count() == n && ember_cpu_feature_name(n) == NULL && ember_cpu_feature_name(-1) == NULL);
    for (int i = 0; i < n && i < ember_cpu_feature_count(); i++) {
        CHECK_MSG(strcmp(ember_cpu_feature_name(i), names[i]) == 0, "feature %d is '%s'", i, ember_cpu_feature_name(i));
        ember_cpu_features one;
        memset(&one, 0, sizeof one);
        ((bool *)&one)[i] = true; /* the struct is one bool per feature, in table order */
        for (int j = 0; j < n; j++)
            CHECK_MSG(ember_cpu_feature_on(&one, j) == (i == j), "%s read as %s", names[i], names[j]);
    }
    static const char *const avx2[] = {"avx2", "fma", "f16c", NULL};
    static const char *const avx512[] = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", NULL};
    const struct {
        ember_kernels k;
        const char *const *needs;
    } sets[] = {{EMBER_KERNELS_AUTO, NULL},
                {EMBER_KERNELS_REFERENCE, NULL},
                {EMBER_KERNELS_AVX2, avx2},
                {EMBER_KERNELS_AVX512, avx512}};
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++)
        for (int i = 0; i < n; i++) {
            bool want = false;
            for (const char *const *f = sets[s].needs; f && *f; f++) want = want || strcmp(*f, names[i]) == 0;
            CHECK_MSG(ember_kernels_requires(sets[s].k, i) == want, "%s requires %s: %d", ember_kernels_name(sets[s].k),
                      names[i], !want);
        }
}

int main(void) {
    test_feature_table();
    test_unsupported_product();
    test_best();
    test_env();
    test_sizes();
    test_grow_cap();
    return ember_test_finish();
}
