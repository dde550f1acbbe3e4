// Row attention (row_attention.cpp) run by the threads of another kernel's parallel region, for
// the decoder layer (decoder_chain.cpp): bfloat16 query, keys and values.
#pragma once

#include <cstdint>

namespace specc_cpu {

// out [batch, heads, rows, dim], laid out [batch, rows, heads, dim], of query [batch, heads, rows,
// dim] over keys and values [batch, kv_heads, kv, dim] under a boolean mask [batch, heads, rows,
// kv]; each tensor's four strides in elements (0 on a broadcast axis, the last axis of query,
// keys and values contiguous).
struct RowAttention {
    const uint16_t* query;
    int64_t query_strides[4];
    const uint16_t* keys;
    int64_t key_strides[4];
    const uint16_t* values;
    int64_t value_strides[4];
    const bool* mask;
    int64_t mask_strides[4];
    int batch, heads, kv_heads, rows, kv, dim;
    float scale;
};

// The schedule of a call and the buffers its threads share, made by the calling thread before
// its parallel region (valid until that thread's next call).
struct RowAttentionTeam {
    bool chunked;
    void* summaries;
    float* accs;
};
RowAttentionTeam row_attention_team(const RowAttention& attention, int threads);

// The call's share of thread `thread` of `threads`, called by every thread of the region; it
// meets the others at one barrier. A row's bits are those of specc_row_attention's.
void row_attention_in_team(const RowAttention& attention, const RowAttentionTeam& team, uint16_t* out, int thread,
                           int threads);

}  // namespace specc_cpu
