// bfloat16 <-> float32 conversions shared by the CPU kernels of this folder (round to nearest
// even; a NaN stays a NaN).
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace specc_cpu {

inline float bf16_to_float(uint16_t h) {
    uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// The same conversions on 16 lanes at once, bit for bit.
inline __m512 bf16x16_to_float(const uint16_t* p) {
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

// Each lane's float32 bits rounded to bfloat16 in the top half (float_to_bf16's rule).
inline __m512i bf16x16_bits(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i even = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), even));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(bits, _mm512_set1_epi32(0x400000)));
}

// bf16_to_float(float_to_bf16(v)) on 16 lanes.
inline __m512 rounded16(__m512 v) {
    return _mm512_castsi512_ps(_mm512_and_si512(bf16x16_bits(v), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// float_to_bf16 of 16 lanes, stored.
inline void store_bf16x16(uint16_t* dst, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16x16_bits(v), 16)));
}
#endif

#if defined(__AVX2__)
// The same conversions on 8 lanes, for CPUs without AVX-512.
inline __m256 bf16x8_to_float(const uint16_t* p) {
    const __m128i eight = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(eight), 16));
}

inline __m256i bf16x8_bits(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i even = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), even));
    const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));   // both non-negative
    return _mm256_blendv_epi8(rounded, _mm256_or_si256(bits, _mm256_set1_epi32(0x400000)), nan);
}

inline __m256 rounded8(__m256 v) {
    return _mm256_castsi256_ps(_mm256_and_si256(bf16x8_bits(v), _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

inline void store_bf16x8(uint16_t* dst, __m256 v) {
    const __m256i high = _mm256_srli_epi32(bf16x8_bits(v), 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(high), _mm256_extracti128_si256(high, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), packed);
}
#endif

// One float32 or bfloat16 element as a float.
template <typename T> inline float load(const T* p);
template <> inline float load<float>(const float* p) { return *p; }
template <> inline float load<uint16_t>(const uint16_t* p) { return bf16_to_float(*p); }

}  // namespace specc_cpu
