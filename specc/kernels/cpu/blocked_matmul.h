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

// `count` consecutive tiles of a weight packed in `bits` (4, 6 or 8) over k inputs, from `tiles`,
// times the rows quantized in `a`: their 16 x count output features written to y (bfloat16, row
// stride y_stride) from its first column. Each output feature's arithmetic is the whole matmul's,
// so a call split into ranges, wherever each range's tiles lie, computes the same bits.
void blocked_tiles(const QuantizedRows& a, int rows, int k, const uint8_t* tiles, int bits, int count, uint16_t* y,
                   int64_t y_stride, bool scalar);

// Bytes of one tile of 16 output features over k inputs at `bits` (0 when k or bits do not fit).
int64_t tile_bytes(int k, int bits);

// Thread `thread`'s contiguous range [first, last) of `tiles` among `threads` (OpenMP's static
// schedule): the share every kernel here gives a thread.
void tile_share(int tiles, int threads, int thread, int* first, int* last);

}  // namespace specc_cpu
