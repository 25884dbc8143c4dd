#include "train/fault_injection.h"

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <iterator>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "core/error.h"
#include "core/exit_code.h"

namespace llmtrain {

namespace {

bool is_rank_kind(const std::string& kind) {
    const std::string kinds[] = {"exit", "hang", "stop", "abort", "hardware", "nan", "bitflip", "localfull"};
    return std::find(std::begin(kinds), std::end(kinds), kind) != std::end(kinds);
}

}  // namespace

FaultPlan FaultPlan::parse(const std::string& spec, const std::string& source) {
    FaultPlan plan;
    std::stringstream items(spec);
    std::string item;
    while (std::getline(items, item, ',')) {
        char kind[16] = {};
        char first[32] = {}, second[32] = {};
        char end = 0;
        Fault f;
        const bool three_fields = std::sscanf(item.c_str(), "%15[a-z]:%31[^:]:%31[^:]%c", kind, first, second, &end) == 3;
        f.kind = kind;
        char* rest = nullptr;
        if (three_fields && is_rank_kind(f.kind)) {
            f.rank = static_cast<int>(std::strtol(first, &rest, 10));
            if (*rest == 0) f.step = std::strtoll(second, &rest, 10);
        } else if (three_fields && (f.kind == "spike" || f.kind == "lr" || f.kind == "slowcommit")) {
            f.step = std::strtoll(first, &rest, 10);
            if (*rest == 0) f.factor = std::strtod(second, &rest);
        } else if (three_fields && f.kind == "commitfail") {
            f.step = std::strtoll(first, &rest, 10);
            f.how = second;
            if (f.how != "error" && f.how != "filesystem") rest = nullptr;
        }
        if (!rest || *rest != 0 || f.step < 1)
            fail(ErrorKind::config, source, "=\"", spec, "\": '", item,
                 "': expected KIND:RANK:STEP with KIND one of exit, hang, stop, abort, hardware, nan, bitflip, localfull, or spike:STEP:FACTOR, lr:STEP:FACTOR,"
                 " commitfail:STEP:error, commitfail:STEP:filesystem or slowcommit:STEP:SECONDS (several separated by commas)");
        plan.faults_.push_back(f);
    }
    return plan;
}

FaultPlan fault_plan_from_environment() {
    const char* spec = std::getenv("LLMTRAIN_INJECT_FAULT");
    if (!spec || !*spec) return {};
    return FaultPlan::parse(spec, "LLMTRAIN_INJECT_FAULT");
}

bool FaultPlan::requested(const std::string& kind, int world_rank, int64_t step) const {
    for (const Fault& f : faults_)
        if (f.kind == kind && f.rank == world_rank && f.step == step) return true;
    return false;
}

bool FaultPlan::nonfinite_gradients(int world_rank, int64_t step) const { return requested("nan", world_rank, step); }

bool FaultPlan::bit_flip(int world_rank, int64_t step) {
    if (!requested("bitflip", world_rank, step) || flipped_.count(step)) return false;
    flipped_.insert(step);
    return true;
}

double FaultPlan::spike_factor(int64_t data_step) const {
    double factor = 1;
    for (const Fault& f : faults_)
        if (f.kind == "spike" && f.step == data_step) factor *= f.factor;
    return factor;
}

double FaultPlan::lr_factor(int64_t step) const {
    double factor = 1;
    for (const Fault& f : faults_)
        if (f.kind == "lr" && step >= f.step) factor *= f.factor;
    return factor;
}

void FaultPlan::strike_commit(int64_t step, std::string_view commit_step) const {
    for (const Fault& f : faults_) {
        if (f.step != step) continue;
        if (f.kind == "slowcommit" && commit_step == "read rank records") std::this_thread::sleep_for(std::chrono::duration<double>(f.factor));
        if (f.kind == "commitfail" && f.how == "error" && commit_step == "write manifest")
            fail(ErrorKind::io, "injected failure of the commit of step ", step, " (LLMTRAIN_INJECT_FAULT commitfail)");
        if (f.kind == "commitfail" && f.how == "filesystem" && commit_step == "rename")
            throw std::filesystem::filesystem_error("injected rename failure of the commit of step " + std::to_string(step), std::make_error_code(std::errc::io_error));
    }
}

void FaultPlan::strike_if_due(int world_rank, int64_t step) const {
    for (const std::string injected : {"exit", "abort", "hardware", "hang", "stop"}) {
        if (!requested(injected, world_rank, step)) continue;
        // The pid lets a test end a stopped process once the job is over.
        std::fprintf(stderr, "[rank %d] injected fault: %s at step %lld (pid %d)\n", world_rank, injected.c_str(), static_cast<long long>(step),
                     static_cast<int>(getpid()));
        std::fflush(stderr);
        if (injected == "stop") {
            raise(SIGSTOP);
            continue;  // continued (SIGCONT): the run goes on
        }
        if (injected == "exit") std::_Exit(exit_failure);  // a crash, which a supervisor restarts (not 3: diverged)
        if (injected == "abort") std::abort();
        if (injected == "hardware") fail(ErrorKind::hardware, "step ", step, ": injected uncorrectable ECC error on this rank's device");
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
}

void FaultPlan::strike_local_snapshot(int world_rank, int64_t step) const {
    if (requested("localfull", world_rank, step))
        fail(ErrorKind::io, "cannot write the local snapshot of step ", step, ": No space left on device (injected: LLMTRAIN_INJECT_FAULT localfull)");
}

}  // namespace llmtrain
