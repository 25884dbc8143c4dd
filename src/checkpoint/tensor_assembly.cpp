#include "checkpoint/tensor_assembly.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace llmtrain {

namespace {
size_t role_slot(TensorRole role) { return static_cast<size_t>(role); }

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

std::vector<int64_t> dims(const Shape& s) { return {s.dims.begin(), s.dims.begin() + s.rank}; }

Shape shape_of(const nlohmann::json& j) {
    Shape s;
    s.rank = static_cast<int>(j.size());
    for (size_t d = 0; d < j.size() && d < Shape::max_rank; ++d) s.dims[d] = j[d].get<int64_t>();
    return s;
}

// The index of one file, to travel between the ranks.
nlohmann::json index_json(int file, const RankFileReader& reader) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const SavedTensor& t : reader.tensors()) {
        nlohmann::json boxes = nlohmann::json::array();
        for (const StoredBox& b : t.boxes) boxes.push_back({dims(b.box.start), dims(b.box.count), b.offset});
        pieces.push_back({t.dataset, t.name, dims(t.global_shape), t.dtype == DType::f64 ? 8 : 4, boxes});
    }
    return {{"file", file}, {"format", reader.format()}, {"pieces", pieces}};
}

// Copies the sub-box `part` of a box `from` (its values row-major at `src`) into a box `to`
// (row-major at `dst`), boxes of any rank, elements of `elem` bytes: one copy per run along
// the last dimension, the runs visited in row-major order of the others.
void copy_part(const char* src, const GlobalBox& from, char* dst, const GlobalBox& to, const GlobalBox& part, size_t elem) {
    const int rank = part.start.rank;
    if (rank < 1) return;
    std::array<int64_t, Shape::max_rank> src_stride{}, dst_stride{}, index{};
    src_stride[static_cast<size_t>(rank - 1)] = dst_stride[static_cast<size_t>(rank - 1)] = 1;
    for (int d = rank - 2; d >= 0; --d) {
        const auto i = static_cast<size_t>(d);
        src_stride[i] = src_stride[i + 1] * from.count[d + 1];
        dst_stride[i] = dst_stride[i + 1] * to.count[d + 1];
    }
    int64_t runs = 1;
    for (int d = 0; d < rank - 1; ++d) runs *= part.count[d];
    const auto run_bytes = static_cast<size_t>(part.count[rank - 1]) * elem;
    for (int64_t k = 0; k < runs; ++k) {
        int64_t src_at = 0, dst_at = 0;
        for (int d = 0; d < rank; ++d) {
            const auto i = static_cast<size_t>(d);
            const int64_t global = part.start[d] + index[i];
            src_at += (global - from.start[d]) * src_stride[i];
            dst_at += (global - to.start[d]) * dst_stride[i];
        }
        std::memcpy(dst + static_cast<size_t>(dst_at) * elem, src + static_cast<size_t>(src_at) * elem, run_bytes);
        for (int d = rank - 2; d >= 0; --d) {  // the next run: an odometer over the leading dimensions
            const auto i = static_cast<size_t>(d);
            if (++index[i] < part.count[d]) break;
            index[i] = 0;
        }
    }
}

Shape relative_start(const GlobalBox& part, const GlobalBox& within) {
    Shape s = part.start;
    for (int d = 0; d < s.rank; ++d) s.dims[static_cast<size_t>(d)] -= within.start[d];
    return s;
}
}  // namespace

CheckpointTensors::CheckpointTensors(const std::string& path, const Manifest& manifest) : path_(path) {
    for (size_t f = 0; f < manifest.files.size(); ++f) {
        file_paths_.push_back((std::filesystem::path(path) / manifest.files[f].name).string());
        readers_.push_back(std::make_unique<RankFileReader>(file_paths_.back()));
        file_formats_.push_back(readers_.back()->format());
        for (const SavedTensor& t : readers_.back()->tensors()) add({static_cast<int>(f), t});
    }
}

CheckpointTensors::CheckpointTensors(const std::string& path, const Manifest& manifest, Comm& world) : path_(path) {
    const size_t files = manifest.files.size();
    readers_.resize(files);
    file_formats_.assign(files, 0);
    nlohmann::json mine = nlohmann::json::array();
    for (size_t f = 0; f < files; ++f) {
        file_paths_.push_back((std::filesystem::path(path) / manifest.files[f].name).string());
        if (static_cast<int>(f % static_cast<size_t>(world.size())) != world.rank()) continue;
        readers_[f] = std::make_unique<RankFileReader>(file_paths_.back());
        mine.push_back(index_json(static_cast<int>(f), *readers_[f]));
    }
    // Every rank's indexes, as CBOR padded to the longest, in one all-gather of i32 words.
    std::vector<uint8_t> bytes = nlohmann::json::to_cbor(mine);
    const auto longest = static_cast<int64_t>(world.all_reduce_scalar(static_cast<double>(bytes.size()), ReduceOp::max));
    const int64_t words = (longest + 8 + 3) / 4;
    std::vector<int32_t> gathered(static_cast<size_t>(words * world.size()), 0);
    int32_t* slot = gathered.data() + world.rank() * words;
    const auto length = static_cast<int64_t>(bytes.size());
    std::memcpy(slot, &length, sizeof length);
    std::memcpy(reinterpret_cast<char*>(slot) + 8, bytes.data(), bytes.size());
    world.all_gather(Tensor(gathered.data(), DType::i32, Shape{words * world.size()}));
    for (int r = 0; r < world.size(); ++r) {
        const char* at = reinterpret_cast<const char*>(gathered.data() + r * words);
        int64_t n = 0;
        std::memcpy(&n, at, sizeof n);
        const nlohmann::json indexes = nlohmann::json::from_cbor(at + 8, at + 8 + n);
        for (const nlohmann::json& index : indexes) {
            const int file = index.at("file").get<int>();
            file_formats_.at(static_cast<size_t>(file)) = index.at("format").get<int>();
            for (const nlohmann::json& p : index.at("pieces")) {
                SavedTensor t;
                t.dataset = p[0].get<std::string>();
                t.name = p[1].get<std::string>();
                t.global_shape = shape_of(p[2]);
                t.dtype = p[3].get<int>() == 8 ? DType::f64 : DType::f32;
                for (const nlohmann::json& b : p[4]) t.boxes.push_back({GlobalBox{shape_of(b[0]), shape_of(b[1])}, b[2].get<int64_t>()});
                add({file, std::move(t)});
            }
        }
    }
}

CheckpointTensors::~CheckpointTensors() = default;

void CheckpointTensors::add(StoredPiece piece) {
    TensorRole role;
    if (!role_of_dataset(piece.tensor.dataset, role)) return;
    stored_.push_back(std::make_unique<StoredPiece>(std::move(piece)));
    pieces_[role_slot(role)][stored_.back()->tensor.name].push_back(stored_.back().get());
}

const RankFileReader& CheckpointTensors::reader(int file) const {
    std::unique_ptr<RankFileReader>& r = readers_.at(static_cast<size_t>(file));
    if (!r) r = std::make_unique<RankFileReader>(file_paths_.at(static_cast<size_t>(file)), false);
    return *r;
}

const std::vector<const StoredPiece*>& CheckpointTensors::pieces(TensorRole role, const std::string& name) const {
    static const std::vector<const StoredPiece*> none;
    const PiecesByName& by_name = pieces_[role_slot(role)];
    const auto found = by_name.find(name);
    return found == by_name.end() ? none : found->second;
}

std::vector<std::string> CheckpointTensors::names(TensorRole role) const {
    std::vector<std::string> names;
    for (const auto& [name, pieces] : pieces_[role_slot(role)]) names.push_back(name);
    std::sort(names.begin(), names.end(), natural_less);
    return names;
}

Shape CheckpointTensors::saved_shape(TensorRole role, const std::string& name) const {
    const std::vector<const StoredPiece*>& found = pieces(role, name);
    if (found.empty()) fail(ErrorKind::data, "checkpoint '", path_, "' holds no ", tensor_role_name(role), " of tensor '", name, "'");
    return found.front()->tensor.global_shape;
}

void CheckpointTensors::read(TensorRole role, const TensorPlace& t, FlatRange local, void* out, DType as) const {
    char* at = static_cast<char*>(out);
    for (const GlobalBox& box : boxes_of(t, local)) {
        read_box(role, t, box, at, as);
        at += static_cast<size_t>(box.numel()) * dtype_size(as);
    }
}

// One box of this run's layout: every stored box it meets is read into its place. The
// volumes of the intersections must add up to the box (less the padding rows the checkpoint
// does not have): less is a missing piece, more an overlap.
void CheckpointTensors::read_box(TensorRole role, const TensorPlace& t, const GlobalBox& wanted, char* out, DType as) const {
    const std::vector<const StoredPiece*>& stored = pieces(role, t.name);
    const char* what = tensor_role_name(role);
    if (stored.empty()) fail(ErrorKind::data, "checkpoint '", path_, "' holds no ", what, " of tensor '", t.name, "'");
    const Shape saved = stored.front()->tensor.global_shape;
    const StoredPiece& first = *stored.front();
    if (saved != t.global_shape && !only_padding_differs(saved, t.global_shape))
        fail(ErrorKind::data, "'", file_path(first.file), "': tensor '", t.name, "' is ", saved.str(), " there and ", t.global_shape.str(), " in this model");
    const size_t elem = dtype_size(as);
    // Rows this model has beyond the saved ones are padding: zeros.
    const std::optional<GlobalBox> present = intersect(wanted, whole_box(saved));
    const int64_t expected = present ? present->numel() : 0;
    if (expected < wanted.numel()) std::memset(out + static_cast<size_t>(expected) * elem, 0, static_cast<size_t>(wanted.numel() - expected) * elem);
    struct Hit {
        const StoredPiece* piece;
        GlobalBox box;
    };
    std::vector<Hit> hits;
    int64_t covered = 0;
    for (const StoredPiece* p : stored) {
        if (p->tensor.global_shape != saved)
            fail(ErrorKind::data, "'", file_path(p->file), "': tensor '", p->tensor.dataset, "' is ", p->tensor.global_shape.str(), ", but ", saved.str(), " in '",
                 file_path(first.file), "'");
        for (const StoredBox& b : p->tensor.boxes) {
            const std::optional<GlobalBox> part = intersect(wanted, b.box);
            if (!part) continue;
            hits.push_back({p, b.box});
            covered += part->numel();
            if (file_format(p->file) >= 2) {
                reader(p->file).read_part(p->tensor, *part, out, as, wanted.count, relative_start(*part, wanted));
                continue;
            }
            // The earlier format (its datasets are tp parts, or ranges of them, laid out flat):
            // the dataset whole, then the part of this box copied out.
            if (cached_ != p || cached_dtype_ != as) {
                cached_values_.resize(static_cast<size_t>(p->tensor.numel()) * elem);
                reader(p->file).read_all(p->tensor, cached_values_.data(), as);
                cached_ = p, cached_dtype_ = as;
            }
            copy_part(cached_values_.data() + static_cast<size_t>(b.offset) * elem, b.box, out, wanted, *part, elem);
        }
    }
    if (covered == expected) return;
    if (covered > expected)
        for (size_t i = 0; i < hits.size(); ++i)
            for (size_t j = i + 1; j < hits.size(); ++j)
                if (const std::optional<GlobalBox> both = intersect(hits[i].box, hits[j].box))
                    fail(ErrorKind::data, "checkpoint '", path_, "': the ", what, " of tensor '", t.name, "' is stored twice in ", both->str(), ": '",
                         file_path(hits[i].piece->file), "' (", hits[i].piece->tensor.dataset, ", ", hits[i].box.str(), ") and '", file_path(hits[j].piece->file),
                         "' (", hits[j].piece->tensor.dataset, ", ", hits[j].box.str(), ")");
    fail(ErrorKind::data, "checkpoint '", path_, "' holds ", covered, " of the ", expected, " values of the ", what, " of tensor '", t.name, "' in ", wanted.str(),
         " (a rank file is missing or was written by another run)");
}

std::vector<double> assemble_global_tensor(const CheckpointTensors& checkpoint, TensorRole role, const std::string& name, const Shape& global_shape) {
    TensorPlace whole{name, global_shape, global_shape, {}, 0, 1, {0, global_shape.numel()}};
    std::vector<double> values(static_cast<size_t>(global_shape.numel()));
    checkpoint.read(role, whole, whole.flat, values.data(), DType::f64);
    return values;
}

}  // namespace llmtrain
