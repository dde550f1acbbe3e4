// A decoder layer's chain from its attention's output to the next layer's projection, in one
// parallel region (decoder_chain.cpp), for the C++ operators of torch_ops.cpp.
#pragma once

#include <cstdint>

#include "row_attention.h"

namespace specc_cpu {

struct Projection {
    int bits;       // of its tiles, packed as blocked_matmul's
    int features;
};

// The layer's four projections are one buffer, `weights`: for each of `packed_threads` threads in
// turn, its share (tile_share) of o's tiles, then of gate's, up's, down's and next's, so that in a
// region of that many threads each thread reads one run of memory a layer. A region of another
// size computes the same bits from the same tiles.
struct Chain {
    const uint16_t* attention;   // [rows, hidden]
    const uint16_t* residual;    // [rows, hidden]
    const uint8_t* weights;
    int packed_threads;
    Projection o, gate_up, down, next;
    const uint16_t* post_norm;   // [hidden]
    const uint16_t* next_norm;   // [hidden]
    int rows, hidden;
    float eps;
    bool scalar;
};

// The next projection's q/k/v ([heads | kv_heads | kv_heads] heads of head_dim) taken further:
// their bias added where there is one (Qwen2's), the rotary embedding on q and k (Llama's
// rotate-half form, in eager bfloat16 steps), k and v written into the caches at each row's
// position, q returned.
struct CacheWrite {
    const uint16_t* cos;         // [rows, head_dim]
    const uint16_t* sin;         // [rows, head_dim]
    const int64_t* positions;    // [rows]
    uint16_t* k_cache;           // [1, kv_heads, capacity, head_dim], strides below
    uint16_t* v_cache;
    int64_t k_strides[2], v_strides[2];   // of the head and the position axes
    int64_t capacity;
    int heads, kv_heads, head_dim;
    uint16_t* query;             // [rows, heads * head_dim]
    const uint16_t* bias;        // [(heads + 2 kv_heads) * head_dim], q's then k's then v's; or null
};

// residual_out [rows, hidden] and, without `cache`, next_out [rows, next features]; with it, the
// cache writes and `cache->query`. With `attention`, the chain's attention rows are that call's
// output, computed first in the same region (`chain.attention` is not read). Returns 0, or 1 on
// shapes or positions it refuses.
int decoder_chain(const Chain& chain, const CacheWrite* cache, const RowAttention* attention, uint16_t* residual_out,
                  uint16_t* next_out);

// One layer of a stack (decoder_stack): its chain with its row attention first and its cache writes
// last; `chain.residual` and `attention.query` are the previous layer's `residual_out` and
// `cache.query` (or the stack's inputs), `chain.attention` is not read.
struct StackLayer {
    Chain chain;
    CacheWrite cache;
    RowAttention attention;
    uint16_t* residual_out;      // [rows, hidden]
};

// decoder_chain with attention and cache writes for `count` layers of one shape in turn, in one
// parallel region: what `count` such calls compute, bit for bit. Returns 0, or 1 on shapes it refuses.
int decoder_stack(const StackLayer* layers, int count);

// Bytes of the chain's `weights`: its four projections' tiles (whatever `packed_threads`), or 0
// when a projection's shape or bits do not fit.
int64_t layer_pack_bytes(const Chain& chain);

}  // namespace specc_cpu
