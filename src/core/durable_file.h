// Files that are either complete and on disk or not there. Every write, fsync and close is
// checked, and an error names the file and gives the system's reason ("No space left on
// device", "Read-only file system"): a full disk must not pass for a finished dataset.
#pragma once

#include <string>

namespace llmtrain {

// A file written front to back: create (or truncate), append, then finish() makes it
// durable (fsync) and closes it. A file never finished is closed, not removed: its caller
// decides whether the partial bytes go (a staging directory, write_file_atomically).
class OutputFile {
public:
    explicit OutputFile(std::string path);
    ~OutputFile();
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;

    void append(const void* data, size_t bytes);
    void append(const std::string& bytes) { append(bytes.data(), bytes.size()); }
    void finish();
    const std::string& path() const { return path_; }

private:
    std::string path_;
    int fd_ = -1;
};

// path holds exactly `bytes`, fsynced; a partial file is left on failure (see OutputFile).
void write_file_durably(const std::string& path, const std::string& bytes);
// Through PATH.tmp, an fsync and a rename: path holds its old bytes or the new ones, never
// a part; the .tmp file is removed on failure.
void write_file_atomically(const std::string& path, const std::string& bytes);
// Makes the entries of a directory (files created, renamed or removed in it) durable.
void fsync_directory(const std::string& path);
// Makes a file another writer closed (an HDF5 file) durable.
void fsync_file(const std::string& path);

// Checked before long work, so that a mistyped or read-only output path fails in a second
// rather than after the work: `path` (a file or a directory to write, as `kind` says) is
// not the other kind where it exists, and its nearest existing ancestor is a directory this
// process may create entries in (the writer creates the missing directories between).
// Throws naming `option` (e.g. "--output") and the path: ErrorKind::config for a path that
// cannot be one (under a file, a directory given for a file), ErrorKind::io with the
// system's reason where the system refuses (read-only file system, permission).
enum class OutputKind { file, directory };
void require_creatable(const std::string& path, OutputKind kind, const std::string& option);

}  // namespace llmtrain
