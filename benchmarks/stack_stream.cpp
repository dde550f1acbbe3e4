// How close one decoder_stack call (a decode step's layers: row attention, the chain, the cache
// writes) comes to the machine's read rate, without an engine around it: a model's layers packed
// for the region's threads, one decode row over `kv` cached positions, against a plain read of the
// same packs by the same threads (256-bit loads summed, what no kernel can beat), and against the
// stack with every layer on the first layer's pack ("hot": its weights in the caches where one
// layer fits them, what the arithmetic costs), all alternating in one process, in a new shuffled
// order every repeat (a fixed rotation always ran each system after the same one, and the one after
// the 4 KiB-page read ran ~10% slow). Where the stack takes about hot + read, the memory's time adds to the arithmetic's
// instead of hiding under it. The packs lie on 2 MiB pages, as an engine's weights do
// (specc/host/huge_pages.py), and a copy on 4 KiB pages runs the stack and the read beside them.
//
//   TUNING=$(python -c "from specc.kernels.cpu.build import tuning_flags
//       from specc.host.cpuinfo import cpuinfo_text; print(*tuning_flags(cpuinfo_text() or ''))")
//   g++ -O3 -march=native -fopenmp -std=c++17 $TUNING -o /tmp/stack_stream benchmarks/stack_stream.cpp
//       specc/kernels/cpu/{blocked_matmul,decoder_chain,row_attention,call_trace}.cpp -ldl
//   OMP_NUM_THREADS=2 /tmp/stack_stream smollm2|qwen2.5-1.5b [kv] [repeats] [LIBRARY.so ...]
//
// $TUNING holds the defines the engines' build chooses for this CPU, e.g. Intel's prefetch hint; without
// them the binary's own stack is the default build, non-temporal requests on every CPU.
//
// Each LIBRARY is another build of the kernels, e.g. with a define changed:
//   g++ -O3 -march=native -fopenmp -std=c++17 -shared -fPIC -DNAME=VALUE -o /tmp/variant.so
//       specc/kernels/cpu/{blocked_matmul,decoder_chain,row_attention,call_trace}.cpp
// and runs the same layers beside this binary's own, in the same shuffled order: two versions of a kernel
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
#include <sys/mman.h>
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

// `layers` packs of `bytes` back to back in one anonymous mapping, on 2 MiB pages where `huge` asks
// the kernel for them (and it lends them), else on 4 KiB pages.
uint8_t* packs_on_pages(const std::vector<std::vector<uint8_t>>& packs, size_t bytes, bool huge) {
    constexpr size_t kPage = 2u << 20;
    const size_t total = (packs.size() * bytes + kPage - 1) / kPage * kPage;
    void* mapping = mmap(nullptr, total + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED) return nullptr;
    auto* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(mapping) + kPage - 1) / kPage * kPage);
    madvise(base, total, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    for (size_t l = 0; l < packs.size(); ++l) std::memcpy(base + l * bytes, packs[l].data(), bytes);
    return base;
}

// Every pack read once by the region's threads, each its own share of each pack, as the stack reads them.
uint64_t read_all(const uint8_t* packs, int layers, size_t bytes) {
    uint64_t total = 0;
#pragma omp parallel reduction(+ : total)
    {
        const int threads = omp_get_num_threads(), thread = omp_get_thread_num();
        __m256i sum = _mm256_setzero_si256();
        for (int l = 0; l < layers; ++l) {
            const size_t lines = bytes / 32, share = lines / threads;
            const size_t first = thread * share, last = thread == threads - 1 ? lines : first + share;
            const auto* p = reinterpret_cast<const __m256i*>(packs + l * bytes);
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
    const uint8_t* huge = packs_on_pages(packs, layer_bytes, true);
    const uint8_t* small = packs_on_pages(packs, layer_bytes, false);
    if (!huge || !small) {
        std::fprintf(stderr, "stack_stream: no memory for the packs\n");
        return 1;
    }
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
        s.chain.weights = huge + l * layer_bytes;
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
    std::vector<specc_cpu::StackLayer> hot = stack, on_small_pages = stack;
    for (int l = 0; l < m.layers; ++l) {
        hot[l].chain.weights = huge;
        on_small_pages[l].chain.weights = small + l * layer_bytes;
    }
    // Each system runs a build's stack over some layers, or (no build) reads the packs at `read`.
    struct System {
        std::string name;
        Stack build;
        const std::vector<specc_cpu::StackLayer>* layers;
        const uint8_t* read;
    };
    std::vector<System> systems = {{"stack", specc_cpu::decoder_stack, &stack, nullptr},
                                   {"hot", specc_cpu::decoder_stack, &hot, nullptr},
                                   {"plain read", nullptr, nullptr, huge},
                                   {"stack, 4 KiB pages", specc_cpu::decoder_stack, &on_small_pages, nullptr},
                                   {"plain read, 4 KiB pages", nullptr, nullptr, small}};
    for (int a = 4; a < argc; ++a) {
        void* library = dlopen(argv[a], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);   // its own kernels, not ours
        void* symbol = library ? dlsym(library, kStackSymbol) : nullptr;
        if (!symbol) {
            std::fprintf(stderr, "stack_stream: %s has no specc_cpu::decoder_stack: %s\n", argv[a], dlerror());
            return 2;
        }
        systems.push_back({argv[a], reinterpret_cast<Stack>(symbol), &stack, nullptr});
    }
    constexpr int kSteps = 10;
    const int count = static_cast<int>(systems.size());
    std::vector<double> seconds(count);
    uint64_t sink = 0;
    std::vector<int> order(count);
    for (int i = 0; i < count; ++i) order[i] = i;
    std::mt19937 shuffler(12345);
    for (int repeat = 0; repeat <= repeats; ++repeat) {
        std::shuffle(order.begin(), order.end(), shuffler);
        for (int i = 0; i < count; ++i) {
            const int v = order[i];
            const System& system = systems[v];
            const double start = now();
            for (int step = 0; step < kSteps; ++step) {
                if (!system.build) {
                    sink += read_all(system.read, m.layers, layer_bytes);
                } else if (system.build(system.layers->data(), m.layers) != 0) {
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
    for (int v = 0; v < count; ++v) {
        const double time = seconds[v] / steps;
        std::printf("  %-40s %9.1f us a step  %5.1f GB/s  %.3f of the stack's time\n", systems[v].name.c_str(), time * 1e6,
                    bytes / time / 1e9, seconds[v] / seconds[0]);
    }
    std::printf("  stack / (hot + read) %.2f%s\n", seconds[0] / (seconds[1] + seconds[2]), sink == 1 ? " " : "");
}
