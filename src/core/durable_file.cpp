#include "core/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace llmtrain {

namespace fs = std::filesystem;

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(ErrorKind::io, "cannot create '", path_, "': ", std::strerror(errno));
}

OutputFile::~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
}

void OutputFile::append(const void* data, size_t bytes) {
    if (fd_ < 0) fail(ErrorKind::runtime, "'", path_, "' is already finished");
    const char* next = static_cast<const char*>(data);
    while (bytes > 0) {
        const ssize_t n = ::write(fd_, next, bytes);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail(ErrorKind::io, "cannot write '", path_, "': ", std::strerror(errno));
        next += n;
        bytes -= static_cast<size_t>(n);
    }
}

// On NFS and tmpfs-like filesystems a full disk may surface only at fsync or close.
void OutputFile::finish() {
    if (::fsync(fd_) != 0) fail(ErrorKind::io, "cannot write '", path_, "' to disk (fsync): ", std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(ErrorKind::io, "cannot write '", path_, "' (close): ", std::strerror(errno));
}

void write_file_durably(const std::string& path, const std::string& bytes) {
    OutputFile file(path);
    file.append(bytes);
    file.finish();
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
    const std::string tmp = path + ".tmp";
    try {
        write_file_durably(tmp, bytes);
        if (::rename(tmp.c_str(), path.c_str()) != 0) fail(ErrorKind::io, "cannot rename '", tmp, "' to '", path, "': ", std::strerror(errno));
    } catch (...) {
        ::unlink(tmp.c_str());
        throw;
    }
    fsync_directory(fs::path(path).parent_path().string());
}

void fsync_directory(const std::string& path) {
    const std::string dir = path.empty() ? "." : path;
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) fail(ErrorKind::io, "cannot open directory '", dir, "': ", std::strerror(errno));
    const int status = ::fsync(fd);
    const int reason = errno;
    ::close(fd);
    if (status != 0) fail(ErrorKind::io, "cannot write directory '", dir, "' to disk (fsync): ", std::strerror(reason));
}

void fsync_file(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(ErrorKind::io, "cannot open '", path, "': ", std::strerror(errno));
    const int status = ::fsync(fd);
    const int reason = errno;
    ::close(fd);
    if (status != 0) fail(ErrorKind::io, "cannot write '", path, "' to disk (fsync): ", std::strerror(reason));
}

void require_creatable(const std::string& path, OutputKind kind, const std::string& option) {
    std::error_code ec;
    const fs::path target = fs::absolute(path, ec);
    if (ec || path.empty()) fail(ErrorKind::config, option, " '", path, "' is not a usable path");
    const fs::file_status status = fs::status(target, ec);
    if (fs::exists(status)) {
        if (kind == OutputKind::file && fs::is_directory(status)) fail(ErrorKind::config, option, " '", path, "' is a directory; give a file name");
        if (kind == OutputKind::directory && !fs::is_directory(status)) fail(ErrorKind::config, option, " '", path, "' exists and is not a directory");
    }
    fs::path ancestor = fs::exists(status) && kind == OutputKind::directory ? target : target.parent_path();
    while (!ancestor.empty() && !fs::exists(ancestor, ec)) ancestor = ancestor.parent_path();
    if (!fs::is_directory(ancestor, ec)) fail(ErrorKind::config, option, " '", path, "': '", ancestor.string(), "' is not a directory");
    if (::access(ancestor.c_str(), W_OK | X_OK) != 0)
        fail(ErrorKind::io, option, " '", path, "' cannot be written: '", ancestor.string(), "': ", std::strerror(errno));
}

}  // namespace llmtrain
