/* half_convert.h — rows of f32 to f16 / bf16 with SIMD (F16C and integer AVX2; AVX-512 when the
 * including file is built for it), bit for bit ember_f32_to_f16 / ember_f32_to_bf16: the KV store.
 * Included by avx2.c and avx512.c only (their compile flags enable the instructions). */
#ifndef EMBER_HALF_CONVERT_H
#define EMBER_HALF_CONVERT_H

#include "simd_common.h"

/* The NaN of the scalar conversions: the sign kept, a quiet NaN without payload (F16C would keep
 * the payload's top bits), as 32-bit lanes holding 16-bit values. */
EMBER_AI __m256i half_nan8(__m256i xi) {
    return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(xi, 16), _mm256_set1_epi32(0x8000)),
                           _mm256_set1_epi32(0x7e00));
}

/* 8 lanes of 32 bits holding values 0..0xffff -> 8 packed 16-bit values. */
EMBER_AI __m128i half_pack8(__m256i v) {
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08));
}

/* F16C rounds to nearest even into subnormals and to infinity from 65520 on, as the scalar code;
 * only NaNs differ and are replaced. */
EMBER_AI __m128i half_f16x8(const float *x) {
    const __m256 v = _mm256_loadu_ps(x);
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    const __m256i nan32 = _mm256_castps_si256(nan); /* signed saturation keeps -1: 0xffff per NaN lane */
    const __m128i nan16 = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packs_epi32(nan32, nan32), 0x08));
    return _mm_blendv_epi8(h, half_pack8(half_nan8(_mm256_castps_si256(v))), nan16);
}

/* bf16: x + 0x7fff + (bit 16 of x), the high half (round to nearest even); NaN: (x >> 16) | 0x40. */
EMBER_AI __m128i half_bf16x8(const float *x) {
    const __m256i xi = _mm256_loadu_si256((const __m256i *)x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(xi, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(xi, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i hi = _mm256_srli_epi32(xi, 16);
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(xi, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    return half_pack8(_mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan));
}

#ifdef __AVX512F__
EMBER_AI __m256i half_f16x16(const float *x) {
    const __m512 v = _mm512_loadu_ps(x);
    const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (!nan) return h;
    const __m512i xi = _mm512_castps_si512(v);
    const __m512i fix = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(xi, 16), _mm512_set1_epi32(0x8000)),
                                        _mm512_set1_epi32(0x7e00));
    return _mm256_mask_blend_epi16(nan, h, _mm512_cvtepi32_epi16(fix));
}

EMBER_AI __m256i half_bf16x16(const float *x) {
    const __m512i xi = _mm512_loadu_si512(x);
    const __m512i hi = _mm512_srli_epi32(xi, 16);
    const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(xi, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(xi, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}
#endif

/* y[i] = ember_f32_to_f16(x[i]) for i < n. */
static void ember_half_f16_row(uint16_t *y, const float *x, int64_t n) {
    int64_t i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(y + i), half_f16x16(x + i));
#endif
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(y + i), half_f16x8(x + i));
    for (; i < n; i++) y[i] = ember_f32_to_f16(x[i]);
}

/* y[i] = ember_f32_to_bf16(x[i]) for i < n. */
static void ember_half_bf16_row(uint16_t *y, const float *x, int64_t n) {
    int64_t i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(y + i), half_bf16x16(x + i));
#endif
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(y + i), half_bf16x8(x + i));
    for (; i < n; i++) y[i] = ember_f32_to_bf16(x[i]);
}

#endif
