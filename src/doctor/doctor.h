// `llmtrain doctor`'s checks of a node before a run. Each check has a name, a status and a
// one-line detail and hint; the command prints them as a table or JSON and exits 0 (every
// check passed or skipped), 1 (a warning) or 2 (a failure).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llmtrain {

enum class CheckStatus { pass, skip, warn, fail };  // in rising severity
const char* check_status_name(CheckStatus status);  // "PASS", "SKIP", "WARN", "FAIL"

struct CheckResult {
    std::string name;    // "storage.free_space"
    CheckStatus status = CheckStatus::pass;
    std::string detail;  // what was measured
    std::string hint;    // what to do about a WARN or FAIL (or why a SKIP)
};

// The checkpoint directory: exists or can be made, writable; free space against
// keep_checkpoints checkpoints of checkpoint_bytes (FAIL below one, WARN below all of them);
// sustained write and read MB/s of a test_bytes file (written, fsynced, re-read after its
// pages were dropped from the cache where the kernel allows); fsync + rename (the commit
// protocol of checkpoints); flock() exclusive locks (what HDF5's file locking uses).
std::vector<CheckResult> check_checkpoint_storage(const std::string& dir, uint64_t checkpoint_bytes, int64_t keep_checkpoints, uint64_t test_bytes);

// Host memory available per rank against what a rank needs (0: not known), cores per rank.
CheckResult check_host_memory(uint64_t needed_bytes_per_rank, int ranks_on_node);
CheckResult check_host_cores(int ranks_on_node);

// The GPUs this process sees (CUDA build, driver, devices), or SKIP with the reason.
CheckResult check_gpu_devices();

std::string format_checks(const std::vector<CheckResult>& checks);
std::string checks_to_json(const std::vector<CheckResult>& checks);
// 0: every check passed or skipped; 1: a warning; 2: a failure.
int doctor_exit_code(const std::vector<CheckResult>& checks);

}  // namespace llmtrain
