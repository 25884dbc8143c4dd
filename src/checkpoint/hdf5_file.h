// Checkpoint files in HDF5 (the only code that includes hdf5.h). One file per rank; every
// tensor a chunked dataset with HDF5's Fletcher32 checksum per chunk, carrying as attributes
// its global name, global shape, tensor-parallel split, the elements of the local part it
// holds, and the hyperslab (start, stride, count, block per dimension) of the global tensor
// that the local part covers, so `h5ls -r` / `h5dump -A` show a readable tree.
//
// Debian's libhdf5 is serial and thread-safe only through one global lock: every call is
// made from one thread at a time (the checkpoint writer thread, or the main thread while no
// save is in flight).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "checkpoint/rank_snapshot.h"

namespace llmtrain {

struct FileAttributes {
    int64_t step = 0;
    int world_rank = 0, world_size = 1;
    int tp = 1, dp = 1, pp = 1;
};

// Writes path (replacing it) and syncs it to disk. between_tensors, if set, runs after each
// tensor (a test hook slows the writer down with it). Throws Error(io) naming the file and
// the tensor, with the system's reason.
void write_rank_file(const std::string& path, const RankSnapshot& snapshot, const FileAttributes& attributes,
                     const std::function<void()>& between_tensors = {});

// Reads one rank file. Throws Error(data) naming the file (and the tensor) when it is not a
// checkpoint file, is damaged, or a chunk fails its checksum.
class RankFileReader {
public:
    explicit RankFileReader(const std::string& path);
    ~RankFileReader();
    RankFileReader(const RankFileReader&) = delete;
    RankFileReader& operator=(const RankFileReader&) = delete;
    const std::string& path() const { return path_; }
    const FileAttributes& attributes() const { return attributes_; }
    // Every tensor's description (byte_offset unused).
    const std::vector<SavedTensor>& tensors() const { return tensors_; }
    // The values of one tensor as doubles (whatever its stored dtype), checksums verified.
    std::vector<double> read(const SavedTensor& tensor) const;

private:
    std::string path_;
    long long file_ = -1;  // hid_t
    FileAttributes attributes_;
    std::vector<SavedTensor> tensors_;
};

}  // namespace llmtrain
