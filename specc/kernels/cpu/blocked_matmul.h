// The parts of the blocked matmul (blocked_matmul.cpp) that other kernels of this folder run
// inside their own parallel regions: quantizing activation rows, and a range of a weight's tiles.
#pragma once

#include <cstdint>
#include <vector>

namespace specc_cpu {

struct QuantizedRows {
    std::vector<int8_t> values;   // [rows, k]
    std::vector<float> scales;    // [rows, k / 32]
    std::vector<float> sums;      // [rows, k / 32]: scale * sum of the block's values
};

// Rows x [rows, k] (bfloat16) quantized per block of 32 to int8 with one fp32 scale, into `out`.
void quantize_rows(const uint16_t* x, int rows, int k, QuantizedRows& out, bool scalar);

// Tiles [first, last) of y [rows, n] (bfloat16, row stride y_stride) = the rows quantized in `a`
// times the transpose of a [n, k] weight packed in `bits` (4, 6 or 8): each output feature's
// arithmetic as the whole matmul's, so a call split into ranges computes the same bits.
void blocked_tiles(const QuantizedRows& a, int rows, int k, const uint8_t* weight, int bits, int first, int last,
                   uint16_t* y, int64_t y_stride, bool scalar);

// Thread `thread`'s contiguous range [first, last) of `tiles` among `threads` (OpenMP's static
// schedule): the share every kernel here gives a thread.
void tile_share(int tiles, int threads, int thread, int* first, int* last);

}  // namespace specc_cpu
