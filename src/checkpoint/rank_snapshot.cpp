#include "checkpoint/rank_snapshot.h"

#include <cstring>

#include "core/error.h"

namespace llmtrain {

namespace {
const char* role_prefix(TensorRole role) {
    switch (role) {
        case TensorRole::weights: return "model/";
        case TensorRole::exp_avg: return "optimizer/exp_avg/";
        case TensorRole::exp_avg_sq: return "optimizer/exp_avg_sq/";
    }
    return "?";
}

struct Copy {
    Tensor from;  // in the state's memory
    size_t tensor;
};
}  // namespace

const char* tensor_role_name(TensorRole role) {
    switch (role) {
        case TensorRole::weights: return "weights";
        case TensorRole::exp_avg: return "AdamW first moment";
        case TensorRole::exp_avg_sq: return "AdamW second moment";
    }
    return "?";
}

int64_t SavedTensor::numel() const {
    int64_t n = 0;
    for (const StoredBox& b : boxes) n += b.box.numel();
    return n;
}

std::string piece_dataset(TensorRole role, const std::string& name, const Shape& global_shape, const GlobalBox& box) {
    std::string path = role_prefix(role) + name;
    if (box == whole_box(global_shape)) return path;
    for (int d = 0; d < box.start.rank; ++d) path += cat(d ? "_" : "/", box.start[d]);
    return path;
}

std::string rank_state_dataset(const std::string& state) { return "optimizer/" + state; }

bool role_of_dataset(const std::string& dataset, TensorRole& role) {
    for (TensorRole r : kTensorRoles)
        if (dataset.starts_with(role_prefix(r))) {
            role = r;
            return true;
        }
    return false;
}

// Each range of the share is one copy to the host; its boxes are its datasets.
void capture_snapshot(const SnapshotSource& source, int64_t step, RankSnapshot& out) {
    const Placement& placement = source.placement;
    out.step = step;
    out.world_rank = source.world_rank;
    out.tensors.clear();
    std::vector<Copy> copies;
    const std::vector<TensorRange> share = placement.checkpoint_share(true);
    for (TensorRole role : kTensorRoles) {
        for (const TensorRange& r : share) {
            const TensorPlace& t = placement.tensors()[r.tensor];
            copies.push_back({source.state(role, {t.flat.begin + r.local.begin, t.flat.begin + r.local.end}), out.tensors.size()});
            for (const GlobalBox& box : boxes_of(t, r.local))
                out.tensors.push_back({piece_dataset(role, t.name, t.global_shape, box), t.name, t.global_shape, source.dtype, {{box, 0}}, 0});
        }
    }
    // Rank-local state lives in host memory already.
    std::vector<std::pair<size_t, const std::vector<float>*>> host_copies;
    for (const RankLocalState& state : source.rank_local) {
        const auto n = static_cast<int64_t>(state.values->size());
        host_copies.emplace_back(out.tensors.size(), state.values);
        out.tensors.push_back({rank_state_dataset(state.name), state.name, Shape{n}, DType::f32, {{whole_box(Shape{n}), 0}}, 0});
    }
    for (const HostDataset& d : source.host_state) {
        const auto n = static_cast<int64_t>(d.values.size());
        host_copies.emplace_back(out.tensors.size(), &d.values);
        out.tensors.push_back({d.dataset, d.dataset, Shape{n}, DType::f32, {{whole_box(Shape{n}), 0}}, 0});
    }
    size_t bytes = 0;
    for (SavedTensor& t : out.tensors) {
        t.byte_offset = bytes;
        bytes += static_cast<size_t>(t.numel()) * dtype_size(t.dtype);
    }
    // No reallocation when the layout is the same as last time; a larger one is unpinned
    // before the buffer moves, and the new one pinned once.
    if (bytes > out.data.capacity()) out.pinned.reset();
    out.data.resize(bytes);
    if (!out.pinned && bytes > 0) out.pinned = source.backend.pin_host_memory(out.data.data(), out.data.capacity());
    for (const Copy& c : copies) source.backend.copy_to_host(out.data.data() + out.tensors[c.tensor].byte_offset, c.from);
    for (const auto& [tensor, values] : host_copies) std::memcpy(out.data.data() + out.tensors[tensor].byte_offset, values->data(), values->size() * sizeof(float));
}

}  // namespace llmtrain
