#include "doctor/doctor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <sys/file.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"

namespace llmtrain {

namespace fs = std::filesystem;

namespace {

constexpr double MB = 1e6;

std::string megabytes(uint64_t bytes) { return cat(static_cast<double>(static_cast<uint64_t>(static_cast<double>(bytes) / MB * 10)) / 10, " MB"); }
std::string system_error() { return std::strerror(errno); }

CheckResult result(const std::string& name, CheckStatus status, std::string detail, std::string hint = "") {
    return {name, status, std::move(detail), std::move(hint)};
}

// Writes `bytes` in 4 MB blocks and fsyncs; returns MB/s, or throws Error(io).
double timed_write(const std::string& path, uint64_t bytes) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) fail(ErrorKind::io, "cannot create '", path, "': ", system_error());
    std::vector<char> block(4 << 20, 'x');
    const auto start = std::chrono::steady_clock::now();
    for (uint64_t done = 0; done < bytes;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), bytes - done));
        const ssize_t w = ::write(fd, block.data(), n);
        if (w <= 0) {
            const std::string why = system_error();
            ::close(fd);
            fail(ErrorKind::io, "writing '", path, "' failed after ", megabytes(done), ": ", why);
        }
        done += static_cast<uint64_t>(w);
    }
    if (::fsync(fd) != 0) {
        const std::string why = system_error();
        ::close(fd);
        fail(ErrorKind::io, "fsync of '", path, "' failed: ", why);
    }
    ::close(fd);
    return static_cast<double>(bytes) / MB / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Reads the file back after asking the kernel to drop its cached pages (a hint: a
// filesystem may keep them, and the figure is then the page cache's).
double timed_read(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) fail(ErrorKind::io, "cannot open '", path, "': ", system_error());
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    std::vector<char> block(4 << 20);
    uint64_t total = 0;
    const auto start = std::chrono::steady_clock::now();
    for (ssize_t r; (r = ::read(fd, block.data(), block.size())) > 0;) total += static_cast<uint64_t>(r);
    ::close(fd);
    return static_cast<double>(total) / MB / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

CheckResult check_free_space(const std::string& dir, uint64_t checkpoint_bytes, int64_t keep) {
    std::error_code ec;
    const fs::space_info space = fs::space(dir, ec);
    if (ec) return result("storage.free_space", CheckStatus::fail, cat("cannot stat '", dir, "': ", ec.message()));
    const std::string detail = cat(megabytes(space.available), " free; a checkpoint is about ", megabytes(checkpoint_bytes), ", ", keep, " kept");
    if (space.available < checkpoint_bytes)
        return result("storage.free_space", CheckStatus::fail, detail, "not even one checkpoint fits: free space or choose another checkpoint.dir");
    if (space.available < checkpoint_bytes * static_cast<uint64_t>(keep))
        return result("storage.free_space", CheckStatus::warn, detail, "fewer than checkpoint.keep_last + 1 checkpoints fit: saves will fail later");
    return result("storage.free_space", CheckStatus::pass, detail);
}

CheckResult check_throughput(const std::string& dir, uint64_t test_bytes, uint64_t checkpoint_bytes) {
    const std::string path = (fs::path(dir) / ".llmtrain-doctor.bin").string();
    try {
        const double write_mbps = timed_write(path, test_bytes);
        const double read_mbps = timed_read(path);
        fs::remove(path);
        const double save_seconds = static_cast<double>(checkpoint_bytes) / MB / write_mbps;
        return result("storage.throughput", CheckStatus::pass,
                      cat("write ", static_cast<int64_t>(write_mbps), " MB/s, read ", static_cast<int64_t>(read_mbps), " MB/s (", megabytes(test_bytes),
                          " file, fsynced); a checkpoint saves in about ", static_cast<int64_t>(save_seconds + 0.5), " s"));
    } catch (const Error& e) {
        std::error_code ignored;
        fs::remove(path, ignored);
        return result("storage.throughput", CheckStatus::fail, e.what(), "the disk is full or failing: free space or choose another checkpoint.dir");
    }
}

// The commit protocol's two steps: fsync of a file and an atomic rename over another.
CheckResult check_fsync_rename(const std::string& dir) {
    const std::string a = (fs::path(dir) / ".llmtrain-doctor.tmp").string(), b = (fs::path(dir) / ".llmtrain-doctor.latest").string();
    std::error_code ec;
    try {
        timed_write(b, 16);
        timed_write(a, 16);
        fs::rename(a, b, ec);
        if (ec) fail(ErrorKind::io, "rename '", a, "' over '", b, "': ", ec.message());
        fs::remove(b);
        return result("storage.fsync_rename", CheckStatus::pass, "fsync and rename over an existing file work");
    } catch (const Error& e) {
        fs::remove(a, ec);
        fs::remove(b, ec);
        return result("storage.fsync_rename", CheckStatus::fail, e.what(), "checkpoints cannot be committed crash-safely here");
    }
}

CheckResult check_file_locking(const std::string& dir) {
    const std::string path = (fs::path(dir) / ".llmtrain-doctor.lock").string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd < 0) return result("storage.file_locking", CheckStatus::fail, cat("cannot create '", path, "': ", system_error()));
    const bool locked = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    const std::string why = locked ? "" : system_error();
    if (locked) ::flock(fd, LOCK_UN);
    ::close(fd);
    std::error_code ec;
    fs::remove(path, ec);
    if (!locked)
        return result("storage.file_locking", CheckStatus::fail, cat("flock: ", why), "HDF5 cannot lock its files here: export HDF5_USE_FILE_LOCKING=FALSE");
    return result("storage.file_locking", CheckStatus::pass, "exclusive flock() works (HDF5's file locking)");
}

}  // namespace

const char* check_status_name(CheckStatus status) {
    switch (status) {
        case CheckStatus::pass: return "PASS";
        case CheckStatus::skip: return "SKIP";
        case CheckStatus::warn: return "WARN";
        case CheckStatus::fail: return "FAIL";
    }
    return "?";
}

namespace {
// The outermost directory of path that does not exist yet (what create_directories would
// make first); empty when path exists.
fs::path first_missing_directory(const fs::path& path) {
    std::error_code ec;
    fs::path missing;
    for (fs::path p = fs::absolute(path, ec).lexically_normal(); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
        missing = p;
        if (p == p.parent_path()) break;
    }
    return missing;
}

std::vector<CheckResult> storage_checks(const std::string& dir, uint64_t checkpoint_bytes, int64_t keep_checkpoints, uint64_t test_bytes);
}  // namespace

std::vector<CheckResult> check_checkpoint_storage(const std::string& dir, uint64_t checkpoint_bytes, int64_t keep_checkpoints, uint64_t test_bytes) {
    // A directory made only to be checked is removed again: doctor leaves no trace behind.
    const fs::path made = first_missing_directory(dir);
    std::vector<CheckResult> checks = storage_checks(dir, checkpoint_bytes, keep_checkpoints, test_bytes);
    std::error_code ec;
    if (made.empty()) return checks;
    fs::remove_all(made, ec);
    if (checks.front().status == CheckStatus::pass)
        checks.front().detail = cat("'", dir, "' does not exist yet: it can be made and is writable (made for the checks and removed again)");
    return checks;
}

namespace {
std::vector<CheckResult> storage_checks(const std::string& dir, uint64_t checkpoint_bytes, int64_t keep_checkpoints, uint64_t test_bytes) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec || !fs::is_directory(dir))
        return {result("storage.directory", CheckStatus::fail, cat("cannot create '", dir, "': ", ec ? ec.message() : "not a directory"),
                       "choose a checkpoint.dir on a writable filesystem")};
    if (::access(dir.c_str(), W_OK) != 0)
        return {result("storage.directory", CheckStatus::fail, cat("'", dir, "' is not writable: ", system_error()), "choose a writable checkpoint.dir")};
    std::vector<CheckResult> checks{result("storage.directory", CheckStatus::pass, cat("'", dir, "' exists and is writable"))};
    checks.push_back(check_fsync_rename(dir));
    if (checks.back().status == CheckStatus::fail) {
        // A read-only filesystem lets access() pass for root: the first write tells.
        checks.front() = result("storage.directory", CheckStatus::fail, checks.back().detail, "choose a writable checkpoint.dir");
        checks.pop_back();
        return checks;
    }
    checks.push_back(check_free_space(dir, checkpoint_bytes, keep_checkpoints));
    const fs::space_info space = fs::space(dir, ec);
    // Half the free space at most: the check must not fill the disk it checks.
    const uint64_t bytes = ec ? test_bytes : std::min<uint64_t>(test_bytes, space.available / 2);
    checks.push_back(check_throughput(dir, std::max<uint64_t>(bytes, 4096), checkpoint_bytes));
    checks.push_back(check_file_locking(dir));
    return checks;
}
}  // namespace

CheckResult check_host_memory(uint64_t needed_bytes_per_rank, int ranks_on_node) {
    const uint64_t per_rank = host_available_memory_bytes() / static_cast<uint64_t>(std::max(1, ranks_on_node));
    const std::string detail = cat(megabytes(per_rank), " available per rank (", ranks_on_node, " rank(s) on this node)",
                                   needed_bytes_per_rank ? cat("; the run needs ", megabytes(needed_bytes_per_rank)) : "");
    if (needed_bytes_per_rank > per_rank) return result("host.memory", CheckStatus::fail, detail, "fewer ranks per node, or a smaller batch / model");
    return result("host.memory", CheckStatus::pass, detail);
}

CheckResult check_host_cores(int ranks_on_node) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const std::string detail = cat(cores, " core(s) for ", ranks_on_node, " rank(s) on this node");
    if (cores < ranks_on_node) return result("host.cores", CheckStatus::warn, detail, "ranks share cores: CPU training will crawl (fewer ranks per node)");
    return result("host.cores", CheckStatus::pass, detail);
}

CheckResult check_gpu_devices() {
    // Said as doctor's finding, not as a training run's refusal: without a CUDA build or a
    // driver there is nothing to count (gpu.driver tells the versions).
    if (!cuda_backend_built()) return result("gpu.devices", CheckStatus::skip, "this llmtrain was built without CUDA", "GPU checks need a CUDA build and a GPU");
    if (cuda_versions().driver <= 0) return result("gpu.devices", CheckStatus::skip, "no NVIDIA driver on this node (gpu.driver)", "GPU checks need a GPU and its driver");
    try {
        const int count = cuda_device_count();
        if (count == 0) return result("gpu.devices", CheckStatus::skip, "no GPU", "GPU checks need a GPU");
        return result("gpu.devices", CheckStatus::pass, cat(count, " GPU(s) visible; ", megabytes(cuda_free_memory_bytes(0)), " free on GPU 0"));
    } catch (const Error& e) {
        return result("gpu.devices", CheckStatus::skip, e.what(), "GPU checks need a CUDA build and a GPU");
    }
}

std::string format_checks(const std::vector<CheckResult>& checks) {
    size_t width = 5;
    for (const CheckResult& c : checks) width = std::max(width, c.name.size());
    std::string out = cat("check", std::string(width - 5 + 2, ' '), "status  detail\n");
    for (const CheckResult& c : checks) {
        out += cat(c.name, std::string(width - c.name.size() + 2, ' '), check_status_name(c.status), "    ", c.detail, "\n");
        if (!c.hint.empty() && c.status != CheckStatus::pass) out += cat(std::string(width + 10, ' '), "hint: ", c.hint, "\n");
    }
    return out;
}

std::string checks_to_json(const std::vector<CheckResult>& checks) {
    nlohmann::json list = nlohmann::json::array();
    for (const CheckResult& c : checks) list.push_back({{"check", c.name}, {"status", check_status_name(c.status)}, {"detail", c.detail}, {"hint", c.hint}});
    return nlohmann::json{{"checks", list}, {"exit_code", doctor_exit_code(checks)}}.dump();
}

int doctor_exit_code(const std::vector<CheckResult>& checks) {
    CheckStatus worst = CheckStatus::pass;
    for (const CheckResult& c : checks) worst = std::max(worst, c.status);
    return worst == CheckStatus::fail ? 2 : worst == CheckStatus::warn ? 1 : 0;
}

}  // namespace llmtrain
