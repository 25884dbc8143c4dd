#include "checkpoint/restore.h"

#include <filesystem>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/hdf5_file.h"
#include "checkpoint/tensor_assembly.h"
#include "core/error.h"

namespace llmtrain {

namespace {
// Host values in the parameters' dtype (f32 or f64).
class HostValues {
public:
    HostValues(DType dtype, int64_t n) : dtype_(dtype), bytes_(static_cast<size_t>(n) * dtype_size(dtype)) {}
    void set(int64_t i, double value) {
        if (dtype_ == DType::f64) reinterpret_cast<double*>(bytes_.data())[i] = value;
        else reinterpret_cast<float*>(bytes_.data())[i] = static_cast<float>(value);
    }
    const void* data() const { return bytes_.data(); }

private:
    DType dtype_;
    std::vector<char> bytes_;
};
}  // namespace

void load_checkpoint_weights(const std::string& path, const Manifest& manifest, Parameters& params, Backend& backend) {
    const CheckpointTensors checkpoint(path, manifest);
    for (size_t i = 0; i < params.count(); ++i) {
        const ParamInfo& info = params.info(i);
        const std::vector<double> weights = assemble_global_tensor(checkpoint, TensorRole::weights, info.name, info.global_shape);
        set_master_weights(params, i, backend, [&](int64_t g) { return weights[static_cast<size_t>(g)]; });
    }
    if (params.has_compute_copy()) params.refresh_compute_copy();
}

void load_checkpoint_tensors(const std::string& path, const Manifest& manifest, Parameters& params, AdamW& optimizer, Backend& backend) {
    if (params.dtype() != DType::f32 && params.dtype() != DType::f64)
        fail(ErrorKind::unsupported, "checkpoint: master weights in ", dtype_name(params.dtype()), " (expected f32 or f64)");
    const CheckpointTensors checkpoint(path, manifest);
    // Where each parameter's elements that this rank updates sit in the moments.
    struct Owned {
        int64_t begin, end;  // flat elements
        int64_t state_at;    // the moment of element begin
    };
    std::vector<std::vector<Owned>> owned(params.count());
    int64_t state_offset = 0;
    for (const OwnedPiece& piece : optimizer.pieces()) {
        for_each_param_in(params, piece, [&](size_t i, int64_t begin, int64_t end) { owned[i].push_back({begin, end, state_offset + begin - piece.begin}); });
        state_offset += piece.end - piece.begin;
    }
    HostValues m(params.dtype(), optimizer.exp_avg().numel()), v(params.dtype(), optimizer.exp_avg_sq().numel());
    for (size_t i = 0; i < params.count(); ++i) {
        const ParamInfo& info = params.info(i);
        const std::vector<double> weights = assemble_global_tensor(checkpoint, TensorRole::weights, info.name, info.global_shape);
        set_master_weights(params, i, backend, [&](int64_t g) { return weights[static_cast<size_t>(g)]; });
        if (owned[i].empty()) continue;
        const std::vector<double> exp_avg = assemble_global_tensor(checkpoint, TensorRole::exp_avg, info.name, info.global_shape);
        const std::vector<double> exp_avg_sq = assemble_global_tensor(checkpoint, TensorRole::exp_avg_sq, info.name, info.global_shape);
        for (const Owned& o : owned[i])
            for (int64_t e = o.begin; e < o.end; ++e) {
                const auto g = static_cast<size_t>(params.global_index(i, e - info.offset));
                m.set(o.state_at + e - o.begin, exp_avg[g]);
                v.set(o.state_at + e - o.begin, exp_avg_sq[g]);
            }
    }
    backend.copy_from_host(optimizer.exp_avg(), m.data());
    backend.copy_from_host(optimizer.exp_avg_sq(), v.data());
    optimizer.set_steps_taken(manifest.optimizer_steps);
    if (params.has_compute_copy()) params.refresh_compute_copy();
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

}  // namespace llmtrain
