// The start and end of each call into specc's CPU operators, recorded only while a profiler
// asks (call_trace.cpp; specc/kernels/call_trace.py): what a decode step spends in the
// kernels, between them, and outside the package.
#pragma once

#include <cstdint>

namespace specc_cpu {

enum class Traced : int64_t { matmul = 1, attention = 2, chain = 3 };

bool tracing();
int64_t now_ns();
void record(Traced kind, int64_t start_ns);

// The enclosing scope recorded as one call of `kind` when tracing was on at its start.
class TracedCall {
public:
    explicit TracedCall(Traced kind) : kind_(kind), start_(tracing() ? now_ns() : -1) {}
    ~TracedCall() {
        if (start_ >= 0) record(kind_, start_);
    }
    TracedCall(const TracedCall&) = delete;
    TracedCall& operator=(const TracedCall&) = delete;

private:
    Traced kind_;
    int64_t start_;
};

}  // namespace specc_cpu
