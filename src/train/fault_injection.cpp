#include "train/fault_injection.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"

namespace llmtrain {

namespace {
// The fault LLMTRAIN_INJECT_FAULT asks of this rank at this step, or "".
std::string requested_fault(int world_rank, int64_t step) {
    const char* spec = std::getenv("LLMTRAIN_INJECT_FAULT");
    if (!spec || !*spec) return "";
    char kind[16] = {};
    int rank = -1;
    long long at_step = -1;
    const std::string known[] = {"exit", "hang", "abort", "hardware", "nan"};
    if (std::sscanf(spec, "%15[a-z]:%d:%lld", kind, &rank, &at_step) != 3 || std::find(std::begin(known), std::end(known), kind) == std::end(known))
        fail(ErrorKind::config, "LLMTRAIN_INJECT_FAULT=\"", spec, "\": expected KIND:RANK:STEP with KIND one of exit, hang, abort, hardware, nan");
    if (rank != world_rank || at_step != step) return "";
    return kind;
}
}  // namespace

bool injected_nonfinite_gradients(int world_rank, int64_t step) { return requested_fault(world_rank, step) == "nan"; }

void inject_fault_if_requested(int world_rank, int64_t step) {
    const std::string injected = requested_fault(world_rank, step);
    if (injected.empty() || injected == "nan") return;
    std::fprintf(stderr, "[rank %d] injected fault: %s at step %lld\n", world_rank, injected.c_str(), static_cast<long long>(step));
    std::fflush(stderr);
    if (injected == "exit") std::_Exit(3);
    if (injected == "abort") std::abort();
    if (injected == "hardware") fail(ErrorKind::hardware, "step ", step, ": injected uncorrectable ECC error on this rank's device");
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace llmtrain
