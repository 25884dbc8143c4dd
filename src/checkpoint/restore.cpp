#include "checkpoint/restore.h"

#include <filesystem>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/hdf5_file.h"
#include "core/error.h"
#include "parallel/parameter_store.h"

namespace llmtrain {

FlatOps backend_ops(Backend& backend) {
    return {[&backend](const Tensor& x) { backend.fill_zero(x); }, [&backend](const Tensor& out, const Tensor& a, const Tensor& b) { backend.add(out, a, b); },
            [&backend](const Tensor& out, const Tensor& in) { backend.copy(out, in); }};
}

ReadTensor checkpoint_reader(const CheckpointTensors& checkpoint, Backend& backend) {
    return [&checkpoint, &backend](TensorRole role, const TensorPlace& t, FlatRange local, const Tensor& out) {
        read_to(out, backend, [&](void* host, DType as) { checkpoint.read(role, t, local, host, as); });
    };
}

void load_checkpoint_weights(const std::string& path, const Manifest& manifest, Parameters& params, Backend& backend) {
    // One rank holding everything: one cut of the whole buffer, nothing shared.
    PlacementSpec spec;
    spec.tensors = tensor_places(params);
    spec.padded_numel = params.padded_numel();
    spec.cuts = bucket_cuts(spec.padded_numel, dtype_size(params.dtype()), 1, static_cast<int64_t>(spec.padded_numel * dtype_size(params.dtype())) + 1);
    const Placement placement(std::move(spec));
    std::unique_ptr<Comm> alone = make_self_comm("world");
    ReplicatedParameters store(flat_parameters(params), placement, *alone, {}, backend_ops(backend));
    const CheckpointTensors checkpoint(path, manifest);
    const RankState rank{placement, store, nullptr, backend, backend_ops(backend), [&params](DType dtype, Shape shape) { return params.new_tensor(dtype, shape); }};
    load_state(rank, checkpoint_reader(checkpoint, backend));
}

bool load_rank_local_state(const std::string& path, const Manifest& manifest, int world_rank, bool same_layout, AdamW& optimizer) {
    const std::vector<RankLocalState> states = optimizer.rank_local_state();
    if (states.empty() || !same_layout || world_rank >= static_cast<int>(manifest.files.size())) return false;
    const RankFileReader file((std::filesystem::path(path) / rank_file_name(world_rank)).string());
    size_t loaded = 0;
    for (const RankLocalState& state : states)
        for (const SavedTensor& t : file.tensors())
            if (t.dataset == rank_state_dataset(state.name)) {
                optimizer.set_rank_local_state(state.name, file.read(t));
                ++loaded;
            }
    return loaded == states.size();
}

std::map<std::string, std::vector<float>> read_host_state(const std::string& path, const Manifest& manifest, const std::vector<int>& world_ranks,
                                                          const std::string& prefix) {
    std::map<std::string, std::vector<float>> out;
    for (const int rank : world_ranks) {
        if (rank < 0 || rank >= static_cast<int>(manifest.files.size()))
            fail(ErrorKind::data, "'", path, "': state listed in rank ", rank, "'s file, but the checkpoint has ", manifest.files.size(), " rank files");
        const RankFileReader file((std::filesystem::path(path) / rank_file_name(rank)).string());
        for (const SavedTensor& t : file.tensors()) {
            if (!t.dataset.starts_with(prefix)) continue;
            const std::vector<double> values = file.read(t);
            out[t.dataset] = std::vector<float>(values.begin(), values.end());
        }
    }
    return out;
}

}  // namespace llmtrain
