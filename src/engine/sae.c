/* sae.c — sparse autoencoders and transcoders: their weights in the engine's layout and their
 * encode and decode as threaded products on a compute context (include/ember.h gives the maths).
 * Must not read files or know any file format (lib/ember/sae/ reads them); it never calls a hook. */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ember_sae {
    int64_t d_in, d_sae, d_out, k;
    ember_sae_arch arch;
    ember_sae_norm norm;
    bool apply_b_dec, denorm_out;
    float scale_in, scale_out;
    ember_compute *compute;
    bool own_compute;
    ember_matrix enc;                  /* (d_sae, d_in) in dtype: row i = feature i's encoder column */
    ember_matrix dec;                  /* (d_out, d_sae) in dtype: row j = output j's weights over the features */
    float *b_enc;                      /* (d_sae) */
    float *b_dec;                      /* (d_out) */
    float *threshold;                  /* (d_sae) jumprelu, else NULL */
    float *b_gate, *b_mag, *exp_r_mag; /* (d_sae) each, gated, else NULL */
    float *scaling;                    /* (d_sae) or NULL */
    /* scratch, grown to the largest call: */
    float *xin;       /* (cap_rows, d_in) the normalised inputs */
    float *fs;        /* (cap_rows, d_sae) scaled or gathered features for a decode */
    float *stats;     /* (cap_rows, 4) per row: sub, mul, dmul, dadd */
    int64_t cap_rows; /* rows the scratch holds */
    int64_t *topk;    /* (n_threads, k) each thread's selection */
    int64_t topk_thr; /* threads topk holds */
};

/* ---- building -------------------------------------------------------------------------------- */

static bool half_type(ember_type t) { return t == EMBER_TYPE_F32 || t == EMBER_TYPE_F16 || t == EMBER_TYPE_BF16; }

/* Element i of t as f32 (exact: f16 and bf16 widen without rounding). */
static float tensor_value(const ember_sae_tensor *t, int64_t i) {
    const uint8_t *p = t->data;
    if (t->type == EMBER_TYPE_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t->type == EMBER_TYPE_F16 ? ember_f16_to_f32(h) : ember_bf16_to_f32(h);
}

/* Stores v as element i of a buffer of type t (round to nearest even for the halves). */
static void store_value(ember_type t, void *dst, int64_t i, float v) {
    if (t == EMBER_TYPE_F32) {
        ((float *)dst)[i] = v;
        return;
    }
    ((uint16_t *)dst)[i] = t == EMBER_TYPE_F16 ? ember_f32_to_f16(v) : ember_f32_to_bf16(v);
}

static ember_status check_tensor(const ember_sae_tensor *t, const char *name, int64_t rows, int64_t cols,
                                 ember_error *err) {
    if (!t->data) return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_new: tensor '%s' is missing", name);
    if (!half_type(t->type))
        return ember_error_set(err, EMBER_ERR_UNSUPPORTED,
                               "ember_sae_new: tensor '%s' has type %s (f32, f16 or bf16 are read)", name,
                               ember_type_name((uint32_t)t->type));
    if (t->rows * t->cols != rows * cols || (t->rows != rows && t->rows != 1 && rows != 1))
        return ember_error_set(err, EMBER_ERR_ARG,
                               "ember_sae_new: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name,
                               (long long)t->rows, (long long)t->cols, (long long)rows, (long long)cols);
    return EMBER_OK;
}

/* A (n, ) vector as f32: a copy of t, zeros when t is absent and optional. */
static ember_status vector_f32(const ember_sae_tensor *t, const char *name, int64_t n, bool optional, float **out,
                               ember_error *err) {
    *out = NULL;
    if (!t->data && optional) {
        *out = calloc((size_t)n, sizeof(float));
        return *out ? EMBER_OK : ember_error_set(err, EMBER_ERR_NOMEM, "ember_sae_new: out of memory for '%s'", name);
    }
    ember_status st = check_tensor(t, name, 1, n, err);
    if (st != EMBER_OK) return st;
    *out = malloc((size_t)n * sizeof(float));
    if (!*out) return ember_error_set(err, EMBER_ERR_NOMEM, "ember_sae_new: out of memory for '%s'", name);
    for (int64_t i = 0; i < n; i++) (*out)[i] = tensor_value(t, i);
    return EMBER_OK;
}

/* m (n_out, n_in) in type from t, which holds it as is (transpose false) or as its transpose
 * (n_in, n_out); blocks of 64 x 64 keep a transposition inside the caches. */
static ember_status matrix_from(ember_matrix *m, ember_type type, const ember_sae_tensor *t, const char *name,
                                int64_t n_out, int64_t n_in, bool transpose, ember_error *err) {
    ember_status st = transpose ? check_tensor(t, name, n_in, n_out, err) : check_tensor(t, name, n_out, n_in, err);
    if (st != EMBER_OK) return st;
    size_t bytes;
    if (!ember_type_nbytes(type, n_out * n_in, &bytes))
        return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_new: tensor '%s' of %lld x %lld values overflows", name,
                               (long long)n_out, (long long)n_in);
    void *data = malloc(bytes);
    if (!data)
        return ember_error_set(err, EMBER_ERR_NOMEM, "ember_sae_new: cannot allocate %zu bytes for '%s'", bytes, name);
    for (int64_t o0 = 0; o0 < n_out; o0 += 64)
        for (int64_t i0 = 0; i0 < n_in; i0 += 64)
            for (int64_t o = o0; o < o0 + 64 && o < n_out; o++)
                for (int64_t i = i0; i < i0 + 64 && i < n_in; i++)
                    store_value(type, data, o * n_in + i, tensor_value(t, transpose ? i * n_out + o : o * n_in + i));
    *m = (ember_matrix){
        .type = type, .data = data, .n_in = n_in, .n_out = n_out, .row_bytes = ember_type_row_size(type, n_in)};
    return EMBER_OK;
}

static ember_status check_params(const ember_sae_params *p, ember_error *err) {
    if (p->d_in < 1 || p->d_sae < 1 || p->d_out < 1)
        return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_new: d_in %lld, d_sae %lld and d_out %lld must be >= 1",
                               (long long)p->d_in, (long long)p->d_sae, (long long)p->d_out);
    if (!half_type(p->dtype))
        return ember_error_set(err, EMBER_ERR_UNSUPPORTED, "ember_sae_new: dtype %s (f32, f16 or bf16)",
                               ember_type_name((uint32_t)p->dtype));
    if ((unsigned)p->arch > EMBER_SAE_GATED || (unsigned)p->norm > EMBER_SAE_NORM_LAYER_NORM)
        return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_new: unknown architecture or normalisation");
    if (p->arch == EMBER_SAE_TOPK && (p->k < 1 || p->k > p->d_sae))
        return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_new: k = %lld must be in 1..d_sae (%lld)",
                               (long long)p->k, (long long)p->d_sae);
    if (p->norm == EMBER_SAE_NORM_SCALE &&
        !(p->scale_in > 0 && p->scale_out > 0 && isfinite(p->scale_in) && isfinite(p->scale_out)))
        return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_new: scale_in %g and scale_out %g must be finite and > 0",
                               p->scale_in, p->scale_out);
    if (p->apply_b_dec_to_input && p->d_in != p->d_out)
        return ember_error_set(err, EMBER_ERR_ARG,
                               "ember_sae_new: apply_b_dec_to_input needs d_out = d_in (%lld != %lld: a transcoder)",
                               (long long)p->d_out, (long long)p->d_in);
    return EMBER_OK;
}

static ember_status build_vectors(ember_sae *s, const ember_sae_params *p, ember_error *err) {
    ember_status st;
    if ((st = vector_f32(&p->b_dec, "b_dec", s->d_out, true, &s->b_dec, err))) return st;
    if ((st = vector_f32(&p->b_enc, "b_enc", s->d_sae, true, &s->b_enc, err))) return st;
    if (p->scaling.data && (st = vector_f32(&p->scaling, "scaling_factor", s->d_sae, false, &s->scaling, err)))
        return st;
    if (p->arch == EMBER_SAE_JUMPRELU) {
        if (!p->threshold.data) {
            if (!(s->threshold = malloc((size_t)s->d_sae * sizeof(float))))
                return ember_error_set(err, EMBER_ERR_NOMEM, "ember_sae_new: out of memory for 'threshold'");
            for (int64_t i = 0; i < s->d_sae; i++) s->threshold[i] = (float)p->threshold_all;
        } else if ((st = vector_f32(&p->threshold, "threshold", s->d_sae, false, &s->threshold, err))) return st;
    }
    if (p->arch == EMBER_SAE_GATED) {
        if ((st = vector_f32(&p->b_gate, "b_gate", s->d_sae, false, &s->b_gate, err))) return st;
        if ((st = vector_f32(&p->b_mag, "b_mag", s->d_sae, false, &s->b_mag, err))) return st;
        if ((st = vector_f32(&p->r_mag, "r_mag", s->d_sae, false, &s->exp_r_mag, err))) return st;
        for (int64_t i = 0; i < s->d_sae; i++) s->exp_r_mag[i] = expf(s->exp_r_mag[i]);
    }
    return EMBER_OK;
}

static ember_status build(ember_sae *s, const ember_model *model, const ember_sae_params *p, ember_error *err) {
    ember_status st;
    if (model) s->compute = model->compute;
    else {
        if ((st = ember_compute_new(p->kernels, p->n_threads > 0 ? p->n_threads : ember_cpu_physical_cores(),
                                    &s->compute, err)))
            return st;
        s->own_compute = true;
    }
    if ((st = ember_compute_reserve(s->compute, p->dtype, p->d_in, err))) return st;
    if ((st = matrix_from(&s->enc, p->dtype, &p->w_enc, "W_enc", p->d_sae, p->d_in, !p->enc_by_feature, err)))
        return st;
    if ((st = matrix_from(&s->dec, p->dtype, &p->w_dec, "W_dec", p->d_out, p->d_sae, !p->dec_by_output, err)))
        return st;
    return build_vectors(s, p, err);
}

ember_status ember_sae_new(const ember_model *model, const ember_sae_params *p, ember_sae **out, ember_error *err) {
    *out = NULL;
    ember_status st = check_params(p, err);
    if (st != EMBER_OK) return st;
    ember_sae *s = calloc(1, sizeof *s);
    if (!s) return ember_error_set(err, EMBER_ERR_NOMEM, "ember_sae_new: out of memory");
    s->d_in = p->d_in;
    s->d_sae = p->d_sae;
    s->d_out = p->d_out;
    s->k = p->k;
    s->arch = p->arch;
    s->norm = p->norm;
    s->apply_b_dec = p->apply_b_dec_to_input;
    s->denorm_out = p->denormalize_output;
    s->scale_in = (float)p->scale_in;
    s->scale_out = (float)p->scale_out;
    if ((st = build(s, model, p, err)) != EMBER_OK) {
        ember_sae_free(s);
        return st;
    }
    *out = s;
    return EMBER_OK;
}

void ember_sae_free(ember_sae *s) {
    if (!s) return;
    if (s->own_compute) ember_compute_free(s->compute);
    free((void *)s->enc.data);
    free((void *)s->dec.data);
    free(s->b_enc);
    free(s->b_dec);
    free(s->threshold);
    free(s->b_gate);
    free(s->b_mag);
    free(s->exp_r_mag);
    free(s->scaling);
    free(s->xin);
    free(s->fs);
    free(s->stats);
    free(s->topk);
    free(s);
}

const char *ember_sae_kernels(const ember_sae *s) { return ember_compute_ops(s->compute)->name; }

/* ---- scratch --------------------------------------------------------------------------------- */

static ember_status grow_scratch(ember_sae *s, int64_t rows, ember_error *err) {
    const int64_t thr = ember_compute_threads(s->compute);
    if (s->arch == EMBER_SAE_TOPK && thr > s->topk_thr) {
        int64_t *t = realloc(s->topk, (size_t)(thr * s->k) * sizeof *t);
        if (!t) return ember_error_set(err, EMBER_ERR_NOMEM, "ember_sae: out of memory for the top-k scratch");
        s->topk = t;
        s->topk_thr = thr;
    }
    if (rows <= s->cap_rows) return EMBER_OK;
    if ((uint64_t)rows > SIZE_MAX / sizeof(float) / (uint64_t)(s->d_sae > s->d_in ? s->d_sae : s->d_in))
        return ember_error_set(err, EMBER_ERR_ARG, "ember_sae: %lld rows overflow the scratch", (long long)rows);
    float *xin = realloc(s->xin, (size_t)(rows * s->d_in) * sizeof(float));
    if (xin) s->xin = xin;
    float *fs = xin ? realloc(s->fs, (size_t)(rows * s->d_sae) * sizeof(float)) : NULL;
    if (fs) s->fs = fs;
    float *stats = fs ? realloc(s->stats, (size_t)(rows * 4) * sizeof(float)) : NULL;
    if (stats) s->stats = stats;
    if (!stats)
        return ember_error_set(err, EMBER_ERR_NOMEM, "ember_sae: cannot allocate the scratch of %lld rows",
                               (long long)rows);
    s->cap_rows = rows;
    return EMBER_OK;
}

/* ---- the row's normalisation ----------------------------------------------------------------- */

/* stats of row x: [sub, mul, dmul, dadd], sums in double. */
static void row_stats(const ember_sae *s, const float *x, float *st) {
    st[0] = 0.0f, st[1] = 1.0f, st[2] = 1.0f, st[3] = 0.0f;
    const int64_t n = s->d_in;
    if (s->norm == EMBER_SAE_NORM_SCALE) {
        st[1] = s->scale_in;
        st[2] = 1.0f / s->scale_out;
    } else if (s->norm == EMBER_SAE_NORM_CONSTANT_NORM_RESCALE) {
        double ss = 0.0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
        if (ss > 0.0) {
            st[1] = (float)(sqrt((double)n) / sqrt(ss));
            st[2] = (float)(sqrt(ss) / sqrt((double)n));
        }
    } else if (s->norm == EMBER_SAE_NORM_LAYER_NORM) {
        double sum = 0.0, ss = 0.0;
        for (int64_t i = 0; i < n; i++) sum += x[i];
        const double mu = sum / (double)n;
        for (int64_t i = 0; i < n; i++) ss += ((double)x[i] - mu) * ((double)x[i] - mu);
        const double sd = n > 1 ? sqrt(ss / (double)(n - 1)) : 0.0; /* unbiased, as torch.std */
        st[0] = (float)mu;
        st[1] = (float)(1.0 / (sd + 1e-5));
        st[2] = (float)sd;
        st[3] = (float)mu;
    }
    if (!s->denorm_out) st[2] = 1.0f, st[3] = 0.0f;
}

typedef struct {
    ember_sae *s;
    const float *x; /* (rows, d_in) */
    float *f;       /* (rows, d_sae) */
} rows_job;

static void prepare_rows(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const rows_job *j = arg;
    const ember_sae *s = j->s;
    for (int64_t r = begin; r < end; r++) {
        const float *x = j->x + r * s->d_in;
        float *st = s->stats + 4 * r, *xin = s->xin + r * s->d_in;
        row_stats(s, x, st);
        for (int64_t i = 0; i < s->d_in; i++) {
            float v = (x[i] - st[0]) * st[1];
            if (s->apply_b_dec) v -= s->b_dec[i];
            xin[i] = v;
        }
    }
}

/* ---- the activations ------------------------------------------------------------------------- */

/* a ranks above b: larger, or equal and at a lower index (NaN above every number). */
static bool ranks_above(float a, int64_t ia, float b, int64_t ib) {
    if (isnan(a) || isnan(b)) return isnan(a) && (!isnan(b) || ia < ib);
    return a > b || (a == b && ia < ib);
}

/* Keeps the k best of row p (d values) in heap h, a min-heap by rank, then writes f. */
static void topk_row(const float *p, int64_t d, int64_t k, int64_t *h, float *f) {
    int64_t n = 0;
    for (int64_t i = 0; i < d; i++) {
        if (n == k && !ranks_above(p[i], i, p[h[0]], h[0])) continue;
        int64_t at;
        if (n < k) { /* sift up from the end */
            at = n++;
            while (at > 0 && ranks_above(p[h[(at - 1) / 2]], h[(at - 1) / 2], p[i], i)) {
                h[at] = h[(at - 1) / 2];
                at = (at - 1) / 2;
            }
        } else { /* replace the root, sift down */
            at = 0;
            for (;;) {
                int64_t c = 2 * at + 1;
                if (c >= k) break;
                if (c + 1 < k && ranks_above(p[h[c]], h[c], p[h[c + 1]], h[c + 1])) c++;
                if (!ranks_above(p[i], i, p[h[c]], h[c])) break;
                h[at] = h[c];
                at = c;
            }
        }
        h[at] = i;
    }
    for (int64_t i = 0; i < d; i++) f[i] = 0.0f;
    for (int64_t j = 0; j < n; j++) f[h[j]] = p[h[j]] > 0.0f ? p[h[j]] : 0.0f;
}

/* f holds x_in W_enc^T on entry; each row becomes its features. */
static void activate_rows(void *arg, int64_t begin, int64_t end, int tid) {
    const rows_job *j = arg;
    const ember_sae *s = j->s;
    const int64_t d = s->d_sae;
    for (int64_t r = begin; r < end; r++) {
        float *f = j->f + r * d;
        switch (s->arch) {
        case EMBER_SAE_STANDARD:
            for (int64_t i = 0; i < d; i++) f[i] = fmaxf(f[i] + s->b_enc[i], 0.0f);
            break;
        case EMBER_SAE_JUMPRELU:
            for (int64_t i = 0; i < d; i++) {
                const float v = f[i] + s->b_enc[i];
                f[i] = v > s->threshold[i] && v > 0.0f ? v : 0.0f;
            }
            break;
        case EMBER_SAE_TOPK:
            for (int64_t i = 0; i < d; i++) f[i] += s->b_enc[i];
            /* the pre-activations wait in fs's row while f is rewritten */
            memcpy(s->fs + r * d, f, (size_t)d * sizeof(float));
            topk_row(s->fs + r * d, d, s->k, s->topk + (int64_t)tid * s->k, f);
            break;
        case EMBER_SAE_GATED:
            for (int64_t i = 0; i < d; i++) {
                const float h = f[i], mag = h * s->exp_r_mag[i] + s->b_mag[i];
                f[i] = h + s->b_gate[i] > 0.0f && mag > 0.0f ? mag : 0.0f;
            }
            break;
        }
    }
}

ember_status ember_sae_encode(ember_sae *s, const float *x, int64_t rows, float *f, ember_error *err) {
    if (!s || !x || !f || rows < 0) return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_encode: bad arguments");
    if (rows == 0) return EMBER_OK;
    ember_status st = grow_scratch(s, rows, err);
    if (st != EMBER_OK) return st;
    rows_job j = {.s = s, .x = x, .f = f};
    ember_compute_for(s->compute, rows, 1, prepare_rows, &j);
    ember_matmul(s->compute, &s->enc, s->xin, f, rows);
    ember_compute_for(s->compute, rows, 1, activate_rows, &j);
    return EMBER_OK;
}

/* ---- decoding -------------------------------------------------------------------------------- */

static bool norm_needs_input(const ember_sae *s) {
    return s->denorm_out && (s->norm == EMBER_SAE_NORM_CONSTANT_NORM_RESCALE || s->norm == EMBER_SAE_NORM_LAYER_NORM);
}

static void decode_stats(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const rows_job *j = arg;
    for (int64_t r = begin; r < end; r++) row_stats(j->s, j->x + r * j->s->d_in, j->s->stats + 4 * r);
}

/* The stats of every row for a decode: from the inputs when the normalisation depends on them,
 * else the same for every row. */
static void fill_decode_stats(ember_sae *s, const float *x, int64_t rows) {
    if (norm_needs_input(s)) {
        rows_job j = {.s = s, .x = x};
        ember_compute_for(s->compute, rows, 1, decode_stats, &j);
        return;
    }
    const float dmul = s->denorm_out && s->norm == EMBER_SAE_NORM_SCALE ? 1.0f / s->scale_out : 1.0f;
    for (int64_t r = 0; r < rows; r++) {
        float *q = s->stats + 4 * r;
        q[0] = 0.0f, q[1] = 1.0f, q[2] = dmul, q[3] = 0.0f;
    }
}

ember_status ember_sae_decode(ember_sae *s, const float *f, const float *x, int64_t rows, float *out,
                              ember_error *err) {
    if (!s || !f || !out || rows < 0) return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_decode: bad arguments");
    if (!x && norm_needs_input(s))
        return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_decode: normalize_activations = %s needs the inputs",
                               s->norm == EMBER_SAE_NORM_LAYER_NORM ? "layer_norm" : "constant_norm_rescale");
    if (rows == 0) return EMBER_OK;
    ember_status st = grow_scratch(s, rows, err);
    if (st != EMBER_OK) return st;
    const float *fin = f;
    if (s->scaling) {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < s->d_sae; i++) s->fs[r * s->d_sae + i] = f[r * s->d_sae + i] * s->scaling[i];
        fin = s->fs;
    }
    fill_decode_stats(s, x, rows);
    ember_matmul(s->compute, &s->dec, fin, out, rows);
    for (int64_t r = 0; r < rows; r++) {
        const float *q = s->stats + 4 * r;
        float *o = out + r * s->d_out;
        for (int64_t i = 0; i < s->d_out; i++) o[i] = (o[i] + s->b_dec[i]) * q[2] + q[3];
    }
    return EMBER_OK;
}

ember_status ember_sae_direction(const ember_sae *s, int64_t feature, float *out, ember_error *err) {
    if (feature < 0 || feature >= s->d_sae)
        return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_direction: feature %lld is outside 0..%lld",
                               (long long)feature, (long long)(s->d_sae - 1));
    const ember_type_traits *tr = ember_type_traits_get(s->dec.type);
    for (int64_t o = 0; o < s->d_out; o++) {
        float v;
        tr->to_float((const uint8_t *)s->dec.data + (size_t)o * s->dec.row_bytes + (size_t)feature * tr->block_bytes,
                     &v, 1);
        out[o] = s->scaling ? v * s->scaling[feature] : v;
    }
    return EMBER_OK;
}

int64_t ember_sae_d_in(const ember_sae *s) { return s->d_in; }
int64_t ember_sae_d_sae(const ember_sae *s) { return s->d_sae; }
int64_t ember_sae_d_out(const ember_sae *s) { return s->d_out; }

/* ---- splicing into a forward pass -------------------------------------------------------------- */

typedef struct {
    ember_sae_site s;
    float *x;          /* (cap, d_in) the inputs, gathered when they are a slice of the view */
    float *f, *g;      /* (cap, d_sae) the features shown at sae_features, and the clean ones */
    float *d;          /* (cap, d_out) what the output stage adds or writes */
    uint8_t *row_set;  /* (cap) rows of d to apply */
    int64_t cap, rows; /* rows of the pending evaluation */
    bool pending;      /* the input ran in this evaluation; the output is due */
    bool any;          /* some row of d is set */
    int64_t calls, changed_rows;
} sae_site_state;

struct ember_sae_sites {
    int n;
    sae_site_state *site; /* (n) */
};

/* Stages an SAE reads and writes: a [rows, width] activation (not the pattern, not the features,
 * not the logits). */
static bool site_stage_ok(ember_stage st) {
    return (unsigned)st < EMBER_STAGE_COUNT && st != EMBER_STAGE_ATTENTION_PATTERN && st != EMBER_STAGE_SAE_FEATURES &&
           st != EMBER_STAGE_AFTER_LOGITS;
}

static ember_status check_site(const ember_sae_site *t, int i, ember_error *err) {
    if (!t->sae) return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_sites_new: site %d has no SAE", i);
    if (!site_stage_ok(t->stage) || !site_stage_ok(t->stage_out))
        return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_sites_new: site %d: an SAE cannot read %s or write %s", i,
                               ember_stage_name(t->stage) ? ember_stage_name(t->stage) : "?",
                               ember_stage_name(t->stage_out) ? ember_stage_name(t->stage_out) : "?");
    /* the output comes in the same evaluation, at or after the input (layers, then stage order) */
    const bool logits_in = t->stage == EMBER_STAGE_BEFORE_LOGITS,
               logits_out = t->stage_out == EMBER_STAGE_BEFORE_LOGITS;
    const bool after = logits_out  ? true
                       : logits_in ? false
                                   : t->layer_out > t->layer || (t->layer_out == t->layer && t->stage_out >= t->stage);
    if (!after || t->col0 < 0 || t->col0_out < 0 || (!logits_in && t->layer < 0) || (!logits_out && t->layer_out < 0))
        return ember_error_set(err, EMBER_ERR_ARG,
                               "ember_sae_sites_new: site %d writes at %s of layer %lld, before it reads (%s of layer "
                               "%lld), or has a negative layer or column",
                               i, ember_stage_name(t->stage_out), (long long)t->layer_out, ember_stage_name(t->stage),
                               (long long)t->layer);
    if (t->splice != EMBER_SAE_SPLICE_ERROR && t->splice != EMBER_SAE_SPLICE_RECONSTRUCTION)
        return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_sites_new: site %d has an unknown splice", i);
    return EMBER_OK;
}

ember_status ember_sae_sites_new(const ember_sae_site *sites, int n, ember_sae_sites **out, ember_error *err) {
    *out = NULL;
    if (n < 1 || !sites) return ember_error_set(err, EMBER_ERR_ARG, "ember_sae_sites_new: no sites");
    for (int i = 0; i < n; i++) {
        ember_status st = check_site(&sites[i], i, err);
        if (st != EMBER_OK) return st;
    }
    ember_sae_sites *S = calloc(1, sizeof *S);
    if (S) S->site = calloc((size_t)n, sizeof *S->site);
    if (!S || !S->site) {
        free(S);
        return ember_error_set(err, EMBER_ERR_NOMEM, "ember_sae_sites_new: out of memory");
    }
    S->n = n;
    for (int i = 0; i < n; i++) S->site[i].s = sites[i];
    *out = S;
    return EMBER_OK;
}

void ember_sae_sites_free(ember_sae_sites *S) {
    if (!S) return;
    for (int i = 0; i < S->n; i++) {
        sae_site_state *t = &S->site[i];
        free(t->x);
        free(t->f);
        free(t->g);
        free(t->d);
        free(t->row_set);
    }
    free(S->site);
    free(S);
}

int ember_sae_sites_count(const ember_sae_sites *S) { return S->n; }
int64_t ember_sae_sites_calls(const ember_sae_sites *S, int i) { return i >= 0 && i < S->n ? S->site[i].calls : 0; }
int64_t ember_sae_sites_changed_rows(const ember_sae_sites *S, int i) {
    return i >= 0 && i < S->n ? S->site[i].changed_rows : 0;
}

static ember_status site_grow(sae_site_state *t, int64_t rows, ember_error *err) {
    if (rows <= t->cap) return EMBER_OK;
    const ember_sae *s = t->s.sae;
    float *x = realloc(t->x, (size_t)(rows * s->d_in) * sizeof(float));
    if (x) t->x = x;
    float *f = x ? realloc(t->f, (size_t)(rows * s->d_sae) * sizeof(float)) : NULL;
    if (f) t->f = f;
    float *g = f ? realloc(t->g, (size_t)(rows * s->d_sae) * sizeof(float)) : NULL;
    if (g) t->g = g;
    float *d = g ? realloc(t->d, (size_t)(rows * s->d_out) * sizeof(float)) : NULL;
    if (d) t->d = d;
    uint8_t *m = d ? realloc(t->row_set, (size_t)rows) : NULL;
    if (m) t->row_set = m;
    if (!m)
        return ember_error_set(err, EMBER_ERR_NOMEM,
                               "sae splice: cannot allocate the buffers of %lld rows x %lld features", (long long)rows,
                               (long long)s->d_sae);
    t->cap = rows;
    return EMBER_OK;
}

/* The input stage: gather x, encode, show the features, and prepare what the output writes. */
static ember_status site_input(const ember_hooks *h, int idx, sae_site_state *t, ember_eval_ctx *ctx, int64_t layer,
                               const ember_view *v, ember_error *err) {
    ember_sae *s = t->s.sae;
    if (t->s.sliced ? v->cols < t->s.col0 + s->d_in : v->cols != s->d_in)
        return ember_error_set(
            err, EMBER_ERR_ARG,
            "sae splice: %s of layer %lld has %lld columns, the SAE reads %lld (d_in) from column %lld",
            ember_stage_name(t->s.stage), (long long)layer, (long long)v->cols, (long long)s->d_in,
            (long long)t->s.col0);
    const int64_t rows = v->rows;
    ember_status st = site_grow(t, rows, err);
    if (st != EMBER_OK) return st;
    for (int64_t r = 0; r < rows; r++)
        memcpy(t->x + r * s->d_in, v->data + r * v->cols + t->s.col0, (size_t)s->d_in * sizeof(float));
    if ((st = ember_sae_encode(s, t->x, rows, t->f, err))) return st;
    t->rows = rows;
    t->pending = true;
    t->any = false;
    t->calls++;
    ember_view fv = {.data = t->f, .rows = rows, .cols = s->d_sae};
    if (h->on_tensor[EMBER_STAGE_SAE_FEATURES]) {
        const int saved = ctx->sae_site;
        ctx->sae_site = idx + 1;
        ctx->layer_index = layer;
        st = h->on_tensor[EMBER_STAGE_SAE_FEATURES](h->user, EMBER_STAGE_SAE_FEATURES, ctx, &fv, err);
        ctx->sae_site = saved;
        if (st != EMBER_OK) return st;
    }
    if (t->s.splice == EMBER_SAE_SPLICE_RECONSTRUCTION) {
        if ((st = ember_sae_decode(s, t->f, t->x, rows, t->d, err))) return st;
        memset(t->row_set, 1, (size_t)rows);
        t->any = true;
        return EMBER_OK;
    }
    if (!fv.written) return EMBER_OK; /* nothing edited: the pass stays as it was, bit for bit */
    /* the clean features again (the same code on the same inputs: the same bits), the rows that
     * differ, and the decoder's linear part on the difference */
    if ((st = ember_sae_encode(s, t->x, rows, t->g, err))) return st;
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *fe = t->f + r * s->d_sae, *fc = t->g + r * s->d_sae;
        bool differs = false;
        for (int64_t i = 0; i < s->d_sae && !differs; i++) differs = fe[i] != fc[i]; /* -0 = +0; NaN differs */
        t->row_set[r] = differs;
        if (!differs) continue;
        float *dst = t->g + n * s->d_sae; /* compacted in place: row n <= r */
        for (int64_t i = 0; i < s->d_sae; i++) dst[i] = fe[i] - fc[i];
        n++;
    }
    if (n == 0) return EMBER_OK;
    if ((st = grow_scratch(s, n, err))) return st;
    const float *din = t->g;
    if (s->scaling) {
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < s->d_sae; i++) s->fs[r * s->d_sae + i] = t->g[r * s->d_sae + i] * s->scaling[i];
        din = s->fs;
    }
    ember_matmul(s->compute, &s->dec, din, t->d, n);
    /* spread the n compact rows back to their places (from the last: row k goes to r >= k), each
     * scaled by its row's denormalising factor */
    for (int64_t r = rows - 1, k = n - 1; r >= 0; r--) {
        if (!t->row_set[r]) continue;
        float q[4];
        if (norm_needs_input(s)) row_stats(s, t->x + r * s->d_in, q);
        else q[2] = s->denorm_out && s->norm == EMBER_SAE_NORM_SCALE ? 1.0f / s->scale_out : 1.0f;
        float *src = t->d + k * s->d_out, *dst = t->d + r * s->d_out;
        for (int64_t j = s->d_out - 1; j >= 0; j--) dst[j] = src[j] * q[2];
        k--;
    }
    t->any = true;
    return EMBER_OK;
}

/* The output stage: add the difference (error splice) or write the reconstruction. */
static ember_status site_output(sae_site_state *t, ember_view *v, ember_error *err) {
    const ember_sae *s = t->s.sae;
    t->pending = false;
    if (!t->any) return EMBER_OK;
    if (v->rows != t->rows || (t->s.sliced_out ? v->cols < t->s.col0_out + s->d_out : v->cols != s->d_out))
        return ember_error_set(err, EMBER_ERR_ARG, "sae splice: %s is [%lld, %lld], the SAE writes %lld rows of %lld",
                               ember_stage_name(t->s.stage_out), (long long)v->rows, (long long)v->cols,
                               (long long)t->rows, (long long)s->d_out);
    const bool replace = t->s.splice == EMBER_SAE_SPLICE_RECONSTRUCTION;
    for (int64_t r = 0; r < t->rows; r++) {
        if (!t->row_set[r]) continue;
        float *y = v->data + r * v->cols + t->s.col0_out;
        const float *d = t->d + r * s->d_out;
        if (replace) memcpy(y, d, (size_t)s->d_out * sizeof(float));
        else
            for (int64_t j = 0; j < s->d_out; j++) y[j] += d[j];
        t->changed_rows++;
    }
    v->written = true;
    return EMBER_OK;
}

ember_status ember_sae_sites_run(const ember_hooks *h, ember_stage stage, ember_eval_ctx *ctx, int64_t layer,
                                 ember_view *v, ember_error *err) {
    ember_sae_sites *S = h->saes;
    for (int i = 0; i < S->n; i++) {
        sae_site_state *t = &S->site[i];
        ember_status st = EMBER_OK;
        if (t->s.stage == stage && t->s.layer == layer) st = site_input(h, i, t, ctx, layer, v, err);
        if (st == EMBER_OK && t->pending && t->s.stage_out == stage && t->s.layer_out == layer)
            st = site_output(t, v, err);
        if (st != EMBER_OK) return st;
    }
    return EMBER_OK;
}
