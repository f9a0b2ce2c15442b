/* gradients.c — ember_session_gradients: the request checked, one forward pass keeping its tape
 * (and, if asked, the values at the requested stages through read-only hooks), the metric and its
 * gradient on the logits, the LM head and final norm backward, then the family's backward; and
 * the gradients object holding what was kept. Must not know any family's block. */
#include "backward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *data; /* (rows, cols) */
    int64_t rows, cols;
} grad_entry;

struct ember_gradients {
    int64_t n_layer;
    double metric;
    bool want[EMBER_STAGE_COUNT], want_embeddings;
    grad_entry *grad[EMBER_STAGE_COUNT];  /* (n_layer) per-layer stages; entry 0 for the logits stages */
    grad_entry *value[EMBER_STAGE_COUNT]; /* likewise, when values were asked for */
    grad_entry embeddings;
    bool failed; /* an allocation failed while keeping */
};

/* The stage table's in_layer: once per layer, or once per evaluation (the logits stages). */
static bool per_layer(ember_stage st) { return ember_stage_get(st)->in_layer; }

static grad_entry *entry_of(grad_entry *const *table, const ember_gradients *g, ember_stage st, int64_t layer) {
    if ((unsigned)st >= EMBER_STAGE_COUNT || !table[st]) return NULL;
    if (per_layer(st) ? layer < 0 || layer >= g->n_layer : layer != -1) return NULL;
    return &table[st][per_layer(st) ? layer : 0];
}

static void keep_into(ember_gradients *g, grad_entry *e, const float *data, int64_t rows, int64_t cols) {
    if (!e) return;
    const size_t bytes = (size_t)(rows * cols) * sizeof(float);
    float *p = e->rows * e->cols == rows * cols ? e->data : realloc(e->data, bytes > 0 ? bytes : 1);
    if (!p) {
        g->failed = true;
        return;
    }
    memcpy(p, data, bytes);
    e->data = p;
    e->rows = rows;
    e->cols = cols;
}

bool ember_backward_wants(const ember_backward *b, ember_stage stage, int64_t layer) {
    return entry_of(b->out->grad, b->out, stage, layer) != NULL;
}

void ember_backward_keep(ember_backward *b, ember_stage stage, int64_t layer, const float *data, int64_t rows,
                         int64_t cols) {
    keep_into(b->out, entry_of(b->out->grad, b->out, stage, layer), data, rows, cols);
}

void ember_backward_keep_embeddings(ember_backward *b, const float *data) {
    if (b->out->want_embeddings) keep_into(b->out, &b->out->embeddings, data, b->n, b->m->n_embd);
}

/* ---- the result --------------------------------------------------------------------------------- */

static ember_gradients *gradients_new(const ember_model *m, const ember_grad_request *req) {
    ember_gradients *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->n_layer = m->n_layer;
    g->want_embeddings = req->embeddings;
    for (int i = 0; i < EMBER_STAGE_COUNT; i++) {
        if (!req->stages[i]) continue;
        const size_t count = per_layer((ember_stage)i) ? (size_t)m->n_layer : 1;
        g->want[i] = true;
        g->grad[i] = calloc(count, sizeof(grad_entry));
        if (req->values) g->value[i] = calloc(count, sizeof(grad_entry));
        if (!g->grad[i] || (req->values && !g->value[i])) g->failed = true;
    }
    return g;
}

void ember_gradients_free(ember_gradients *g) {
    if (!g) return;
    for (int i = 0; i < EMBER_STAGE_COUNT; i++) {
        const int64_t count = per_layer((ember_stage)i) ? g->n_layer : 1;
        for (int64_t l = 0; l < count; l++) {
            if (g->grad[i]) free(g->grad[i][l].data);
            if (g->value[i]) free(g->value[i][l].data);
        }
        free(g->grad[i]);
        free(g->value[i]);
    }
    free(g->embeddings.data);
    free(g);
}

double ember_gradients_metric(const ember_gradients *g) { return g->metric; }

static const float *entry_data(const grad_entry *e, int64_t *rows, int64_t *cols) {
    if (rows) *rows = e && e->data ? e->rows : 0;
    if (cols) *cols = e && e->data ? e->cols : 0;
    return e ? e->data : NULL;
}

const float *ember_gradients_get(const ember_gradients *g, ember_stage stage, int64_t layer, int64_t *rows,
                                 int64_t *cols) {
    return entry_data(entry_of(g->grad, g, stage, layer), rows, cols);
}

const float *ember_gradients_value(const ember_gradients *g, ember_stage stage, int64_t layer, int64_t *rows,
                                   int64_t *cols) {
    return entry_data(entry_of(g->value, g, stage, layer), rows, cols);
}

const float *ember_gradients_embeddings(const ember_gradients *g, int64_t *rows, int64_t *cols) {
    return entry_data(g->want_embeddings ? &g->embeddings : NULL, rows, cols);
}

/* The forward's values at the requested stages: a read-only hook copying its view. */
static ember_status capture_value(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                                  ember_error *err) {
    (void)err;
    ember_gradients *g = user;
    keep_into(g, entry_of(g->value, g, stage, per_layer(stage) ? ctx->layer_index : -1), v->data, v->rows, v->cols);
    return EMBER_OK;
}

/* ---- the metric ---------------------------------------------------------------------------------- */

static ember_status check_request(const ember_session *s, const ember_grad_request *req, ember_error *err) {
    const ember_model *m = s->model;
    const ember_metric *mt = &req->metric;
    if ((unsigned)mt->kind > EMBER_METRIC_KL)
        return ember_error_set(err, EMBER_ERR_ARG, "gradients: unknown metric kind %d", (int)mt->kind);
    const bool uses_a = mt->kind != EMBER_METRIC_KL, uses_b = mt->kind == EMBER_METRIC_LOGIT_DIFF;
    const int32_t toks[2] = {mt->a, mt->b};
    for (int i = 0; i < (uses_b ? 2 : uses_a ? 1 : 0); i++)
        if (toks[i] < 0 || toks[i] >= m->n_vocab)
            return ember_error_set(err, EMBER_ERR_ARG, "gradients: metric token %d is outside the vocabulary (0..%lld)",
                                   (int)toks[i], (long long)m->n_vocab - 1);
    if (mt->kind == EMBER_METRIC_KL) {
        if (!mt->reference)
            return ember_error_set(err, EMBER_ERR_ARG, "gradients: the kl metric needs a reference distribution");
        for (int64_t i = 0; i < m->n_vocab; i++)
            if (!(mt->reference[i] >= 0.0f) || !isfinite(mt->reference[i]))
                return ember_error_set(err, EMBER_ERR_ARG,
                                       "gradients: the kl reference distribution has %g at token %lld (probabilities "
                                       "are finite and >= 0)",
                                       (double)mt->reference[i], (long long)i);
    }
    if (req->stages[EMBER_STAGE_SAE_FEATURES])
        return ember_error_set(err, EMBER_ERR_ARG,
                               "gradients: no gradient at sae_features (it exists only where an SAE is spliced in)");
    for (int i = 0; i < EMBER_STAGE_COUNT; i++) { /* the stage table says which families have it */
        const char *const *fam = ember_stage_get((ember_stage)i)->families;
        bool has = fam == NULL;
        for (; fam && *fam && !has; fam++) has = strcmp(*fam, m->family->info.name) == 0;
        if (req->stages[i] && !has)
            return ember_error_set(err, EMBER_ERR_ARG, "gradients: the %s family has no stage '%s'",
                                   m->family->info.name, ember_stage_name((ember_stage)i));
    }
    if (!m->family->backward)
        return ember_error_set(err, EMBER_ERR_UNSUPPORTED, "gradients: the %s family has no backward pass yet",
                               m->family->info.name);
    return EMBER_OK;
}

/* The metric of the logits z and its gradient seed = d metric / d z, in double. */
static double metric_seed(const ember_metric *mt, const float *z, int64_t n, float *seed) {
    for (int64_t i = 0; i < n; i++) seed[i] = 0.0f;
    if (mt->kind == EMBER_METRIC_LOGIT) {
        seed[mt->a] = 1.0f;
        return z[mt->a];
    }
    if (mt->kind == EMBER_METRIC_LOGIT_DIFF) {
        seed[mt->a] += 1.0f;
        seed[mt->b] -= 1.0f;
        return (double)z[mt->a] - (double)z[mt->b];
    }
    double mx = -INFINITY, sum = 0.0;
    for (int64_t i = 0; i < n; i++) mx = z[i] > mx ? z[i] : mx;
    for (int64_t i = 0; i < n; i++) sum += exp((double)z[i] - mx);
    const double lse = mx + log(sum);
    if (mt->kind == EMBER_METRIC_KL) { /* KL(r || p): d/dz_i = p_i - r_i */
        double kl = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const double r = mt->reference[i], p = exp((double)z[i] - lse);
            if (r > 0.0) kl += r * (log(r) - ((double)z[i] - lse));
            seed[i] = (float)(p - r);
        }
        return kl;
    }
    const double pa = exp((double)z[mt->a] - lse), scale = mt->kind == EMBER_METRIC_PROB ? pa : 1.0;
    for (int64_t i = 0; i < n; i++) seed[i] = (float)(scale * ((i == mt->a ? 1.0 : 0.0) - exp((double)z[i] - lse)));
    return mt->kind == EMBER_METRIC_PROB ? pa : (double)z[mt->a] - lse;
}

/* ---- the backward's scratch ----------------------------------------------------------------------- */

typedef struct {
    float **p;
    int64_t width; /* floats per token */
} scratch_buffer;

static ember_status backward_alloc(ember_backward *b, bool pattern, ember_error *err) {
    const ember_model *m = b->m;
    int64_t q_dim = 1, kv_dim = 1, n_ff = 1, fused = 1;
    for (int64_t l = 0; l < m->n_layer; l++) {
        const ember_layer *L = &m->layers[l];
        if (L->wqkv.n_out > fused) fused = L->wqkv.n_out;
        if (m->n_head * L->head_dim > q_dim) q_dim = m->n_head * L->head_dim;
        if (L->kv_dim > kv_dim) kv_dim = L->kv_dim;
        if (L->n_ff > n_ff) n_ff = L->n_ff;
    }
    const int64_t d = m->n_embd, ple = m->n_layer * m->ple_dim + 1, n = b->n;
    int64_t widest = d > n_ff ? d : n_ff;
    if (q_dim > widest) widest = q_dim;
    if (ple > widest) widest = ple;
    const scratch_buffer bufs[] = {
        {&b->gx, d},      {&b->t0, d},      {&b->t1, d},        {&b->t2, d},        {&b->f0, n_ff},
        {&b->f1, n_ff},   {&b->f2, n_ff},   {&b->qa, q_dim},    {&b->qb, q_dim},    {&b->qc, q_dim},
        {&b->ka, kv_dim}, {&b->kb, kv_dim}, {&b->kc, kv_dim},   {&b->va, kv_dim},   {&b->vb, kv_dim},
        {&b->ple_a, ple}, {&b->ple_b, ple}, {&b->fused, fused}, {&b->prod, widest}, {&b->stats, 3 * m->n_head},
    };
    bool ok = true;
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        ok = ok && (*bufs[i].p = calloc((size_t)(n * bufs[i].width), sizeof(float))) != NULL;
    const int threads = ember_compute_threads(m->compute);
    b->rows = ok ? malloc((size_t)ember_attention_backward_scratch(threads, n) * sizeof(float)) : NULL;
    b->pattern = ok && pattern ? malloc((size_t)(m->n_head * n * n) * sizeof(float)) : NULL;
    b->dk_acc = ok ? calloc((size_t)m->n_layer, sizeof *b->dk_acc) : NULL;
    b->dv_acc = ok ? calloc((size_t)m->n_layer, sizeof *b->dv_acc) : NULL;
    for (int64_t l = 0; ok && b->dk_acc && b->dv_acc && l < m->n_layer; l++) {
        const int64_t src = m->layers[l].kv_source;
        if (src == l || b->dk_acc[src]) continue; /* layer src's cache is read by a later layer */
        b->dk_acc[src] = calloc((size_t)(n * m->layers[src].kv_dim), sizeof(float));
        b->dv_acc[src] = calloc((size_t)(n * m->layers[src].kv_dim), sizeof(float));
        ok = b->dk_acc[src] && b->dv_acc[src];
    }
    if (!ok || !b->rows || (pattern && !b->pattern) || !b->dk_acc || !b->dv_acc)
        return ember_error_set(err, EMBER_ERR_NOMEM, "gradients: cannot allocate the backward pass of %lld tokens",
                               (long long)n);
    return EMBER_OK;
}

static void backward_free(ember_backward *b) {
    float **all[] = {&b->gx,    &b->t0,   &b->t1,    &b->t2,   &b->f0,      &b->f1,   &b->f2, &b->qa,
                     &b->qb,    &b->qc,   &b->ka,    &b->kb,   &b->kc,      &b->va,   &b->vb, &b->ple_a,
                     &b->ple_b, &b->prod, &b->stats, &b->rows, &b->pattern, &b->fused};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(*all[i]);
    for (int64_t l = 0; l < b->m->n_layer; l++) {
        if (b->dk_acc) free(b->dk_acc[l]);
        if (b->dv_acc) free(b->dv_acc[l]);
    }
    free(b->dk_acc);
    free(b->dv_acc);
}

/* ---- the driver ------------------------------------------------------------------------------------ */

/* The metric's gradient on the logits, back through the softcap, the LM head and the final norm:
 * gx (n, d) holds the gradient of the residual after the last layer (its last row only). */
static ember_status head_backward(ember_backward *b, const ember_grad_request *req, ember_error *err) {
    const ember_model *m = b->m;
    const int64_t d = m->n_embd, n = b->n;
    const float *z = ember_session_logits(b->s);
    float *seed = malloc((size_t)m->n_vocab * sizeof(float)), *dlast = b->t0;
    if (!seed) return ember_error_set(err, EMBER_ERR_NOMEM, "gradients: out of memory for the logits' gradient");
    b->out->metric = metric_seed(&req->metric, z, m->n_vocab, seed);
    ember_backward_keep(b, EMBER_STAGE_AFTER_LOGITS, -1, seed, 1, m->n_vocab);
    if (m->softcap > 0.0f) /* z = cap tanh(u / cap): dz/du = 1 - (z / cap)^2 */
        for (int64_t i = 0; i < m->n_vocab; i++) seed[i] *= 1.0f - (z[i] / m->softcap) * (z[i] / m->softcap);
    if (!ember_matmul_t(m->compute, &m->output, seed, dlast, 1)) b->missing = m->output.type;
    free(seed);
    ember_backward_keep(b, EMBER_STAGE_BEFORE_LOGITS, -1, dlast, 1, d);
    const float *x = ember_tape_get(b->tape, -1, EMBER_TAPE_X) + (n - 1) * d;
    memset(b->gx, 0, (size_t)(n * d) * sizeof(float));
    if (m->family->final_norm == EMBER_NORM_LAYER)
        ember_layernorm_backward(b->gx + (n - 1) * d, dlast, x, m->output_norm, d, m->norm_eps, b->freeze_norm);
    else ember_rmsnorm_backward(b->gx + (n - 1) * d, dlast, x, m->output_norm, d, m->norm_eps, b->freeze_norm);
    return EMBER_OK;
}

/* The forward pass with its tape (and the value hooks): a prefill from position 0. */
static ember_status forward_with_tape(ember_session *s, const int32_t *ids, int64_t n, const ember_grad_request *req,
                                      ember_gradients *g, ember_tape **tape, ember_error *err) {
    const ember_model *m = s->model;
    ember_status st = ember_tape_new(m, n, m->family->tape_slots(m), tape, err);
    if (st != EMBER_OK) return st;
    ember_hooks hooks = {.user = g};
    for (int i = 0; i < EMBER_STAGE_COUNT; i++)
        if (req->values && req->stages[i]) hooks.on_tensor[i] = capture_value;
    ember_session_reset(s);
    s->tape = *tape;
    st = ember_session_prefill(s, ids, n, req->values ? &hooks : NULL, err);
    s->tape = NULL;
    if (st == EMBER_OK && (*tape)->failed)
        st = ember_error_set(err, EMBER_ERR_NOMEM,
                             "gradients: cannot keep the forward's intermediates for the backward (%zu bytes kept "
                             "when it failed)",
                             (*tape)->bytes);
    return st;
}

ember_status ember_session_gradients(ember_session *s, const int32_t *ids, int64_t n, const ember_grad_request *req,
                                     ember_gradients **out, ember_error *err) {
    *out = NULL;
    ember_status st = check_request(s, req, err);
    if (st != EMBER_OK) return st;
    const ember_model *m = s->model;
    ember_gradients *g = gradients_new(m, req);
    if (!g || g->failed) {
        ember_gradients_free(g);
        return ember_error_set(err, EMBER_ERR_NOMEM, "gradients: out of memory");
    }
    ember_tape *tape = NULL;
    st = forward_with_tape(s, ids, n, req, g, &tape, err);
    ember_backward b = {.s = s,
                        .m = m,
                        .tape = tape,
                        .out = g,
                        .freeze_attention = req->freeze_attention,
                        .freeze_norm = req->freeze_norm,
                        .n = n,
                        .missing = -1};
    if (st == EMBER_OK) st = backward_alloc(&b, req->stages[EMBER_STAGE_ATTENTION_PATTERN], err);
    if (st == EMBER_OK) st = head_backward(&b, req, err);
    if (st == EMBER_OK) st = m->family->backward(&b, err);
    if (st == EMBER_OK && b.missing >= 0)
        st = ember_error_set(err, EMBER_ERR_UNSUPPORTED, "gradients: kernels '%s' have no transposed product for %s",
                             m->ops->name, ember_type_name((uint32_t)b.missing));
    if (st == EMBER_OK && g->failed) st = ember_error_set(err, EMBER_ERR_NOMEM, "gradients: out of memory");
    backward_free(&b);
    ember_tape_free(tape);
    if (st != EMBER_OK) {
        ember_gradients_free(g);
        return st;
    }
    *out = g;
    return EMBER_OK;
}
