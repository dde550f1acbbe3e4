// What one q4 block costs the core with no memory in the way: one tile of 16 features over 512
// inputs (16 blocks, ~4.7 KB, in L1) multiplied by one row again and again on one thread, in
// ns and cycles a block. The clock is timed first by a chain of dependent adds (one a cycle).
// It compiles the kernel's source into itself to reach the tile loop; to compare a variant,
// build it from a changed copy (-DKERNEL='"copy.cpp"') and alternate the binaries.
//
//   g++ -O3 -march=native -fopenmp -std=c++17 -Ispecc/kernels/cpu -o /tmp/block_cycles \
//       benchmarks/block_cycles.cpp specc/kernels/cpu/call_trace.cpp
//   /tmp/block_cycles [repeats] [rows]   # rows 1..4: one call's rows (a verification's share)
//
// The tile's result must escape each pass (the empty asm below takes its address): otherwise the
// compiler drops the arithmetic and times the prefetches alone.

#ifndef BITS
#define BITS 4
#endif
#ifndef KERNEL
#define KERNEL "blocked_matmul.cpp"
#endif
#include KERNEL

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double clock_ghz() {
    const long adds = 400000000;
    const auto start = std::chrono::steady_clock::now();
    long v = 1;
    for (long i = 0; i < adds; ++i) asm volatile("add $1, %0" : "+r"(v));
    return adds / seconds_since(start) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
    const int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
    const int rows = argc > 2 ? std::max(1, std::min(kRowTile, std::atoi(argv[2]))) : 1;
    const int k = 512, blocks = k / kBlock, passes = 2000000;
    const size_t bytes = ::tile_bytes<BITS>(blocks);
    std::vector<uint8_t> tile(bytes, 0x11);   // fp16 0x1111 scales: normal numbers
    std::vector<uint16_t> x(static_cast<size_t>(rows) * k, 0x3f80);   // bfloat16 1.0
    QuantizedRows a;
    specc_cpu::quantize_rows(x.data(), rows, k, a, false);
    float out[kRowTile][kTile];
    const double ghz = clock_ghz();
    double best = 1e9;
    for (int r = 0; r < repeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < passes; ++i) {
            tile_rows<BITS>(tile.data(), blocks, a, k, 0, rows, out);
            asm volatile("" : : "r"(&out[0][0]) : "memory");
        }
        best = std::min(best, seconds_since(start) / passes / blocks);
    }
    std::printf("clock ~%.2f GHz, q%d, %d row(s): %.2f ns a block (%.1f cycles), %.1f GB/s on one core (best of %d)\n",
                ghz, BITS, rows, best * 1e9, best * ghz * 1e9, bytes / blocks / best / 1e9, repeats);
}
