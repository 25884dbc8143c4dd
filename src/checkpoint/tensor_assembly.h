// A checkpoint's tensors as their pieces: every rank file's datasets, each a box (or, in the
// earlier format, several) of a global tensor in some role (checkpoint/rank_snapshot.h). A
// reader asks for local elements of a tensor as its own layout holds them; they are read by
// intersecting the boxes they lie in with the stored ones, each intersection one HDF5
// hyperslab read in the stored dtype straight into the destination: no whole tensors, no
// conversions element by element. Loading into a run (state_load.h), export to Hugging Face
// (safetensors.h) and `llmtrain checkpoint inspect` all read checkpoints through this index.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/hdf5_file.h"
#include "checkpoint/manifest.h"
#include "parallel/comm.h"
#include "parallel/placement.h"

namespace llmtrain {

// One stored piece: a dataset of rank file `file` (the manifest's order).
struct StoredPiece {
    int file = 0;
    SavedTensor tensor;
};

class CheckpointTensors {
public:
    // Opens every rank file the manifest lists and reads its index. Throws Error(data) naming
    // a file that is not a readable checkpoint file.
    CheckpointTensors(const std::string& path, const Manifest& manifest);
    // The same index, each rank reading that of the files f with f % world.size() ==
    // world.rank() and the ranks exchanging them: a collective over `world`.
    CheckpointTensors(const std::string& path, const Manifest& manifest, Comm& world);
    ~CheckpointTensors();
    const std::string& path() const { return path_; }
    // The pieces of tensor `name` in this role, in rank-file order; empty if none.
    const std::vector<const StoredPiece*>& pieces(TensorRole role, const std::string& name) const;
    // The names of the tensors with pieces in this role, in natural order (layer 2 before 10).
    std::vector<std::string> names(TensorRole role) const;
    // The global shape the pieces of a tensor carry (the saved model's, padding rows
    // included). Throws Error(data) if the checkpoint holds no such tensor.
    Shape saved_shape(TensorRole role, const std::string& name) const;
    // The file a piece is in.
    const std::string& file_path(int file) const { return file_paths_.at(static_cast<size_t>(file)); }
    int file_format(int file) const { return file_formats_.at(static_cast<size_t>(file)); }

    // Local elements `local` of tensor `t` (as this run's layout holds it) in a role, into
    // `out`: local.size() elements of dtype `as` in host memory. The saved global shape may
    // differ in its number of rows only (a vocabulary padded to another multiple): saved rows
    // beyond this model's are left out, rows beyond the saved ones are zero. Throws
    // Error(data) naming the file, the tensor and the ranges when the pieces miss part of
    // them, overlap, or hold another shape.
    void read(TensorRole role, const TensorPlace& t, FlatRange local, void* out, DType as) const;

private:
    using PiecesByName = std::map<std::string, std::vector<const StoredPiece*>>;
    void add(StoredPiece piece);
    const RankFileReader& reader(int file) const;
    void read_box(TensorRole role, const TensorPlace& t, const GlobalBox& wanted, char* out, DType as) const;

    std::string path_;
    std::vector<std::string> file_paths_;
    std::vector<int> file_formats_;
    std::vector<std::unique_ptr<StoredPiece>> stored_;
    std::array<PiecesByName, 3> pieces_;
    mutable std::vector<std::unique_ptr<RankFileReader>> readers_;  // opened on first use
    // The earlier format's datasets are read whole: the last one read, kept for its next boxes.
    mutable const StoredPiece* cached_ = nullptr;
    mutable std::vector<char> cached_values_;
    mutable DType cached_dtype_ = DType::f32;
};

// The whole tensor `name` of this role, laid out row-major in global_shape (which may differ
// from the saved one in its rows, as for read()): what an export writes.
std::vector<double> assemble_global_tensor(const CheckpointTensors& checkpoint, TensorRole role, const std::string& name, const Shape& global_shape);

}  // namespace llmtrain
