#include "checkpoint/tensor_assembly.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "core/error.h"

namespace llmtrain {

namespace {
size_t role_slot(TensorRole role) { return static_cast<size_t>(role); }

// The role of a dataset, from its path in the rank file; none for other datasets.
bool role_of(const std::string& dataset, TensorRole& role) {
    if (dataset.starts_with("model/")) role = TensorRole::weights;
    else if (dataset.starts_with("optimizer/exp_avg/")) role = TensorRole::exp_avg;
    else if (dataset.starts_with("optimizer/exp_avg_sq/")) role = TensorRole::exp_avg_sq;
    else return false;
    return true;
}

// Whether saved and wanted differ only in their number of rows: a vocabulary padded to
// another multiple (model.pad_vocab_to, or tp), whose padding rows hold zeros.
bool only_padding_differs(const Shape& saved, const Shape& wanted) { return saved.rank == 2 && wanted.rank == 2 && saved.cols() == wanted.cols(); }

// "layers.2." before "layers.10.": runs of digits compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
        if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
            size_t i_end = i, j_end = j;
            while (i_end < a.size() && std::isdigit(static_cast<unsigned char>(a[i_end]))) ++i_end;
            while (j_end < b.size() && std::isdigit(static_cast<unsigned char>(b[j_end]))) ++j_end;
            const std::string x = a.substr(i, i_end - i), y = b.substr(j, j_end - j);
            if (x.size() != y.size()) return x.size() < y.size();
            if (x != y) return x < y;
            i = i_end, j = j_end;
        } else {
            if (a[i] != b[j]) return a[i] < b[j];
            ++i, ++j;
        }
    }
    return a.size() - i < b.size() - j;
}
}  // namespace

const char* tensor_role_name(TensorRole role) {
    switch (role) {
        case TensorRole::weights: return "weights";
        case TensorRole::exp_avg: return "AdamW first moment";
        case TensorRole::exp_avg_sq: return "AdamW second moment";
    }
    return "?";
}

CheckpointTensors::CheckpointTensors(const std::string& path, const Manifest& manifest) : path_(path) {
    for (const CheckpointFile& f : manifest.files) {
        files_.push_back(std::make_unique<RankFileReader>((std::filesystem::path(path) / f.name).string()));
        const RankFileReader& file = *files_.back();
        for (const SavedTensor& t : file.tensors()) {
            TensorRole role;
            if (role_of(t.dataset, role)) parts_[role_slot(role)][t.name].push_back({&file, &t});
        }
    }
}

const std::vector<TensorPart>& CheckpointTensors::parts(TensorRole role, const std::string& name) const {
    static const std::vector<TensorPart> none;
    const PartsByName& by_name = parts_[role_slot(role)];
    const auto found = by_name.find(name);
    return found == by_name.end() ? none : found->second;
}

std::vector<std::string> CheckpointTensors::names(TensorRole role) const {
    std::vector<std::string> names;
    for (const auto& [name, parts] : parts_[role_slot(role)]) names.push_back(name);
    std::sort(names.begin(), names.end(), natural_less);
    return names;
}

Shape CheckpointTensors::saved_shape(TensorRole role, const std::string& name) const {
    const std::vector<TensorPart>& found = parts(role, name);
    if (found.empty()) fail(ErrorKind::data, "checkpoint '", path_, "' holds no ", tensor_role_name(role), " of tensor '", name, "'");
    return found.front().tensor->global_shape;
}

std::vector<double> assemble_global_tensor(const CheckpointTensors& checkpoint, TensorRole role, const std::string& name, const Shape& global_shape) {
    const char* what = tensor_role_name(role);
    const std::vector<TensorPart>& parts = checkpoint.parts(role, name);
    if (parts.empty()) fail(ErrorKind::data, "checkpoint '", checkpoint.path(), "' holds no ", what, " of tensor '", name, "'");
    const int64_t n = global_shape.numel();
    std::vector<double> global(static_cast<size_t>(n), 0.0);
    std::vector<bool> covered(static_cast<size_t>(n), false);
    int64_t covered_count = 0;
    for (const TensorPart& part : parts) {
        const SavedTensor& t = *part.tensor;
        const bool padded = t.global_shape != global_shape;
        if (padded && !only_padding_differs(t.global_shape, global_shape))
            fail(ErrorKind::data, "'", part.file->path(), "': tensor '", name, "' is ", t.global_shape.str(), " there and ", global_shape.str(),
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
    const int64_t saved_rows = parts.front().tensor->global_shape[0];
    if (saved_rows < global_shape[0]) covered_count += (global_shape[0] - saved_rows) * global_shape.cols();
    if (covered_count != n)
        fail(ErrorKind::data, "checkpoint '", checkpoint.path(), "' holds ", covered_count, " of the ", n, " values of the ", what, " of tensor '", name,
             "' (a rank file is missing or was written by another run)");
    return global;
}

void set_master_weights(Parameters& params, size_t index, Backend& backend, const std::function<double(int64_t global_index)>& value_at) {
    const int64_t n = params.info(index).shape.numel();
    if (params.dtype() == DType::f64) {
        std::vector<double> local(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) local[static_cast<size_t>(j)] = value_at(params.global_index(index, j));
        backend.copy_from_host(params.master_value(index), local.data());
    } else if (params.dtype() == DType::f32) {
        std::vector<float> local(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) local[static_cast<size_t>(j)] = static_cast<float>(value_at(params.global_index(index, j)));
        backend.copy_from_host(params.master_value(index), local.data());
    } else {
        fail(ErrorKind::unsupported, "master weights in ", dtype_name(params.dtype()), " (expected f32 or f64)");
    }
}

}  // namespace llmtrain
