// One process per directory. Two `llmtrain train` started on one run directory or one
// checkpoint.dir (a leftover job of an earlier allocation, a double sbatch) would both
// resume from the same checkpoint, pass over each other's saves in flight as incomplete and
// append to one log: the second is refused at the door instead.
//
// The lock is an exclusive flock(2) on DIR/.llmtrain.lock, held for the life of the object:
// the kernel (or the NFS lock manager) releases it when the holder dies, however it dies. The
// file names its holder (host, pid, start time) for the refusal's message. A file still naming
// a holder when the lock is free was left by a process that is gone: it is taken over, and said
// once. A clean release empties it.
#pragma once

#include <string>

namespace llmtrain {

class DirectoryLock {
public:
    // Takes the lock of dir (made if missing) for `what` ("run directory", "checkpoint.dir").
    // Error(config) naming the directory, the holder and the lock file when another process
    // holds it; when the directory or the lock file cannot be made, Error(storage) (exit 74)
    // where the storage refuses writes (read-only, full, over quota, not permitted), else
    // Error(io). Where the file system has no
    // flock (ENOSYS, ENOLCK, EOPNOTSUPP), a holder named in the file on this host that is
    // alive still refuses; others are taken over with a warning.
    DirectoryLock(const std::string& dir, const std::string& what);
    ~DirectoryLock();
    DirectoryLock(const DirectoryLock&) = delete;
    DirectoryLock& operator=(const DirectoryLock&) = delete;

    const std::string& path() const { return path_; }

private:
    std::string path_;
    int fd_ = -1;
};

// "host NAME pid PID since TIME": how a lock names this process.
std::string lock_holder_of_this_process();

}  // namespace llmtrain
