// Fault injection for testing failure handling: LLMTRAIN_INJECT_FAULT=KIND:RANK:STEP makes
// world rank RANK, at the start of step STEP (1-based), either exit at once without any
// clean-up (KIND = exit: a crashed process) or stop making progress forever (KIND = hang).
// Unset, nothing happens; a malformed value is a config error naming the variable.
#pragma once

#include <cstdint>

namespace llmtrain {

void inject_fault_if_requested(int world_rank, int64_t step);

}  // namespace llmtrain
