// The tensor-parallel matmuls' collectives under sequence parallelism, and their overlap with
// the matmuls (parallel.tp_overlap).
//
// Sequence parallelism keeps 1/tp of the micro-batch's N token rows per rank (n = N / tp):
// a column-parallel matmul (qkv, MLP up, head) needs the whole rows, all-gathered first; a
// row-parallel one (attention out, MLP down) gives partial sums of whole rows, reduce-scattered
// after. Overlapped, each collective runs in up to tp pieces: piece k is rows [b_k, e_k) of
// every rank's n, packed as tp segments of e_k - b_k rows (segment d: rank d's).
// Gathering piece k + 1 while piece k multiplies hides all but the first piece's transfer;
// reduce-scattering piece k while piece k + 1 multiplies hides all but the last one's.
//
// Bitwise the plain path: every output row comes from the same GEMM row with the same K-sum
// (pieces are whole blocks of the backend's matmul_row_block), and each piece's
// reduce-scatter is the same collective over the same group, whose order of addition does not
// depend on the element count (MPI's reduce_scatter_block: a binomial tree over the ranks;
// tp = 2 adds two terms, in either order the same). In backward the matmuls are not split: the input gradient's GEMM
// runs while the input is gathered, the weight gradient's while the input gradient is
// reduce-scattered; the same GEMMs and collectives, overlapped. CUDA makes no row-block
// promise (cuBLASLt may pick another algorithm for a piece's shape): there the pieces track
// the plain path within rounding, not bitwise.
//
// MPI moves a nonblocking collective only inside MPI calls, so the pieces' transfers are
// polled (progress) between the segments' GEMMs.
#include <algorithm>
#include <vector>

#include "model/transformer.h"

namespace llmtrain {

namespace {

// Pieces of whole row blocks of the backend's forward matmul (matmul_row_block), so that each
// piece's GEMM is bitwise its rows of the whole; without that promise (CUDA) pieces of any
// size, tracking the plain path within rounding. Rank d's rows start at row d n of the
// gathered tensor, so n must be whole blocks too. Fewer than two pieces: no overlap (the
// plain path), as for an evaluation's last, small micro-batch.
struct Piece {
    int64_t begin, rows;  // rows [begin, begin + rows) of each rank's n
};
std::vector<Piece> overlap_pieces(int64_t n, int64_t tp, int64_t row_block) {
    const int64_t unit = row_block > 0 ? row_block : 1;
    if (n % unit != 0) return {};
    const int64_t units = n / unit, count = std::min(tp, units);
    std::vector<Piece> pieces;
    for (int64_t k = 0; count > 1 && k < count; ++k) {
        const int64_t begin = units * k / count, end = units * (k + 1) / count;
        pieces.push_back({begin * unit, (end - begin) * unit});
    }
    return pieces;
}

void poll(std::vector<CommHandle>& in_flight) {
    for (CommHandle& h : in_flight) h.progress();
}

}  // namespace

CommHandle Transformer::start_gather(const Tensor& local, const Tensor& whole) {
    backend_.copy(whole.slice_rows(tp_rank() * local.dim(0), local.dim(0)), local);
    return tp_->all_gather_async(whole);
}

Tensor Transformer::gather_rows(const Tensor& local, Arena::Slot scratch) {
    if (!sp_) return local;
    const Tensor whole = rows(scratch);
    start_gather(local, whole).wait();
    return whole;
}

Tensor Transformer::reduce_rows(const Tensor& partial, Arena::Slot local) {
    if (!tp_) return partial;
    if (!sp_) {
        tp_->all_reduce(partial, ReduceOp::sum);
        return partial;
    }
    const Tensor mine = local_rows(local);
    tp_->reduce_scatter(mine, partial);
    return mine;
}

void Transformer::column_parallel(const Tensor& local, const RowsMatmul& matmul) {
    const int64_t tp = tp_size(), n = local.dim(0);
    const std::vector<Piece> pieces = sp_ && part_.tp_overlap ? overlap_pieces(n, tp, backend_.matmul_row_block()) : std::vector<Piece>();
    if (pieces.empty()) return matmul(gather_rows(local, gathered_), 0);
    const Tensor packed = rows(gathered_);
    const auto segments = [&](const Piece& p) { return packed.slice_rows(tp * p.begin, tp * p.rows); };
    const auto start = [&](const Piece& p) { return start_gather(local.slice_rows(p.begin, p.rows), segments(p)); };
    std::vector<CommHandle> in_flight;
    in_flight.push_back(start(pieces.front()));
    for (size_t k = 0; k < pieces.size(); ++k) {
        if (k + 1 < pieces.size()) in_flight.push_back(start(pieces[k + 1]));
        in_flight[k].wait();
        const Piece& p = pieces[k];
        for (int64_t d = 0; d < tp; ++d) {
            matmul(segments(p).slice_rows(d * p.rows, p.rows), d * n + p.begin);
            poll(in_flight);
        }
    }
}

Tensor Transformer::row_parallel(const RowsMatmul& matmul, Arena::Slot local) {
    const Tensor partial = rows(proj_out_);
    const int64_t tp = tp_size(), n = local_tokens(batch_, seq_len_);
    const std::vector<Piece> pieces = sp_ && part_.tp_overlap ? overlap_pieces(n, tp, backend_.matmul_row_block()) : std::vector<Piece>();
    if (pieces.empty()) {
        matmul(partial, 0);
        return reduce_rows(partial, local);
    }
    const Tensor mine = local_rows(local);
    std::vector<CommHandle> in_flight;
    for (const Piece& p : pieces) {
        const Tensor segments = partial.slice_rows(tp * p.begin, tp * p.rows);
        for (int64_t d = 0; d < tp; ++d) {
            matmul(segments.slice_rows(d * p.rows, p.rows), d * n + p.begin);
            poll(in_flight);
        }
        in_flight.push_back(tp_->reduce_scatter_async(mine.slice_rows(p.begin, p.rows), segments));
    }
    for (CommHandle& h : in_flight) h.wait();
    return mine;
}

Tensor Transformer::column_parallel_bwd(MatmulBwd args, const Tensor& local_x, Arena::Slot dx_local) {
    if (!sp_ || !part_.tp_overlap) {
        args.x = gather_rows(local_x, gathered_);
        backend_.matmul_bwd(args);
        return reduce_rows(args.dx, dx_local);
    }
    const Tensor whole = rows(gathered_);
    CommHandle gather = start_gather(local_x, whole);
    // dx = dout w reads neither x nor what the gather writes.
    backend_.matmul_bwd({.dx = args.dx, .dw = Tensor(), .dbias = Tensor(), .dout = args.dout, .x = whole, .w = args.w});
    gather.wait();
    const Tensor mine = local_rows(dx_local);
    CommHandle reduce = tp_->reduce_scatter_async(mine, args.dx);
    backend_.matmul_bwd({.dx = Tensor(), .dw = args.dw, .dbias = args.dbias, .dout = args.dout, .x = whole, .w = args.w});
    reduce.wait();
    return mine;
}

}  // namespace llmtrain
