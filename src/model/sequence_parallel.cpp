// The tensor-parallel matmuls' collectives under sequence parallelism, and their overlap with
// the matmuls (parallel.tp_overlap).
//
// Sequence parallelism keeps 1/tp of the micro-batch's N token rows per rank (n = N / tp):
// a column-parallel matmul (qkv, MLP up, head) needs the whole rows, all-gathered first; a
// row-parallel one (attention out, MLP down) gives partial sums of whole rows, reduce-scattered
// after. Overlapped, each collective runs in tp pieces: piece k is rows [k m, (k + 1) m) of
// every rank's n (m = n / tp), packed as tp segments of m rows (segment d: rank d's).
// Gathering piece k + 1 while piece k multiplies hides all but the first piece's transfer;
// reduce-scattering piece k while piece k + 1 multiplies hides all but the last one's.
//
// Bitwise the plain path: every output row comes from the same GEMM call with the same K-sum
// (on a backend that keeps_row_blocks, sequence parallelism's forward GEMMs compute blocks of
// m rows each by itself, with or without the overlap, and a piece's segment is one block),
// and each piece's
// reduce-scatter is the same collective over the same group, whose order of addition does not
// depend on the element count (MPI's reduce_scatter_block: a binomial tree over the ranks;
// tp = 2 adds two terms, in either order the same). In backward the matmuls are not split: the input gradient's GEMM
// runs while the input is gathered, the weight gradient's while the input gradient is
// reduce-scattered; the same GEMMs and collectives, overlapped. CUDA keeps no row blocks
// (cuBLASLt may pick another algorithm for a piece's shape): there the pieces track the
// plain path within rounding, not bitwise.
//
// MPI moves a nonblocking collective only inside MPI calls, so the pieces' transfers are
// polled (progress) between the segments' GEMMs.
#include <algorithm>
#include <vector>

#include "model/transformer.h"

namespace llmtrain {

namespace {

// Each rank's n rows in tp pieces of n / tp rows; none (no overlap) when tp does not divide n
// or the pieces would be thinner than min_piece_rows (a GEMM of a few rows costs more than
// its transfer hides; an evaluation's last micro-batch can be that small).
constexpr int64_t min_piece_rows = 16;

struct Piece {
    int64_t begin, rows;  // rows [begin, begin + rows) of each rank's n
};
int64_t piece_rows(int64_t n, int64_t tp) { return n % tp == 0 && n / tp >= min_piece_rows ? n / tp : 0; }
std::vector<Piece> overlap_pieces(int64_t n, int64_t tp) {
    std::vector<Piece> pieces;
    const int64_t rows = piece_rows(n, tp);
    for (int64_t k = 0; rows > 0 && k < tp; ++k) pieces.push_back({k * rows, rows});
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

int64_t Transformer::forward_row_block(int64_t n) const { return sp_ && backend_.keeps_row_blocks() ? piece_rows(n, tp_size()) : 0; }

void Transformer::column_parallel(const Tensor& local, const RowsMatmul& matmul) {
    const int64_t tp = tp_size(), n = local.dim(0), block = forward_row_block(n);
    const std::vector<Piece> pieces = sp_ && part_.tp_overlap ? overlap_pieces(n, tp) : std::vector<Piece>();
    if (pieces.empty()) return matmul(gather_rows(local, gathered_), 0, block);
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
            matmul(segments(p).slice_rows(d * p.rows, p.rows), d * n + p.begin, block);
            poll(in_flight);
        }
    }
}

Tensor Transformer::row_parallel(const RowsMatmul& matmul) {
    const Tensor partial = rows(proj_out_);
    const int64_t tp = tp_size(), n = local_tokens(batch_, seq_len_), block = forward_row_block(n);
    const std::vector<Piece> pieces = sp_ && part_.tp_overlap ? overlap_pieces(n, tp) : std::vector<Piece>();
    if (pieces.empty()) {
        matmul(partial, 0, block);
        return reduce_rows(partial, proj_local_);
    }
    const Tensor mine = local_rows(proj_local_);
    std::vector<CommHandle> in_flight;
    for (const Piece& p : pieces) {
        const Tensor segments = partial.slice_rows(tp * p.begin, tp * p.rows);
        for (int64_t d = 0; d < tp; ++d) {
            matmul(segments.slice_rows(d * p.rows, p.rows), d * n + p.begin, block);
            poll(in_flight);
        }
        in_flight.push_back(tp_->reduce_scatter_async(mine.slice_rows(p.begin, p.rows), segments));
    }
    for (CommHandle& h : in_flight) h.wait();
    return mine;
}

Tensor Transformer::column_parallel_bwd(MatmulBwd args, const Tensor& local_x, ParamSpan w) {
    if (!sp_ || !part_.tp_overlap) {
        args.x = gather_rows(local_x, gathered_);
        linear_bwd(w, args);
        return reduce_rows(args.dx, d_norm_local_);
    }
    const Tensor whole = rows(gathered_);
    CommHandle gather = start_gather(local_x, whole);
    // dx = dout w reads neither x nor what the gather writes.
    linear_bwd(w, {.dx = args.dx, .dw = Tensor(), .dbias = Tensor(), .dout = args.dout, .x = whole, .w = args.w});
    gather.wait();
    const Tensor mine = local_rows(d_norm_local_);
    CommHandle reduce = tp_->reduce_scatter_async(mine, args.dx);
    linear_bwd(w, {.dx = Tensor(), .dw = args.dw, .dbias = args.dbias, .dout = args.dout, .x = whole, .w = args.w});
    reduce.wait();
    return mine;
}

}  // namespace llmtrain
