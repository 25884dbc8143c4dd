#include "checkpoint/restore.h"

#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "checkpoint/hdf5_file.h"
#include "core/error.h"

namespace llmtrain {

namespace {
struct Part {
    const RankFileReader* file;
    const SavedTensor* tensor;
};
using PartsByName = std::map<std::string, std::vector<Part>>;

struct Index {
    std::vector<std::unique_ptr<RankFileReader>> files;
    PartsByName weights, exp_avg, exp_avg_sq;
};

Index index_files(const std::string& path, const Manifest& manifest) {
    Index index;
    for (const CheckpointFile& f : manifest.files) {
        index.files.push_back(std::make_unique<RankFileReader>((std::filesystem::path(path) / f.name).string()));
        const RankFileReader& file = *index.files.back();
        for (const SavedTensor& t : file.tensors()) {
            PartsByName* kind = t.dataset.starts_with("model/")                ? &index.weights
                                : t.dataset.starts_with("optimizer/exp_avg/")    ? &index.exp_avg
                                : t.dataset.starts_with("optimizer/exp_avg_sq/") ? &index.exp_avg_sq
                                                                                 : nullptr;
            if (kind) (*kind)[t.name].push_back({&file, &t});
        }
    }
    return index;
}

// Whether saved and wanted differ only in their number of rows: a vocabulary padded to
// another multiple (model.pad_vocab_to, or tp), whose padding rows hold zeros.
bool only_padding_differs(const Shape& saved, const Shape& wanted) { return saved.rank == 2 && wanted.rank == 2 && saved.cols() == wanted.cols(); }

// The whole global tensor of parameter `info` from its parts.
std::vector<double> assemble(const std::string& path, const PartsByName& parts, const ParamInfo& info, const char* what) {
    const auto found = parts.find(info.name);
    if (found == parts.end()) fail(ErrorKind::data, "checkpoint '", path, "' holds no ", what, " of tensor '", info.name, "'");
    const int64_t n = info.global_shape.numel();
    std::vector<double> global(static_cast<size_t>(n), 0.0);
    std::vector<bool> covered(static_cast<size_t>(n), false);
    int64_t covered_count = 0;
    for (const Part& part : found->second) {
        const SavedTensor& t = *part.tensor;
        const bool padded = t.global_shape != info.global_shape;
        if (padded && !only_padding_differs(t.global_shape, info.global_shape))
            fail(ErrorKind::data, "'", part.file->path(), "': tensor '", info.name, "' is ", t.global_shape.str(), " there and ", info.global_shape.str(),
                 " in this model");
        const std::vector<double> values = part.file->read(t);
        for (int64_t k = 0; k < t.numel(); ++k) {
            const auto g = static_cast<size_t>(tp_global_index(t.local_shape, t.global_shape, t.split, t.tp_rank, t.tp_size, t.begin + k));
            if (g >= static_cast<size_t>(t.global_shape.numel()))
                fail(ErrorKind::data, "'", part.file->path(), "': tensor '", t.dataset, "' places a value outside ", t.global_shape.str());
            if (g >= global.size()) continue;  // a padding row this model does not have
            global[g] = values[static_cast<size_t>(k)];
            if (!covered[g]) covered[g] = true, ++covered_count;
        }
    }
    // Padding rows this model has and the checkpoint had not: zeros.
    const int64_t saved_rows = found->second.front().tensor->global_shape[0];
    if (saved_rows < info.global_shape[0]) covered_count += (info.global_shape[0] - saved_rows) * info.global_shape.cols();
    if (covered_count != n)
        fail(ErrorKind::data, "checkpoint '", path, "' holds ", covered_count, " of the ", n, " values of the ", what, " of tensor '", info.name,
             "' (a rank file is missing or was written by another run)");
    return global;
}

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

void load_checkpoint_tensors(const std::string& path, const Manifest& manifest, Parameters& params, AdamW& optimizer, Backend& backend) {
    if (params.dtype() != DType::f32 && params.dtype() != DType::f64)
        fail(ErrorKind::unsupported, "checkpoint: master weights in ", dtype_name(params.dtype()), " (expected f32 or f64)");
    const Index index = index_files(path, manifest);
    HostValues m(params.dtype(), optimizer.exp_avg().numel()), v(params.dtype(), optimizer.exp_avg_sq().numel());
    for (size_t i = 0; i < params.count(); ++i) {
        const ParamInfo& info = params.info(i);
        const std::vector<double> weights = assemble(path, index.weights, info, "weights");
        HostValues local(params.dtype(), info.shape.numel());
        for (int64_t j = 0; j < info.shape.numel(); ++j) local.set(j, weights[static_cast<size_t>(params.global_index(i, j))]);
        backend.copy_from_host(params.master_value(i), local.data());

        int64_t state_offset = 0;
        std::vector<double> exp_avg, exp_avg_sq;  // assembled on first use
        for (const OwnedPiece& piece : optimizer.pieces()) {
            for_each_param_in(params, piece, [&](size_t index_in_piece, int64_t begin, int64_t end) {
                if (index_in_piece != i) return;
                if (exp_avg.empty()) {
                    exp_avg = assemble(path, index.exp_avg, info, "AdamW first moment");
                    exp_avg_sq = assemble(path, index.exp_avg_sq, info, "AdamW second moment");
                }
                for (int64_t e = begin; e < end; ++e) {
                    const auto g = static_cast<size_t>(params.global_index(i, e - info.offset));
                    m.set(state_offset + e - piece.begin, exp_avg[g]);
                    v.set(state_offset + e - piece.begin, exp_avg_sq[g]);
                }
            });
            state_offset += piece.end - piece.begin;
        }
    }
    backend.copy_from_host(optimizer.exp_avg(), m.data());
    backend.copy_from_host(optimizer.exp_avg_sq(), v.data());
    optimizer.set_steps_taken(manifest.optimizer_steps);
    if (params.has_compute_copy()) params.refresh_compute_copy();
}

}  // namespace llmtrain
