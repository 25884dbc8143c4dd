// A checkpoint's tensors, whole. Each rank file holds parts of global tensors, every part
// saying where its values sit in the global tensor (checkpoint/rank_snapshot.h); a tensor is
// assembled from its parts in every rank file, whatever tp / pp / dp / ZeRO-1 layout saved
// it. Loading into a run (restore.h), export to Hugging Face (safetensors.h) and
// `llmtrain checkpoint inspect` all read checkpoints through this one index.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/hdf5_file.h"
#include "checkpoint/manifest.h"
#include "model/parameters.h"

namespace llmtrain {

// What a stored tensor is to its parameter.
enum class TensorRole { weights, exp_avg, exp_avg_sq };
const char* tensor_role_name(TensorRole role);  // "weights", "AdamW first moment", ...

// One rank file's part of a tensor.
struct TensorPart {
    const RankFileReader* file;
    const SavedTensor* tensor;
};

class CheckpointTensors {
public:
    // Opens every rank file the manifest lists. Throws Error(data) naming a file that is not
    // a readable checkpoint file.
    CheckpointTensors(const std::string& path, const Manifest& manifest);
    const std::string& path() const { return path_; }
    // The parts of parameter `name`'s tensor in this role, in rank-file order; empty if none.
    const std::vector<TensorPart>& parts(TensorRole role, const std::string& name) const;
    // The names of the parameters with a tensor in this role, in natural order (layer 2 before 10).
    std::vector<std::string> names(TensorRole role) const;
    // The global shape the parts of a tensor carry (the saved model's, padding rows included).
    // Throws Error(data) if the checkpoint holds no such tensor.
    Shape saved_shape(TensorRole role, const std::string& name) const;

private:
    using PartsByName = std::map<std::string, std::vector<TensorPart>>;
    std::string path_;
    std::vector<std::unique_ptr<RankFileReader>> files_;
    std::array<PartsByName, 3> parts_;
};

// The whole tensor `name` of this role, laid out row-major in global_shape. global_shape may
// differ from the saved one in its number of rows only (a vocabulary padded to another
// multiple): saved rows beyond it are left out, rows beyond the saved ones are zero. Throws
// Error(data) naming the file and the tensor when a part is missing, damaged, of another
// shape, or the parts do not cover the tensor.
std::vector<double> assemble_global_tensor(const CheckpointTensors& checkpoint, TensorRole role, const std::string& name, const Shape& global_shape);

// Fills this rank's part of parameter `index` (master weights, in their dtype) with
// value_at(global index) for each of its elements (tp_global_index: any tp layout).
void set_master_weights(Parameters& params, size_t index, Backend& backend, const std::function<double(int64_t global_index)>& value_at);

}  // namespace llmtrain
