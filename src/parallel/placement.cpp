#include "parallel/placement.h"

#include <algorithm>
#include <array>

#include "core/error.h"

namespace llmtrain {

// rows: local row lr lies in block b = lr / block_rows of the local rows; globally that
// block starts at b * block_rows * tp and this rank's part of it at tp_rank * block_rows.
// cols: local column lc is global column tp_rank * local_cols + lc.
int64_t tp_global_index(const Shape& shape, const Shape& global_shape, TensorSplit split, int tp_rank, int tp_size, int64_t local) {
    if (split.kind == TpSplit::none || tp_size == 1) return local;
    const int64_t cols = shape.rank >= 2 ? shape.cols() : 1;
    const int64_t row = local / cols, col = local % cols;
    if (split.kind == TpSplit::cols) return row * global_shape.cols() + static_cast<int64_t>(tp_rank) * cols + col;
    const int64_t block_rows = shape[0] / split.blocks;
    const int64_t block = row / block_rows, within = row % block_rows;
    const int64_t global_row = block * block_rows * tp_size + static_cast<int64_t>(tp_rank) * block_rows + within;
    return global_row * cols + col;
}

bool GlobalBox::inside(const Shape& shape) const {
    if (start.rank != shape.rank || count.rank != shape.rank) return false;
    for (int d = 0; d < shape.rank; ++d)
        if (start[d] < 0 || count[d] < 0 || start[d] + count[d] > shape[d]) return false;
    return true;
}

std::string GlobalBox::str() const {
    std::string text = "[";
    for (int d = 0; d < start.rank; ++d) text += cat(d ? ", " : "", start[d], ":", start[d] + count[d]);
    return text + "]";
}

GlobalBox whole_box(const Shape& shape) {
    GlobalBox box{shape, shape};
    for (int d = 0; d < shape.rank; ++d) box.start.dims[static_cast<size_t>(d)] = 0;
    return box;
}

std::optional<GlobalBox> intersect(const GlobalBox& a, const GlobalBox& b) {
    if (a.start.rank != b.start.rank) return std::nullopt;
    GlobalBox out = a;
    for (int d = 0; d < a.start.rank; ++d) {
        const auto i = static_cast<size_t>(d);
        const int64_t begin = std::max(a.start[d], b.start[d]), end = std::min(a.start[d] + a.count[d], b.start[d] + b.count[d]);
        if (begin >= end) return std::nullopt;
        out.start.dims[i] = begin;
        out.count.dims[i] = end - begin;
    }
    return out;
}

namespace {

// A tensor's local part seen as a matrix of `rows` x `cols` (a vector: one element per row),
// and where its rows and columns sit in the global tensor.
struct LocalMatrix {
    int64_t rows = 0, cols = 1;
    int64_t col_offset = 0;   // cols split: the global column of local column 0
    int64_t block_rows = 0;   // global rows are contiguous within blocks of this many local rows
    int64_t block_stride = 0;  // global rows between the starts of consecutive blocks
    int64_t row_offset = 0;   // rows split: the global row of the first block's first local row
    int64_t global_row(int64_t r) const { return r / block_rows * block_stride + row_offset + r % block_rows; }
};

LocalMatrix matrix_of(const TensorPlace& t) {
    const Shape& s = t.local_shape;
    if (s.rank < 1) fail(ErrorKind::runtime, "tensor '", t.name, "' of shape ", s.str(), ": placements hold tensors of one dimension or more");
    // A tensor of 3 or more dimensions ([experts, rows, cols]) is its rows() x cols() matrix;
    // tensor parallelism splits vectors and matrices only.
    if (s.rank > 2 && t.tp_size > 1 && t.split.kind != TpSplit::none)
        fail(ErrorKind::runtime, "tensor '", t.name, "' of shape ", s.str(), ": tensor parallelism splits vectors and matrices, not tensors of ", s.rank, " dimensions");
    LocalMatrix m;
    m.rows = s.rank == 1 ? s[0] : s.rows();
    m.cols = s.rank == 1 ? 1 : s.cols();
    m.block_rows = m.block_stride = std::max<int64_t>(m.rows, 1);
    if (t.tp_size == 1 || t.split.kind == TpSplit::none) return m;
    if (t.split.kind == TpSplit::cols) {
        if (s.rank != 2) fail(ErrorKind::runtime, "tensor '", t.name, "' of shape ", s.str(), " is split by columns but has none");
        m.col_offset = static_cast<int64_t>(t.tp_rank) * m.cols;
        return m;
    }
    m.block_rows = m.rows / t.split.blocks;
    m.block_stride = m.block_rows * t.tp_size;
    m.row_offset = static_cast<int64_t>(t.tp_rank) * m.block_rows;
    return m;
}

// Whole rows [row, row + rows) of an N-D tensor (N >= 3, held whole: global = local) as
// boxes: rows are the tensor's leading dimensions in mixed radix, and each box takes, from
// where it starts, as many whole units of the largest dimension aligned there as the range
// holds (every dimension after it whole), so a range is at most 2 (N - 1) boxes.
void append_row_boxes(const Shape& s, int64_t row, int64_t rows, std::vector<GlobalBox>& boxes) {
    const int leading = s.rank - 1;
    std::array<int64_t, Shape::max_rank> inner{};  // rows in one unit of leading dimension d
    inner[static_cast<size_t>(leading - 1)] = 1;
    for (int d = leading - 2; d >= 0; --d) inner[static_cast<size_t>(d)] = inner[static_cast<size_t>(d + 1)] * s[d + 1];
    for (const int64_t end = row + rows; row < end;) {
        int d = 0;  // the outermost dimension whose unit starts at row and fits the range
        while (row % inner[static_cast<size_t>(d)] != 0 || row + inner[static_cast<size_t>(d)] > end) ++d;
        const int64_t unit = inner[static_cast<size_t>(d)], at = row / unit % s[d];
        const int64_t units = std::min(s[d] - at, (end - row) / unit);
        GlobalBox box;
        box.start.rank = box.count.rank = s.rank;
        for (int k = 0; k < s.rank; ++k) {
            const auto i = static_cast<size_t>(k);
            if (k < d) box.start.dims[i] = row / inner[i] % s[k], box.count.dims[i] = 1;
            else if (k == d) box.start.dims[i] = at, box.count.dims[i] = units;
            else box.start.dims[i] = 0, box.count.dims[i] = s[k];
        }
        boxes.push_back(box);
        row += units * unit;
    }
}

// A part of one row [col, col + cols) of an N-D tensor: 1 in every leading dimension.
GlobalBox row_part_box(const Shape& s, int64_t row, int64_t col, int64_t cols) {
    GlobalBox box;
    box.start.rank = box.count.rank = s.rank;
    for (int k = s.rank - 2; k >= 0; --k) {
        box.start.dims[static_cast<size_t>(k)] = row % s[k];
        box.count.dims[static_cast<size_t>(k)] = 1;
        row /= s[k];
    }
    box.start.dims[static_cast<size_t>(s.rank - 1)] = col;
    box.count.dims[static_cast<size_t>(s.rank - 1)] = cols;
    return box;
}

GlobalBox box_at(const TensorPlace& t, const LocalMatrix& m, int64_t row, int64_t rows, int64_t col, int64_t cols) {
    GlobalBox box;
    if (t.local_shape.rank == 1) {
        box.start = Shape{m.global_row(row)};
        box.count = Shape{rows};
    } else {
        box.start = Shape{m.global_row(row), m.col_offset + col};
        box.count = Shape{rows, cols};
    }
    return box;
}

}  // namespace

std::vector<GlobalBox> boxes_of(const TensorPlace& t, FlatRange local) {
    if (local.begin < 0 || local.end > t.numel() || local.begin > local.end)
        fail(ErrorKind::runtime, "elements [", local.begin, ", ", local.end, ") of tensor '", t.name, "' (", t.numel(), " elements here)");
    const LocalMatrix m = matrix_of(t);
    std::vector<GlobalBox> boxes;
    int64_t at = local.begin;
    while (at < local.end) {
        const int64_t row = at / m.cols, col = at % m.cols;
        if (col > 0 || local.end - at < m.cols) {
            // A partial row: from col to the range's end or the row's.
            const int64_t n = std::min(m.cols - col, local.end - at);
            boxes.push_back(t.local_shape.rank > 2 ? row_part_box(t.local_shape, row, col, n) : box_at(t, m, row, 1, col, n));
            at += n;
            continue;
        }
        // Whole rows, up to the range's last whole row and the end of the row block.
        const int64_t last_whole = local.end / m.cols, block_end = (row / m.block_rows + 1) * m.block_rows;
        const int64_t rows = std::min(last_whole, block_end) - row;
        if (t.local_shape.rank > 2) append_row_boxes(t.local_shape, row, rows, boxes);
        else boxes.push_back(box_at(t, m, row, rows, 0, m.cols));
        at += rows * m.cols;
    }
    return boxes;
}

FlatRange FlatCut::piece_of(int rank) const {
    const int64_t n = flat.size(), from = std::min(n, rank * piece);
    return {flat.begin + from, flat.begin + std::min(n, from + piece)};
}

std::vector<FlatCut> bucket_cuts(int64_t padded_numel, size_t elem_bytes, int parts, int64_t bucket_bytes) {
    if (parts < 1 || padded_numel % parts != 0)
        fail(ErrorKind::runtime, "gradient buffer of ", padded_numel, " elements is not padded to a multiple of dp = ", parts);
    const int64_t step = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(elem_bytes) / parts) * parts;
    std::vector<FlatCut> cuts;
    int64_t shard_at = 0;
    for (int64_t end = padded_numel; end > 0; end -= step) {
        const FlatRange flat{std::max<int64_t>(0, end - step), end};
        cuts.push_back({flat, flat.size() / parts, shard_at, {}});
        shard_at += flat.size() / parts;
    }
    return cuts;
}

std::vector<FlatCut> group_cuts(const std::vector<FlatRange>& ranges, const std::vector<GradGroup>& groups, int parts) {
    std::vector<FlatCut> cuts;
    int64_t shard_at = 0;
    for (const GradGroup& g : groups) {
        if (g.first >= g.end || g.end > ranges.size()) fail(ErrorKind::runtime, "gradient group of parameters [", g.first, ", ", g.end, ") of ", ranges.size());
        const FlatRange flat{ranges[g.first].begin, ranges[g.end - 1].end};
        const int64_t piece = (flat.size() + parts - 1) / parts;
        cuts.push_back({flat, piece, shard_at, g});
        shard_at += piece;
    }
    return cuts;
}

Placement::Placement(PlacementSpec spec) : spec_(std::move(spec)) {
    if (spec_.shard_rank < 0 || spec_.shard_rank >= spec_.shard_size || spec_.replica_rank < 0 || spec_.replica_rank >= spec_.replicas)
        fail(ErrorKind::runtime, "placement: shard rank ", spec_.shard_rank, " of ", spec_.shard_size, ", replica ", spec_.replica_rank, " of ", spec_.replicas);
    for (const TensorPlace& t : spec_.tensors)
        if (t.flat.begin < 0 || t.flat.end > spec_.padded_numel || t.numel() != t.local_shape.numel())
            fail(ErrorKind::runtime, "placement: tensor '", t.name, "' at flat elements [", t.flat.begin, ", ", t.flat.end, ") of ", spec_.padded_numel);
    if (spec_.tied && *spec_.tied >= spec_.tensors.size()) fail(ErrorKind::runtime, "placement: tied tensor ", *spec_.tied, " of ", spec_.tensors.size());
}

std::vector<FlatRange> Placement::pieces() const {
    std::vector<FlatRange> pieces;
    for (const FlatCut& c : spec_.cuts)
        if (const FlatRange p = c.piece_of(spec_.shard_rank); p.size() > 0) pieces.push_back(p);
    return pieces;
}

int64_t Placement::shard_numel() const {
    int64_t n = 0;
    for (const FlatCut& c : spec_.cuts) n += c.piece;
    return n;
}

int64_t Placement::optimizer_numel() const {
    if (!shards_optimizer()) return spec_.padded_numel;
    int64_t n = 0;
    for (const FlatRange& p : pieces()) n += p.size();
    return n;
}

FlatRange Placement::part_of(FlatRange range, int parts, int index) {
    const int64_t n = range.size(), base = n / parts, longer = n % parts;
    const int64_t begin = range.begin + index * base + std::min<int64_t>(index, longer);
    return {begin, begin + base + (index < longer ? 1 : 0)};
}

std::vector<FlatRange> Placement::first_pieces() const {
    std::vector<FlatRange> first;
    for (const FlatRange& p : pieces())
        if (const FlatRange part = part_of(p, spec_.replicas, spec_.replica_rank); part.size() > 0) first.push_back(part);
    return first;
}

std::vector<TensorRange> Placement::tensors_in(FlatRange range) const {
    std::vector<TensorRange> out;
    // The tensors lie in flat order: the first that ends after range.begin, then on.
    auto it = std::partition_point(spec_.tensors.begin(), spec_.tensors.end(), [&](const TensorPlace& t) { return t.flat.end <= range.begin; });
    for (; it != spec_.tensors.end() && it->flat.begin < range.end; ++it) {
        const FlatRange mine = it->flat.intersect(range);
        if (mine.size() > 0)
            out.push_back({static_cast<size_t>(it - spec_.tensors.begin()), {mine.begin - it->flat.begin, mine.end - it->flat.begin}});
    }
    return out;
}

std::vector<TensorRange> Placement::checkpoint_share(bool split_tied, bool split_tp) const {
    std::vector<TensorRange> share;
    for (const FlatRange& piece : first_pieces())
        for (TensorRange r : tensors_in(piece)) {
            const TensorPlace& t = spec_.tensors[r.tensor];
            const FlatRange whole{0, t.numel()};
            if (split_tp && t.replicated_over_tp()) r.local = r.local.intersect(part_of(whole, t.tp_size, t.tp_rank));
            if (split_tied && spec_.tied == r.tensor) r.local = r.local.intersect(part_of(whole, 2, spec_.tied_end));
            if (r.local.size() > 0) share.push_back(r);
        }
    return share;
}

}  // namespace llmtrain
