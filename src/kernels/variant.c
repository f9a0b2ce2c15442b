/* variant.c — which code of a kernel set computes an op, as the name a trace records ("avx512",
 * "reference", "avx512/q8_0_x4"). Read from the set's own tables, so it cannot drift from what ran. */
#include "kernels.h"

#include <stdio.h>

/* A small op is the reference's when the set points at the reference function (layernorm,
 * get_row and the per-layer GELU gate on every set; docs/kernels.md), else the set's own. */
const char *ember_kernels_op_variant(const ember_kernel_ops *ops, ember_kop op) {
    const ember_kernel_ops *r = &ember_kernels_reference;
    bool same;
    switch (op) {
    case EMBER_KOP_GET_ROW: same = ops->get_row == r->get_row; break;
    case EMBER_KOP_RMSNORM: same = ops->rmsnorm == r->rmsnorm; break;
    case EMBER_KOP_LAYERNORM: same = ops->layernorm == r->layernorm; break;
    case EMBER_KOP_SILU_MUL: same = ops->silu_mul == r->silu_mul; break;
    case EMBER_KOP_GELU_MUL: same = ops->gelu_mul == r->gelu_mul; break;
    case EMBER_KOP_GELU_MUL_REF: same = ops->gelu_mul_ref == r->gelu_mul_ref; break;
    case EMBER_KOP_ROPE: same = ops->rope_heads == r->rope_heads; break;
    case EMBER_KOP_ATTENTION: same = ops->attn_chunk == r->attn_chunk; break;
    /* the attention_pattern path and the engine's own loops are plain C shared by every set */
    case EMBER_KOP_ATTENTION_PATTERN: return "shared/pattern";
    case EMBER_KOP_ENGINE: return "shared";
    default: return "unknown";
    }
    return same ? "reference" : ops->name;
}

/* <set>/<weight type>, "_x4" when the weights were repacked into the set's 4-row groups (every
 * packed layout is one, kernels.h), and the reference's name for a type on the fallback list. */
void ember_kernels_product_variant(const ember_kernel_ops *ops, const ember_matrix *w, char *buf, size_t n) {
    const ember_type_kernels *k = ember_kernels_mm(ops, w->type);
    const bool fallback = k && k->rows == ember_rows_reference && ops != &ember_kernels_reference;
    snprintf(buf, n, "%s/%s%s", fallback ? "reference" : ops->name, ember_type_name((uint32_t)w->type),
             w->packed ? "_x4" : "");
}

/* What the product multiplies the weights with: "f32", or the activation blocks it quantizes
 * them into first (q8_0, q8_1, q8_K) — the one place the fast path's numerics leave f32. */
const char *ember_kernels_product_activations(const ember_kernel_ops *ops, const ember_matrix *w) {
    const ember_type_kernels *k = ember_kernels_mm(ops, w->type);
    if (!k || !k->act_size) return "f32";
    const ember_type_traits *tr = ember_type_traits_get((uint32_t)w->type);
    return tr ? ember_type_name((uint32_t)tr->vec_dot_type) : "unknown";
}
