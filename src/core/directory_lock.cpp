#include "core/directory_lock.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <filesystem>
#include <sstream>
#include <sys/file.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"

namespace llmtrain {

namespace {

constexpr const char* kLockFile = ".llmtrain.lock";

std::string this_host() {
    char name[256] = {};
    if (gethostname(name, sizeof name - 1) != 0) return "unknown";
    return name;
}

std::string read_all(int fd) {
    std::string text;
    char buffer[512];
    off_t offset = 0;
    for (ssize_t n; (n = ::pread(fd, buffer, sizeof buffer, offset)) > 0; offset += n) text.append(buffer, static_cast<size_t>(n));
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    return text;
}

void write_holder(int fd, const std::string& path, const std::string& holder) {
    const std::string line = holder + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()) || ::fsync(fd) != 0)
        fail(ErrorKind::storage, "cannot write the lock file '", path, "': ", std::strerror(errno));
}

// A holder the lock file names, alive on this host: the judgment left where flock is missing.
bool names_live_process_here(const std::string& holder) {
    std::istringstream in(holder);
    std::string host_key, host, pid_key;
    long pid = 0;
    if (!(in >> host_key >> host >> pid_key >> pid) || host_key != "host" || pid_key != "pid" || host != this_host() || pid <= 0 || pid == ::getpid())
        return false;
    return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

bool flock_unsupported(int error) { return error == ENOSYS || error == ENOLCK || error == EOPNOTSUPP || error == EINVAL; }

}  // namespace

std::string lock_holder_of_this_process() {
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm utc{};
    gmtime_r(&now, &utc);
    char since[32];
    std::strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", &utc);
    return cat("host ", this_host(), " pid ", ::getpid(), " since ", since);
}

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) fail(ErrorKind::storage, what, " '", dir, "': cannot create it: ", ec.message());
    path_ = (std::filesystem::path(dir) / kLockFile).string();
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(ErrorKind::storage, what, " '", dir, "': cannot open its lock file '", path_, "': ", std::strerror(errno));
    const std::string previous = read_all(fd_);
    const auto refuse = [&](const std::string& holder) {
        ::close(fd_);
        fd_ = -1;
        fail(ErrorKind::config, what, " '", dir, "' is in use by another llmtrain (", holder.empty() ? "holder unknown" : holder, ", lock file '", path_,
             "'): one process trains a run; stop that one first, or give this one its own directory");
    };
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int reason = errno;
        if (reason == EWOULDBLOCK) refuse(previous);
        if (!flock_unsupported(reason)) {
            ::close(fd_);
            fd_ = -1;
            fail(ErrorKind::io, what, " '", dir, "': cannot lock '", path_, "': ", std::strerror(reason));
        }
        if (names_live_process_here(previous)) refuse(previous);
        log_warn(what, " '", dir, "': its file system cannot lock files (flock: ", std::strerror(reason),
                 "); a second process on another host would not be refused");
    } else if (!previous.empty()) {
        log_warn(what, " '", dir, "': took over the lock that ", previous, " left (that process is gone)");
    }
    write_holder(fd_, path_, lock_holder_of_this_process());
}

DirectoryLock::~DirectoryLock() {
    if (fd_ < 0) return;
    // Emptied while still held: the next process finds no holder to take over from.
    if (::ftruncate(fd_, 0) == 0) ::fsync(fd_);
    ::close(fd_);
}

}  // namespace llmtrain
