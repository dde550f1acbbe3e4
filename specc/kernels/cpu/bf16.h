// bfloat16 <-> float32 conversions shared by the CPU kernels of this folder (round to nearest
// even; a NaN stays a NaN).
#pragma once

#include <cstdint>
#include <cstring>

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

// One float32 or bfloat16 element as a float.
template <typename T> inline float load(const T* p);
template <> inline float load<float>(const float* p) { return *p; }
template <> inline float load<uint16_t>(const uint16_t* p) { return bf16_to_float(*p); }

}  // namespace specc_cpu
