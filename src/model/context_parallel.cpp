// Context parallelism (parallel.cp; Megatron-Core's context parallelism, Liu et al. 2023's
// ring attention). Each sequence of T tokens is cut into 2 cp chunks of c = T / (2 cp);
// rank r of the cp group holds chunks r and 2cp - 1 - r, so that every rank has as much
// causal work as any other (an early chunk sees few keys, its partner many). Row t of a
// rank's T / cp rows sits at position
//   pos_r(t) = r c + t              for t < c
//            = (2cp - 1 - r) c + t - c   otherwise,
// increasing in t, so the positions keep the causal order of the rows.
//
// Everything but attention works on a row by itself: only attention needs other rows.
// Attention runs as a ring: each rank starts with its own keys and values, and at step i
// computes its queries against the block of rank (r - i) mod cp while it passes that block
// to the next rank and receives the following one from the previous rank. Each block's
// partial output is merged into the running output by log-sum-exp (AttentionBlockFwd), so
// after cp steps every query has attended to every key it may see, causally (positions) and
// within its document (first positions), whichever rank holds the key.
//
// Backward walks the ring again: the key/value blocks travel as in forward, and with each
// block its key/value gradient, to which every rank adds its queries' share before passing
// it on; after cp steps each block's gradient is back with its owner. A rank computes its
// share of the block into a fresh buffer while the previous share travels, and adds the one
// that arrived afterwards: the transfer runs behind the block's computation.
#include <numeric>

#include "model/transformer.h"

namespace llmtrain {

namespace {

// The position of row t of cp rank r's T / cp rows in its sequence of T tokens.
int32_t chunk_position(int64_t t, int64_t seq_len, int64_t cp, int64_t r) {
    const int64_t c = seq_len / (2 * cp);
    return static_cast<int32_t>(t < c ? r * c + t : (2 * cp - 1 - r) * c + (t - c));
}

}  // namespace

void TransformerLayout::plan_ring() {
    const int64_t N = max_batch_ * max_seq_len_, D = config_.head_dim();
    const int64_t kv_width = 2 * n_kv_heads_ * D, out_width = n_heads_ * D;
    for (size_t i = 0; i < 2; ++i) {
        ring_.kv[i] = arena_.reserve(cat("ring.kv.", i), dtype_, {N, kv_width});
        ring_.dkv[i] = arena_.reserve(cat("ring.grad.kv.", i), stat_dtype_, {N, kv_width});
    }
    ring_.acc = arena_.reserve("ring.acc", stat_dtype_, {N, out_width});
    ring_.dkv_in = arena_.reserve("ring.grad.kv_in", stat_dtype_, {N, kv_width});
    ring_.chunk_positions = arena_.reserve("ring.chunk_positions", DType::i32, {part_.cp_size * max_seq_len_});
}

std::vector<int32_t> Transformer::context_chunks(const Tensor& whole, int64_t seq_len) const {
    if (whole.empty()) return {};
    expect_dtype("forward", "tokens", whole, DType::i32);
    expect_shape("forward", "tokens", whole, {batch_ * seq_len});
    const int32_t* in = whole.data<int32_t>();
    std::vector<int32_t> chunks(static_cast<size_t>(batch_ * seq_len_));
    for (int64_t b = 0; b < batch_; ++b)
        for (int64_t t = 0; t < seq_len_; ++t)
            chunks[static_cast<size_t>(b * seq_len_ + t)] = in[b * seq_len + chunk_position(t, seq_len, part_.cp_size, part_.cp_rank)];
    return chunks;
}

void Transformer::load_context_positions(const ActivationSet& a, const Tensor& whole_tokens, int64_t seq_len) {
    const int64_t cp = part_.cp_size;
    if (chunk_positions_len_ != seq_len) {
        std::vector<int32_t> every(static_cast<size_t>(cp * seq_len_));
        for (int64_t r = 0; r < cp; ++r)
            for (int64_t t = 0; t < seq_len_; ++t) every[static_cast<size_t>(r * seq_len_ + t)] = chunk_position(t, seq_len, cp, r);
        backend_.copy_from_host(arena_.tensor(ring_.chunk_positions).slice_rows(0, cp * seq_len_), every.data());
        chunk_positions_len_ = seq_len;
    }
    // A document may begin in another rank's chunk: its start comes from the whole sequence.
    std::vector<int32_t> starts;
    if (part_.splits_documents()) {
        if (whole_tokens.empty())
            fail(ErrorKind::runtime, "forward: the document mask or position reset needs the micro-batch's tokens on every pipeline stage; none were given");
        expect_dtype("forward", "tokens", whole_tokens, DType::i32);
        expect_shape("forward", "tokens", whole_tokens, {batch_ * seq_len});
        starts = document_starts(whole_tokens.data<int32_t>(), batch_, seq_len, part_.document_end_token);
    }
    std::vector<int32_t> positions(static_cast<size_t>(batch_ * seq_len_)), first(part_.document_mask ? positions.size() : 0);
    for (int64_t b = 0; b < batch_; ++b)
        for (int64_t t = 0; t < seq_len_; ++t) {
            const auto n = static_cast<size_t>(b * seq_len_ + t);
            const int32_t position = chunk_position(t, seq_len, cp, part_.cp_rank);
            const int32_t start = starts.empty() ? 0 : starts[static_cast<size_t>(b * seq_len + position)];
            positions[n] = part_.reset_position_ids ? position - start : position;
            if (!first.empty()) first[n] = start;
        }
    backend_.copy_from_host(rows(a.positions), positions.data());
    if (!first.empty()) backend_.copy_from_host(rows(a.first_position), first.data());
}

namespace {

// The ring's neighbours and the rank whose keys and values a step computes with.
struct Ring {
    int size, rank;
    int next() const { return (rank + 1) % size; }
    int prev() const { return (rank + size - 1) % size; }
    int holder(int step) const { return (rank - step % size + size) % size; }
};

}  // namespace

// What both directions of the ring read: the shape, the widths of the query and key/value
// columns, the two key/value buffers and each rank's chunk positions.
Transformer::RingPass Transformer::ring_pass(const ActivationSet& a, const AttentionSlots& s) const {
    RingPass r;
    r.shape = attention_shape();
    r.q_width = r.shape.out_width();
    r.kv_width = 2 * r.shape.n_kv_heads * r.shape.head_dim;
    r.qkv = rows(s.qkv);
    r.kv = {rows(ring_.kv[0]), rows(ring_.kv[1])};
    r.chunk_positions = arena_.tensor(ring_.chunk_positions);
    r.first = part_.document_mask ? rows(a.first_position) : Tensor();
    return r;
}

void Transformer::ring_attention_fwd(const ActivationSet& a, const AttentionSlots& s) {
    const RingPass r = ring_pass(a, s);
    const Ring ring{static_cast<int>(part_.cp_size), part_.cp_rank};
    const Tensor acc = rows(ring_.acc), lse = att_saved(s.saved);
    backend_.copy_columns({.dst = r.kv[0], .dst_col = 0, .src = r.qkv, .src_col = r.q_width, .cols = r.kv_width});
    for (int step = 0; step < ring.size; ++step) {
        const Tensor& current = r.kv[static_cast<size_t>(step % 2)];
        CommHandle sent, received;
        if (step + 1 < ring.size) {
            sent = cp_->send_async(current, ring.next());
            received = cp_->recv_async(r.kv[static_cast<size_t>((step + 1) % 2)], ring.prev());
        }
        backend_.attention_block_fwd({.acc = acc, .lse = lse, .qkv = r.qkv, .kv = current, .shape = r.shape, .kv_len = seq_len_,
                                      .q_positions = r.positions_of(ring.rank, seq_len_), .kv_positions = r.positions_of(ring.holder(step), seq_len_),
                                      .q_first = r.first, .first = step == 0});
        received.wait();
        sent.wait();
    }
    backend_.copy_columns({.dst = rows(s.out), .dst_col = 0, .src = acc, .src_col = 0, .cols = r.q_width});
}

void Transformer::ring_attention_bwd(const ActivationSet& a, const AttentionSlots& s) {
    const RingPass r = ring_pass(a, s);
    const Ring ring{static_cast<int>(part_.cp_size), part_.cp_rank};
    const Tensor dq = rows(ring_.acc), dkv_in = rows(ring_.dkv_in);
    const std::array<Tensor, 2> dkv{rows(ring_.dkv[0]), rows(ring_.dkv[1])};
    backend_.fill_zero(dq);
    backend_.copy_columns({.dst = r.kv[0], .dst_col = 0, .src = r.qkv, .src_col = r.q_width, .cols = r.kv_width});
    CommHandle share_sent, share_received;
    for (int step = 0; step < ring.size; ++step) {
        const Tensor& current = r.kv[static_cast<size_t>(step % 2)];
        CommHandle sent, received;
        if (step + 1 < ring.size) {
            sent = cp_->send_async(current, ring.next());
            received = cp_->recv_async(r.kv[static_cast<size_t>((step + 1) % 2)], ring.prev());
        }
        // This rank's share of the block's gradient, in the buffer not in flight.
        const Tensor& share = dkv[static_cast<size_t>(step % 2)];
        backend_.fill_zero(share);
        backend_.attention_block_bwd({.dq = dq, .dkv = share, .dout = rows(attention_grad_.d_out), .out = rows(s.out), .lse = att_saved(s.saved),
                                      .qkv = r.qkv, .kv = current, .shape = r.shape, .kv_len = seq_len_,
                                      .q_positions = r.positions_of(ring.rank, seq_len_), .kv_positions = r.positions_of(ring.holder(step), seq_len_),
                                      .q_first = r.first});
        // The shares of the ranks the block visited before, then on to the next rank.
        if (step > 0) {
            share_received.wait();
            backend_.add(share, share, dkv_in);
        }
        share_sent.wait();
        share_sent = cp_->send_async(share, ring.next());
        share_received = cp_->recv_async(dkv_in, ring.prev());
        received.wait();
        sent.wait();
    }
    // Every rank's share of this rank's own keys and values has come back around the ring.
    share_received.wait();
    share_sent.wait();
    backend_.copy_columns({.dst = rows(attention_grad_.d_qkv), .dst_col = 0, .src = dq, .src_col = 0, .cols = r.q_width});
    backend_.copy_columns({.dst = rows(attention_grad_.d_qkv), .dst_col = r.q_width, .src = dkv_in, .src_col = 0, .cols = r.kv_width});
}

}  // namespace llmtrain
