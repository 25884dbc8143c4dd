#include "checkpoint/rank_snapshot.h"

#include <cstring>

#include "core/error.h"

namespace llmtrain {

namespace {
// The rules of the header: a value held by several ranks is written by one of them.
bool writes(const SnapshotSource& source, size_t index) {
    const ParamInfo& info = source.params.info(index);
    if (source.tied_copy && *source.tied_copy == index) return false;
    return !(info.replicated() && source.params.tp_rank() != 0);
}

SavedTensor describe(const Parameters& params, size_t index, std::string dataset, int64_t begin, int64_t end) {
    const ParamInfo& info = params.info(index);
    SavedTensor t;
    t.dataset = std::move(dataset);
    t.name = info.name;
    t.local_shape = info.shape;
    t.global_shape = info.global_shape;
    t.split = info.split;
    t.tp_rank = params.tp_rank();
    t.tp_size = params.tp_size();
    t.begin = begin;
    t.end = end;
    t.dtype = params.dtype();
    return t;
}

struct Copy {
    Tensor from;  // in the parameters' memory
    size_t tensor;
};
}  // namespace

std::string model_dataset(const std::string& name) { return "model/" + name; }

std::string rank_state_dataset(const std::string& state) { return "optimizer/" + state; }

std::string moment_dataset(const char* moment, const std::string& name, int64_t begin, int64_t end) {
    return cat("optimizer/", moment, "/", name, "/elements_", begin, "_", end);
}

void capture_snapshot(const SnapshotSource& source, int64_t step, RankSnapshot& out) {
    const Parameters& params = source.params;
    out.step = step;
    out.world_rank = source.world_rank;
    out.tensors.clear();
    std::vector<Copy> copies;
    if (source.dp_rank == 0) {
        for (size_t i = 0; i < params.count(); ++i) {
            if (!writes(source, i)) continue;
            copies.push_back({params.master_value(i), out.tensors.size()});
            out.tensors.push_back(describe(params, i, model_dataset(params.info(i).name), 0, params.info(i).shape.numel()));
        }
    }
    if (source.shards_optimizer || source.dp_rank == 0) {
        int64_t state_offset = 0;  // where the current piece's moments start
        for (const OwnedPiece& piece : source.optimizer.pieces()) {
            for_each_param_in(params, piece, [&](size_t index, int64_t begin, int64_t end) {
                if (!writes(source, index)) return;
                const int64_t offset = params.info(index).offset, count = end - begin, at = state_offset + begin - piece.begin;
                for (const auto& [moment, state] : {std::pair{"exp_avg", source.optimizer.exp_avg()}, std::pair{"exp_avg_sq", source.optimizer.exp_avg_sq()}}) {
                    copies.push_back({state.slice_rows(at, count), out.tensors.size()});
                    out.tensors.push_back(describe(params, index, moment_dataset(moment, params.info(index).name, begin - offset, end - offset), begin - offset,
                                                   end - offset));
                }
            });
            state_offset += piece.end - piece.begin;
        }
    }
    // Rank-local state lives in host memory already.
    std::vector<std::pair<size_t, const std::vector<float>*>> host_copies;
    for (const RankLocalState& state : source.optimizer.rank_local_state()) {
        SavedTensor t;
        t.dataset = rank_state_dataset(state.name);
        t.name = state.name;
        const auto n = static_cast<int64_t>(state.values->size());
        t.local_shape = t.global_shape = Shape{n};
        t.end = n;
        t.dtype = DType::f32;
        host_copies.emplace_back(out.tensors.size(), state.values);
        out.tensors.push_back(std::move(t));
    }
    size_t bytes = 0;
    for (SavedTensor& t : out.tensors) {
        t.byte_offset = bytes;
        bytes += static_cast<size_t>(t.numel()) * dtype_size(t.dtype);
    }
    out.data.resize(bytes);  // no reallocation when the layout is the same as last time
    for (const Copy& c : copies) source.backend.copy_to_host(out.data.data() + out.tensors[c.tensor].byte_offset, c.from);
    for (const auto& [tensor, values] : host_copies) std::memcpy(out.data.data() + out.tensors[tensor].byte_offset, values->data(), values->size() * sizeof(float));
}

}  // namespace llmtrain
