// The CPU kernels of this folder as the CPU implementations of torch.ops.specc.blocked_matmul,
// torch.ops.specc.row_attention and torch.ops.specc.row_argmax (their schemas and fake
// implementations are defined in Python: specc/kernels/blocked_matmul.py, row_attention.py,
// row_argmax.py). Registered in C++ so that a
// call from an AOTInductor package or from eager PyTorch reaches the kernel without Python:
// through a Python implementation each call cost 20-50 us of wrapping, more than a small
// matmul or a decode step's attention takes.
//
// blocked_matmul and row_attention are also C shims (aoti_torch_cpu_<op>, AOTInductor's calling
// convention for a custom op's direct call: specc/lower/c_shims.py declares them to Inductor), so a
// package calls them as plain functions instead of through its proxy executor, which boxes every
// argument and dispatches by name on each call.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include <cmath>
#include <optional>

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
}

namespace {

const at::Tensor& tensor_of(AtenTensorHandle handle) {
    return *torch::aot_inductor::tensor_handle_to_tensor_pointer(handle);
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
