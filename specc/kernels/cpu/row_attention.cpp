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
// lanes in a fixed order; exp is a fixed polynomial; a row that may see no key is zeros.

#include "bf16.h"
#include "call_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>
#include <immintrin.h>

namespace {

constexpr int kLanes = 16;

using specc_cpu::float_to_bf16;
using specc_cpu::load;

// exp(x) for x <= 0 (scores minus their maximum): 2^n * p(r), r = x - n ln 2, |r| <= ln 2 / 2;
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

#if defined(__AVX512F__)
constexpr bool kVector = true;

inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const uint16_t* p, __mmask16 m) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
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

// weights[i] = exp(weights[i] - max) in place; returns their sum (lane l sums i = l mod 16).
inline float softmax_numerators(float* weights, int n) {
    __m512 highest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int i = 0; i < n; i += kLanes) {
        highest = _mm512_max_ps(highest, _mm512_mask_loadu_ps(highest, lanes_below(n - i), weights + i));
    }
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(highest));
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

inline float softmax_numerators(float* weights, int n) {
    float highest = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n; ++i) highest = std::max(highest, weights[i]);
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

template <typename T>
void one_row(const T* query, const T* keys, const T* values, const bool* mask, int kv, int dim,
             float scale, const Strides& key_strides, const Strides& value_strides, int64_t mask_key_stride,
             T* out, std::vector<float>& q, std::vector<int>& seen, std::vector<float>& weights,
             std::vector<float>& acc) {
    const int n = seen_keys(mask, kv, mask_key_stride, seen.data());
    if (n == 0) {
        for (int d = 0; d < dim; ++d) out[d] = store<T>(0.f);
        return;
    }
    for (int d = 0; d < dim; ++d) q[d] = load<T>(query + d) * scale;
    scores(q.data(), keys, key_strides.position, seen.data(), n, dim, weights.data());
    const float total = softmax_numerators(weights.data(), n);
    weighted_sum(weights.data(), values, value_strides.position, seen.data(), n, dim, acc.data());
    for (int d = 0; d < dim; ++d) out[d] = store<T>(acc[d] / total);
}

template <typename T>
void attention(const T* query, const Strides& qs, const T* keys, const Strides& ks, const T* values,
               const Strides& vs, const bool* mask, const Strides& ms, int batch, int heads, int kv_heads,
               int rows, int kv, int dim, float scale, T* out) {
    const int group = heads / kv_heads;
    const int64_t tasks = static_cast<int64_t>(batch) * heads * rows;
#pragma omp parallel
    {
        std::vector<float> q(dim), weights(kv), acc(dim);
        std::vector<int> seen(kv);
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; ++task) {
            const int r = static_cast<int>(task % rows);
            const int h = static_cast<int>((task / rows) % heads);
            const int b = static_cast<int>(task / (static_cast<int64_t>(rows) * heads));
            const int g = h / group;
            one_row<T>(query + b * qs.batch + h * qs.head + r * qs.position,
                       keys + b * ks.batch + g * ks.head, values + b * vs.batch + g * vs.head,
                       mask + b * ms.batch + h * ms.head + r * ms.position, kv, dim, scale, ks, vs, ms.element,
                       out + ((static_cast<int64_t>(b) * heads + h) * rows + r) * dim, q, seen, weights, acc);
        }
    }
}

Strides strides_of(const int64_t* s) { return Strides{s[0], s[1], s[2], s[3]}; }

}  // namespace

extern "C" {

// out [batch, heads, rows, dim] (contiguous) = attention of query [batch, heads, rows, dim] over
// keys and values [batch, kv_heads, kv, dim] under a boolean mask [batch, heads, rows, kv]; each
// tensor's four strides in elements (0 on a broadcast axis; the last axis of query, keys and
// values contiguous). dtype 0: float32, 1: bfloat16. Returns 0, or 1 on arguments it refuses.
int specc_row_attention(const void* query, const int64_t* query_strides, const void* keys,
                        const int64_t* key_strides, const void* values, const int64_t* value_strides,
                        const bool* mask, const int64_t* mask_strides, int batch, int heads, int kv_heads,
                        int rows, int kv, int dim, float scale, int dtype, void* out) {
    if (batch < 0 || rows < 0 || kv < 0 || dim <= 0 || kv_heads <= 0 || heads % kv_heads != 0) return 1;
    const specc_cpu::TracedCall traced(specc_cpu::Traced::attention);
    const Strides qs = strides_of(query_strides), ks = strides_of(key_strides), vs = strides_of(value_strides),
                  ms = strides_of(mask_strides);
    if (dtype == 0) {
        attention<float>(static_cast<const float*>(query), qs, static_cast<const float*>(keys), ks,
                         static_cast<const float*>(values), vs, mask, ms, batch, heads, kv_heads, rows, kv, dim,
                         scale, static_cast<float*>(out));
    } else if (dtype == 1) {
        attention<uint16_t>(static_cast<const uint16_t*>(query), qs, static_cast<const uint16_t*>(keys), ks,
                            static_cast<const uint16_t*>(values), vs, mask, ms, batch, heads, kv_heads, rows, kv,
                            dim, scale, static_cast<uint16_t*>(out));
    } else {
        return 1;
    }
    return 0;
}

}
