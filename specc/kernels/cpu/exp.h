// exp of a non-positive argument, scalar and on 16 lanes, shared by the CPU kernels of this folder:
// a fixed polynomial, so a value's bits depend on nothing but the value.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

namespace specc_cpu {

// exp(x) for x <= 0: 2^n * p(r), r = x - n ln 2, |r| <= ln 2 / 2;
// relative error ~2e-7. Below -87 (where 2^n leaves the normal floats) it is 0.
inline float exp_nonpositive(float x) {
    const float n = std::floor(x * 1.44269504088896341f + 0.5f);
    const float r = x - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
    float p = 1.f / 5040.f;
    p = p * r + 1.f / 720.f;
    p = p * r + 1.f / 120.f;
    p = p * r + 1.f / 24.f;
    p = p * r + 1.f / 6.f;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    p = p * r + 1.f;
    const int32_t exponent = static_cast<int32_t>(n) + 127;
    uint32_t bits = static_cast<uint32_t>(std::max(exponent, 1)) << 23;
    float two_n;
    std::memcpy(&two_n, &bits, 4);
    return x < -87.f ? 0.f : p * two_n;
}

#if defined(__AVX512F__)
// exp_nonpositive on 16 lanes.
inline __m512 exp_nonpositive16(__m512 x) {
    const __m512 n = _mm512_roundscale_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                                        _mm512_set1_ps(0.5f)), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693145751953125f))),
                                   _mm512_mul_ps(n, _mm512_set1_ps(1.428606765330187045e-06f)));
    __m512 p = _mm512_set1_ps(1.f / 5040.f);
    for (const float c : {1.f / 720.f, 1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f}) {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    const __m512i exponent = _mm512_max_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)),
                                              _mm512_set1_epi32(1));
    const __m512 two_n = _mm512_castsi512_ps(_mm512_slli_epi32(exponent, 23));
    return _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.f), _CMP_GE_OQ), p, two_n);
}

#endif

#if defined(__AVX2__) && defined(__FMA__)
// exp_nonpositive on 8 lanes, for CPUs without AVX-512.
inline __m256 exp_nonpositive8(__m256 x) {
    const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                                   _mm256_set1_ps(0.5f)));
    const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693145751953125f))),
                                   _mm256_mul_ps(n, _mm256_set1_ps(1.428606765330187045e-06f)));
    __m256 p = _mm256_set1_ps(1.f / 5040.f);
    for (const float c : {1.f / 720.f, 1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f}) {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    const __m256i exponent = _mm256_max_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                                              _mm256_set1_epi32(1));
    const __m256 two_n = _mm256_castsi256_ps(_mm256_slli_epi32(exponent, 23));
    return _mm256_and_ps(_mm256_mul_ps(p, two_n), _mm256_cmp_ps(x, _mm256_set1_ps(-87.f), _CMP_GE_OQ));
}
#endif

}  // namespace specc_cpu
