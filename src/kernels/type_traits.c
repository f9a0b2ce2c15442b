/* type_traits.c — the one table of what ember knows about each weight type: name, block geometry,
 * how to read a row as f32, which activation type its products want and how to quantize into it.
 * The kernel sets' product tables (ref.c, avx2.c, avx512.c) are indexed by the same type ids. */
#include "kernels.h"
#include "quants.h"

#include <string.h>

static void f32_to_float(const void *row, float *out, int64_t n) { memcpy(out, row, (size_t)n * sizeof(float)); }

static void f16_to_float(const void *row, float *out, int64_t n) {
    const uint8_t *p = row;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        out[i] = ember_f16_to_f32(h);
    }
}

static void bf16_to_float(const void *row, float *out, int64_t n) {
    const uint8_t *p = row;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        out[i] = ember_bf16_to_f32(h);
    }
}

static void q8_0_to_float(const void *row, float *out, int64_t n) {
    const uint8_t *p = row;
    for (int64_t b = 0; b < n / EMBER_QK8_0; b++) {
        ember_block_q8_0 blk;
        memcpy(&blk, p + (size_t)b * sizeof blk, sizeof blk);
        const float d = ember_f16_to_f32(blk.d);
        for (int j = 0; j < EMBER_QK8_0; j++) out[b * EMBER_QK8_0 + j] = d * (float)blk.qs[j];
    }
}

static void q8_0_from_float(const float *x, void *y, int64_t n) { ember_quantize_row_q8_0(x, y, n); }
static void q8_1_from_float(const float *x, void *y, int64_t n) { ember_quantize_row_q8_1(x, y, n); }

/* Types with a block size and no kernels carry their geometry (so sizes and names are right and a
 * file holding them is refused with a clear message) and to_float = NULL (see docs/kernels.md,
 * "Adding a weight type"). */
static const ember_type_traits traits[EMBER_TYPE_COUNT] = {
    [EMBER_TYPE_F32] = {.name = "f32",
                        .block_size = 1,
                        .block_bytes = sizeof(float),
                        .to_float = f32_to_float,
                        .vec_dot_type = EMBER_TYPE_F32},
    [EMBER_TYPE_F16] = {.name = "f16",
                        .block_size = 1,
                        .block_bytes = sizeof(uint16_t),
                        .to_float = f16_to_float,
                        .vec_dot_type = EMBER_TYPE_F32},
    [EMBER_TYPE_BF16] = {.name = "bf16",
                         .block_size = 1,
                         .block_bytes = sizeof(uint16_t),
                         .to_float = bf16_to_float,
                         .vec_dot_type = EMBER_TYPE_F32},
    [EMBER_TYPE_Q8_0] = {.name = "q8_0",
                         .block_size = EMBER_QK8_0,
                         .block_bytes = sizeof(ember_block_q8_0),
                         .to_float = q8_0_to_float,
                         .vec_dot_type = EMBER_TYPE_Q8_0,
                         .from_float = q8_0_from_float},
    /* The 4- to 6-bit weight types (quants.h). The reference set multiplies them by the exact f32
     * product of the dequantized weights; vec_dot_type is what the SIMD sets quantize the
     * activations into, as llama.cpp does (docs/kernels.md). Q2_K and Q3_K have no SIMD kernels
     * (every set runs the reference product for them): no activation type. */
    [EMBER_TYPE_Q4_0] = {.name = "q4_0",
                         .block_size = EMBER_QK4_0,
                         .block_bytes = sizeof(ember_block_q4_0),
                         .to_float = ember_dequantize_row_q4_0,
                         .vec_dot_type = EMBER_TYPE_Q8_0,
                         .from_float = q8_0_from_float},
    [EMBER_TYPE_Q4_1] = {.name = "q4_1",
                         .block_size = EMBER_QK4_1,
                         .block_bytes = sizeof(ember_block_q4_1),
                         .to_float = ember_dequantize_row_q4_1,
                         .vec_dot_type = EMBER_TYPE_Q8_1,
                         .from_float = q8_1_from_float},
    [EMBER_TYPE_Q5_0] = {.name = "q5_0",
                         .block_size = EMBER_QK5_0,
                         .block_bytes = sizeof(ember_block_q5_0),
                         .to_float = ember_dequantize_row_q5_0,
                         .vec_dot_type = EMBER_TYPE_Q8_0,
                         .from_float = q8_0_from_float},
    [EMBER_TYPE_Q5_1] = {.name = "q5_1",
                         .block_size = EMBER_QK5_1,
                         .block_bytes = sizeof(ember_block_q5_1),
                         .to_float = ember_dequantize_row_q5_1,
                         .vec_dot_type = EMBER_TYPE_Q8_1,
                         .from_float = q8_1_from_float},
    /* Q8_1: the activation type of the Q4_1/Q5_1 products only (no to_float: refused as weights). */
    [EMBER_TYPE_Q8_1] = {.name = "q8_1",
                         .block_size = EMBER_QK8_1,
                         .block_bytes = sizeof(ember_block_q8_1),
                         .from_float = q8_1_from_float},
    [EMBER_TYPE_Q2_K] = {.name = "q2_K",
                         .block_size = EMBER_QK_K,
                         .block_bytes = sizeof(ember_block_q2_K),
                         .to_float = ember_dequantize_row_q2_k,
                         .vec_dot_type = EMBER_TYPE_F32},
    [EMBER_TYPE_Q3_K] = {.name = "q3_K",
                         .block_size = EMBER_QK_K,
                         .block_bytes = sizeof(ember_block_q3_K),
                         .to_float = ember_dequantize_row_q3_k,
                         .vec_dot_type = EMBER_TYPE_F32},
    [EMBER_TYPE_Q4_K] = {.name = "q4_K",
                         .block_size = EMBER_QK_K,
                         .block_bytes = sizeof(ember_block_q4_K),
                         .to_float = ember_dequantize_row_q4_k,
                         .vec_dot_type = EMBER_TYPE_Q8_K,
                         .from_float = ember_quantize_act_q8_k},
    [EMBER_TYPE_Q5_K] = {.name = "q5_K",
                         .block_size = EMBER_QK_K,
                         .block_bytes = sizeof(ember_block_q5_K),
                         .to_float = ember_dequantize_row_q5_k,
                         .vec_dot_type = EMBER_TYPE_Q8_K,
                         .from_float = ember_quantize_act_q8_k},
    [EMBER_TYPE_Q6_K] = {.name = "q6_K",
                         .block_size = EMBER_QK_K,
                         .block_bytes = sizeof(ember_block_q6_K),
                         .to_float = ember_dequantize_row_q6_k,
                         .vec_dot_type = EMBER_TYPE_Q8_K,
                         .from_float = ember_quantize_act_q8_k},
    /* Q8_K is an activation type (what llama.cpp quantizes activations into for the K-quant
     * products), never a weight in the files ember reads: no to_float, so a file holding it is
     * refused; from_float is its quantizer (ggml's reference, bit for bit). */
    [EMBER_TYPE_Q8_K] = {.name = "q8_K",
                         .block_size = EMBER_QK_K,
                         .block_bytes = sizeof(ember_block_q8_K),
                         .from_float = ember_quantize_row_q8_k},
};

const ember_type_traits *ember_type_traits_get(uint32_t type) {
    return type < EMBER_TYPE_COUNT && traits[type].name ? &traits[type] : NULL;
}

const char *ember_type_name(uint32_t type) {
    /* GGUF ids ember has no traits for, named so refusals can say what a file holds */
    static const char *other[EMBER_TYPE_COUNT] = {
        [16] = "iq2_xxs", [17] = "iq2_xs", [18] = "iq3_xxs", [19] = "iq1_s", [20] = "iq4_nl", [21] = "iq3_s",
        [22] = "iq2_s",   [23] = "iq4_xs", [24] = "i8",      [25] = "i16",   [26] = "i32",    [27] = "i64",
        [28] = "f64",     [29] = "iq1_m",  [34] = "tq1_0",   [35] = "tq2_0", [39] = "mxfp4",
    };
    const ember_type_traits *t = ember_type_traits_get(type);
    if (t) return t->name;
    if (type < EMBER_TYPE_COUNT && other[type]) return other[type];
    return "unknown";
}

bool ember_type_nbytes(ember_type t, int64_t n_elements, size_t *out) {
    const ember_type_traits *tr = ember_type_traits_get((uint32_t)t);
    if (!tr || n_elements < 0 || n_elements % tr->block_size) return false;
    const uint64_t blocks = (uint64_t)(n_elements / tr->block_size);
    if (blocks > SIZE_MAX / tr->block_bytes) return false;
    *out = (size_t)blocks * tr->block_bytes;
    return true;
}

bool ember_shape_count(const int64_t *dims, int n, int64_t max_count, int64_t *out) {
    bool empty = false; /* a zero dimension makes the product 0, whatever the others */
    for (int i = 0; i < n; i++) {
        if (dims[i] < 0) return false;
        empty = empty || dims[i] == 0;
    }
    int64_t count = 1;
    for (int i = 0; i < n && !empty; i++) {
        if (count > max_count / dims[i]) return false; /* count * dims[i] > max_count */
        count *= dims[i];
    }
    if (empty) count = 0;
    if (count > max_count) return false; /* n = 0: the empty product 1 */
    *out = count;
    return true;
}

size_t ember_type_row_size(ember_type t, int64_t n) {
    size_t bytes;
    return ember_type_nbytes(t, n, &bytes) ? bytes : 0;
}
