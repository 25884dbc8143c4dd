#include "train/fault_injection.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"

namespace llmtrain {

void inject_fault_if_requested(int world_rank, int64_t step) {
    const char* spec = std::getenv("LLMTRAIN_INJECT_FAULT");
    if (!spec || !*spec) return;
    char kind[16] = {};
    int rank = -1;
    long long at_step = -1;
    if (std::sscanf(spec, "%15[a-z]:%d:%lld", kind, &rank, &at_step) != 3 || (std::string(kind) != "exit" && std::string(kind) != "hang"))
        fail(ErrorKind::config, "LLMTRAIN_INJECT_FAULT=\"", spec, "\": expected exit:RANK:STEP or hang:RANK:STEP");
    if (rank != world_rank || at_step != step) return;
    std::fprintf(stderr, "[rank %d] injected fault: %s at step %lld\n", world_rank, kind, at_step);
    std::fflush(stderr);
    if (std::string(kind) == "exit") std::_Exit(3);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace llmtrain
