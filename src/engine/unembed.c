/* unembed.c — the logit lens: a residual-stream row through the family's final norm, the LM head
 * and its post-processing, outside any forward pass; and the final norm of residual components
 * with a frozen scale (direct logit attribution). Calls no hook and touches no session. */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The family's final norm, computed with the same call the forward pass makes on its last row,
 * so the last layer's residual gives the run's logits bit for bit. */
static void final_norm(const ember_model *m, float *y, const float *x) {
    if (m->family->final_norm == EMBER_NORM_LAYER)
        m->ops->layernorm(y, x, m->output_norm, m->output_norm_b, m->n_embd, m->norm_eps);
    else m->ops->rmsnorm(y, x, m->output_norm, m->n_embd, m->norm_eps);
}

ember_status ember_model_unembed(const ember_model *m, const float *x, int64_t rows, float *out, ember_error *err) {
    if (!m || !x || !out || rows < 1)
        return ember_error_set(err, EMBER_ERR_ARG, "ember_model_unembed: need a model, %lld >= 1 rows and buffers",
                               (long long)rows);
    const int64_t d = m->n_embd;
    /* One normed copy of the request: what was asked for, nothing kept. */
    if ((uint64_t)rows > SIZE_MAX / sizeof(float) / (uint64_t)d)
        return ember_error_set(err, EMBER_ERR_ARG, "ember_model_unembed: %lld rows of %lld values overflow",
                               (long long)rows, (long long)d);
    float *xn = malloc((size_t)rows * (size_t)d * sizeof(float));
    if (!xn)
        return ember_error_set(err, EMBER_ERR_NOMEM, "ember_model_unembed: cannot allocate %lld rows of %lld values",
                               (long long)rows, (long long)d);
    for (int64_t r = 0; r < rows; r++) final_norm(m, xn + r * d, x + r * d);
    ember_matmul(m->compute, &m->output, xn, out, rows);
    free(xn);
    if (m->softcap > 0.0f) /* cap * tanh(logits / cap), as in ember_logits_head */
        for (int64_t i = 0, n = rows * m->n_vocab; i < n; i++) out[i] = m->softcap * tanhf(out[i] / m->softcap);
    return EMBER_OK;
}

ember_status ember_model_final_norm_frozen(const ember_model *m, const float *x, int64_t rows, const float *ref,
                                           int64_t ref_rows, float *out, ember_error *err) {
    if (!m || !x || !ref || !out || rows < 1 || (ref_rows != rows && ref_rows != 1))
        return ember_error_set(err, EMBER_ERR_ARG,
                               "final_norm_frozen: need a model, rows >= 1 (got %lld) and 1 or as many reference "
                               "rows (got %lld)",
                               (long long)rows, (long long)ref_rows);
    const int64_t d = m->n_embd;
    const bool layer = m->family->final_norm == EMBER_NORM_LAYER;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *rr = ref + (ref_rows == 1 ? 0 : r) * d;
        float ref_mean, scale = layer ? ember_layernorm_scale(rr, d, m->norm_eps, &ref_mean)
                                      : ember_rmsnorm_scale(rr, d, m->norm_eps);
        /* LayerNorm centres each component on its own mean: the mean is linear, so the centred
         * components sum to the centred residual. */
        float mean = 0.0f;
        if (layer) {
            for (int64_t i = 0; i < d; i++) mean += xr[i];
            mean /= (float)d;
        }
        float *y = out + r * d;
        for (int64_t i = 0; i < d; i++) y[i] = (xr[i] - mean) * scale * m->output_norm[i];
    }
    return EMBER_OK;
}
