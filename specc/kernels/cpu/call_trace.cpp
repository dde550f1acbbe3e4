// call_trace.h's record: a ring of the last kEvents calls, (start ns, end ns, kind) each, on the
// monotonic clock Python's time.perf_counter_ns reads; calls come from the thread that runs the
// graph, one at a time.

#include "call_trace.h"

#include <algorithm>
#include <atomic>
#include <chrono>

namespace {

constexpr int64_t kEvents = int64_t{1} << 16;
int64_t events[kEvents][3];
std::atomic<int64_t> recorded{0};
std::atomic<bool> enabled{false};

}  // namespace

namespace specc_cpu {

bool tracing() { return enabled.load(std::memory_order_relaxed); }

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}

void record(Traced kind, int64_t start_ns) {
    const int64_t end_ns = now_ns();
    const int64_t slot = recorded.fetch_add(1, std::memory_order_relaxed) % kEvents;
    events[slot][0] = start_ns;
    events[slot][1] = end_ns;
    events[slot][2] = static_cast<int64_t>(kind);
}

}  // namespace specc_cpu

extern "C" {

// 1: start recording (forgetting earlier calls); 0: stop.
void specc_trace_calls(int on) {
    if (on) recorded.store(0);
    enabled.store(on != 0);
}

// How many calls were recorded since recording started (the ring keeps the last 65,536).
long long specc_traced_count() { return recorded.load(); }

// The last `wanted` recorded calls, oldest first, as (start ns, end ns, kind) triples in `out`;
// returns how many it wrote.
long long specc_traced_calls(long long* out, long long wanted) {
    const int64_t total = recorded.load();
    const int64_t n = std::min<int64_t>({wanted, total, kEvents});
    for (int64_t k = 0; k < n; ++k) {
        const int64_t slot = (total - n + k) % kEvents;
        for (int field = 0; field < 3; ++field) out[3 * k + field] = events[slot][field];
    }
    return n;
}

}
