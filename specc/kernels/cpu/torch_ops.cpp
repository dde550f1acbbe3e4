// The CPU kernels of this folder as the CPU implementations of torch.ops.specc.blocked_matmul,
// torch.ops.specc.row_attention, torch.ops.specc.decoder_chain(_into_cache) and torch.ops.specc.row_argmax
// (their schemas and fake implementations are defined in Python: specc/kernels/blocked_matmul.py,
// row_attention.py, decoder_chain.py, row_argmax.py). Registered in C++ so that a
// call from an AOTInductor package or from eager PyTorch reaches the kernel without Python:
// through a Python implementation each call cost 20-50 us of wrapping, more than a small
// matmul or a decode step's attention takes.
//
// blocked_matmul, row_attention and the decoder chains are also C shims (aoti_torch_cpu_<op>, AOTInductor's calling
// convention for a custom op's direct call: specc/lower/c_shims.py declares them to Inductor), so a
// package calls them as plain functions instead of through its proxy executor, which boxes every
// argument and dispatches by name on each call.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include "decoder_chain.h"

#include <cmath>
#include <array>
#include <optional>
#include <tuple>
#include <vector>

extern "C" int specc_blocked_matmul(const uint16_t* x, int rows, int k, const uint8_t* weight, int n, int bits,
                                    uint16_t* y, int scalar);
extern "C" long long specc_blocked_tile_bytes(int k, int bits);
extern "C" int specc_row_attention(const void* query, const int64_t* query_strides, const void* keys,
                                   const int64_t* key_strides, const void* values, const int64_t* value_strides,
                                   const bool* mask, const int64_t* mask_strides, int batch, int heads, int kv_heads,
                                   int rows, int kv, int dim, float scale, int dtype, void* out);
extern "C" int specc_row_argmax(const void* scores, int64_t rows, int64_t n, int64_t row_stride, int dtype,
                                int64_t* out);

namespace {

constexpr int64_t kBlock = 32, kTile = 16;

at::Tensor blocked_matmul(const at::Tensor& rows_in, const at::Tensor& packed_in, int64_t bits, int64_t out_features) {
    TORCH_CHECK_VALUE(rows_in.dim() == 2 && rows_in.scalar_type() == at::kBFloat16,
                "blocked_matmul takes bfloat16 rows [n, in], got ", rows_in.scalar_type(), " ", rows_in.sizes());
    TORCH_CHECK_VALUE(packed_in.dim() != 3,
                "blocked_matmul: this weight is in the layout of specc before 2026-11-30 (an fp16 scale and min "
                "per block, [out/16, in/32, bytes]); recompile the engine with this specc");
    TORCH_CHECK_VALUE((bits == 4 || bits == 6 || bits == 8) && packed_in.scalar_type() == at::kByte
                    && packed_in.dim() == 2,
                "blocked_matmul takes a uint8 weight [out/16, bytes per tile] of 4, 6 or 8 bits, got ",
                packed_in.scalar_type(), " ", packed_in.sizes(), " at ", bits, " bits");
    const int64_t tiles = packed_in.size(0), bytes = packed_in.size(1);
    TORCH_CHECK_VALUE(tiles * kTile == out_features && rows_in.size(1) % kBlock == 0
                    && bytes == specc_blocked_tile_bytes(static_cast<int>(rows_in.size(1)), static_cast<int>(bits)),
                "blocked_matmul: a weight of ", tiles, " tiles x ", bytes,
                " bytes does not map ", rows_in.size(1), " inputs to ", out_features, " outputs at ", bits, " bits");
    const at::Tensor rows = rows_in.contiguous(), packed = packed_in.contiguous();
    at::Tensor out = at::empty({rows.size(0), out_features}, rows.options());
    const int status = specc_blocked_matmul(
        reinterpret_cast<const uint16_t*>(rows.data_ptr()), static_cast<int>(rows.size(0)),
        static_cast<int>(rows.size(1)), packed.data_ptr<uint8_t>(), static_cast<int>(out_features),
        static_cast<int>(bits), reinterpret_cast<uint16_t*>(out.data_ptr()), 0);
    TORCH_CHECK_VALUE(status == 0, "blocked_matmul refused its arguments (status ", status, ")");
    return out;
}

at::Tensor last_axis_contiguous(const at::Tensor& t) {
    return t.stride(-1) == 1 || t.size(-1) == 1 ? t : t.contiguous();
}

const uint16_t* bf16_vector(const char* name, const at::Tensor& t, int64_t size) {
    TORCH_CHECK_VALUE(t.scalar_type() == at::kBFloat16 && t.dim() == 1 && t.size(0) == size && t.is_contiguous(),
                "decoder_chain: ", name, " must be a contiguous bfloat16 vector of ", size, ", got ", t.scalar_type(),
                " ", t.sizes());
    return reinterpret_cast<const uint16_t*>(t.data_ptr());
}

// A layer's chain over `rows` rows of `hidden` at `attention` and `residual`, its pack and norms checked.
specc_cpu::Chain packed_chain(const uint16_t* attention, const uint16_t* residual, int rows, int hidden,
                              const at::Tensor& weights, const at::Tensor& post_norm, const at::Tensor& next_norm,
                              int64_t o_bits, int64_t gate_up_bits, int64_t down_bits, int64_t next_bits,
                              int64_t intermediate, int64_t next_features, int64_t packed_threads, double eps) {
    specc_cpu::Chain c{
        attention, residual, nullptr, static_cast<int>(packed_threads),
        {static_cast<int>(o_bits), hidden}, {static_cast<int>(gate_up_bits), static_cast<int>(2 * intermediate)},
        {static_cast<int>(down_bits), hidden}, {static_cast<int>(next_bits), static_cast<int>(next_features)},
        bf16_vector("post_norm", post_norm, hidden), bf16_vector("next_norm", next_norm, hidden),
        rows, hidden, static_cast<float>(eps), false};
    const int64_t bytes = specc_cpu::layer_pack_bytes(c);
    TORCH_CHECK_VALUE(bytes > 0 && packed_threads > 0,
                "decoder_chain: no layer of hidden ", hidden, ", intermediate ", intermediate, ", next features ",
                next_features, " at bits ", o_bits, "/", gate_up_bits, "/", down_bits, "/", next_bits,
                " packed for ", packed_threads, " threads (features must be multiples of 16, inputs of 32, bits 4, 6 or 8)");
    TORCH_CHECK_VALUE(weights.scalar_type() == at::kByte && weights.dim() == 1 && weights.numel() == bytes
                    && weights.is_contiguous(),
                "decoder_chain: weights must be the layer's packed projections, contiguous uint8 of ", bytes,
                " bytes, got ", weights.scalar_type(), " ", weights.sizes());
    c.weights = weights.data_ptr<uint8_t>();
    return c;
}

// The chain's operands checked, with `attention` and `residual` made contiguous (kept alive in `held`).
specc_cpu::Chain chain_of(const at::Tensor& attention_in, const at::Tensor& residual_in, const at::Tensor& weights,
                          const at::Tensor& post_norm, const at::Tensor& next_norm, int64_t o_bits,
                          int64_t gate_up_bits, int64_t down_bits, int64_t next_bits, int64_t intermediate,
                          int64_t next_features, int64_t packed_threads, double eps, std::array<at::Tensor, 2>& held) {
    TORCH_CHECK_VALUE(attention_in.dim() == 2 && residual_in.sizes() == attention_in.sizes()
                    && attention_in.scalar_type() == at::kBFloat16 && residual_in.scalar_type() == at::kBFloat16,
                "decoder_chain takes bfloat16 attention and residual rows [n, hidden] of one shape, got ",
                attention_in.scalar_type(), " ", attention_in.sizes(), " and ", residual_in.scalar_type(), " ",
                residual_in.sizes());
    held = {attention_in.contiguous(), residual_in.contiguous()};
    return packed_chain(reinterpret_cast<const uint16_t*>(held[0].data_ptr()),
                        reinterpret_cast<const uint16_t*>(held[1].data_ptr()), static_cast<int>(held[0].size(0)),
                        static_cast<int>(held[0].size(1)), weights, post_norm, next_norm, o_bits, gate_up_bits,
                        down_bits, next_bits, intermediate, next_features, packed_threads, eps);
}

std::tuple<at::Tensor, at::Tensor> decoder_chain(
        const at::Tensor& attention, const at::Tensor& residual, const at::Tensor& weights,
        const at::Tensor& post_norm, const at::Tensor& next_norm, int64_t o_bits, int64_t gate_up_bits,
        int64_t down_bits, int64_t next_bits, int64_t intermediate, int64_t next_features, int64_t packed_threads,
        double eps) {
    std::array<at::Tensor, 2> held;
    const specc_cpu::Chain c = chain_of(attention, residual, weights, post_norm, next_norm, o_bits, gate_up_bits,
                                        down_bits, next_bits, intermediate, next_features, packed_threads, eps, held);
    at::Tensor residual_out = at::empty({c.rows, c.hidden}, attention.options());
    at::Tensor next_out = at::empty({c.rows, c.next.features}, attention.options());
    const int status = specc_cpu::decoder_chain(c, nullptr, nullptr,
                                                reinterpret_cast<uint16_t*>(residual_out.data_ptr()),
                                                reinterpret_cast<uint16_t*>(next_out.data_ptr()));
    TORCH_CHECK_VALUE(status == 0, "decoder_chain refused its arguments (status ", status, ")");
    return {residual_out, next_out};
}

const uint16_t* bf16_rows(const char* name, const at::Tensor& t, int64_t rows, int64_t width) {
    TORCH_CHECK_VALUE(t.scalar_type() == at::kBFloat16 && t.numel() == rows * width && t.is_contiguous(),
                "decoder_chain_into_cache: ", name, " must be contiguous bfloat16 [", rows, ", ", width, "], got ",
                t.scalar_type(), " ", t.sizes());
    return reinterpret_cast<const uint16_t*>(t.data_ptr());
}

// The chain's cache write: q/k/v of `heads` + 2 kv heads (the caches' head_dim) rotated by `cos` and `sin`,
// k and v written into the caches at `positions` (contiguous int64), q into `query`, `bias` added first if given.
specc_cpu::CacheWrite cache_write_of(const specc_cpu::Chain& c, const at::Tensor& cos, const at::Tensor& sin,
                                     const at::Tensor& positions, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                     int64_t heads, uint16_t* query, const at::Tensor* bias) {
    const int64_t dim = k_cache.size(3);
    return {bf16_rows("cos", cos, c.rows, dim), bf16_rows("sin", sin, c.rows, dim), positions.data_ptr<int64_t>(),
            reinterpret_cast<uint16_t*>(k_cache.data_ptr()), reinterpret_cast<uint16_t*>(v_cache.data_ptr()),
            {k_cache.stride(1), k_cache.stride(2)}, {v_cache.stride(1), v_cache.stride(2)}, k_cache.size(2),
            static_cast<int>(heads), static_cast<int>(k_cache.size(1)), static_cast<int>(dim),
            query, bias ? bf16_rows("next_bias", *bias, 1, c.next.features) : nullptr};
}

// decoder_chain_into_cache, after `attention` when it is given (the chain's attention rows are then its output).
std::tuple<at::Tensor, at::Tensor> chain_into_cache(
        const at::Tensor& attention, const at::Tensor& residual, const at::Tensor& weights,
        const at::Tensor& post_norm, const at::Tensor& next_norm, int64_t o_bits, int64_t gate_up_bits,
        int64_t down_bits, int64_t next_bits, int64_t intermediate, int64_t next_features, int64_t packed_threads,
        double eps, const at::Tensor& cos, const at::Tensor& sin,
        const at::Tensor& positions_in, at::Tensor& k_cache, at::Tensor& v_cache, int64_t heads,
        const std::optional<at::Tensor>& next_bias, const specc_cpu::RowAttention* attended) {
    std::array<at::Tensor, 2> held;
    const specc_cpu::Chain c = chain_of(attention, residual, weights, post_norm, next_norm, o_bits, gate_up_bits,
                                        down_bits, next_bits, intermediate, next_features, packed_threads, eps, held);
    TORCH_CHECK_VALUE(k_cache.dim() == 4 && k_cache.size(0) == 1 && v_cache.sizes() == k_cache.sizes()
                    && k_cache.scalar_type() == at::kBFloat16 && v_cache.scalar_type() == at::kBFloat16
                    && k_cache.stride(3) == 1 && v_cache.stride(3) == 1,
                "decoder_chain_into_cache takes bfloat16 caches [1, kv_heads, capacity, head_dim] of one shape, got ",
                k_cache.sizes(), " and ", v_cache.sizes());
    const at::Tensor positions = positions_in.contiguous();
    TORCH_CHECK_VALUE(positions.scalar_type() == at::kLong && positions.numel() == c.rows,
                "decoder_chain_into_cache takes one int64 cache position a row, got ", positions.scalar_type(), " ",
                positions.sizes());
    const int64_t dim = k_cache.size(3);
    at::Tensor residual_out = at::empty({c.rows, c.hidden}, residual.options());
    at::Tensor query = at::empty({c.rows, heads * dim}, residual.options());
    const specc_cpu::CacheWrite w = cache_write_of(c, cos, sin, positions, k_cache, v_cache, heads,
                                                   reinterpret_cast<uint16_t*>(query.data_ptr()),
                                                   next_bias.has_value() ? &*next_bias : nullptr);
    const int status = specc_cpu::decoder_chain(c, &w, attended, reinterpret_cast<uint16_t*>(residual_out.data_ptr()),
                                                nullptr);
    TORCH_CHECK_VALUE(status == 0, "decoder_chain_into_cache refused its arguments (status ", status, "): q/k/v of ",
                      c.next.features, " features are no ", heads, " + 2 x ", k_cache.size(1), " heads of ", dim,
                      ", a position is outside the cache's ", k_cache.size(2), ", or the attention does not give ",
                      c.rows, " rows of ", c.hidden);
    return {residual_out, query};
}

std::tuple<at::Tensor, at::Tensor> decoder_chain_into_cache(
        const at::Tensor& attention, const at::Tensor& residual, const at::Tensor& weights,
        const at::Tensor& post_norm, const at::Tensor& next_norm, int64_t o_bits, int64_t gate_up_bits,
        int64_t down_bits, int64_t next_bits, int64_t intermediate, int64_t next_features, int64_t packed_threads,
        double eps, const at::Tensor& cos, const at::Tensor& sin,
        const at::Tensor& positions, at::Tensor& k_cache, at::Tensor& v_cache, int64_t heads,
        const std::optional<at::Tensor>& next_bias) {
    return chain_into_cache(attention, residual, weights, post_norm, next_norm, o_bits, gate_up_bits, down_bits,
                            next_bits, intermediate, next_features, packed_threads, eps, cos, sin, positions, k_cache,
                            v_cache, heads, next_bias, nullptr);
}

// The row attention operands of `query` [1, heads, rows, dim] over keys and values [1, kv_heads, kv, dim]
// under `mask` (broadcast to [1, heads, rows, kv] and kept alive by the caller).
specc_cpu::RowAttention attention_of(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                     const at::Tensor& expanded_mask, double scale) {
    specc_cpu::RowAttention a{reinterpret_cast<const uint16_t*>(query.data_ptr()), {},
                              reinterpret_cast<const uint16_t*>(key.data_ptr()), {},
                              reinterpret_cast<const uint16_t*>(value.data_ptr()), {},
                              expanded_mask.data_ptr<bool>(), {},
                              1, static_cast<int>(query.size(1)), static_cast<int>(key.size(1)),
                              static_cast<int>(query.size(2)), static_cast<int>(key.size(2)),
                              static_cast<int>(query.size(3)), static_cast<float>(scale)};
    for (int i = 0; i < 4; ++i) {
        a.query_strides[i] = query.stride(i);
        a.key_strides[i] = key.stride(i);
        a.value_strides[i] = value.stride(i);
        a.mask_strides[i] = expanded_mask.stride(i);
    }
    return a;
}

// `a` over another layer's caches [1, kv_heads, capacity, head_dim], of the shape `a`'s were (checked by the caller).
specc_cpu::RowAttention over_caches(specc_cpu::RowAttention a, const at::Tensor& key, const at::Tensor& value) {
    a.keys = reinterpret_cast<const uint16_t*>(key.data_ptr());
    a.values = reinterpret_cast<const uint16_t*>(value.data_ptr());
    for (int i = 0; i < 4; ++i) {
        a.key_strides[i] = key.stride(i);
        a.value_strides[i] = value.stride(i);
    }
    return a;
}

// `a` for a query given as rows [rows, heads * dim] (a chain's cache write), read as [1, heads, rows, dim].
specc_cpu::RowAttention with_row_major_query(specc_cpu::RowAttention a, const uint16_t* query) {
    const int64_t row = static_cast<int64_t>(a.heads) * a.dim;
    a.query = query;
    a.query_strides[0] = a.rows * row;
    a.query_strides[1] = a.dim;
    a.query_strides[2] = row;
    a.query_strides[3] = 1;
    return a;
}

// decoder_chain_into_cache after the layer's row attention of `query` over `key` and `value`
// under `mask` (row_attention's operands), in the same parallel region.
std::tuple<at::Tensor, at::Tensor> decoder_layer(
        const at::Tensor& query_in, const at::Tensor& key_in, const at::Tensor& value_in, const at::Tensor& mask,
        double scale, const at::Tensor& residual, const at::Tensor& weights, const at::Tensor& post_norm,
        const at::Tensor& next_norm, int64_t o_bits, int64_t gate_up_bits, int64_t down_bits, int64_t next_bits,
        int64_t intermediate, int64_t next_features, int64_t packed_threads, double eps, const at::Tensor& cos,
        const at::Tensor& sin, const at::Tensor& positions, at::Tensor& k_cache, at::Tensor& v_cache, int64_t heads,
        const std::optional<at::Tensor>& next_bias) {
    TORCH_CHECK_VALUE(query_in.dim() == 4 && key_in.dim() == 4 && value_in.dim() == 4 && mask.dim() == 4
                    && query_in.scalar_type() == at::kBFloat16 && key_in.scalar_type() == at::kBFloat16
                    && value_in.scalar_type() == at::kBFloat16 && mask.scalar_type() == at::kBool,
                "decoder_layer takes 4-d bfloat16 query, key and value and a boolean mask");
    const at::Tensor query = last_axis_contiguous(query_in), key = last_axis_contiguous(key_in),
                     value = last_axis_contiguous(value_in);
    const int64_t batch = query.size(0), rows = query.size(2), dim = query.size(3);
    TORCH_CHECK_VALUE(batch == 1 && key.sizes() == value.sizes() && key.size(0) == 1 && key.size(3) == dim
                    && query.size(1) % key.size(1) == 0 && residual.dim() == 2 && residual.size(0) == rows,
                "decoder_layer: keys ", key.sizes(), " and values ", value.sizes(), " do not serve a query ",
                query.sizes(), " of the residual's ", residual.sizes(), " rows");
    const at::Tensor expanded = mask.expand({1, query.size(1), rows, key.size(2)});
    const specc_cpu::RowAttention a = attention_of(query, key, value, expanded, scale);
    // the chain's attention rows are the attention's output: `residual` stands in for their shape
    return chain_into_cache(residual, residual, weights, post_norm, next_norm, o_bits, gate_up_bits, down_bits,
                            next_bits, intermediate, next_features, packed_threads, eps, cos, sin, positions, k_cache,
                            v_cache, heads, next_bias, &a);
}

// decoder_layer for layers of one shape in turn, in one call: layer i attends over the first
// `kv_length` positions of k_caches[i] and v_caches[i] and writes the next attention's keys and
// values into k_caches[i + 1] and v_caches[i + 1]; `bits` holds each layer's o, gate_up, down and
// next bits in turn. Returns the last layer's (residual_out, query).
std::tuple<at::Tensor, at::Tensor> decoder_stack(
        const at::Tensor& query_in, const at::Tensor& mask, double scale, const at::Tensor& residual,
        at::TensorList weights, at::TensorList post_norms, at::TensorList next_norms, at::IntArrayRef bits,
        int64_t intermediate, int64_t next_features, int64_t packed_threads, double eps, const at::Tensor& cos,
        const at::Tensor& sin, const at::Tensor& positions_in, int64_t kv_length, at::TensorList k_caches,
        at::TensorList v_caches, int64_t heads, at::TensorList next_biases) {
    const int64_t layers = static_cast<int64_t>(weights.size());
    TORCH_CHECK_VALUE(layers >= 1 && post_norms.size() == weights.size() && next_norms.size() == weights.size()
                    && static_cast<int64_t>(bits.size()) == 4 * layers
                    && static_cast<int64_t>(k_caches.size()) == layers + 1 && v_caches.size() == k_caches.size()
                    && (next_biases.empty() || next_biases.size() == weights.size()),
                "decoder_stack takes, for each of its layers, a pack, two norms, four bits, and one bias or none; "
                "and one more key and value cache than layers (the first layer's own), got ", weights.size(),
                " packs, ", post_norms.size(), " and ", next_norms.size(), " norms, ", bits.size(), " bits, ",
                k_caches.size(), " and ", v_caches.size(), " caches and ", next_biases.size(), " biases");
    TORCH_CHECK_VALUE(query_in.dim() == 4 && query_in.scalar_type() == at::kBFloat16 && mask.dim() == 4
                    && mask.scalar_type() == at::kBool && residual.dim() == 2 && residual.size(0) == query_in.size(2)
                    && residual.scalar_type() == at::kBFloat16 && query_in.size(0) == 1,
                "decoder_stack takes a bfloat16 query [1, heads, rows, head_dim], a boolean mask and bfloat16 "
                "residual rows [rows, hidden], got ", query_in.sizes(), ", ", mask.sizes(), " and ", residual.sizes());
    const at::Tensor query = last_axis_contiguous(query_in);
    const int64_t rows = query.size(2), dim = query.size(3);
    for (int64_t i = 0; i <= layers; ++i) {
        const at::Tensor& k = k_caches[i];
        const at::Tensor& v = v_caches[i];
        TORCH_CHECK_VALUE(k.dim() == 4 && k.size(0) == 1 && v.sizes() == k.sizes() && k.size(3) == dim
                        && k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16 && k.stride(3) == 1
                        && v.stride(3) == 1 && kv_length >= 0 && kv_length <= k.size(2)
                        && query.size(1) % k.size(1) == 0 && k.size(1) == k_caches[0].size(1),
                    "decoder_stack takes bfloat16 caches [1, kv_heads, capacity, head_dim] of one shape holding ",
                    kv_length, " positions for a query ", query.sizes(), ", got ", k.sizes(), " and ", v.sizes());
    }
    const at::Tensor expanded = mask.expand({1, query.size(1), rows, kv_length});
    const at::Tensor positions = positions_in.contiguous();
    TORCH_CHECK_VALUE(positions.scalar_type() == at::kLong && positions.numel() == rows,
                      "decoder_stack takes one int64 cache position a row, got ", positions.scalar_type(), " ",
                      positions.sizes());
    const at::Tensor residual_rows = residual.contiguous();
    const int hidden = static_cast<int>(residual_rows.size(1));
    at::Tensor residual_out = at::empty({rows, hidden}, residual.options());
    at::Tensor query_out = at::empty({rows, heads * dim}, residual.options());
    // Layers before the last hand their residual and query on through two pairs of buffers in turn,
    // found by offsets: views made per layer (dispatched ops on a cold cache) cost more than the step's attention.
    at::Tensor between_residual = at::empty({2, rows, hidden}, residual.options());
    at::Tensor between_query = at::empty({2, rows, heads * dim}, residual.options());
    const specc_cpu::RowAttention first = attention_of(query, k_caches[0].narrow(2, 0, kv_length),
                                                       v_caches[0].narrow(2, 0, kv_length), expanded, scale);
    std::vector<specc_cpu::StackLayer> stack;
    stack.reserve(layers);
    const uint16_t* residual_in = reinterpret_cast<const uint16_t*>(residual_rows.data_ptr());
    for (int64_t i = 0; i < layers; ++i) {
        const bool last = i == layers - 1;
        uint16_t* out_residual = reinterpret_cast<uint16_t*>((last ? residual_out : between_residual).data_ptr())
                                 + (last ? 0 : (i % 2) * rows * hidden);
        uint16_t* out_query = reinterpret_cast<uint16_t*>((last ? query_out : between_query).data_ptr())
                              + (last ? 0 : (i % 2) * rows * heads * dim);
        const specc_cpu::Chain c = packed_chain(residual_in, residual_in, static_cast<int>(rows), hidden, weights[i],
                                                post_norms[i], next_norms[i], bits[4 * i], bits[4 * i + 1],
                                                bits[4 * i + 2], bits[4 * i + 3], intermediate, next_features,
                                                packed_threads, eps);
        const specc_cpu::CacheWrite w = cache_write_of(c, cos, sin, positions, k_caches[i + 1], v_caches[i + 1],
                                                       heads, out_query, next_biases.empty() ? nullptr : &next_biases[i]);
        specc_cpu::RowAttention a = over_caches(first, k_caches[i], v_caches[i]);
        if (i > 0) a = with_row_major_query(a, stack.back().cache.query);
        stack.push_back({c, w, a, out_residual});
        residual_in = out_residual;
    }
    const int status = specc_cpu::decoder_stack(stack.data(), static_cast<int>(layers));
    TORCH_CHECK_VALUE(status == 0, "decoder_stack refused its arguments (status ", status, "): a layer's q/k/v of ",
                      next_features, " features are no ", heads, " + 2 x ", k_caches[0].size(1), " heads of ", dim,
                      ", a position is outside the caches, or the layers differ in shape");
    return {residual_out, query_out};
}

at::Tensor row_attention(const at::Tensor& query_in, const at::Tensor& key_in, const at::Tensor& value_in,
                         const at::Tensor& mask, std::optional<double> scale) {
    TORCH_CHECK_VALUE(query_in.dim() == 4 && key_in.dim() == 4 && value_in.dim() == 4 && mask.dim() == 4,
                "row_attention takes 4-d query, key, value and mask");
    const auto dtype = query_in.scalar_type();
    TORCH_CHECK_VALUE((dtype == at::kFloat || dtype == at::kBFloat16) && key_in.scalar_type() == dtype
                    && value_in.scalar_type() == dtype,
                "row_attention takes float32 or bfloat16 query, key and value of one dtype");
    TORCH_CHECK_VALUE(mask.scalar_type() == at::kBool, "row_attention takes a boolean mask (True: may attend), got ",
                mask.scalar_type());
    const at::Tensor query = last_axis_contiguous(query_in), key = last_axis_contiguous(key_in),
                     value = last_axis_contiguous(value_in);
    const int64_t batch = query.size(0), heads = query.size(1), rows = query.size(2), dim = query.size(3);
    const int64_t kv_heads = key.size(1), kv = key.size(2);
    TORCH_CHECK_VALUE(key.sizes() == value.sizes() && key.size(0) == batch && key.size(3) == dim && heads % kv_heads == 0,
                "row_attention: keys ", key.sizes(), " and values ", value.sizes(), " do not serve a query ",
                query.sizes());
    const at::Tensor expanded_mask = mask.expand({batch, heads, rows, kv});
    at::Tensor out = at::empty_strided({batch, heads, rows, dim}, {rows * heads * dim, dim, heads * dim, 1},
                                       query.options());
    const int status = specc_row_attention(
        query.data_ptr(), query.strides().data(), key.data_ptr(), key.strides().data(), value.data_ptr(),
        value.strides().data(), expanded_mask.data_ptr<bool>(), expanded_mask.strides().data(),
        static_cast<int>(batch), static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(rows),
        static_cast<int>(kv), static_cast<int>(dim),
        static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(dim))),
        dtype == at::kFloat ? 0 : 1, out.data_ptr());
    TORCH_CHECK_VALUE(status == 0, "row_attention refused its arguments (status ", status, ")");
    return out;
}

// Scores the kernel does not take (another dtype or rank, an empty row) go to torch's argmax.
at::Tensor row_argmax(const at::Tensor& scores_in) {
    const auto dtype = scores_in.scalar_type();
    if (!(scores_in.dim() == 1 || scores_in.dim() == 2) || scores_in.size(-1) == 0
        || !(dtype == at::kFloat || dtype == at::kBFloat16)) {
        return scores_in.argmax(-1);
    }
    const at::Tensor scores = scores_in.dim() == 1 ? scores_in.unsqueeze(0) : scores_in;
    const at::Tensor rows = scores.stride(1) == 1 ? scores : scores.contiguous();
    at::Tensor out = at::empty({rows.size(0)}, rows.options().dtype(at::kLong));
    const int status = specc_row_argmax(rows.data_ptr(), rows.size(0), rows.size(1), rows.stride(0),
                                        dtype == at::kFloat ? 0 : 1, out.data_ptr<int64_t>());
    TORCH_CHECK_VALUE(status == 0, "row_argmax refused its arguments (status ", status, ")");
    return scores_in.dim() == 1 ? out.squeeze(0) : out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specc, CPU, m) {
    m.impl("row_argmax", &row_argmax);
    m.impl("blocked_matmul", &blocked_matmul);
    m.impl("row_attention", &row_attention);
    m.impl("decoder_chain", &decoder_chain);
    m.impl("decoder_chain_into_cache", &decoder_chain_into_cache);
    m.impl("decoder_layer", &decoder_layer);
    m.impl("decoder_stack", &decoder_stack);
}

namespace {

const at::Tensor& tensor_of(AtenTensorHandle handle) {
    return *torch::aot_inductor::tensor_handle_to_tensor_pointer(handle);
}

// An optional tensor as a package passes it: a pointer to its handle, null for None.
std::optional<at::Tensor> optional_tensor(AtenTensorHandle* handle) {
    return handle && *handle ? std::optional<at::Tensor>(tensor_of(*handle)) : std::nullopt;
}

// A package's tensor list: its handles and their count.
std::vector<at::Tensor> tensors_of(const AtenTensorHandle* handles, int64_t count) {
    std::vector<at::Tensor> tensors;
    tensors.reserve(count);
    for (int64_t i = 0; i < count; ++i) tensors.push_back(tensor_of(handles[i]));
    return tensors;
}

// A decoder chain's two outputs handed to the package as new handles.
void hand_over(std::tuple<at::Tensor, at::Tensor> outputs, AtenTensorHandle* ret0, AtenTensorHandle* ret1) {
    *ret0 = torch::aot_inductor::new_tensor_handle(std::move(std::get<0>(outputs)));
    *ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(outputs)));
}

}  // namespace

extern "C" {

AOTI_TORCH_EXPORT AOTITorchError aoti_torch_cpu_blocked_matmul(AtenTensorHandle rows, AtenTensorHandle packed,
                                                               int64_t bits, int64_t out_features,
                                                               AtenTensorHandle* ret0) {
    AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
        *ret0 = torch::aot_inductor::new_tensor_handle(
            blocked_matmul(tensor_of(rows), tensor_of(packed), bits, out_features));
    });
}

AOTI_TORCH_EXPORT AOTITorchError aoti_torch_cpu_decoder_chain(
        AtenTensorHandle attention, AtenTensorHandle residual, AtenTensorHandle weights, AtenTensorHandle post_norm,
        AtenTensorHandle next_norm, int64_t o_bits, int64_t gate_up_bits, int64_t down_bits, int64_t next_bits,
        int64_t intermediate, int64_t next_features, int64_t packed_threads, double eps, AtenTensorHandle* ret0, AtenTensorHandle* ret1) {
    AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
        hand_over(decoder_chain(tensor_of(attention), tensor_of(residual), tensor_of(weights), tensor_of(post_norm),
                                tensor_of(next_norm), o_bits, gate_up_bits, down_bits, next_bits, intermediate,
                                next_features, packed_threads, eps),
                  ret0, ret1);
    });
}

AOTI_TORCH_EXPORT AOTITorchError aoti_torch_cpu_decoder_chain_into_cache(
        AtenTensorHandle attention, AtenTensorHandle residual, AtenTensorHandle weights, AtenTensorHandle post_norm,
        AtenTensorHandle next_norm, int64_t o_bits, int64_t gate_up_bits, int64_t down_bits, int64_t next_bits,
        int64_t intermediate, int64_t next_features, int64_t packed_threads, double eps, AtenTensorHandle cos, AtenTensorHandle sin, AtenTensorHandle positions, AtenTensorHandle k_cache,
        AtenTensorHandle v_cache, int64_t heads, AtenTensorHandle* next_bias, AtenTensorHandle* ret0,
        AtenTensorHandle* ret1) {
    AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
        at::Tensor keys = tensor_of(k_cache), values = tensor_of(v_cache);
        hand_over(decoder_chain_into_cache(
                      tensor_of(attention), tensor_of(residual), tensor_of(weights), tensor_of(post_norm),
                      tensor_of(next_norm), o_bits, gate_up_bits, down_bits, next_bits, intermediate, next_features,
                      packed_threads, eps, tensor_of(cos), tensor_of(sin),
                      tensor_of(positions), keys, values, heads, optional_tensor(next_bias)),
                  ret0, ret1);
    });
}

AOTI_TORCH_EXPORT AOTITorchError aoti_torch_cpu_decoder_layer(
        AtenTensorHandle query, AtenTensorHandle key, AtenTensorHandle value, AtenTensorHandle mask, double scale,
        AtenTensorHandle residual, AtenTensorHandle weights, AtenTensorHandle post_norm, AtenTensorHandle next_norm,
        int64_t o_bits, int64_t gate_up_bits, int64_t down_bits, int64_t next_bits, int64_t intermediate,
        int64_t next_features, int64_t packed_threads, double eps, AtenTensorHandle cos, AtenTensorHandle sin, AtenTensorHandle positions, AtenTensorHandle k_cache,
        AtenTensorHandle v_cache, int64_t heads, AtenTensorHandle* next_bias, AtenTensorHandle* ret0,
        AtenTensorHandle* ret1) {
    AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
        at::Tensor keys = tensor_of(k_cache), values = tensor_of(v_cache);
        hand_over(decoder_layer(
                      tensor_of(query), tensor_of(key), tensor_of(value), tensor_of(mask), scale, tensor_of(residual),
                      tensor_of(weights), tensor_of(post_norm), tensor_of(next_norm), o_bits, gate_up_bits, down_bits,
                      next_bits, intermediate, next_features, packed_threads, eps,
                      tensor_of(cos), tensor_of(sin), tensor_of(positions), keys, values, heads,
                      optional_tensor(next_bias)),
                  ret0, ret1);
    });
}

AOTI_TORCH_EXPORT AOTITorchError aoti_torch_cpu_decoder_stack(
        AtenTensorHandle query, AtenTensorHandle mask, double scale, AtenTensorHandle residual,
        const AtenTensorHandle* weights, int64_t weights_count, const AtenTensorHandle* post_norms,
        int64_t post_norms_count, const AtenTensorHandle* next_norms, int64_t next_norms_count, const int64_t* bits,
        int64_t bits_count, int64_t intermediate, int64_t next_features, int64_t packed_threads, double eps,
        AtenTensorHandle cos, AtenTensorHandle sin, AtenTensorHandle positions, int64_t kv_length,
        const AtenTensorHandle* k_caches, int64_t k_caches_count, const AtenTensorHandle* v_caches,
        int64_t v_caches_count, int64_t heads, const AtenTensorHandle* next_biases, int64_t next_biases_count,
        AtenTensorHandle* ret0, AtenTensorHandle* ret1) {
    AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
        hand_over(decoder_stack(tensor_of(query), tensor_of(mask), scale, tensor_of(residual),
                                tensors_of(weights, weights_count), tensors_of(post_norms, post_norms_count),
                                tensors_of(next_norms, next_norms_count), at::IntArrayRef(bits, bits_count),
                                intermediate, next_features, packed_threads, eps, tensor_of(cos), tensor_of(sin),
                                tensor_of(positions), kv_length, tensors_of(k_caches, k_caches_count),
                                tensors_of(v_caches, v_caches_count), heads,
                                tensors_of(next_biases, next_biases_count)),
                  ret0, ret1);
    });
}

AOTI_TORCH_EXPORT AOTITorchError aoti_torch_cpu_row_attention(AtenTensorHandle query, AtenTensorHandle key,
                                                              AtenTensorHandle value, AtenTensorHandle mask,
                                                              double* scale, AtenTensorHandle* ret0) {
    AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
        const std::optional<double> given = scale ? std::optional<double>(*scale) : std::nullopt;
        *ret0 = torch::aot_inductor::new_tensor_handle(
            row_attention(tensor_of(query), tensor_of(key), tensor_of(value), tensor_of(mask), given));
    });
}

}
