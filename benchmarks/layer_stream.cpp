// How fast the q4 decoder chains stream a model's layers, without an engine around them: 30
// SmolLM2-shaped layers (hidden 576, intermediate 1536, q/k/v 960) and a 6-bit head of 49152 rows,
// one decode row, the layers' weights packed for 1 thread and for 2 (the layout the engine compiles
// for 2), the two alternating in one process, order swapped every repeat. With HOT=n the layers
// reuse n layers' weights (what the arithmetic costs when the weights sit in the caches).
//
//   g++ -O3 -march=native -fopenmp -std=c++17 -o /tmp/layer_stream benchmarks/layer_stream.cpp \
//       specc/kernels/cpu/{blocked_matmul,decoder_chain,row_attention,call_trace}.cpp
//   OMP_NUM_THREADS=2 /tmp/layer_stream [repeats]          # and HOT=1 OMP_NUM_THREADS=2 ...
//
// The weights are random bytes (the arithmetic does not depend on them); results are µs a step.

#include "../specc/kernels/cpu/blocked_matmul.h"
#include "../specc/kernels/cpu/decoder_chain.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

extern "C" int specc_blocked_matmul(const uint16_t*, int, int, const uint8_t*, int, int, uint16_t*, int);

namespace {

constexpr int kHidden = 576, kIntermediate = 1536, kNext = 960, kLayers = 30, kVocab = 49152, kSteps = 20;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<uint8_t> random_bytes(size_t n, std::mt19937& rng) {
    std::vector<uint8_t> bytes(n);
    for (size_t i = 0; i + 4 <= n; i += 4) {
        const uint32_t r = rng() & 0x3bff3bffu;   // finite fp16 scales wherever they fall
        std::memcpy(&bytes[i], &r, 4);
    }
    return bytes;
}

}  // namespace

int main(int argc, char** argv) {
    const int repeats = argc > 1 ? std::atoi(argv[1]) : 40;
    const int hot = std::getenv("HOT") ? std::atoi(std::getenv("HOT")) : 0;
    std::mt19937 rng(1);
    specc_cpu::Chain shape{nullptr, nullptr, nullptr, 1, {4, kHidden}, {4, 2 * kIntermediate}, {4, kHidden},
                           {4, kNext}, nullptr, nullptr, 1, kHidden, 1e-5f, false};
    const size_t layer_bytes = static_cast<size_t>(specc_cpu::layer_pack_bytes(shape));
    const int packings[2] = {1, 2};
    std::vector<std::vector<uint8_t>> packs[2];
    for (auto& layers : packs) {
        for (int l = 0; l < kLayers; ++l) layers.push_back(random_bytes(layer_bytes, rng));
    }
    const auto head = random_bytes(static_cast<size_t>(kVocab / 16) * specc_cpu::tile_bytes(kHidden, 6), rng);
    std::vector<uint16_t> norm(kHidden, 0x3f80), rows(kHidden, 0x3f00), residual(kHidden, 0x3f00), residual_out(kHidden),
        next(kNext), logits(kVocab);
    double layers_seconds[2] = {}, head_seconds[2] = {};
    for (int repeat = 0; repeat <= repeats; ++repeat) {
        for (int i = 0; i < 2; ++i) {
            const int v = repeat % 2 ? 1 - i : i;
            for (int step = 0; step < kSteps; ++step) {
                const double start = now();
                for (int l = 0; l < kLayers; ++l) {
                    specc_cpu::Chain c = shape;
                    c.attention = rows.data();
                    c.residual = residual.data();
                    c.weights = packs[v][hot ? l % hot : l].data();
                    c.packed_threads = packings[v];
                    c.post_norm = c.next_norm = norm.data();
                    specc_cpu::decoder_chain(c, nullptr, nullptr, residual_out.data(), next.data());
                }
                const double middle = now();
                specc_blocked_matmul(rows.data(), 1, kHidden, head.data(), kVocab, 6, logits.data(), 0);
                if (repeat > 0) {   // the first repeat warms up
                    layers_seconds[v] += middle - start;
                    head_seconds[v] += now() - middle;
                }
            }
        }
    }
    const double steps = static_cast<double>(repeats) * kSteps;
    for (int v = 0; v < 2; ++v) {
        const double layers = layers_seconds[v] / steps, head_time = head_seconds[v] / steps;
        std::printf("layers packed for %d thread(s): %.1f us a step (%.1f GB/s); head %.1f us (%.1f GB/s)%s\n",
                    packings[v], layers * 1e6, layer_bytes * kLayers / layers / 1e9, head_time * 1e6,
                    head.size() / head_time / 1e9, hot ? " [HOT]" : "");
    }
}
