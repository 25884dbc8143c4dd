// Checkpoint files in HDF5 (the only code that includes hdf5.h). One file per rank; every
// piece a chunked dataset with HDF5's Fletcher32 checksum per chunk, shaped as the box of
// the global tensor it holds and carrying as attributes its global name, global shape and
// that box as a hyperslab (start, stride, count, block per dimension): a reader places it
// with H5Sselect_hyperslab(global, start, stride, count, block) alone, and `h5ls -r` /
// `h5dump -A` show a readable tree.
//
// Files of the earlier format ("llmtrain-checkpoint-1": each rank's tensor-parallel part of
// a tensor, or a range of its elements, per dataset, with attributes local_shape, tp_split,
// tp_blocks, tp_rank, tp_size and local_elements) are read too: their datasets are described
// as the boxes they hold (SavedTensor::boxes), and read whole.
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

// The file attributes "mesh_tp_dp_pp" (three values, as files before context parallelism
// wrote them) and "mesh_cp" (absent from those files: cp 1).
struct FileAttributes {
    int64_t step = 0;
    int world_rank = 0, world_size = 1;
    int tp = 1, dp = 1, pp = 1;
    int cp = 1;
};

// Writes path (replacing it) and syncs it to disk. between_tensors, if set, runs after each
// tensor (a test hook slows the writer down with it). Throws Error(io) naming the file and
// the tensor, with the system's reason.
void write_rank_file(const std::string& path, const RankSnapshot& snapshot, const FileAttributes& attributes,
                     const std::function<void()>& between_tensors = {});

// The format version of a rank file: 2 (pieces as boxes), or 1 (compatibility).
int rank_file_format(const std::string& format_attribute);

// Reads one rank file. Throws Error(data) naming the file (and the tensor) when it is not a
// checkpoint file, is damaged, or a chunk fails its checksum.
class RankFileReader {
public:
    // index = false: only the file's attributes are read, not every dataset's description
    // (a reader that knows the datasets from elsewhere).
    explicit RankFileReader(const std::string& path, bool index = true);
    ~RankFileReader();
    RankFileReader(const RankFileReader&) = delete;
    RankFileReader& operator=(const RankFileReader&) = delete;
    const std::string& path() const { return path_; }
    const FileAttributes& attributes() const { return attributes_; }
    int format() const { return format_; }
    // Every dataset's description (byte_offset unused).
    const std::vector<SavedTensor>& tensors() const { return tensors_; }
    // The values of one dataset as doubles (whatever its stored dtype), checksums verified.
    std::vector<double> read(const SavedTensor& tensor) const;
    // Every value of a dataset into `out` (tensor.numel() elements of dtype `as`, converted
    // from the stored dtype), checksums verified.
    void read_all(const SavedTensor& tensor, void* out, DType as) const;
    // The values of `part`, a box inside the dataset's single box (this format's datasets
    // are shaped as their box), into `out`: a row-major
    // buffer of dtype `as` and shape out_shape, at box position out_start (a hyperslab of
    // the memory: the rest of `out` is left as it is). Only the chunks that hold `part` are
    // read (and their checksums verified).
    void read_part(const SavedTensor& tensor, const GlobalBox& part, void* out, DType as, const Shape& out_shape, const Shape& out_start) const;

private:
    std::string path_;
    long long file_ = -1;  // hid_t
    int format_ = 2;
    FileAttributes attributes_;
    std::vector<SavedTensor> tensors_;
};

}  // namespace llmtrain
