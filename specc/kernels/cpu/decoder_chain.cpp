// A decoder layer's chain from its attention's output to the next layer's projection, in one
// parallel region: the output projection, the residual add, the post-attention RMSNorm, the
// gate and up projections, SiLU(gate) x up, the down projection, the residual add, the next
// layer's RMSNorm and its (q/k/v) projection. A q4 decode step of a small model spent more
// between these calls than in the elementwise work itself (a parallel region per matmul, each
// handing its rows to a one-thread kernel and back); here every thread runs the small steps
// itself, on all rows alike, and the threads meet at three barriers a layer. The layer's
// weights are one buffer laid out for a number of threads (decoder_chain.h): each thread's
// shares of the four projections follow one another, so the memory streams on into the next
// phase's weights while the threads meet. Optionally the
// region starts with the layer's row attention (row_attention.h) and ends with the next
// attention's operands: q/k/v plus their bias if any, q and k rotated, k and v written into the
// caches (CacheWrite).
//
// The arithmetic is the eager bfloat16 graph's, each step rounded to bfloat16 where PyTorch's
// would be: a + b, then the norm x * rsqrt(mean(x^2) + eps) in fp32 rounded, times its weight
// rounded; silu(gate) rounded, times up rounded; x * cos and rotate_half(x) * sin rounded, their
// sum rounded. Sums of squares run over 16 lanes in a fixed order, SiLU's exp is a fixed
// polynomial (exp.h), and the matmuls are blocked_matmul.cpp's tiles: a row's bits depend on
// that row alone, never on the call's other rows or its threads (so verifying several rows
// computes what one-row decode steps do). The portable path (`scalar`) may differ from the
// vector path in SiLU's last bit: the compiler contracts the scalar polynomial its own way.

#include "bf16.h"
#include "blocked_matmul.h"
#include "call_trace.h"
#include "decoder_chain.h"
#include "exp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <immintrin.h>
#include <omp.h>
#include <vector>

namespace {

using specc_cpu::bf16_to_float;
using specc_cpu::float_to_bf16;
using specc_cpu::CacheWrite;
using specc_cpu::Chain;
using specc_cpu::Projection;
using specc_cpu::QuantizedRows;

constexpr int kTile = 16, kLanes = 16;

inline uint16_t round_bf16(float v) { return float_to_bf16(v); }
inline float rounded(float v) { return bf16_to_float(float_to_bf16(v)); }

// The 16 lanes' partial sums of squares added pairwise, halves first: the one order both paths use.
float lane_sum(float (&lanes)[kLanes]) {
    for (int width = kLanes / 2; width > 0; width /= 2) {
        for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
    }
    return lanes[0];
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// add_norm's row on 16 lanes: the same roundings, the squares summed lane by lane in the same order.
void add_norm_row16(const uint16_t* a, const uint16_t* b, const uint16_t* weight, int hidden, float eps, float* h,
                    uint16_t* sum, uint16_t* out) {
    __m512 squares = _mm512_setzero_ps();
    for (int i = 0; i < hidden; i += kLanes) {
        const __m512 v = specc_cpu::rounded16(_mm512_add_ps(specc_cpu::bf16x16_to_float(a + i),
                                                             specc_cpu::bf16x16_to_float(b + i)));
        _mm512_storeu_ps(h + i, v);
        squares = _mm512_fmadd_ps(v, v, squares);
    }
    alignas(64) float lanes[kLanes];
    _mm512_store_ps(lanes, squares);
    const __m512 inverse = _mm512_set1_ps(1.f / std::sqrt(lane_sum(lanes) / static_cast<float>(hidden) + eps));
    for (int i = 0; i < hidden; i += kLanes) {
        const __m512 v = _mm512_loadu_ps(h + i);
        const __m512 scaled = specc_cpu::rounded16(_mm512_mul_ps(v, inverse));
        specc_cpu::store_bf16x16(out + i, _mm512_mul_ps(specc_cpu::bf16x16_to_float(weight + i), scaled));
        if (sum) specc_cpu::store_bf16x16(sum + i, v);
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
// add_norm's row on 8 lanes for CPUs without AVX-512: two registers stand for the 16 lanes, so the
// squares are summed in the same lanes and order as above.
void add_norm_row16(const uint16_t* a, const uint16_t* b, const uint16_t* weight, int hidden, float eps, float* h,
                    uint16_t* sum, uint16_t* out) {
    __m256 squares[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int i = 0; i < hidden; i += kLanes) {
        for (int q = 0; q < 2; ++q) {
            const int at = i + 8 * q;
            const __m256 v = specc_cpu::rounded8(_mm256_add_ps(specc_cpu::bf16x8_to_float(a + at),
                                                               specc_cpu::bf16x8_to_float(b + at)));
            _mm256_storeu_ps(h + at, v);
            squares[q] = _mm256_fmadd_ps(v, v, squares[q]);
        }
    }
    alignas(32) float lanes[kLanes];
    _mm256_store_ps(lanes, squares[0]);
    _mm256_store_ps(lanes + 8, squares[1]);
    const __m256 inverse = _mm256_set1_ps(1.f / std::sqrt(lane_sum(lanes) / static_cast<float>(hidden) + eps));
    for (int i = 0; i < hidden; i += 8) {
        const __m256 v = _mm256_loadu_ps(h + i);
        const __m256 scaled = specc_cpu::rounded8(_mm256_mul_ps(v, inverse));
        specc_cpu::store_bf16x8(out + i, _mm256_mul_ps(specc_cpu::bf16x8_to_float(weight + i), scaled));
        if (sum) specc_cpu::store_bf16x8(sum + i, v);
    }
}
#endif

// sum = a + b rounded; normed = weight * rounded(sum * rsqrt(mean(sum^2) + eps)), rounded: RMSNorm
// as Llama's eager code computes it in bfloat16, for every row. `sum` may be null. Squares are
// summed over 16 lanes in a fixed order, each a fused multiply-add, in both paths.
void add_norm(const uint16_t* a, const uint16_t* b, const uint16_t* weight, int rows, int hidden, float eps,
              uint16_t* sum, uint16_t* normed, std::vector<float>& scratch, bool scalar) {
    scratch.resize(hidden);
    float* h = scratch.data();
    for (int r = 0; r < rows; ++r) {
        const uint16_t* ar = a + static_cast<int64_t>(r) * hidden;
        const uint16_t* br = b + static_cast<int64_t>(r) * hidden;
        uint16_t* out = normed + static_cast<int64_t>(r) * hidden;
        uint16_t* s = sum ? sum + static_cast<int64_t>(r) * hidden : nullptr;
#if (defined(__AVX512F__) && defined(__AVX512BW__)) || (defined(__AVX2__) && defined(__FMA__))
        if (!scalar) {
            add_norm_row16(ar, br, weight, hidden, eps, h, s, out);
            continue;
        }
#endif
        float lanes[kLanes] = {};
        for (int i0 = 0; i0 < hidden; i0 += kLanes) {
            for (int l = 0; l < kLanes; ++l) {
                const float v = rounded(bf16_to_float(ar[i0 + l]) + bf16_to_float(br[i0 + l]));
                h[i0 + l] = v;
                lanes[l] = std::fma(v, v, lanes[l]);
            }
        }
        const float inverse = 1.f / std::sqrt(lane_sum(lanes) / static_cast<float>(hidden) + eps);
        for (int i = 0; i < hidden; ++i) out[i] = round_bf16(bf16_to_float(weight[i]) * rounded(h[i] * inverse));
        if (s) {
            for (int i = 0; i < hidden; ++i) s[i] = round_bf16(h[i]);
        }
    }
}

// silu(x) = x / (1 + exp(-x)) through exp of -|x| only: e = exp(-|x|), x / (1 + e) for x >= 0,
// x e / (1 + e) below.
inline float silu(float x) {
    const float e = specc_cpu::exp_nonpositive(-std::fabs(x));
    return x >= 0.f ? x / (1.f + e) : x * e / (1.f + e);
}

// act[r, f] = rounded(rounded(silu(gate)) * up) for features [first, last) of every row; gate_up
// holds [gate | up] per row.
void gated(const uint16_t* gate_up, int rows, int intermediate, int first, int last, uint16_t* act, bool scalar) {
    for (int r = 0; r < rows; ++r) {
        const uint16_t* gate = gate_up + static_cast<int64_t>(r) * 2 * intermediate;
        const uint16_t* up = gate + intermediate;
        uint16_t* out = act + static_cast<int64_t>(r) * intermediate;
        int f = first;
#if defined(__AVX512F__) && defined(__AVX512BW__)
        if (!scalar) {
            const __m512 magnitude = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
            const __m512 one = _mm512_set1_ps(1.f);
            for (; f + kLanes <= last; f += kLanes) {
                const __m512 x = specc_cpu::bf16x16_to_float(gate + f), u = specc_cpu::bf16x16_to_float(up + f);
                const __m512 e = specc_cpu::exp_nonpositive16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_and_ps(x, magnitude)));
                const __m512 numerator = _mm512_mask_mul_ps(x, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), x, e);
                const __m512 s = _mm512_div_ps(numerator, _mm512_add_ps(one, e));
                specc_cpu::store_bf16x16(out + f, _mm512_mul_ps(specc_cpu::rounded16(s), u));
            }
        }
#elif defined(__AVX2__) && defined(__FMA__)
        if (!scalar) {
            const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
            const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
            for (; f + 8 <= last; f += 8) {
                const __m256 x = specc_cpu::bf16x8_to_float(gate + f), u = specc_cpu::bf16x8_to_float(up + f);
                const __m256 e = specc_cpu::exp_nonpositive8(_mm256_sub_ps(zero, _mm256_and_ps(x, magnitude)));
                const __m256 numerator = _mm256_blendv_ps(x, _mm256_mul_ps(x, e), _mm256_cmp_ps(x, zero, _CMP_LT_OQ));
                const __m256 s = _mm256_div_ps(numerator, _mm256_add_ps(one, e));
                specc_cpu::store_bf16x8(out + f, _mm256_mul_ps(specc_cpu::rounded8(s), u));
            }
        }
#endif
        for (; f < last; ++f) out[f] = round_bf16(rounded(silu(bf16_to_float(gate[f]))) * bf16_to_float(up[f]));
    }
}

// The projections in the order a thread reads its shares of them, gate and up apart.
enum Phase { kO, kGate, kUp, kDown, kNext, kPhases };

struct PhaseShape {
    int inputs, bits, tiles;
    int64_t tile_bytes;
};

// Where each packing thread's share of each phase lies in the chain's weights (decoder_chain.h).
struct Layout {
    PhaseShape phases[kPhases];
    std::vector<int64_t> offsets;   // [packed_threads][kPhases]
    int64_t bytes = 0;
};

Layout layout_of(const Chain& c) {
    const int intermediate = c.gate_up.features / 2;
    Layout l;
    const int shapes[kPhases][3] = {{c.hidden, c.o.bits, c.o.features}, {c.hidden, c.gate_up.bits, intermediate},
                                    {c.hidden, c.gate_up.bits, intermediate}, {intermediate, c.down.bits, c.down.features},
                                    {c.hidden, c.next.bits, c.next.features}};
    for (int p = 0; p < kPhases; ++p) {
        l.phases[p] = {shapes[p][0], shapes[p][1], shapes[p][2] / kTile, specc_cpu::tile_bytes(shapes[p][0], shapes[p][1])};
    }
    l.offsets.resize(static_cast<size_t>(std::max(c.packed_threads, 0)) * kPhases);
    for (int t = 0; t < c.packed_threads; ++t) {
        for (int p = 0; p < kPhases; ++p) {
            int first, last;
            specc_cpu::tile_share(l.phases[p].tiles, c.packed_threads, t, &first, &last);
            l.offsets[static_cast<size_t>(t) * kPhases + p] = l.bytes;
            l.bytes += (last - first) * l.phases[p].tile_bytes;
        }
    }
    return l;
}

// Tiles [first, last) of phase p into y (the phase's first output column), found in the packing
// threads' shares they fall in.
void project(const Chain& c, const Layout& l, int p, const QuantizedRows& a, int rows, int first, int last, uint16_t* y,
             int64_t stride) {
    const PhaseShape& phase = l.phases[p];
    for (int t = 0; t < c.packed_threads; ++t) {
        int packed_first, packed_last;
        specc_cpu::tile_share(phase.tiles, c.packed_threads, t, &packed_first, &packed_last);
        const int from = std::max(first, packed_first), to = std::min(last, packed_last);
        if (from >= to) continue;
        const uint8_t* tiles = c.weights + l.offsets[static_cast<size_t>(t) * kPhases + p]
                               + (from - packed_first) * phase.tile_bytes;
        specc_cpu::blocked_tiles(a, rows, phase.inputs, tiles, phase.bits, to - from, y + from * kTile, stride,
                                 c.scalar);
    }
}

// x rotated: rounded(rounded(x * cos) + rounded(rotate_half(x) * sin)), rotate_half(x) = (-x2, x1).
void rotate(const uint16_t* x, const uint16_t* cos, const uint16_t* sin, int dim, uint16_t* out) {
    const int half = dim / 2;
    for (int d = 0; d < dim; ++d) {
        const float turned = d < half ? -bf16_to_float(x[d + half]) : bf16_to_float(x[d - half]);
        out[d] = round_bf16(rounded(bf16_to_float(x[d]) * bf16_to_float(cos[d]))
                            + rounded(turned * bf16_to_float(sin[d])));
    }
}

// Heads [first, last) of the rows' q/k/v, each plus its bias (rounded) where there is one: q heads
// rotated into the query, k heads rotated into the key cache, v heads copied into the value cache,
// each at its row's position.
void write_heads(const uint16_t* qkv, int rows, const CacheWrite& w, int first, int last) {
    const int dim = w.head_dim, features = (w.heads + 2 * w.kv_heads) * dim;
    thread_local std::vector<uint16_t> biased;   // a head plus its bias; kept, as the region's other scratch
    biased.resize(w.bias ? dim : 0);
    for (int head = first; head < last; ++head) {
        for (int r = 0; r < rows; ++r) {
            const uint16_t* x = qkv + static_cast<int64_t>(r) * features + static_cast<int64_t>(head) * dim;
            if (w.bias) {
                const uint16_t* b = w.bias + static_cast<int64_t>(head) * dim;
                for (int d = 0; d < dim; ++d) biased[d] = round_bf16(bf16_to_float(x[d]) + bf16_to_float(b[d]));
                x = biased.data();
            }
            const uint16_t* cos = w.cos + static_cast<int64_t>(r) * dim;
            const uint16_t* sin = w.sin + static_cast<int64_t>(r) * dim;
            const int64_t position = w.positions[r];
            if (head < w.heads) {
                rotate(x, cos, sin, dim, w.query + (static_cast<int64_t>(r) * w.heads + head) * dim);
            } else if (head < w.heads + w.kv_heads) {
                const int h = head - w.heads;
                rotate(x, cos, sin, dim, w.k_cache + h * w.k_strides[0] + position * w.k_strides[1]);
            } else {
                const int h = head - w.heads - w.kv_heads;
                std::copy(x, x + dim, w.v_cache + h * w.v_strides[0] + position * w.v_strides[1]);
            }
        }
    }
}

struct Shared {
    std::vector<uint16_t> attention, o, gate_up, act, down, next;

    // Sized for `c`'s rows and shapes (the calling thread's, before its region).
    void size_for(const Chain& c, bool cache, bool attention_first) {
        const size_t rows = c.rows, hidden = c.hidden, intermediate = c.gate_up.features / 2;
        o.resize(rows * hidden);
        gate_up.resize(rows * 2 * intermediate);
        act.resize(rows * intermediate);
        down.resize(rows * hidden);
        if (cache) next.resize(rows * c.next.features);
        if (attention_first) attention.resize(rows * hidden);
    }
};

struct Private {
    QuantizedRows a;
    std::vector<uint16_t> sum, normed;
    std::vector<float> scratch;
};

// One layer's chain by thread `thread` of the region's `threads`, from its attention (when given)
// to the next projection (and its cache writes); the threads meet at the chain's barriers.
void layer_in_region(const Chain& c, const Layout& layout, const CacheWrite* cache,
                     const specc_cpu::RowAttention* attention, const specc_cpu::RowAttentionTeam& team, Shared& s,
                     Private& mine, uint16_t* residual_out, uint16_t* next_out, int thread, int threads) {
    const int rows = c.rows, hidden = c.hidden, intermediate = c.gate_up.features / 2;
    uint16_t* projected = cache ? s.next.data() : next_out;
    const uint16_t* attended = attention ? s.attention.data() : c.attention;
    int first, last;
    mine.sum.resize(static_cast<size_t>(rows) * hidden);
    mine.normed.resize(static_cast<size_t>(rows) * hidden);

    if (attention) {
        specc_cpu::row_attention_in_team(*attention, team, s.attention.data(), thread, threads);
#pragma omp barrier
    }
    specc_cpu::quantize_rows(attended, rows, hidden, mine.a, c.scalar);
    specc_cpu::tile_share(hidden / kTile, threads, thread, &first, &last);
    project(c, layout, kO, mine.a, rows, first, last, s.o.data(), hidden);
#pragma omp barrier
    add_norm(c.residual, s.o.data(), c.post_norm, rows, hidden, c.eps, mine.sum.data(), mine.normed.data(),
             mine.scratch, c.scalar);
    specc_cpu::quantize_rows(mine.normed.data(), rows, hidden, mine.a, c.scalar);
    // Each thread takes the same features of gate and of up, so it can multiply them itself.
    specc_cpu::tile_share(intermediate / kTile, threads, thread, &first, &last);
    project(c, layout, kGate, mine.a, rows, first, last, s.gate_up.data(), 2 * intermediate);
    project(c, layout, kUp, mine.a, rows, first, last, s.gate_up.data() + intermediate, 2 * intermediate);
    gated(s.gate_up.data(), rows, intermediate, first * kTile, last * kTile, s.act.data(), c.scalar);
#pragma omp barrier
    specc_cpu::quantize_rows(s.act.data(), rows, intermediate, mine.a, c.scalar);
    specc_cpu::tile_share(hidden / kTile, threads, thread, &first, &last);
    project(c, layout, kDown, mine.a, rows, first, last, s.down.data(), hidden);
#pragma omp barrier
    add_norm(mine.sum.data(), s.down.data(), c.next_norm, rows, hidden, c.eps, thread == 0 ? residual_out : nullptr,
             mine.normed.data(), mine.scratch, c.scalar);
    specc_cpu::quantize_rows(mine.normed.data(), rows, hidden, mine.a, c.scalar);
    specc_cpu::tile_share(c.next.features / kTile, threads, thread, &first, &last);
    project(c, layout, kNext, mine.a, rows, first, last, projected, c.next.features);
    if (cache) {
#pragma omp barrier
        specc_cpu::tile_share(cache->heads + 2 * cache->kv_heads, threads, thread, &first, &last);
        write_heads(projected, rows, *cache, first, last);
    }
}

void run(const Chain& c, const CacheWrite* cache, const specc_cpu::RowAttention* attention, uint16_t* residual_out,
         uint16_t* next_out) {
    thread_local Shared shared;
    Shared& s = shared;   // the calling thread's, which every thread of the region uses
    s.size_for(c, cache != nullptr, attention != nullptr);
    const specc_cpu::RowAttentionTeam team =
        attention ? specc_cpu::row_attention_team(*attention, omp_get_max_threads()) : specc_cpu::RowAttentionTeam{};
    const Layout layout = layout_of(c);
#pragma omp parallel
    {
        thread_local Private mine;
        layer_in_region(c, layout, cache, attention, team, s, mine, residual_out, next_out, omp_get_thread_num(),
                        omp_get_num_threads());
    }
}

// Layers of one shape in turn, in one region: layer i's attention reads what layer i - 1 wrote
// (its query, its residual, the caches), so the threads meet once more between layers.
void run_stack(const specc_cpu::StackLayer* layers, int count) {
    thread_local Shared shared;
    Shared& s = shared;   // the calling thread's, which every thread of the region uses
    s.size_for(layers[0].chain, true, true);
    const specc_cpu::RowAttentionTeam team = specc_cpu::row_attention_team(layers[0].attention, omp_get_max_threads());
    std::vector<Layout> layouts;
    layouts.reserve(count);
    for (int i = 0; i < count; ++i) layouts.push_back(layout_of(layers[i].chain));
#pragma omp parallel
    {
        thread_local Private mine;
        const int threads = omp_get_num_threads(), thread = omp_get_thread_num();
        for (int i = 0; i < count; ++i) {
            if (i > 0) {
#pragma omp barrier
            }
            const specc_cpu::StackLayer& l = layers[i];
            layer_in_region(l.chain, layouts[i], &l.cache, &l.attention, team, s, mine, l.residual_out, nullptr,
                            thread, threads);
        }
    }
}

bool writable(const CacheWrite& w, int rows, int features) {
    if (w.heads <= 0 || w.kv_heads <= 0 || w.head_dim <= 0 || w.head_dim % 2
        || (w.heads + 2 * w.kv_heads) * w.head_dim != features) {
        return false;
    }
    for (int r = 0; r < rows; ++r) {
        if (w.positions[r] < 0 || w.positions[r] >= w.capacity) return false;
    }
    return true;
}

bool fits(const Projection& p, int inputs) {
    return (p.bits == 4 || p.bits == 6 || p.bits == 8) && p.features > 0 && p.features % kTile == 0
           && inputs > 0 && inputs % 32 == 0;
}

bool fits(const Chain& c) {
    const int intermediate = c.gate_up.features / 2;
    return c.rows >= 0 && c.packed_threads > 0 && fits(c.o, c.hidden) && c.o.features == c.hidden
           && fits(c.gate_up, c.hidden) && intermediate % kTile == 0 && fits(c.down, intermediate)
           && c.down.features == c.hidden && fits(c.next, c.hidden);
}


// Whether the kernel takes a chain with this cache write and attention (either may be absent).
bool takes(const Chain& c, const CacheWrite* cache, const specc_cpu::RowAttention* attention) {
    return fits(c) && (!cache || writable(*cache, c.rows, c.next.features))
           && (!attention || (attention->batch == 1 && attention->rows == c.rows
                              && attention->heads * attention->dim == c.hidden));
}

}  // namespace

int specc_cpu::decoder_chain(const Chain& c, const CacheWrite* cache, const RowAttention* attention,
                             uint16_t* residual_out, uint16_t* next_out) {
    if (!takes(c, cache, attention)) return 1;
    const specc_cpu::TracedCall traced(specc_cpu::Traced::chain);
    run(c, cache, attention, residual_out, next_out);
    return 0;
}

int specc_cpu::decoder_stack(const StackLayer* layers, int count) {
    if (count < 1) return 1;
    const Chain& first = layers[0].chain;
    for (int i = 0; i < count; ++i) {
        const StackLayer& l = layers[i];
        const Chain& c = l.chain;
        if (!takes(c, &l.cache, &l.attention) || c.rows != first.rows || c.hidden != first.hidden || c.gate_up.features != first.gate_up.features
            || c.next.features != first.next.features || l.attention.heads != layers[0].attention.heads
            || l.attention.kv_heads != layers[0].attention.kv_heads || l.attention.kv != layers[0].attention.kv
            || l.attention.dim != layers[0].attention.dim) {
            return 1;
        }
    }
    const specc_cpu::TracedCall traced(specc_cpu::Traced::chain);
    run_stack(layers, count);
    return 0;
}

int64_t specc_cpu::layer_pack_bytes(const Chain& c) {
    Chain one = c;
    one.packed_threads = 1;
    return fits(one) ? layout_of(one).bytes : 0;
}

extern "C" {

// decoder_chain without a cache write, for ctypes: residual_out [rows, hidden] and next_out
// [rows, next_features] (bfloat16) for `attention` and `residual` [rows, hidden] and the layer's
// `weights` packed for `packed_threads` threads (decoder_chain.h). Returns 0, or 1 on shapes it
// refuses.
int specc_decoder_chain(const uint16_t* attention, const uint16_t* residual, int rows, int hidden,
                        const uint8_t* weights, int packed_threads, int o_bits, const uint16_t* post_norm,
                        int gate_up_bits, int intermediate, int down_bits, const uint16_t* next_norm, int next_bits,
                        int next_features, float eps, uint16_t* residual_out, uint16_t* next_out, int scalar) {
    const Chain c{attention, residual, weights, packed_threads, {o_bits, hidden}, {gate_up_bits, 2 * intermediate},
                  {down_bits, hidden}, {next_bits, next_features}, post_norm, next_norm, rows, hidden, eps, scalar != 0};
    return specc_cpu::decoder_chain(c, nullptr, nullptr, residual_out, next_out);
}

}
