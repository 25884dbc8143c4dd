#include "core/directory_lock.h"

#include <cerrno>
#include <csignal>
#include <cstring>
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

// Where the storage refuses to be written (read-only, full, over quota, not permitted) the run
// cannot save anything: Error(storage), exit 74, "fix the storage"; any other failure (a path
// through a file) is Error(io).
ErrorKind kind_of_write_failure(int error) {
    return error == EROFS || error == ENOSPC || error == EDQUOT || error == EACCES || error == EPERM ? ErrorKind::storage : ErrorKind::io;
}

void write_holder(int fd, const std::string& path, const std::string& holder) {
    const std::string line = holder + "\n";
    if (::ftruncate(fd, 0) == 0 && ::pwrite(fd, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0) return;
    const int reason = errno;
    fail(kind_of_write_failure(reason), "cannot write the lock file '", path, "': ", std::strerror(reason));
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

std::string lock_holder_of_this_process() { return cat("host ", this_host(), " pid ", ::getpid(), " since ", utc_timestamp()); }

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) fail(kind_of_write_failure(ec.value()), "cannot create ", what, " '", dir, "': ", ec.message());
    path_ = (std::filesystem::path(dir) / kLockFile).string();
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
        const int reason = errno;
        fail(kind_of_write_failure(reason), what, " '", dir, "': cannot open its lock file '", path_, "': ", std::strerror(reason));
    }
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
