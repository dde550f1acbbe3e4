// Masked attention computed row by row on the CPU: the attention of specc's quantized engines.
//
// out[b, h, r] = softmax(scale * q[b, h, r] . k[b, h / group, j] over the keys j the mask
// allows in row r) . v[b, h / group, j], in fp32, rounded once to the output dtype.
// Each (batch, head, row) is one task whose arithmetic depends on that row's query and
// mask and on the keys it may see, nothing else: not the call's other rows, not the
// masked keys (never read, so padding the key axis changes nothing), not the threads.
// So a row computes the same bits in a one-row decode step as in a verification of
// several rows, which is what lets a lossless method on a quantized engine verify
// without padding its calls. Sums run over 16 lanes in a fixed order, then across the
// lanes in a fixed order; the keys are taken in chunks of fixed positions whose partial
// softmaxes combine in chunk order (below); exp is a fixed polynomial; a row that may see no
// key is zeros.

#include "bf16.h"
#include "call_trace.h"
#include "exp.h"
#include "row_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>
#include <immintrin.h>
#include <omp.h>

namespace {

constexpr int kLanes = 16;
constexpr int kChunk = 64;   // keys a chunk spans (see attention_by_chunk)

using specc_cpu::exp_nonpositive;
using specc_cpu::float_to_bf16;
using specc_cpu::load;

template <typename T> inline T store(float v);
template <> inline float store<float>(float v) { return v; }
template <> inline uint16_t store<uint16_t>(float v) { return float_to_bf16(v); }

// Lanes summed pairwise, halves then quarters and so on: a fixed order, 4 dependent adds.
inline float lanes_sum(float (&lanes)[kLanes]) {
    for (int width = kLanes / 2; width > 0; width /= 2) {
        for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
    }
    return lanes[0];
}

// Every cache line of one row of `dim` values asked of the memory, into the cache `Hint` names.
template <int Hint, typename T>
inline void request_row(const T* row, int dim) {
    const char* bytes = reinterpret_cast<const char*>(row);
    for (int64_t at = 0; at < static_cast<int64_t>(dim) * static_cast<int64_t>(sizeof(T)); at += 64) {
        _mm_prefetch(bytes + at, static_cast<_mm_hint>(Hint));
    }
}

// Every cache line of the n rows asked of the memory at once: a chunk's rows are read one after
// another, too slowly for the hardware prefetcher to run far enough ahead in a short chunk.
template <typename T>
inline void request_rows(const T* rows, int64_t stride, const int* seen, int n, int dim) {
    for (int i = 0; i < n; ++i) request_row<_MM_HINT_T0>(rows + seen[i] * stride, dim);
}

// The next chunk's `n` rows asked into L2 while this one is computed: in attention_by_chunk
// most often the same thread's next task, whose rows a decode step finds cold (the weights
// streamed since the last step have emptied the caches), and those asked at a chunk's start
// come too late to keep the loop busy. Not in attention_by_row: there many rows read each
// chunk, hot after the first, and the requests would only cost instructions.
template <typename T>
inline void request_next_chunk(const T* rows, int64_t stride, int n, int dim) {
    for (int i = 0; i < n; ++i) request_row<_MM_HINT_T1>(rows + i * stride, dim);
}

#if defined(__AVX512F__)
constexpr bool kVector = true;

inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const uint16_t* p, __mmask16 m) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
using specc_cpu::exp_nonpositive16;

inline __mmask16 lanes_below(int n) { return n >= kLanes ? 0xffff : static_cast<__mmask16>((1u << n) - 1); }

// q . k for each key in `seen`: lanes of 16 values, then the lanes summed by halves. Four keys
// at a time, each with its own sums, so their chains overlap; a key's arithmetic is the same.
template <typename T>
inline float score(const float* q, const T* k, int dim) {
    __m512 acc = _mm512_setzero_ps();
    for (int d = 0; d < dim; d += kLanes) {
        const __mmask16 m = lanes_below(dim - d);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d), load16(k + d, m), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

// The 16 lane sums of 16 keys' accumulators at once, each in lanes_sum's order (halves, then
// quarters, then pairs, then the last two: _mm512_reduce_add_ps's), so a key's score is the
// same bits as when it is summed alone; out[k] is key k's.
inline void sums_of_16(const __m512 (&acc)[16], float* out) {
    __m512 halves[8], quarters[4], pairs[2];
    for (int p = 0; p < 8; ++p) {   // lanes i + (i + 8) of keys 2p and 2p + 1
        halves[p] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * p], acc[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(acc[2 * p], acc[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    for (int r = 0; r < 4; ++r) {   // + (i + 4): keys 4r .. 4r + 3, one per 128-bit quarter
        quarters[r] = _mm512_add_ps(_mm512_shuffle_f32x4(halves[2 * r], halves[2 * r + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(halves[2 * r], halves[2 * r + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    }
    for (int s = 0; s < 2; ++s) {   // + (i + 2): quarter j holds keys 8s + j and 8s + 4 + j
        pairs[s] = _mm512_add_ps(_mm512_shuffle_ps(quarters[2 * s], quarters[2 * s + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(quarters[2 * s], quarters[2 * s + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    // + (i + 1): lane 4j + t is key 4t + j.
    const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i lane_of_key = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(lane_of_key, sums));
}

// acc[u] = lanes of q . k for the `Keys` keys seen[0 .. Keys), each key's chain over d in order.
template <int Keys, typename T>
inline void accumulate(const float* q, const T* keys, int64_t key_stride, const int* seen, int dim,
                       __m512 (&acc)[Keys]) {
    const T* k[Keys];
    for (int u = 0; u < Keys; ++u) {
        acc[u] = _mm512_setzero_ps();
        k[u] = keys + seen[u] * key_stride;
    }
    for (int d = 0; d < dim; d += kLanes) {
        const __mmask16 m = lanes_below(dim - d);
        const __m512 qd = _mm512_maskz_loadu_ps(m, q + d);
        for (int u = 0; u < Keys; ++u) acc[u] = _mm512_fmadd_ps(qd, load16(k[u] + d, m), acc[u]);
    }
}

template <typename T>
void scores(const float* q, const T* keys, int64_t key_stride, const int* seen, int n, int dim, float* out) {
    constexpr int kWide = 16, kKeys = 4;
    int i = 0;
    for (; i + kWide <= n; i += kWide) {
        __m512 acc[kWide];
        accumulate(q, keys, key_stride, seen + i, dim, acc);
        sums_of_16(acc, out + i);
    }
    for (; i + kKeys <= n; i += kKeys) {
        __m512 acc[kKeys];
        accumulate(q, keys, key_stride, seen + i, dim, acc);
        for (int u = 0; u < kKeys; ++u) out[i + u] = _mm512_reduce_add_ps(acc[u]);
    }
    for (; i < n; ++i) out[i] = score(q, keys + seen[i] * key_stride, dim);
}

// weights[i] = exp(weights[i] - max) in place; *top = max; returns their sum (lane l sums i = l mod 16).
inline float softmax_numerators(float* weights, int n, float* top_out) {
    __m512 highest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int i = 0; i < n; i += kLanes) {
        highest = _mm512_max_ps(highest, _mm512_mask_loadu_ps(highest, lanes_below(n - i), weights + i));
    }
    *top_out = _mm512_reduce_max_ps(highest);
    const __m512 top = _mm512_set1_ps(*top_out);
    __m512 sums = _mm512_setzero_ps();
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 m = lanes_below(n - i);
        const __m512 e = _mm512_maskz_mov_ps(m, exp_nonpositive16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, weights + i), top)));
        _mm512_mask_storeu_ps(weights + i, m, e);
        sums = _mm512_add_ps(sums, e);
    }
    float lanes[kLanes];
    _mm512_storeu_ps(lanes, sums);
    return lanes_sum(lanes);
}

// acc[d] = sum over i, in order, of weights[i] * v_i[d], 128 values of d at a time in registers.
template <typename T>
void weighted_sum(const float* weights, const T* values, int64_t value_stride, const int* seen, int n, int dim,
                  float* acc) {
    constexpr int kChunks = 8;
    for (int d0 = 0; d0 < dim; d0 += kChunks * kLanes) {
        __m512 sums[kChunks];
        __mmask16 masks[kChunks];
        for (int c = 0; c < kChunks; ++c) {
            sums[c] = _mm512_setzero_ps();
            masks[c] = dim - d0 - c * kLanes > 0 ? lanes_below(dim - d0 - c * kLanes) : 0;
        }
        for (int i = 0; i < n; ++i) {
            const T* v = values + seen[i] * value_stride + d0;
            const __m512 w = _mm512_set1_ps(weights[i]);
            for (int c = 0; c < kChunks; ++c) {
                if (masks[c]) sums[c] = _mm512_fmadd_ps(w, load16(v + c * kLanes, masks[c]), sums[c]);
            }
        }
        for (int c = 0; c < kChunks; ++c) _mm512_mask_storeu_ps(acc + d0 + c * kLanes, masks[c], sums[c]);
    }
}

// scores() for H query heads against the same keys, each key's K rows loaded once for all of
// them: out[h][i] is head h's score of key i, the same arithmetic (so bits) as scores().
template <int H, typename T>
void scores_of_heads(const float* const* q, const T* keys, int64_t key_stride, const int* seen, int n, int dim,
                     float* const* out) {
    constexpr int kKeys = 4;
    auto accumulate_heads = [&](const int* at, __m512 (&acc)[H][kKeys]) {
        const T* k[kKeys];
        for (int u = 0; u < kKeys; ++u) k[u] = keys + at[u] * key_stride;
        for (int h = 0; h < H; ++h) {
            for (int u = 0; u < kKeys; ++u) acc[h][u] = _mm512_setzero_ps();
        }
        for (int d = 0; d < dim; d += kLanes) {
            const __mmask16 m = lanes_below(dim - d);
            __m512 kd[kKeys];
            for (int u = 0; u < kKeys; ++u) kd[u] = load16(k[u] + d, m);
            for (int h = 0; h < H; ++h) {
                const __m512 qd = _mm512_maskz_loadu_ps(m, q[h] + d);
                for (int u = 0; u < kKeys; ++u) acc[h][u] = _mm512_fmadd_ps(qd, kd[u], acc[h][u]);
            }
        }
    };
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 lanes[H][16];
        for (int u0 = 0; u0 < 16; u0 += kKeys) {
            __m512 acc[H][kKeys];
            accumulate_heads(seen + i + u0, acc);
            for (int h = 0; h < H; ++h) {
                for (int u = 0; u < kKeys; ++u) lanes[h][u0 + u] = acc[h][u];
            }
        }
        for (int h = 0; h < H; ++h) sums_of_16(lanes[h], out[h] + i);
    }
    for (; i + kKeys <= n; i += kKeys) {
        __m512 acc[H][kKeys];
        accumulate_heads(seen + i, acc);
        for (int h = 0; h < H; ++h) {
            for (int u = 0; u < kKeys; ++u) out[h][i + u] = _mm512_reduce_add_ps(acc[h][u]);
        }
    }
    for (; i < n; ++i) {
        for (int h = 0; h < H; ++h) out[h][i] = score(q[h], keys + seen[i] * key_stride, dim);
    }
}

// weighted_sum() for H heads' weights over the same values, each value row loaded once: acc[h][d],
// the same arithmetic as weighted_sum().
template <int H, typename T>
void weighted_sums_of_heads(const float* const* weights, const T* values, int64_t value_stride, const int* seen,
                            int n, int dim, float* const* acc) {
    constexpr int kChunks = 4;
    for (int d0 = 0; d0 < dim; d0 += kChunks * kLanes) {
        __m512 sums[H][kChunks];
        __mmask16 masks[kChunks];
        for (int c = 0; c < kChunks; ++c) {
            masks[c] = dim - d0 - c * kLanes > 0 ? lanes_below(dim - d0 - c * kLanes) : 0;
            for (int h = 0; h < H; ++h) sums[h][c] = _mm512_setzero_ps();
        }
        for (int i = 0; i < n; ++i) {
            const T* v = values + seen[i] * value_stride + d0;
            __m512 vc[kChunks];
            for (int c = 0; c < kChunks; ++c) vc[c] = masks[c] ? load16(v + c * kLanes, masks[c]) : _mm512_setzero_ps();
            for (int h = 0; h < H; ++h) {
                const __m512 w = _mm512_set1_ps(weights[h][i]);
                for (int c = 0; c < kChunks; ++c) {
                    if (masks[c]) sums[h][c] = _mm512_fmadd_ps(w, vc[c], sums[h][c]);
                }
            }
        }
        for (int h = 0; h < H; ++h) {
            for (int c = 0; c < kChunks; ++c) _mm512_mask_storeu_ps(acc[h] + d0 + c * kLanes, masks[c], sums[h][c]);
        }
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr bool kVector = true;
using specc_cpu::exp_nonpositive8;

// 16 lanes as two registers, for CPUs without AVX-512: lane l < 8 in lo, lane 8 + l in hi, so
// every sum below runs in the lanes and order of the AVX-512 path and the scalar one.
struct Lanes16 {
    __m256 lo, hi;
};

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return specc_cpu::bf16x8_to_float(p); }

// Elements [d, d + 16) of a row of `dim`, zeros past its end.
template <typename T>
inline Lanes16 load16(const T* row, int d, int dim) {
    if (d + kLanes <= dim) return {load8(row + d), load8(row + d + 8)};
    alignas(32) float padded[kLanes] = {};
    for (int i = d; i < dim; ++i) padded[i - d] = load<T>(row + i);
    return {_mm256_load_ps(padded), _mm256_load_ps(padded + 8)};
}

// lanes_sum's order: halves (lo + hi), then quarters, pairs and the last two of those 8.
inline float sum16(const Lanes16& v) {
    const __m256 halves = _mm256_add_ps(v.lo, v.hi);
    __m128 quarters = _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
    quarters = _mm_add_ps(quarters, _mm_movehl_ps(quarters, quarters));
    return _mm_cvtss_f32(_mm_add_ss(quarters, _mm_movehdup_ps(quarters)));
}

// Lanes of q . k over d, each lane's chain in order of d.
template <typename T>
inline Lanes16 dot_lanes(const float* q, const T* k, int dim) {
    Lanes16 acc{_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int d = 0; d < dim; d += kLanes) {
        const Lanes16 qd = load16(q, d, dim), kd = load16(k, d, dim);
        acc.lo = _mm256_fmadd_ps(qd.lo, kd.lo, acc.lo);
        acc.hi = _mm256_fmadd_ps(qd.hi, kd.hi, acc.hi);
    }
    return acc;
}

template <typename T>
void scores(const float* q, const T* keys, int64_t key_stride, const int* seen, int n, int dim, float* out) {
    for (int i = 0; i < n; ++i) out[i] = sum16(dot_lanes(q, keys + seen[i] * key_stride, dim));
}

// The largest of n scores, as std::max in order finds it (a NaN score is passed over), 8 lanes at
// a time.
inline float highest_of(const float* weights, int n) {
    __m256 lanes = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    int i = 0;
    for (; i + 8 <= n; i += 8) lanes = _mm256_max_ps(_mm256_loadu_ps(weights + i), lanes);   // NaN: keeps `lanes`
    alignas(32) float kept[8];
    _mm256_store_ps(kept, lanes);
    float highest = -std::numeric_limits<float>::infinity();
    for (const float v : kept) highest = std::max(highest, v);
    for (; i < n; ++i) highest = std::max(highest, weights[i]);
    return highest;
}

// weights[i] = exp(weights[i] - max) in place; *top = max; returns their sum (lane l sums i = l mod 16).
inline float softmax_numerators(float* weights, int n, float* top_out) {
    const float highest = highest_of(weights, n);
    *top_out = highest;
    const __m256 top = _mm256_set1_ps(highest);
    Lanes16 sums{_mm256_setzero_ps(), _mm256_setzero_ps()};
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) {   // whole blocks: every lane a weight
        const __m256 lo = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(weights + i), top));
        const __m256 hi = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(weights + i + 8), top));
        _mm256_storeu_ps(weights + i, lo);
        _mm256_storeu_ps(weights + i + 8, hi);
        sums.lo = _mm256_add_ps(sums.lo, lo);
        sums.hi = _mm256_add_ps(sums.hi, hi);
    }
    for (; i < n; i += kLanes) {
        const Lanes16 w = load16(weights, i, n);
        const Lanes16 e{exp_nonpositive8(_mm256_sub_ps(w.lo, top)), exp_nonpositive8(_mm256_sub_ps(w.hi, top))};
        alignas(32) float lanes[kLanes];
        _mm256_store_ps(lanes, e.lo);
        _mm256_store_ps(lanes + 8, e.hi);
        const int valid = std::min(kLanes, n - i);
        for (int l = 0; l < kLanes; ++l) lanes[l] = l < valid ? lanes[l] : 0.f;
        std::copy(lanes, lanes + valid, weights + i);
        sums.lo = _mm256_add_ps(sums.lo, _mm256_load_ps(lanes));
        sums.hi = _mm256_add_ps(sums.hi, _mm256_load_ps(lanes + 8));
    }
    return sum16(sums);
}

// acc[d] = sum over i, in order, of weights[i] * v_i[d].
template <typename T>
void weighted_sum(const float* weights, const T* values, int64_t value_stride, const int* seen, int n, int dim,
                  float* acc) {
    int d0 = 0;
    for (; d0 + 8 <= dim; d0 += 8) {
        __m256 sum = _mm256_setzero_ps();
        for (int i = 0; i < n; ++i) {
            sum = _mm256_fmadd_ps(_mm256_set1_ps(weights[i]), load8(values + seen[i] * value_stride + d0), sum);
        }
        _mm256_storeu_ps(acc + d0, sum);
    }
    for (; d0 < dim; ++d0) {
        float sum = 0.f;
        for (int i = 0; i < n; ++i) sum = std::fma(weights[i], load<T>(values + seen[i] * value_stride + d0), sum);
        acc[d0] = sum;
    }
}

// scores() for H query heads against the same keys, each key's row read once for all of them
// (the same arithmetic, so bits).
template <int H, typename T>
void scores_of_heads(const float* const* q, const T* keys, int64_t key_stride, const int* seen, int n, int dim,
                     float* const* out) {
    if (dim % kLanes == 0) {   // no padded tail: the sums stay in registers
        for (int i = 0; i < n; ++i) {
            const T* k = keys + seen[i] * key_stride;
            __m256 lo[H], hi[H];
            for (int h = 0; h < H; ++h) lo[h] = hi[h] = _mm256_setzero_ps();
            for (int d = 0; d < dim; d += kLanes) {
                const __m256 k_lo = load8(k + d), k_hi = load8(k + d + 8);
                for (int h = 0; h < H; ++h) {
                    lo[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q[h] + d), k_lo, lo[h]);
                    hi[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q[h] + d + 8), k_hi, hi[h]);
                }
            }
            for (int h = 0; h < H; ++h) out[h][i] = sum16(Lanes16{lo[h], hi[h]});
        }
        return;
    }
    for (int i = 0; i < n; ++i) {
        const T* k = keys + seen[i] * key_stride;
        Lanes16 acc[H];
        for (int h = 0; h < H; ++h) acc[h] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int d = 0; d < dim; d += kLanes) {
            const Lanes16 kd = load16(k, d, dim);
            for (int h = 0; h < H; ++h) {
                const Lanes16 qd = load16(q[h], d, dim);
                acc[h].lo = _mm256_fmadd_ps(qd.lo, kd.lo, acc[h].lo);
                acc[h].hi = _mm256_fmadd_ps(qd.hi, kd.hi, acc[h].hi);
            }
        }
        for (int h = 0; h < H; ++h) out[h][i] = sum16(acc[h]);
    }
}

// Dimensions [d0, d0 + 8 C) of weighted_sum() for H heads, the sums in registers.
template <int H, int C, typename T>
inline void weighted_sums_block(const float* const* weights, const T* values, int64_t value_stride, const int* seen,
                                int n, int d0, float* const* acc) {
    __m256 sums[H][C];
    for (int h = 0; h < H; ++h) {
        for (int c = 0; c < C; ++c) sums[h][c] = _mm256_setzero_ps();
    }
    for (int i = 0; i < n; ++i) {
        const T* v = values + seen[i] * value_stride + d0;
        __m256 vc[C];
        for (int c = 0; c < C; ++c) vc[c] = load8(v + 8 * c);
        for (int h = 0; h < H; ++h) {
            const __m256 w = _mm256_broadcast_ss(weights[h] + i);
            for (int c = 0; c < C; ++c) sums[h][c] = _mm256_fmadd_ps(w, vc[c], sums[h][c]);
        }
    }
    for (int h = 0; h < H; ++h) {
        for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc[h] + d0 + 8 * c, sums[h][c]);
    }
}

// weighted_sum() for H heads' weights over the same values, each value row read once per block of
// dimensions whose sums fit the registers.
template <int H, typename T>
void weighted_sums_of_heads(const float* const* weights, const T* values, int64_t value_stride, const int* seen,
                            int n, int dim, float* const* acc) {
    if (dim % 8) {
        for (int h = 0; h < H; ++h) weighted_sum(weights[h], values, value_stride, seen, n, dim, acc[h]);
        return;
    }
    constexpr int C = H <= 2 ? 4 : 2;
    int d0 = 0;
    for (; d0 + 8 * C <= dim; d0 += 8 * C) weighted_sums_block<H, C>(weights, values, value_stride, seen, n, d0, acc);
    for (; d0 < dim; d0 += 8) weighted_sums_block<H, 1>(weights, values, value_stride, seen, n, d0, acc);
}
#else
constexpr bool kVector = false;

template <typename T>
void scores(const float* q, const T* keys, int64_t key_stride, const int* seen, int n, int dim, float* out) {
    for (int i = 0; i < n; ++i) {
        const T* k = keys + seen[i] * key_stride;
        float lanes[kLanes] = {};
        for (int d = 0; d < dim; ++d) lanes[d % kLanes] += q[d] * load<T>(k + d);
        out[i] = lanes_sum(lanes);
    }
}

inline float softmax_numerators(float* weights, int n, float* top_out) {
    float highest = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n; ++i) highest = std::max(highest, weights[i]);
    *top_out = highest;
    float lanes[kLanes] = {};
    for (int i = 0; i < n; ++i) {
        weights[i] = exp_nonpositive(weights[i] - highest);
        lanes[i % kLanes] += weights[i];
    }
    return lanes_sum(lanes);
}

template <typename T>
void weighted_sum(const float* weights, const T* values, int64_t value_stride, const int* seen, int n, int dim,
                  float* acc) {
    std::fill(acc, acc + dim, 0.f);
    for (int i = 0; i < n; ++i) {
        const T* v = values + seen[i] * value_stride;
        for (int d = 0; d < dim; ++d) acc[d] += weights[i] * load<T>(v + d);
    }
}
#endif

struct Strides {
    int64_t batch, head, position, element;   // in elements (0 on a broadcast axis); position: a query row or a key
};

// The keys row `mask` allows, in order, into `seen`; their count.
inline int seen_keys(const bool* mask, int kv, int64_t stride, int* seen) {
    int n = 0, j = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    if (stride == 1) {
        const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        for (; j + kLanes <= kv; j += kLanes) {
            const __mmask16 allowed = _mm_test_epi8_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mask + j)),
                                                         _mm_set1_epi8(1));
            _mm512_mask_compressstoreu_epi32(seen + n, allowed, _mm512_add_epi32(lanes, _mm512_set1_epi32(j)));
            n += __builtin_popcount(allowed);
        }
    }
#endif
    for (; j < kv; ++j) {
        seen[n] = j;
        n += mask[j * stride] ? 1 : 0;
    }
    return n;
}

// The keys are taken in chunks of kChunk fixed positions ([c * kChunk, (c + 1) * kChunk)); a
// row's softmax over a chunk's allowed keys is summarised by its top score, the sum of
// exp(score - top) and the unnormalised weighted sum of the values, and the chunks' summaries
// are combined in chunk order. Chunk bounds are positions, not counts of allowed keys, so a
// row's chunks (and its bits) depend on its mask and keys only; whether one thread runs all of
// a row's chunks or the threads share them (a decode step has too few rows to keep two cores
// busy, and reads the cache once per kv head either way) does not change a bit.
struct ChunkSummary {
    int count;     // allowed keys; 0: the chunk adds nothing
    float top;     // their highest score
    float total;   // sum over them of exp(score - top)
};

struct Scratch {
    std::vector<float> q, weights;   // a row's scaled query and chunk weights, per head of a kv head's group
    std::vector<int> seen;
    std::vector<float> sum;
};

// At least n elements; grown, never shrunk, so a thread's buffers are allocated once, not per call.
template <typename V>
inline typename V::value_type* fitted(V& buffer, int64_t n) {
    if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
    return buffer.data();
}

// This thread's scratch, fitted to the call.
inline Scratch& thread_scratch(int dim, int group) {
    thread_local Scratch scratch;
    fitted(scratch.q, static_cast<int64_t>(dim) * group);
    fitted(scratch.weights, static_cast<int64_t>(kChunk) * group);
    fitted(scratch.seen, kChunk);
    fitted(scratch.sum, dim);
    return scratch;
}

// A call's per-chunk summaries and weighted sums, in the calling thread's buffers (the parallel
// region's threads write into the caller's).
struct ChunkResults {
    std::vector<struct ChunkSummary> summaries;
    std::vector<float> accs;
};

// The summary of chunk `c` for one (batch, head, row); acc[dim] gets the weighted sum of its values.
template <typename T>
ChunkSummary summarise_chunk(const float* q, const T* keys, const T* values, const bool* mask, int kv, int dim,
                             const Strides& ks, const Strides& vs, int64_t mask_key_stride, int c, Scratch& scratch,
                             float* acc) {
    const int begin = c * kChunk, end = std::min(kv, begin + kChunk);
    const int n = seen_keys(mask + begin * mask_key_stride, end - begin, mask_key_stride, scratch.seen.data());
    ChunkSummary summary{n, 0.f, 0.f};
    if (n == 0) return summary;
    scores(q, keys + begin * ks.position, ks.position, scratch.seen.data(), n, dim, scratch.weights.data());
    summary.total = softmax_numerators(scratch.weights.data(), n, &summary.top);
    weighted_sum(scratch.weights.data(), values + begin * vs.position, vs.position, scratch.seen.data(), n, dim, acc);
    return summary;
}

// out[dim] from a row's chunk summaries, in chunk order; zeros when no chunk has a key.
template <typename T>
void combine(const ChunkSummary* summaries, const float* accs, int chunks, int dim, std::vector<float>& sum, T* out) {
    float top = -std::numeric_limits<float>::infinity();
    for (int c = 0; c < chunks; ++c) {
        if (summaries[c].count) top = std::max(top, summaries[c].top);
    }
    if (top == -std::numeric_limits<float>::infinity()) {
        for (int d = 0; d < dim; ++d) out[d] = store<T>(0.f);
        return;
    }
    std::fill(sum.begin(), sum.end(), 0.f);
    float total = 0.f;
    for (int c = 0; c < chunks; ++c) {
        if (!summaries[c].count) continue;
        const float weight = exp_nonpositive(summaries[c].top - top);
        total += summaries[c].total * weight;
        const float* acc = accs + static_cast<int64_t>(c) * dim;
        for (int d = 0; d < dim; ++d) sum[d] += acc[d] * weight;
    }
    for (int d = 0; d < dim; ++d) out[d] = store<T>(sum[d] / total);
}

struct Shape {
    int batch, heads, kv_heads, rows, kv, dim, chunks;
    float scale;
    int group() const { return heads / kv_heads; }
};

struct Operands {
    Strides qs, ks, vs, ms;
};

// query row (b, h, r), scaled, into q.
template <typename T>
void scaled_query(const T* query, const Operands& o, const Shape& s, int b, int h, int r, float* q) {
    const T* row = query + b * o.qs.batch + h * o.qs.head + r * o.qs.position;
    for (int d = 0; d < s.dim; ++d) q[d] = load<T>(row + d) * s.scale;
}

// Chunk c of (b, h, r) summarised into summary / acc.
template <typename T>
void summarise(const T* query, const T* keys, const T* values, const bool* mask, const Operands& o, const Shape& s,
               int b, int h, int r, int c, Scratch& scratch, ChunkSummary* summary, float* acc) {
    const int g = h / s.group();
    scaled_query(query, o, s, b, h, r, scratch.q.data());
    *summary = summarise_chunk<T>(scratch.q.data(), keys + b * o.ks.batch + g * o.ks.head,
                                  values + b * o.vs.batch + g * o.vs.head,
                                  mask + b * o.ms.batch + h * o.ms.head + r * o.ms.position, s.kv, s.dim, o.ks, o.vs,
                                  o.ms.element, c, scratch, acc);
}

// Chunk c of (b, h, r) for each query head h of kv head g: head i's summary at summaries[i * stride],
// its weighted sum at accs[i * stride * dim]. When the heads share a mask, the chunk's keys and
// values are read once for up to four heads at a time; each head's arithmetic, so its bits, stay
// those of summarise().
template <typename T>
void summarise_group(const T* query, const T* keys, const T* values, const bool* mask, const Operands& o,
                     const Shape& s, int b, int g, int r, int c, Scratch& scratch, ChunkSummary* summaries,
                     int64_t stride, float* accs, bool ask_next) {
    const int group = s.group();
    if (!kVector || group == 1 || o.ms.head != 0) {
        for (int i = 0; i < group; ++i) {
            summarise<T>(query, keys, values, mask, o, s, b, g * group + i, r, c, scratch, &summaries[i * stride],
                         &accs[i * stride * s.dim]);
        }
        return;
    }
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    const int begin = c * kChunk, end = std::min(s.kv, begin + kChunk);
    const bool* row_mask = mask + b * o.ms.batch + r * o.ms.position + begin * o.ms.element;
    const int n = seen_keys(row_mask, end - begin, o.ms.element, scratch.seen.data());
    for (int i = 0; i < group; ++i) summaries[i * stride] = ChunkSummary{n, 0.f, 0.f};
    if (n == 0) return;
    const T* k = keys + b * o.ks.batch + g * o.ks.head + begin * o.ks.position;
    const T* v = values + b * o.vs.batch + g * o.vs.head + begin * o.vs.position;
    request_rows(k, o.ks.position, scratch.seen.data(), n, s.dim);
    request_rows(v, o.vs.position, scratch.seen.data(), n, s.dim);
    if (ask_next && end < s.kv) {
        request_next_chunk(k + kChunk * o.ks.position, o.ks.position, std::min(kChunk, s.kv - end), s.dim);
        request_next_chunk(v + kChunk * o.vs.position, o.vs.position, std::min(kChunk, s.kv - end), s.dim);
    }
    for (int first = 0; first < group; first += 4) {
        const int heads = std::min(4, group - first);
        const float* q[4];
        float* weights[4];
        float* acc[4];
        for (int i = 0; i < heads; ++i) {
            float* qi = &scratch.q[static_cast<int64_t>(first + i) * s.dim];
            scaled_query(query, o, s, b, g * group + first + i, r, qi);
            q[i] = qi;
            weights[i] = &scratch.weights[static_cast<int64_t>(first + i) * kChunk];
            acc[i] = &accs[(first + i) * stride * s.dim];
        }
        const int* seen = scratch.seen.data();
        switch (heads) {
            case 1: scores_of_heads<1>(q, k, o.ks.position, seen, n, s.dim, weights); break;
            case 2: scores_of_heads<2>(q, k, o.ks.position, seen, n, s.dim, weights); break;
            case 3: scores_of_heads<3>(q, k, o.ks.position, seen, n, s.dim, weights); break;
            default: scores_of_heads<4>(q, k, o.ks.position, seen, n, s.dim, weights); break;
        }
        for (int i = 0; i < heads; ++i) {
            ChunkSummary& summary = summaries[(first + i) * stride];
            summary.total = softmax_numerators(weights[i], n, &summary.top);
        }
        const float* const* w = weights;
        switch (heads) {
            case 1: weighted_sums_of_heads<1>(w, v, o.vs.position, seen, n, s.dim, acc); break;
            case 2: weighted_sums_of_heads<2>(w, v, o.vs.position, seen, n, s.dim, acc); break;
            case 3: weighted_sums_of_heads<3>(w, v, o.vs.position, seen, n, s.dim, acc); break;
            default: weighted_sums_of_heads<4>(w, v, o.vs.position, seen, n, s.dim, acc); break;
        }
    }
#endif
}

// The index of (batch, head, row) among the call's [batch, heads, rows] rows (the order of
// attention_by_chunk's summaries).
inline int64_t row_index(const Shape& s, int b, int h, int r) {
    return (static_cast<int64_t>(b) * s.heads + h) * s.rows + r;
}

// Where (batch, head, row)'s output starts: the output is laid out [batch, rows, heads, dim], the
// layout the attention's output projection reads, so a graph's transpose back to it is a view
// and not a copy.
inline int64_t out_offset(const Shape& s, int b, int h, int r) {
    return ((static_cast<int64_t>(b) * s.rows + r) * s.heads + h) * s.dim;
}

// Buffers a call's threads share: the chunk summaries and weighted sums of attention_by_chunk,
// sized before the parallel region in the calling thread's own.
struct Team {
    bool chunked;   // attention_by_chunk, else attention_by_row
    ChunkSummary* summaries;
    float* accs;
};

// The schedule for `threads` and, for attention_by_chunk, its shared buffers.
Team team_buffers(const Shape& s, int threads) {
    thread_local ChunkResults results;
    if (static_cast<int64_t>(s.batch) * s.kv_heads * s.rows >= 4 * static_cast<int64_t>(threads)) {
        return Team{false, nullptr, nullptr};
    }
    const int64_t heads_rows = static_cast<int64_t>(s.batch) * s.heads * s.rows;
    return Team{true, fitted(results.summaries, heads_rows * s.chunks),
                fitted(results.accs, heads_rows * s.chunks * s.dim)};
}

// Few (batch, kv head, row) triples: the threads share their chunks, then, after a barrier, each
// combines its share of the (head, row)s. Tasks run triple by triple, chunk by chunk, and each
// thread takes one contiguous run of them: its reads of a kv head's keys and values are one
// stream the memory can run ahead on, where tasks dealt round robin (chunk-major) had each thread
// hop between kv heads. Which thread runs a chunk or combines a row changes no bit (see
// ChunkSummary). Called by every thread of a parallel region.
template <typename T>
void attention_by_chunk(const T* query, const T* keys, const T* values, const bool* mask, const Operands& o,
                        const Shape& s, T* out, const Team& team, int thread, int threads) {
    const int64_t triples = static_cast<int64_t>(s.batch) * s.kv_heads * s.rows, heads_rows = triples * s.group();
    const int64_t tasks = triples * s.chunks;
    Scratch& scratch = thread_scratch(s.dim, s.group());
    for (int64_t task = tasks * thread / threads; task < tasks * (thread + 1) / threads; ++task) {
        const int c = static_cast<int>(task % s.chunks);
        const int64_t t = task / s.chunks;
        const int r = static_cast<int>(t % s.rows), g = static_cast<int>((t / s.rows) % s.kv_heads),
                  b = static_cast<int>(t / (static_cast<int64_t>(s.rows) * s.kv_heads));
        const int64_t at = row_index(s, b, g * s.group(), r) * s.chunks + c;
        summarise_group<T>(query, keys, values, mask, o, s, b, g, r, c, scratch, &team.summaries[at],
                           static_cast<int64_t>(s.rows) * s.chunks, &team.accs[at * s.dim], true);
    }
#pragma omp barrier
    for (int64_t i = heads_rows * thread / threads; i < heads_rows * (thread + 1) / threads; ++i) {
        const int r = static_cast<int>(i % s.rows), h = static_cast<int>((i / s.rows) % s.heads),
                  b = static_cast<int>(i / (static_cast<int64_t>(s.rows) * s.heads));
        combine<T>(&team.summaries[i * s.chunks], &team.accs[i * s.chunks * s.dim], s.chunks, s.dim, scratch.sum,
                   out + out_offset(s, b, h, r));
    }
}

// Many (batch, kv head, row) triples: each thread takes whole triples, chunk by chunk, each chunk
// for the kv head's query heads in turn while its keys and values are in the L1 cache. Called by
// every thread of a parallel region.
template <typename T>
void attention_by_row(const T* query, const T* keys, const T* values, const bool* mask, const Operands& o,
                      const Shape& s, T* out, int thread, int threads) {
    const int64_t triples = static_cast<int64_t>(s.batch) * s.kv_heads * s.rows;
    Scratch& scratch = thread_scratch(s.dim, s.group());
    thread_local ChunkResults results;
    ChunkSummary* summaries = fitted(results.summaries, static_cast<int64_t>(s.group()) * s.chunks);
    float* accs = fitted(results.accs, static_cast<int64_t>(s.group()) * s.chunks * s.dim);
    for (int64_t t = triples * thread / threads; t < triples * (thread + 1) / threads; ++t) {
        const int r = static_cast<int>(t % s.rows), g = static_cast<int>((t / s.rows) % s.kv_heads),
                  b = static_cast<int>(t / (static_cast<int64_t>(s.rows) * s.kv_heads));
        for (int c = 0; c < s.chunks; ++c) {
            summarise_group<T>(query, keys, values, mask, o, s, b, g, r, c, scratch, &summaries[c], s.chunks,
                               &accs[static_cast<int64_t>(c) * s.dim], false);
        }
        for (int i = 0; i < s.group(); ++i) {
            combine<T>(&summaries[static_cast<int64_t>(i) * s.chunks], &accs[static_cast<int64_t>(i) * s.chunks * s.dim],
                       s.chunks, s.dim, scratch.sum, out + out_offset(s, b, g * s.group() + i, r));
        }
    }
}

// The attention by every thread of a parallel region, `team` from team_buffers.
template <typename T>
void attention_in_team(const T* query, const T* keys, const T* values, const bool* mask, const Operands& o,
                       const Shape& s, T* out, const Team& team, int thread, int threads) {
    if (team.chunked) {
        attention_by_chunk<T>(query, keys, values, mask, o, s, out, team, thread, threads);
    } else {
        attention_by_row<T>(query, keys, values, mask, o, s, out, thread, threads);
    }
}

template <typename T>
void attention(const T* query, const T* keys, const T* values, const bool* mask, const Operands& o, const Shape& s,
               T* out) {
    const Team team = team_buffers(s, omp_get_max_threads());
#pragma omp parallel
    attention_in_team<T>(query, keys, values, mask, o, s, out, team, omp_get_thread_num(), omp_get_num_threads());
}

Strides strides_of(const int64_t* s) { return Strides{s[0], s[1], s[2], s[3]}; }

Operands operands_of(const specc_cpu::RowAttention& a) {
    return Operands{strides_of(a.query_strides), strides_of(a.key_strides), strides_of(a.value_strides),
                    strides_of(a.mask_strides)};
}

Shape shape_of(const specc_cpu::RowAttention& a) {
    return Shape{a.batch, a.heads, a.kv_heads, a.rows, a.kv, a.dim, (a.kv + kChunk - 1) / kChunk, a.scale};
}

}  // namespace

specc_cpu::RowAttentionTeam specc_cpu::row_attention_team(const RowAttention& a, int threads) {
    const Team team = team_buffers(shape_of(a), threads);
    return RowAttentionTeam{team.chunked, team.summaries, team.accs};
}

void specc_cpu::row_attention_in_team(const RowAttention& a, const RowAttentionTeam& team, uint16_t* out, int thread,
                                      int threads) {
    const Team shared{team.chunked, static_cast<ChunkSummary*>(team.summaries), team.accs};
    attention_in_team<uint16_t>(a.query, a.keys, a.values, a.mask, operands_of(a), shape_of(a), out, shared, thread,
                                threads);
}

extern "C" {

// out [batch, heads, rows, dim], laid out [batch, rows, heads, dim] (see out_offset) = attention of query [batch, heads, rows, dim] over
// keys and values [batch, kv_heads, kv, dim] under a boolean mask [batch, heads, rows, kv]; each
// tensor's four strides in elements (0 on a broadcast axis; the last axis of query, keys and
// values contiguous). dtype 0: float32, 1: bfloat16. Returns 0, or 1 on arguments it refuses.
int specc_row_attention(const void* query, const int64_t* query_strides, const void* keys,
                        const int64_t* key_strides, const void* values, const int64_t* value_strides,
                        const bool* mask, const int64_t* mask_strides, int batch, int heads, int kv_heads,
                        int rows, int kv, int dim, float scale, int dtype, void* out) {
    if (batch < 0 || rows < 0 || kv < 0 || dim <= 0 || kv_heads <= 0 || heads % kv_heads != 0) return 1;
    const specc_cpu::TracedCall traced(specc_cpu::Traced::attention);
    const Operands o{strides_of(query_strides), strides_of(key_strides), strides_of(value_strides),
                     strides_of(mask_strides)};
    const Shape s{batch, heads, kv_heads, rows, kv, dim, (kv + kChunk - 1) / kChunk, scale};
    if (dtype == 0) {
        attention<float>(static_cast<const float*>(query), static_cast<const float*>(keys),
                         static_cast<const float*>(values), mask, o, s, static_cast<float*>(out));
    } else if (dtype == 1) {
        attention<uint16_t>(static_cast<const uint16_t*>(query), static_cast<const uint16_t*>(keys),
                            static_cast<const uint16_t*>(values), mask, o, s, static_cast<uint16_t*>(out));
    } else {
        return 1;
    }
    return 0;
}

}
