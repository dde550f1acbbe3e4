// The greedy choice over each row of scores on the CPU: the index of the row's largest value,
// the first one among equals, and the first NaN where the row holds one (as torch.argmax).
// torch's own argmax over a bfloat16 row of a vocabulary (~50k) took longer than a small
// model's LM head; this reads the row once on one thread, 16 lanes at a time (8 without AVX-512).

#include "bf16.h"

#include <cmath>
#include <cstdint>
#include <immintrin.h>

namespace {

using specc_cpu::load;

template <typename T>
int64_t argmax_scalar(const T* row, int64_t n) {
    int64_t best = 0;
    float top = load<T>(row);
    for (int64_t i = 0; i < n; ++i) {
        const float v = load<T>(row + i);
        if (std::isnan(v)) return i;
        if (v > top) top = v, best = i;
    }
    return best;
}

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// Each lane keeps its largest value and that value's first index (a strictly larger value
// replaces it); then the lanes' largest, at the lowest index among equals. A row holding a
// NaN is left to the scalar scan, which finds the first.
template <typename T>
int64_t argmax_row(const T* row, int64_t n) {
    if (n < 16 || n >= (int64_t{1} << 31)) return argmax_scalar(row, n);
    __m512 top = load16(row);
    __m512i where = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i index = where;
    const __m512i step = _mm512_set1_epi32(16);
    __mmask16 nan = _mm512_cmp_ps_mask(top, top, _CMP_UNORD_Q);
    int64_t i = 16;
    for (; i + 16 <= n; i += 16) {
        index = _mm512_add_epi32(index, step);
        const __m512 v = load16(row + i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        const __mmask16 larger = _mm512_cmp_ps_mask(v, top, _CMP_GT_OQ);
        top = _mm512_mask_mov_ps(top, larger, v);
        where = _mm512_mask_mov_epi32(where, larger, index);
    }
    if (nan) return argmax_scalar(row, n);
    float lanes[16];
    int32_t at[16];
    _mm512_storeu_ps(lanes, top);
    _mm512_storeu_si512(at, where);
    float best_value = lanes[0];
    int64_t best = at[0];
    for (int l = 1; l < 16; ++l) {
        if (lanes[l] > best_value || (lanes[l] == best_value && at[l] < best)) best_value = lanes[l], best = at[l];
    }
    for (; i < n; ++i) {
        const float v = load<T>(row + i);
        if (std::isnan(v)) return argmax_scalar(row, n);
        if (v > best_value) best_value = v, best = i;
    }
    return best;
}
#elif defined(__AVX2__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// The AVX-512 scan above on 8 lanes, for CPUs without AVX-512: the same choice.
template <typename T>
int64_t argmax_row(const T* row, int64_t n) {
    if (n < 8 || n >= (int64_t{1} << 31)) return argmax_scalar(row, n);
    __m256 top = load8(row);
    __m256i where = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i index = where;
    const __m256i step = _mm256_set1_epi32(8);
    __m256 nan = _mm256_cmp_ps(top, top, _CMP_UNORD_Q);
    int64_t i = 8;
    for (; i + 8 <= n; i += 8) {
        index = _mm256_add_epi32(index, step);
        const __m256 v = load8(row + i);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        const __m256 larger = _mm256_cmp_ps(v, top, _CMP_GT_OQ);
        top = _mm256_blendv_ps(top, v, larger);
        where = _mm256_blendv_epi8(where, index, _mm256_castps_si256(larger));
    }
    if (_mm256_movemask_ps(nan)) return argmax_scalar(row, n);
    float lanes[8];
    int32_t at[8];
    _mm256_storeu_ps(lanes, top);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(at), where);
    float best_value = lanes[0];
    int64_t best = at[0];
    for (int l = 1; l < 8; ++l) {
        if (lanes[l] > best_value || (lanes[l] == best_value && at[l] < best)) best_value = lanes[l], best = at[l];
    }
    for (; i < n; ++i) {
        const float v = load<T>(row + i);
        if (std::isnan(v)) return argmax_scalar(row, n);
        if (v > best_value) best_value = v, best = i;
    }
    return best;
}
#else
template <typename T>
int64_t argmax_row(const T* row, int64_t n) { return argmax_scalar(row, n); }
#endif

}  // namespace

extern "C" {

// out[r] = the argmax of row r of `scores` ([rows, n], rows `row_stride` elements apart, each
// row contiguous); dtype 0: float32, 1: bfloat16. Returns 0, or 1 on arguments it refuses.
int specc_row_argmax(const void* scores, int64_t rows, int64_t n, int64_t row_stride, int dtype, int64_t* out) {
    if (rows < 0 || n <= 0) return 1;
    for (int64_t r = 0; r < rows; ++r) {
        if (dtype == 0) {
            out[r] = argmax_row(static_cast<const float*>(scores) + r * row_stride, n);
        } else if (dtype == 1) {
            out[r] = argmax_row(static_cast<const uint16_t*>(scores) + r * row_stride, n);
        } else {
            return 1;
        }
    }
    return 0;
}

}
