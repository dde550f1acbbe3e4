// Blocked low-bit weights times 8-bit activations on the CPU: the kernel of
// specc's `q4`, `q6` and `q8` quantized linears (specc/kernels/blocked_matmul.py packs the weights).
//
// Weights come in tiles of 16 output features; a tile holds, for each group of
// up to 8 blocks of 32 inputs, 16 fp16 scales d and 16 fp16 mins m, then per block
// 16 8-bit sub-scales s and 16 signed 8-bit sub-mins n (padded to 64 bytes), then
// each block's 16 x 32 values q (0..15, 0..63 or 0..255): w = (d * s) * q + m * n.
// Values are laid out so that one 64-byte load gives, for each of the 16 features,
// 4 consecutive inputs: chunk c (inputs 4c..4c+3) of feature f at bytes
// [64 c + 4 f, 64 c + 4 f + 4). 4-bit blocks pack chunk c in the low nibbles and
// chunk c + 4 in the high nibbles of 4 such loads; 6-bit blocks hold those low 4 bits
// of each value, then 2 loads of their top 2 bits, chunk 4 h + s at bits 2 s..2 s + 1
// of load h.
// Activations: each row is quantized per block of 32 to int8 with one fp32
// scale (amax / 127, as llama.cpp's Q8_0).
// y[r][f] accumulates, block by block, fma(dot(q, qa), scale * a_scale) then
// fma(min, a_scale * sum(qa)) in fp32, in the same order whatever the rows
// of the call and the threads, so a row's result never depends on the others;
// the vector and the scalar paths compute each lane alike.

#include "bf16.h"
#include "blocked_matmul.h"
#include "call_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <omp.h>
#include <vector>
#include <immintrin.h>

namespace {

constexpr int kBlock = 32;
constexpr int kGroup = 8;   // blocks per group
constexpr int kTile = 16;
constexpr int kLine = 64;
constexpr int kRowTile = 4;
// How far ahead the weights are requested: one request per line, a few KiB ahead (non-temporal
// by default: they are read once a step, so they need not displace anything from the outer
// caches), and each thread's first lines before it starts, which the loop's own requests never
// cover. Fewer and nearer requests left the core time to keep up when the memory delivered more:
// the measurements are in docs/quantization.md ("Memory"). build.py may choose another distance
// and cache for the CPU (`tuning_flags`).
#ifndef SPECC_PREFETCH_BYTES
#define SPECC_PREFETCH_BYTES 6144
#endif
constexpr int kPrefetchBytes = SPECC_PREFETCH_BYTES;
// Which widths' tiles make those requests block by block: a mask of 1 << bits, chosen for the CPU by
// build.py (`tuning_flags`): on a Zen 4 the 4- and 8-bit tiles streamed faster without them, the
// hardware prefetchers keeping up alone, and the 6-bit ones slower (benchmarks/NOTES.md).
#ifndef SPECC_BLOCK_REQUESTS
#define SPECC_BLOCK_REQUESTS ((1 << 4) | (1 << 6) | (1 << 8))
#endif
template <int Bits>
constexpr bool kRequestsBlocks = ((SPECC_BLOCK_REQUESTS) >> Bits) & 1;
// Which cache those requests fill, also chosen by build.py: non-temporal (L1 only, past the outer
// caches) suits AMD's cores; on Intel's Xeons the same requests left the layers at 0.4-0.5 of the
// rate of requests into L2 (benchmarks/NOTES.md).
#ifndef SPECC_PREFETCH_HINT
#define SPECC_PREFETCH_HINT _MM_HINT_NTA
#endif

using specc_cpu::bf16_to_float;
using specc_cpu::float_to_bf16;
using specc_cpu::QuantizedRows;

inline float fp16_to_float(uint16_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits;
    if (exponent == 0) {
        if (mantissa == 0) {
            bits = sign;
        } else {
            exponent = 127 - 15 + 1;
            while (!(mantissa & 0x400u)) { mantissa <<= 1; --exponent; }
            bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
        }
    } else if (exponent == 31) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else {
        bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

void quantize_rows_scalar(const uint16_t* x, int rows, int k, QuantizedRows& out) {
    const int blocks = k / kBlock;
    for (int r = 0; r < rows; ++r) {
        for (int b = 0; b < blocks; ++b) {
            const uint16_t* src = x + static_cast<size_t>(r) * k + b * kBlock;
            float v[kBlock];
            float amax = 0.f;
            for (int i = 0; i < kBlock; ++i) {
                v[i] = bf16_to_float(src[i]);
                amax = std::max(amax, std::fabs(v[i]));
            }
            const float scale = amax / 127.f;
            const float inverse = scale > 0.f ? 1.f / scale : 0.f;
            int8_t* q = out.values.data() + static_cast<size_t>(r) * k + b * kBlock;
            int sum = 0;
            for (int i = 0; i < kBlock; ++i) {
                q[i] = static_cast<int8_t>(std::nearbyint(v[i] * inverse));
                sum += q[i];
            }
            out.scales[static_cast<size_t>(r) * blocks + b] = scale;
            out.sums[static_cast<size_t>(r) * blocks + b] = scale * static_cast<float>(sum);
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// The scalar quantizer's arithmetic on 16 lanes: the same products, rounded to nearest even
// (the default mode nearbyint also rounds in), so the same bytes, scales and sums.
void quantize_rows_vector(const uint16_t* x, int rows, int k, QuantizedRows& out) {
    const int blocks = k / kBlock;
    const __m512 magnitude = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int r = 0; r < rows; ++r) {
        for (int b = 0; b < blocks; ++b) {
            const uint16_t* src = x + static_cast<size_t>(r) * k + b * kBlock;
            __m512 v[2];
            for (int h = 0; h < 2; ++h) {
                const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16 * h));
                v[h] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
            }
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v[0], magnitude),
                                                                    _mm512_and_ps(v[1], magnitude)));
            const float scale = amax / 127.f;
            const __m512 inverse = _mm512_set1_ps(scale > 0.f ? 1.f / scale : 0.f);
            int8_t* q = out.values.data() + static_cast<size_t>(r) * k + b * kBlock;
            __m512i sum = _mm512_setzero_si512();
            for (int h = 0; h < 2; ++h) {
                const __m512i rounded = _mm512_cvtps_epi32(_mm512_mul_ps(v[h], inverse));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * h), _mm512_cvtsepi32_epi8(rounded));
                sum = _mm512_add_epi32(sum, rounded);
            }
            out.scales[static_cast<size_t>(r) * blocks + b] = scale;
            out.sums[static_cast<size_t>(r) * blocks + b] = scale * static_cast<float>(_mm512_reduce_add_epi32(sum));
        }
    }
}
#elif defined(__AVX2__)
// The scalar quantizer's arithmetic on 8 lanes (the same bytes, scales and sums, as above).
void quantize_rows_vector(const uint16_t* x, int rows, int k, QuantizedRows& out) {
    const int blocks = k / kBlock;
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i byte_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int r = 0; r < rows; ++r) {
        for (int b = 0; b < blocks; ++b) {
            const uint16_t* src = x + static_cast<size_t>(r) * k + b * kBlock;
            __m256 v[4];
            __m256 largest = _mm256_setzero_ps();
            for (int q = 0; q < 4; ++q) {
                const __m128i eight = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 8 * q));
                v[q] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(eight), 16));
                largest = _mm256_max_ps(largest, _mm256_and_ps(v[q], magnitude));
            }
            __m128 m = _mm_max_ps(_mm256_castps256_ps128(largest), _mm256_extractf128_ps(largest, 1));
            m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            m = _mm_max_ss(m, _mm_movehdup_ps(m));
            const float scale = _mm_cvtss_f32(m) / 127.f;
            const __m256 inverse = _mm256_set1_ps(scale > 0.f ? 1.f / scale : 0.f);
            __m256i q32[4];
            __m256i sum = _mm256_setzero_si256();
            for (int q = 0; q < 4; ++q) {
                q32[q] = _mm256_cvtps_epi32(_mm256_mul_ps(v[q], inverse));
                sum = _mm256_add_epi32(sum, q32[q]);
            }
            const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q32[0], q32[1]), _mm256_packs_epi32(q32[2], q32[3]));
            int8_t* q = out.values.data() + static_cast<size_t>(r) * k + b * kBlock;
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(bytes, byte_order));
            __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
            out.scales[static_cast<size_t>(r) * blocks + b] = scale;
            out.sums[static_cast<size_t>(r) * blocks + b] = scale * static_cast<float>(_mm_cvtsi128_si32(s));
        }
    }
}
#endif

}  // namespace

void specc_cpu::quantize_rows(const uint16_t* x, int rows, int k, QuantizedRows& out, bool scalar) {
    const int blocks = k / kBlock;
    out.values.resize(static_cast<size_t>(rows) * k);
    out.scales.resize(static_cast<size_t>(rows) * blocks);
    out.sums.resize(static_cast<size_t>(rows) * blocks);
#if (defined(__AVX512F__) && defined(__AVX512BW__)) || defined(__AVX2__)
    if (!scalar) return quantize_rows_vector(x, rows, k, out);
#endif
    quantize_rows_scalar(x, rows, k, out);
}

namespace {

template <int Bits>
constexpr size_t block_value_bytes() { return kTile * kBlock * Bits / 8; }

// A group of `blocks` blocks: fp16 scales and mins, sub-scales and sub-mins, padded to a line.
inline size_t header_bytes(int blocks) { return 4 * kTile + (2 * kTile * blocks + kLine - 1) / kLine * kLine; }

template <int Bits>
size_t group_bytes(int blocks) { return header_bytes(blocks) + blocks * block_value_bytes<Bits>(); }

template <int Bits>
size_t tile_bytes(int blocks) {
    size_t bytes = 0;
    for (int first = 0; first < blocks; first += kGroup) bytes += group_bytes<Bits>(std::min(kGroup, blocks - first));
    return bytes;
}

// The value of input i of feature f in one tile-block's values.
template <int Bits>
inline int value_at(const uint8_t* values, int f, int i) {
    const int chunk = i / 4, e = i % 4;
    if (Bits == 8) return values[64 * chunk + 4 * f + e];
    const uint8_t byte = values[64 * (chunk % 4) + 4 * f + e];
    const int low = chunk < 4 ? (byte & 0x0f) : (byte >> 4);
    if (Bits == 4) return low;
    const uint8_t top = values[256 + 64 * (chunk / 4) + 4 * f + e];
    return low | (((top >> (2 * (chunk % 4))) & 3) << 4);
}

template <int Bits>
void tile_rows_scalar(const uint8_t* tile, int blocks, const QuantizedRows& a, int k,
                      int r0, int count, float (*acc)[kTile]) {
    for (int r = 0; r < count; ++r) std::fill(acc[r], acc[r] + kTile, 0.f);
    const uint8_t* group = tile;
    for (int first = 0; first < blocks; first += kGroup) {
        const int size = std::min(kGroup, blocks - first);
        uint16_t scale_bits[kTile], min_bits[kTile];
        std::memcpy(scale_bits, group, sizeof scale_bits);
        std::memcpy(min_bits, group + 2 * kTile, sizeof min_bits);
        const uint8_t* sub_scales = group + 4 * kTile;
        const int8_t* sub_mins = reinterpret_cast<const int8_t*>(group + 4 * kTile + kTile * size);
        for (int j = 0; j < size; ++j) {
            const int b = first + j;
            const uint8_t* values = group + header_bytes(size) + j * block_value_bytes<Bits>();
            for (int r = 0; r < count; ++r) {
                const size_t row = static_cast<size_t>(r0 + r);
                const int8_t* qa = a.values.data() + row * k + b * kBlock;
                const float a_scale = a.scales[row * blocks + b], a_sum = a.sums[row * blocks + b];
                for (int f = 0; f < kTile; ++f) {
                    int dot = 0;
                    for (int i = 0; i < kBlock; ++i) dot += value_at<Bits>(values, f, i) * qa[i];
                    const float scale = fp16_to_float(scale_bits[f]) * static_cast<float>(sub_scales[kTile * j + f]);
                    const float min = fp16_to_float(min_bits[f]) * static_cast<float>(sub_mins[kTile * j + f]);
                    acc[r][f] = std::fma(static_cast<float>(dot), scale * a_scale, acc[r][f]);
                    acc[r][f] = std::fma(min, a_sum, acc[r][f]);
                }
            }
        }
        group += group_bytes<Bits>(size);
    }
}

// The lines of this block's share of its group (`per_block` bytes, whole lines) requested ahead.
inline void prefetch_share(const uint8_t* group, size_t per_block, int j) {
    const size_t begin = per_block * j, end = per_block * (j + 1);
    for (size_t line = begin; line < end; line += kLine) {
        _mm_prefetch(reinterpret_cast<const char*>(group + kPrefetchBytes + line), SPECC_PREFETCH_HINT);
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
constexpr bool kVector = true;

// Each byte's high nibble, as a byte: one affine bit transform (GFNI) where the CPU has it.
inline __m512i high_nibbles(__m512i v, __m512i low_mask) {
#if defined(__GFNI__)
    (void)low_mask;
    return _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(0x1020408000000000LL), 0);
#else
    return _mm512_and_si512(_mm512_srli_epi16(v, 4), low_mask);
#endif
}

template <int Bits, int Count>
void tile_rows_vector(const uint8_t* tile, int blocks, const QuantizedRows& a, int k, int r0,
                      float (*out)[kTile]) {
    __m512 acc[Count];
    for (int r = 0; r < Count; ++r) acc[r] = _mm512_setzero_ps();
    const __m512i low_mask = _mm512_set1_epi8(0x0f);
    const uint8_t* group = tile;
    for (int first = 0; first < blocks; first += kGroup) {
        const int size = std::min(kGroup, blocks - first);
        const size_t bytes = group_bytes<Bits>(size);
        const size_t per_block = bytes / size / kLine * kLine;   // a division a group, not two a block
        const __m512 group_scales = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group)));
        const __m512 group_mins = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 2 * kTile)));
        const uint8_t* sub_scales = group + 4 * kTile;
        const uint8_t* sub_mins = sub_scales + kTile * size;
        for (int j = 0; j < size; ++j) {
            const int b = first + j;
            if constexpr (kRequestsBlocks<Bits>) prefetch_share(group, per_block, j);
            const __m512 scales = _mm512_mul_ps(group_scales, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(sub_scales + kTile * j)))));
            const __m512 mins = _mm512_mul_ps(group_mins, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(sub_mins + kTile * j)))));
            const uint8_t* values = group + header_bytes(size) + j * block_value_bytes<Bits>();
            __m512i w[8];
            if (Bits == 4 || Bits == 6) {
                for (int c = 0; c < 4; ++c) {
                    __m512i v = _mm512_loadu_si512(values + 64 * c);
                    asm("" : "+v"(v));   // one load for both uses: the compiler would fold it into each
                    w[c] = _mm512_and_si512(v, low_mask);
                    w[c + 4] = high_nibbles(v, low_mask);
                }
                if (Bits == 6) {
                    const __m512i two_bits = _mm512_set1_epi8(3);
                    for (int h = 0; h < 2; ++h) {
                        const __m512i top = _mm512_loadu_si512(values + 256 + 64 * h);
                        for (int s = 0; s < 4; ++s) {
                            const __m512i high = _mm512_and_si512(_mm512_srli_epi16(top, 2 * s), two_bits);
                            w[4 * h + s] = _mm512_or_si512(w[4 * h + s], _mm512_slli_epi16(high, 4));
                        }
                    }
                }
            } else {
                for (int c = 0; c < 8; ++c) w[c] = _mm512_loadu_si512(values + 64 * c);
            }
            for (int r = 0; r < Count; ++r) {
                const size_t row = static_cast<size_t>(r0 + r);
                const int32_t* qa = reinterpret_cast<const int32_t*>(a.values.data() + row * k + b * kBlock);
                __m512i dot = _mm512_setzero_si512();
                for (int c = 0; c < 8; ++c) dot = _mm512_dpbusd_epi32(dot, w[c], _mm512_set1_epi32(qa[c]));
                const __m512 scale = _mm512_mul_ps(scales, _mm512_set1_ps(a.scales[row * blocks + b]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
                acc[r] = _mm512_fmadd_ps(mins, _mm512_set1_ps(a.sums[row * blocks + b]), acc[r]);
            }
        }
        group += bytes;
    }
    for (int r = 0; r < Count; ++r) _mm512_storeu_ps(out[r], acc[r]);
}

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
constexpr bool kVector = true;

// The 4-bit halves of 32 bytes: low nibbles, and high nibbles as bytes.
inline __m256i low_nibbles(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0f)); }
inline __m256i high_nibbles(__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f)); }

// Unsigned weight bytes times one row's signed activation bytes, 4 to a 32-bit lane, added into
// 16-bit pairs (maddubs; AVX2 has no VNNI). Pairs of nibbles times int8 stay within 16 bits for 8
// such sums (8 * 2 * 15 * 127), of 6-bit values for 2 (2 * 2 * 63 * 127); 8-bit values are split
// into nibbles. The integer dot products are exact, so each lane equals the VNNI and scalar paths.
// The 4 activation bytes are broadcast straight from memory (`activation_word`): a load, not a
// move and a shuffle on the vector ports that the multiplies need.
inline __m256i activation_word(const int8_t* activations) {
    return _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(activations)));
}

inline __m256i pair_sums(__m256i weights, const int8_t* activations) {
    return _mm256_maddubs_epi16(weights, activation_word(activations));
}

inline __m256i lane_sums(__m256i pairs) { return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)); }

// Bits 2s..2s+1 of each byte of `top` moved to bits 4..5 (the rest zero): one shift and one mask.
// A 16-bit shift moves no bit across the byte boundary into bits 4..5 for these counts.
inline __m256i top_bits(__m256i top, int s) {
    const __m256i bits_4_5 = _mm256_set1_epi8(0x30);
    switch (s) {
        case 0: return _mm256_and_si256(_mm256_slli_epi16(top, 4), bits_4_5);
        case 1: return _mm256_and_si256(_mm256_slli_epi16(top, 2), bits_4_5);
        case 2: return _mm256_and_si256(top, bits_4_5);
        default: return _mm256_and_si256(_mm256_srli_epi16(top, 2), bits_4_5);
    }
}

// A 6- or 8-bit block's integer dot products for 8 features (half h of the tile's 16) with each
// row; row r's 32 activation bytes start at qa + r * k. (4-bit blocks: q4_block_dots.)
template <int Bits, int Count>
inline void block_dots(const uint8_t* values, int h, const int8_t* qa, int k, __m256i (&dot)[Count]) {
    static_assert(Bits == 6 || Bits == 8, "4-bit blocks take q4_block_dots");
    const uint8_t* half = values + 32 * h;
    if (Bits == 6) {
        __m256i w[8];
        for (int c = 0; c < 4; ++c) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half + 64 * c));
            w[c] = low_nibbles(v);
            w[c + 4] = high_nibbles(v);
        }
        for (int hh = 0; hh < 2; ++hh) {
            const __m256i top = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half + 256 + 64 * hh));
            for (int s = 0; s < 4; ++s) w[4 * hh + s] = _mm256_or_si256(w[4 * hh + s], top_bits(top, s));
        }
        for (int r = 0; r < Count; ++r) {
            dot[r] = _mm256_setzero_si256();
            for (int c = 0; c < 8; c += 2) {
                const __m256i pairs = _mm256_add_epi16(pair_sums(w[c], qa + r * k + 4 * c),
                                                       pair_sums(w[c + 1], qa + r * k + 4 * c + 4));
                dot[r] = _mm256_add_epi32(dot[r], lane_sums(pairs));
            }
        }
    } else {
        __m256i low_pairs[Count], high_pairs[Count];
        for (int r = 0; r < Count; ++r) low_pairs[r] = high_pairs[r] = _mm256_setzero_si256();
        for (int c = 0; c < 8; ++c) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half + 64 * c));
            const __m256i low = low_nibbles(v), high = high_nibbles(v);
            for (int r = 0; r < Count; ++r) {
                low_pairs[r] = _mm256_add_epi16(low_pairs[r], pair_sums(low, qa + r * k + 4 * c));
                high_pairs[r] = _mm256_add_epi16(high_pairs[r], pair_sums(high, qa + r * k + 4 * c));
            }
        }
        for (int r = 0; r < Count; ++r) {
            dot[r] = _mm256_add_epi32(lane_sums(low_pairs[r]), _mm256_slli_epi32(lane_sums(high_pairs[r]), 4));
        }
    }
}

// A 4-bit block's integer dot products for all 16 features with `Rows` rows (1 or 2): each
// activation broadcast serves both halves of the tile, and two rows' sums, the unpacked values and
// the broadcasts still fit the 16 registers (more rows spilled, and cost more than unpacking the
// values again from L1 for the next two).
template <int Rows>
inline void q4_block_dots(const uint8_t* values, const int8_t* qa, int k, __m256i (&dot)[Rows][2]) {
    __m256i pairs[Rows][2];
    for (int r = 0; r < Rows; ++r) pairs[r][0] = pairs[r][1] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
        const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 64 * c));
        const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 64 * c + 32));
        const __m256i low0 = low_nibbles(v0), high0 = high_nibbles(v0);
        const __m256i low1 = low_nibbles(v1), high1 = high_nibbles(v1);
        for (int r = 0; r < Rows; ++r) {
            const int8_t* row = qa + r * k + 4 * c;
            const __m256i a_low = activation_word(row), a_high = activation_word(row + 16);
            pairs[r][0] = _mm256_add_epi16(pairs[r][0], _mm256_add_epi16(_mm256_maddubs_epi16(low0, a_low),
                                                                         _mm256_maddubs_epi16(high0, a_high)));
            pairs[r][1] = _mm256_add_epi16(pairs[r][1], _mm256_add_epi16(_mm256_maddubs_epi16(low1, a_low),
                                                                         _mm256_maddubs_epi16(high1, a_high)));
        }
    }
    for (int r = 0; r < Rows; ++r) {
        dot[r][0] = lane_sums(pairs[r][0]);
        dot[r][1] = lane_sums(pairs[r][1]);
    }
}

// Half h's 8 weight scales (or mins) of block j: the group's fp16 value times the block's 8-bit one.
inline __m256 block_scales(const __m256 (&group_scales)[2], const uint8_t* sub_scales, int j, int h) {
    return _mm256_mul_ps(group_scales[h], _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sub_scales + kTile * j + 8 * h)))));
}

inline __m256 block_mins(const __m256 (&group_mins)[2], const uint8_t* sub_mins, int j, int h) {
    return _mm256_mul_ps(group_mins[h], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sub_mins + kTile * j + 8 * h)))));
}

// Rows' dot products scaled into their accumulators, in the order every path uses.
template <int Rows>
inline void q4_block_rows(const uint8_t* values, const int8_t* qa, int k, const __m256 (&scales)[2],
                          const __m256 (&mins)[2], const float* a_scales, const float* a_sums, int blocks,
                          __m256 (*acc)[2]) {
    __m256i dot[Rows][2];
    q4_block_dots<Rows>(values, qa, k, dot);
    for (int r = 0; r < Rows; ++r) {
        const __m256 a_scale = _mm256_broadcast_ss(a_scales + r * blocks), a_sum = _mm256_broadcast_ss(a_sums + r * blocks);
        for (int h = 0; h < 2; ++h) {
            acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][h]), _mm256_mul_ps(scales[h], a_scale), acc[r][h]);
            acc[r][h] = _mm256_fmadd_ps(mins[h], a_sum, acc[r][h]);
        }
    }
}

template <int Bits, int Count>
void tile_rows_vector(const uint8_t* tile, int blocks, const QuantizedRows& a, int k, int r0,
                      float (*out)[kTile]) {
    __m256 acc[Count][2];
    for (int r = 0; r < Count; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const int8_t* rows_values = a.values.data() + static_cast<size_t>(r0) * k;
    const float* rows_scales = a.scales.data() + static_cast<size_t>(r0) * blocks;
    const float* rows_sums = a.sums.data() + static_cast<size_t>(r0) * blocks;
    const uint8_t* group = tile;
    for (int first = 0; first < blocks; first += kGroup) {
        const int size = std::min(kGroup, blocks - first);
        const size_t bytes = group_bytes<Bits>(size);
        const size_t per_block = bytes / size / kLine * kLine;
        __m256 group_scales[2], group_mins[2];
        for (int h = 0; h < 2; ++h) {
            group_scales[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 16 * h)));
            group_mins[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 2 * kTile + 16 * h)));
        }
        const uint8_t* sub_scales = group + 4 * kTile;
        const uint8_t* sub_mins = sub_scales + kTile * size;
        for (int j = 0; j < size; ++j) {
            const int b = first + j;
            if constexpr (kRequestsBlocks<Bits>) prefetch_share(group, per_block, j);
            const uint8_t* values = group + header_bytes(size) + j * block_value_bytes<Bits>();
            const int8_t* qa = rows_values + b * kBlock;
            if constexpr (Bits == 4) {
                const __m256 scales[2] = {block_scales(group_scales, sub_scales, j, 0), block_scales(group_scales, sub_scales, j, 1)};
                const __m256 mins[2] = {block_mins(group_mins, sub_mins, j, 0), block_mins(group_mins, sub_mins, j, 1)};
                for (int r = 0; r < Count; r += 2) {
                    if (Count - r >= 2) {
                        q4_block_rows<2>(values, qa + r * k, k, scales, mins, rows_scales + r * blocks + b,
                                         rows_sums + r * blocks + b, blocks, acc + r);
                    } else {
                        q4_block_rows<1>(values, qa + r * k, k, scales, mins, rows_scales + r * blocks + b,
                                         rows_sums + r * blocks + b, blocks, acc + r);
                    }
                }
            } else {
                for (int h = 0; h < 2; ++h) {
                    const __m256 scales = block_scales(group_scales, sub_scales, j, h);
                    const __m256 mins = block_mins(group_mins, sub_mins, j, h);
                    __m256i dot[Count];
                    block_dots<Bits, Count>(values, h, qa, k, dot);
                    for (int r = 0; r < Count; ++r) {
                        const __m256 scale = _mm256_mul_ps(scales, _mm256_broadcast_ss(rows_scales + r * blocks + b));
                        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), scale, acc[r][h]);
                        acc[r][h] = _mm256_fmadd_ps(mins, _mm256_broadcast_ss(rows_sums + r * blocks + b), acc[r][h]);
                    }
                }
            }
        }
        group += bytes;
    }
    for (int r = 0; r < Count; ++r) {
        _mm256_storeu_ps(out[r], acc[r][0]);
        _mm256_storeu_ps(out[r] + 8, acc[r][1]);
    }
}

#endif

#if (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)) \
    || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
// A tile's `count` rows (at most kRowTile) by the vector path above.
template <int Bits>
void tile_rows(const uint8_t* tile, int blocks, const QuantizedRows& a, int k, int r0, int count,
               float (*out)[kTile]) {
    switch (count) {
        case 1: tile_rows_vector<Bits, 1>(tile, blocks, a, k, r0, out); break;
        case 2: tile_rows_vector<Bits, 2>(tile, blocks, a, k, r0, out); break;
        case 3: tile_rows_vector<Bits, 3>(tile, blocks, a, k, r0, out); break;
        default: tile_rows_vector<Bits, 4>(tile, blocks, a, k, r0, out); break;
    }
}
#else
constexpr bool kVector = false;

template <int Bits>
void tile_rows(const uint8_t* tile, int blocks, const QuantizedRows& a, int k, int r0, int count,
               float (*out)[kTile]) {
    tile_rows_scalar<Bits>(tile, blocks, a, k, r0, count, out);
}
#endif

// A tile's 16 outputs rounded to bfloat16, 16 lanes at once where the CPU has them.
inline void store_rounded(const float* out, uint16_t* dst, bool scalar) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (!scalar) return specc_cpu::store_bf16x16(dst, _mm512_loadu_ps(out));
#elif defined(__AVX2__)
    if (!scalar) {
        specc_cpu::store_bf16x8(dst, _mm256_loadu_ps(out));
        return specc_cpu::store_bf16x8(dst + 8, _mm256_loadu_ps(out + 8));
    }
#endif
    for (int f = 0; f < kTile; ++f) dst[f] = float_to_bf16(out[f]);
}

// The first `bytes` at `start` requested into the outer caches.
inline void request_ahead(const uint8_t* start, size_t bytes) {
    for (size_t line = 0; line < bytes; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(start + line), _MM_HINT_T1);
    }
}

template <int Bits>
void tiles(const QuantizedRows& a, int rows, int k, const uint8_t* weight, int tile_count, uint16_t* y,
           int64_t y_stride, bool scalar) {
    const int blocks = k / kBlock;
    const size_t stride = tile_bytes<Bits>(blocks);
    request_ahead(weight, std::min<size_t>(tile_count * stride, kPrefetchBytes));
    for (int t = 0; t < tile_count; ++t) {
        const uint8_t* tile = weight + t * stride;
        for (int r0 = 0; r0 < rows; r0 += kRowTile) {
            const int count = std::min(kRowTile, rows - r0);
            float out[kRowTile][kTile];
            if (scalar) {
                tile_rows_scalar<Bits>(tile, blocks, a, k, r0, count, out);
            } else {
                tile_rows<Bits>(tile, blocks, a, k, r0, count, out);
            }
            for (int r = 0; r < count; ++r) store_rounded(out[r], y + (r0 + r) * y_stride + t * kTile, scalar);
        }
    }
}

}  // namespace

void specc_cpu::tile_share(int tiles, int threads, int thread, int* first, int* last) {
    const int share = tiles / threads, longer = tiles % threads;   // omp's static schedule, by hand
    *first = thread * share + std::min(thread, longer);
    *last = *first + share + (thread < longer ? 1 : 0);
}

void specc_cpu::blocked_tiles(const QuantizedRows& a, int rows, int k, const uint8_t* tiles_from, int bits, int count,
                              uint16_t* y, int64_t y_stride, bool scalar) {
    if (bits == 4) {
        tiles<4>(a, rows, k, tiles_from, count, y, y_stride, scalar);
    } else if (bits == 6) {
        tiles<6>(a, rows, k, tiles_from, count, y, y_stride, scalar);
    } else {
        tiles<8>(a, rows, k, tiles_from, count, y, y_stride, scalar);
    }
}

int64_t specc_cpu::tile_bytes(int k, int bits) {
    if (k <= 0 || k % kBlock != 0) return 0;
    if (bits == 4) return static_cast<int64_t>(::tile_bytes<4>(k / kBlock));
    if (bits == 6) return static_cast<int64_t>(::tile_bytes<6>(k / kBlock));
    if (bits == 8) return static_cast<int64_t>(::tile_bytes<8>(k / kBlock));
    return 0;
}

namespace {

void matmul(const uint16_t* x, int rows, int k, const uint8_t* weight, int n, int bits, uint16_t* y, bool scalar) {
    QuantizedRows a;
    specc_cpu::quantize_rows(x, rows, k, a, scalar);
#pragma omp parallel
    {
        int first, last;
        specc_cpu::tile_share(n / kTile, omp_get_num_threads(), omp_get_thread_num(), &first, &last);
        specc_cpu::blocked_tiles(a, rows, k, weight + first * specc_cpu::tile_bytes(k, bits), bits, last - first,
                                 y + first * kTile, n, scalar);
    }
}

}  // namespace

extern "C" {

// 1 when this build has the AVX-512 VNNI path, 0 when every call runs the scalar one.
int specc_blocked_matmul_vectorized() { return kVector ? 1 : 0; }

// Bytes of one tile of 16 output features over k inputs at `bits` (0 when k or bits do not fit).
long long specc_blocked_tile_bytes(int k, int bits) { return specc_cpu::tile_bytes(k, bits); }

// y[rows, n] (bf16) = x[rows, k] (bf16) times the transpose of a [n, k] weight packed in
// `bits` (4, 6 or 8) as above; n a multiple of 16, k of 32. `scalar` forces the portable path.
int specc_blocked_matmul(const uint16_t* x, int rows, int k, const uint8_t* weight, int n, int bits,
                         uint16_t* y, int scalar) {
    if (n % kTile != 0 || k % kBlock != 0 || rows < 0) return 1;
    const specc_cpu::TracedCall traced(specc_cpu::Traced::matmul);
    if (bits != 4 && bits != 6 && bits != 8) return 2;
    matmul(x, rows, k, weight, n, bits, y, scalar != 0);
    return 0;
}

}
