/* backward_qwen3moe.c — the backward pass of the Qwen3-MoE block (family_qwen3moe.c): the qwen3
 * attention (backward_llama.c's) and the routed SwiGLU experts: each chosen slot's activation
 * gradient (its routing weight times the expert's down projection transposed), each expert's gate
 * and up transposed over the rows routed to it, and the router's logits through the renormalised
 * softmax of the chosen experts (the choice itself is a constant: a gradient does not move it). */
#include "backward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint32_t ember_qwen3moe_tape_slots(const ember_model *m) { return ember_llama_tape_slots(m) | 1u << EMBER_TAPE_ROUTER; }

/* Scratch of one MoE layer's backward: the routing recomputed, and one expert's gathered rows. */
typedef struct {
    int32_t *ids, *slots;           /* (n, k) the choice; one expert's slots t * k + j */
    float *weights, *dw;            /* (n, k) the routing weights and their gradients */
    float *dr;                      /* (n, n_expert) the router logits' gradient */
    float *g, *o, *dx;              /* (n, d) gathered: the output's gradient, the expert's output, dx */
    float *act, *gt, *up, *dg, *du; /* (n, n_ff_exp) gathered */
} moe_scratch;

static void moe_scratch_free(moe_scratch *s) {
    free(s->ids), free(s->slots), free(s->weights), free(s->dw), free(s->dr), free(s->g), free(s->o), free(s->dx);
    free(s->act), free(s->gt), free(s->up), free(s->dg), free(s->du);
}

static bool moe_scratch_new(const ember_model *m, int64_t n, moe_scratch *s) {
    const size_t nk = (size_t)(n * m->n_expert_used), nd = (size_t)(n * m->n_embd), nf = (size_t)(n * m->n_ff_exp);
    memset(s, 0, sizeof *s);
    s->ids = malloc(nk * sizeof *s->ids), s->slots = malloc(nk * sizeof *s->slots);
    s->weights = malloc(nk * sizeof(float)), s->dw = malloc(nk * sizeof(float));
    s->dr = malloc((size_t)(n * m->n_expert) * sizeof(float));
    s->g = malloc(nd * sizeof(float)), s->o = malloc(nd * sizeof(float)), s->dx = malloc(nd * sizeof(float));
    s->act = malloc(nf * sizeof(float)), s->gt = malloc(nf * sizeof(float)), s->up = malloc(nf * sizeof(float));
    s->dg = malloc(nf * sizeof(float)), s->du = malloc(nf * sizeof(float));
    if (s->ids && s->slots && s->weights && s->dw && s->dr && s->g && s->o && s->dx && s->act && s->gt && s->up &&
        s->dg && s->du)
        return true;
    moe_scratch_free(s);
    return false;
}

/* dx (rows, n_in) = g W over `rows` gathered rows (ember_backward_product's, for one expert). */
static void product_t(ember_backward *b, const ember_matrix *w, const float *g, float *dx, int64_t rows) {
    if (!ember_matmul_t(b->m->compute, w, g, dx, rows)) {
        b->missing = w->type;
        memset(dx, 0, (size_t)(rows * w->n_in) * sizeof(float));
    }
}

/* Slot i's n_ff_exp values of a (n, k * n_ff_exp) tensor, gathered into row r of out. */
static void gather_slots(const moe_scratch *s, int64_t c, const float *from, int64_t f, float *out) {
    for (int64_t r = 0; r < c; r++) memcpy(out + r * f, from + (int64_t)s->slots[r] * f, (size_t)f * sizeof(float));
}

/* The router logits' gradient of row t from its weights' (the chosen experts' renormalised softmax:
 * w_j = exp(r_j) / sum over the chosen; when llama.cpp's clamp of that sum held, w_j = p_j / 2^-14
 * with p the softmax over every expert). */
static void router_row_backward(const float *logits, int64_t E, int64_t k, const int32_t *ids, const float *w,
                                const float *dw, float *dr) {
    memset(dr, 0, (size_t)E * sizeof(float));
    double mx = -INFINITY, total = 0.0, chosen = 0.0;
    for (int64_t e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    for (int64_t e = 0; e < E; e++) total += exp((double)logits[e] - mx);
    for (int64_t j = 0; j < k; j++) chosen += exp((double)logits[ids[j]] - mx) / total;
    if (chosen >= 6.103515625e-5) {
        double sum = 0.0;
        for (int64_t j = 0; j < k; j++) sum += (double)w[j] * dw[j];
        for (int64_t j = 0; j < k; j++) dr[ids[j]] += (float)((double)w[j] * (dw[j] - sum));
        return;
    }
    double pdw = 0.0; /* sum_j p_j dw_j */
    for (int64_t j = 0; j < k; j++) pdw += exp((double)logits[ids[j]] - mx) / total * dw[j];
    for (int64_t e = 0; e < E; e++) {
        const double p = exp((double)logits[e] - mx) / total;
        dr[e] = (float)(-p * pdw / 6.103515625e-5);
    }
    for (int64_t j = 0; j < k; j++)
        dr[ids[j]] += (float)(exp((double)logits[ids[j]] - mx) / total * dw[j] / 6.103515625e-5);
}

/* gx: the gradient after layer l's MoE residual -> after its attention residual. */
static void moe_backward(ember_backward *b, int64_t l, moe_scratch *s) {
    const ember_model *m = b->m;
    const ember_layer *L = &m->layers[l];
    const int64_t n = b->n, d = m->n_embd, E = m->n_expert, k = m->n_expert_used, f = m->n_ff_exp;
    const float *router = ember_tape_get(b->tape, l, EMBER_TAPE_ROUTER);
    const float *gate = ember_tape_get(b->tape, l, EMBER_TAPE_GATE), *up = ember_tape_get(b->tape, l, EMBER_TAPE_UP);
    ember_backward_keep(b, EMBER_STAGE_AFTER_LAYER, l, b->gx, n, d);
    ember_backward_keep(b, EMBER_STAGE_AFTER_MLP, l, b->gx, n, d);
    for (int64_t t = 0; t < n; t++) ember_moe_route_row(router + t * E, E, k, s->ids + t * k, s->weights + t * k);
    /* each slot's activation gradient (into f0, mlp_activation's layout) and its weight's gradient */
    for (int32_t e = 0; e < E; e++) {
        const int64_t c = ember_moe_expert_slots(s->ids, n, k, e, s->slots);
        if (c == 0) continue;
        for (int64_t r = 0; r < c; r++) memcpy(s->g + r * d, b->gx + s->slots[r] / k * d, (size_t)d * sizeof(float));
        gather_slots(s, c, gate, f, s->act);
        gather_slots(s, c, up, f, s->up);
        m->ops->silu_mul(s->act, s->up, c * f); /* the activation as the forward computed it */
        ember_matmul(m->compute, &L->exp_down[e], s->act, s->o, c);
        for (int64_t r = 0; r < c; r++) {
            double dot = 0.0;
            for (int64_t i = 0; i < d; i++) dot += (double)s->g[r * d + i] * s->o[r * d + i];
            s->dw[s->slots[r]] = (float)dot;
        }
        product_t(b, &L->exp_down[e], s->g, s->dg, c);
        for (int64_t r = 0; r < c; r++) {
            float *into = b->f0 + (int64_t)s->slots[r] * f;
            const float wt = s->weights[s->slots[r]];
            for (int64_t i = 0; i < f; i++) into[i] = wt * s->dg[r * f + i];
        }
    }
    ember_backward_keep(b, EMBER_STAGE_MLP_ACTIVATION, l, b->f0, n, k * f);
    /* the normed input's gradient in t1: every expert's gate and up transposed (experts ascending) */
    memset(b->t1, 0, (size_t)(n * d) * sizeof(float));
    for (int32_t e = 0; e < E; e++) {
        const int64_t c = ember_moe_expert_slots(s->ids, n, k, e, s->slots);
        if (c == 0) continue;
        gather_slots(s, c, b->f0, f, s->act); /* d act */
        gather_slots(s, c, gate, f, s->gt);
        gather_slots(s, c, up, f, s->up);
        ember_silu_mul_backward(s->dg, s->du, s->act, s->gt, s->up, c * f);
        product_t(b, &L->exp_gate[e], s->dg, s->dx, c);
        for (int64_t r = 0; r < c; r++) ember_backward_add(b->t1 + s->slots[r] / k * d, s->dx + r * d, d);
        product_t(b, &L->exp_up[e], s->du, s->dx, c);
        for (int64_t r = 0; r < c; r++) ember_backward_add(b->t1 + s->slots[r] / k * d, s->dx + r * d, d);
    }
    for (int64_t t = 0; t < n; t++)
        router_row_backward(router + t * E, E, k, s->ids + t * k, s->weights + t * k, s->dw + t * k, s->dr + t * E);
    ember_backward_keep(b, EMBER_STAGE_MOE_ROUTER, l, s->dr, n, E);
    ember_backward_product(b, &L->gate_inp, s->dr, b->t1, true);
    ember_backward_block_input(b, l, false, EMBER_TAPE_X_MID, L->ffn_norm);
}

ember_status ember_qwen3moe_backward(ember_backward *b, ember_error *err) {
    moe_scratch s;
    if (!moe_scratch_new(b->m, b->n, &s))
        return ember_error_set(err, EMBER_ERR_NOMEM, "gradients: out of memory for the experts' backward");
    for (int64_t l = b->m->n_layer - 1; l >= 0; l--) {
        moe_backward(b, l, &s);
        ember_llama_attention_backward(b, l);
    }
    ember_backward_keep_embeddings(b, b->gx);
    moe_scratch_free(&s);
    return EMBER_OK;
}
