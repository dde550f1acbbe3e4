// How close one decoder_stack call (a decode step's layers: row attention, the chain, the cache
// writes) comes to the machine's read rate, without an engine around it: a model's layers packed
// for the region's threads, one decode row over `kv` cached positions, against a plain read of the
// same packs by the same threads (256-bit loads summed, what no kernel can beat), and against the
// stack with every layer on the first layer's pack ("hot": its weights in the caches where one
// layer fits them, what the arithmetic costs), all alternating in one process, order rotated every
// repeat. Where the stack takes about hot + read, the memory's time adds to the arithmetic's
// instead of hiding under it.
//
//   g++ -O3 -march=native -fopenmp -std=c++17 -o /tmp/stack_stream benchmarks/stack_stream.cpp
//       specc/kernels/cpu/{blocked_matmul,decoder_chain,row_attention,call_trace}.cpp -ldl
//   OMP_NUM_THREADS=2 /tmp/stack_stream smollm2|qwen2.5-1.5b [kv] [repeats] [LIBRARY.so ...]
//
// Each LIBRARY is another build of the kernels, e.g. with a define changed:
//   g++ -O3 -march=native -fopenmp -std=c++17 -shared -fPIC -DNAME=VALUE -o /tmp/variant.so
//       specc/kernels/cpu/{blocked_matmul,decoder_chain,row_attention,call_trace}.cpp
// and runs the same layers beside this binary's own, in the same rotation: two versions of a kernel
// compared in one process, where runs in turn on this VM drift by more than most changes.
//
// Shapes: SmolLM2-135M (30 layers of hidden 576, intermediate 1536, 9 heads over 3 kv heads of 64)
// and Qwen2.5-1.5B (28 of 1536, 8960, 12 over 2 of 128); every projection 4-bit. The weights are
// random bytes (the arithmetic does not depend on them); results are µs a step and GB/s.

#include "../specc/kernels/cpu/blocked_matmul.h"
#include "../specc/kernels/cpu/decoder_chain.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <immintrin.h>
#include <omp.h>
#include <random>
#include <string>
#include <vector>

namespace {

using Stack = int (*)(const specc_cpu::StackLayer*, int);
constexpr const char* kStackSymbol = "_ZN9specc_cpu13decoder_stackEPKNS_10StackLayerEi";   // specc_cpu::decoder_stack

struct Model {
    int layers, hidden, intermediate, heads, kv_heads, dim;
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<uint8_t> random_bytes(size_t n, std::mt19937& rng) {
    std::vector<uint8_t> bytes(n);
    for (size_t i = 0; i + 4 <= n; i += 4) {
        const uint32_t r = rng() & 0x3bff3bffu;   // finite fp16 scales, small bfloat16 values
        std::memcpy(&bytes[i], &r, 4);
    }
    return bytes;
}

std::vector<uint16_t> bf16_values(size_t n, uint16_t value) { return std::vector<uint16_t>(n, value); }

// Every pack read once by the region's threads, each its own share of each pack, as the stack reads them.
uint64_t read_all(const std::vector<std::vector<uint8_t>>& packs) {
    uint64_t total = 0;
#pragma omp parallel reduction(+ : total)
    {
        const int threads = omp_get_num_threads(), thread = omp_get_thread_num();
        __m256i sum = _mm256_setzero_si256();
        for (const auto& pack : packs) {
            const size_t lines = pack.size() / 32, share = lines / threads;
            const size_t first = thread * share, last = thread == threads - 1 ? lines : first + share;
            const auto* p = reinterpret_cast<const __m256i*>(pack.data());
            for (size_t i = first; i < last; ++i) sum = _mm256_add_epi64(sum, _mm256_loadu_si256(p + i));
        }
        alignas(32) uint64_t lanes[4];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
        total += lanes[0] + lanes[1] + lanes[2] + lanes[3];
    }
    return total;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string name = argc > 1 ? argv[1] : "smollm2";
    const int kv = argc > 2 ? std::atoi(argv[2]) : 300;
    const int repeats = argc > 3 ? std::atoi(argv[3]) : 20;
    if (name != "smollm2" && name != "qwen2.5-1.5b") {
        std::fprintf(stderr, "stack_stream: model is smollm2 or qwen2.5-1.5b, not %s\n", name.c_str());
        return 2;
    }
    const Model m = name == "smollm2" ? Model{30, 576, 1536, 9, 3, 64} : Model{28, 1536, 8960, 12, 2, 128};
    const int threads = omp_get_max_threads(), capacity = kv + 1, next = (m.heads + 2 * m.kv_heads) * m.dim;
    std::mt19937 rng(1);
    const specc_cpu::Chain shape{nullptr, nullptr, nullptr, threads, {4, m.hidden}, {4, 2 * m.intermediate},
                                 {4, m.hidden}, {4, next}, nullptr, nullptr, 1, m.hidden, 1e-5f, false};
    const size_t layer_bytes = static_cast<size_t>(specc_cpu::layer_pack_bytes(shape));
    std::vector<std::vector<uint8_t>> packs;
    std::vector<std::vector<uint16_t>> caches;   // k then v of each layer's cache, and one more pair
    for (int l = 0; l < m.layers; ++l) packs.push_back(random_bytes(layer_bytes, rng));
    for (int c = 0; c < 2 * (m.layers + 1); ++c) {
        caches.push_back(bf16_values(static_cast<size_t>(m.kv_heads) * capacity * m.dim, 0x3c00));
    }
    const auto norm = bf16_values(m.hidden, 0x3f80), cos = bf16_values(m.dim, 0x3f00), sin = bf16_values(m.dim, 0x3f00);
    auto residual = bf16_values(m.hidden, 0x3f00), query = bf16_values(static_cast<size_t>(m.heads) * m.dim, 0x3c00);
    std::vector<std::vector<uint16_t>> residual_out(m.layers, bf16_values(m.hidden, 0)),
        query_out(m.layers, bf16_values(static_cast<size_t>(m.heads) * m.dim, 0));
    std::vector<uint8_t> mask_bytes(kv + 1, 1);
    const bool* mask = reinterpret_cast<const bool*>(mask_bytes.data());
    const int64_t position = kv;
    const int64_t cache_strides[4] = {static_cast<int64_t>(m.kv_heads) * capacity * m.dim,
                                      static_cast<int64_t>(capacity) * m.dim, m.dim, 1};
    std::vector<specc_cpu::StackLayer> stack;
    for (int l = 0; l < m.layers; ++l) {
        specc_cpu::StackLayer s{};
        s.chain = shape;
        s.chain.residual = l ? residual_out[l - 1].data() : residual.data();
        s.chain.weights = packs[l].data();
        s.chain.post_norm = s.chain.next_norm = norm.data();
        s.cache = {cos.data(), sin.data(), &position, caches[2 * l + 2].data(), caches[2 * l + 3].data(),
                   {cache_strides[1], cache_strides[2]}, {cache_strides[1], cache_strides[2]}, capacity,
                   m.heads, m.kv_heads, m.dim, query_out[l].data(), nullptr};
        s.attention = {l ? query_out[l - 1].data() : query.data(), {}, caches[2 * l].data(), {},
                       caches[2 * l + 1].data(), {}, mask, {0, 0, 0, 1}, 1, m.heads, m.kv_heads, 1, kv + 1, m.dim,
                       0.125f};
        const int64_t row = static_cast<int64_t>(m.heads) * m.dim;
        const int64_t query_strides[4] = {row, m.dim, row, 1};   // rows [1, heads * dim] read as [1, heads, 1, dim]
        std::copy(query_strides, query_strides + 4, s.attention.query_strides);
        std::copy(cache_strides, cache_strides + 4, s.attention.key_strides);
        std::copy(cache_strides, cache_strides + 4, s.attention.value_strides);
        s.residual_out = residual_out[l].data();
        stack.push_back(s);
    }
    std::vector<specc_cpu::StackLayer> hot = stack;
    for (auto& l : hot) l.chain.weights = packs[0].data();
    // Systems: this build's stack, the stack hot, the plain read, then each library's stack.
    std::vector<Stack> builds = {specc_cpu::decoder_stack};
    std::vector<std::string> names = {"stack", "hot", "plain read"};
    for (int a = 4; a < argc; ++a) {
        void* library = dlopen(argv[a], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);   // its own kernels, not ours
        void* symbol = library ? dlsym(library, kStackSymbol) : nullptr;
        if (!symbol) {
            std::fprintf(stderr, "stack_stream: %s has no specc_cpu::decoder_stack: %s\n", argv[a], dlerror());
            return 2;
        }
        builds.push_back(reinterpret_cast<Stack>(symbol));
        names.push_back(argv[a]);
    }
    constexpr int kSteps = 10;
    const int systems = static_cast<int>(names.size());
    std::vector<double> seconds(systems);
    uint64_t sink = 0;
    for (int repeat = 0; repeat <= repeats; ++repeat) {
        for (int i = 0; i < systems; ++i) {
            const int v = (i + repeat) % systems;
            const double start = now();
            for (int step = 0; step < kSteps; ++step) {
                if (v == 2) {
                    sink += read_all(packs);
                } else if ((v < 2 ? builds[0] : builds[v - 2])((v == 1 ? hot : stack).data(), m.layers) != 0) {
                    std::fprintf(stderr, "stack_stream: decoder_stack refused the layers\n");
                    return 1;
                }
            }
            if (repeat > 0) seconds[v] += now() - start;   // the first repeat warms up
        }
    }
    const double steps = static_cast<double>(repeats) * kSteps, bytes = static_cast<double>(layer_bytes) * m.layers;
    std::printf("%s, %d threads, kv %d, %d repeats x %d steps (%.1f MB of weights a step):\n", name.c_str(), threads,
                kv, repeats, kSteps, bytes / 1e6);
    for (int v = 0; v < systems; ++v) {
        const double time = seconds[v] / steps;
        std::printf("  %-40s %9.1f us a step  %5.1f GB/s  %.3f of the stack's time\n", names[v].c_str(), time * 1e6,
                    bytes / time / 1e9, seconds[v] / seconds[0]);
    }
    std::printf("  stack / (hot + read) %.2f%s\n", seconds[0] / (seconds[1] + seconds[2]), sink == 1 ? " " : "");
}
