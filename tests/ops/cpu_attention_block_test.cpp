// Context parallelism's ops on the CPU (backend.h) in f64: a sequence's keys split into blocks
// (context parallelism's pairing, rank r holding chunks r and 2cp - 1 - r, and uneven blocks
// in any order), each merged into (acc, lse) by attention_block_fwd, give attention_fwd's
// output and the log-sum-exp of every row; attention_block_bwd over the same blocks gives
// attention_bwd's dq, dk and dv; with and without document starts. A block no query sees
// changes nothing. Explicit positions in rope and the embedding equal the doc_starts path;
// copy_columns copies and converts only its columns.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "model/transformer.h"
#include "op_test_util.h"

using namespace llmtrain;
using namespace llmtrain::test;

namespace {

constexpr DType f64 = DType::f64;
constexpr double kTol = 1e-10;

OwnedTensor i32_tensor(const std::vector<int32_t>& values) {
    OwnedTensor t(DType::i32, {static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), t.data<int32_t>());
    return t;
}

// The positions rank r of cp holds: chunks r and 2cp - 1 - r of T / (2cp) rows.
std::vector<int32_t> cp_positions(int64_t T, int64_t cp, int64_t r) {
    const int64_t chunk = T / (2 * cp);
    std::vector<int32_t> positions;
    for (const int64_t c : {r, 2 * cp - 1 - r})
        for (int64_t i = 0; i < chunk; ++i) positions.push_back(static_cast<int32_t>(c * chunk + i));
    return positions;
}

// Columns [col, col + cols) of rows `positions` of every sequence of x [B*T, W]: [B*P, cols].
OwnedTensor gather(const Tensor& x, int64_t B, int64_t T, const std::vector<int32_t>& positions, int64_t col, int64_t cols) {
    const auto P = static_cast<int64_t>(positions.size());
    const int64_t W = x.dim(1);
    OwnedTensor out(f64, {B * P, cols});
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < P; ++i)
            for (int64_t c = 0; c < cols; ++c) set(out, (b * P + i) * cols + c, get(x, (b * T + positions[static_cast<size_t>(i)]) * W + col + c));
    return out;
}

// The document starts of the rows `positions` of every sequence.
std::vector<int32_t> gather_starts(const std::vector<int32_t>& starts, int64_t B, int64_t T, const std::vector<int32_t>& positions) {
    std::vector<int32_t> out;
    for (int64_t b = 0; b < B; ++b)
        for (const int32_t p : positions) out.push_back(starts[static_cast<size_t>(b * T + p)]);
    return out;
}

// The log-sum-exp of every attention row [B, H, T], from the definition.
std::vector<double> reference_lse(const Tensor& qkv, const AttentionShape& s, const std::vector<int32_t>& starts) {
    const int64_t T = s.seq_len, H = s.n_heads, D = s.head_dim, W = s.qkv_width(), group = H / s.n_kv_heads;
    std::vector<double> lse(static_cast<size_t>(s.batch * H * T));
    for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t t = 0; t < T; ++t) {
                const int64_t first = starts.empty() ? 0 : starts[static_cast<size_t>(b * T + t)];
                double m = -std::numeric_limits<double>::infinity(), sum = 0;
                std::vector<double> scores;
                for (int64_t k = first; k <= t; ++k) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += get(qkv, (b * T + t) * W + h * D + d) * get(qkv, (b * T + k) * W + (H + h / group) * D + d);
                    scores.push_back(dot / std::sqrt(static_cast<double>(D)));
                    m = std::max(m, scores.back());
                }
                for (const double x : scores) sum += std::exp(x - m);
                lse[static_cast<size_t>((b * H + h) * T + t)] = m + std::log(sum);
            }
    return lse;
}

void expect_near_all(const char* name, const std::vector<double>& got, const std::vector<double>& want, double tol) {
    ASSERT_EQ(got.size(), want.size()) << name;
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < got.size(); ++i)
        if (!(std::abs(got[i] - want[i]) <= worst)) {
            worst = std::abs(got[i] - want[i]);
            at = i;
        }
    EXPECT_LE(worst, tol) << name << ": worst [" << at << "] " << got[at] << " vs " << want[at];
}

std::vector<double> values(const Tensor& t) {
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = get(t, i);
    return v;
}

// One attention problem with its whole-sequence reference: out, lse and dqkv.
struct Problem {
    AttentionShape s;
    std::vector<int32_t> starts;  // empty: causal
    OwnedTensor qkv, dout, out, dqkv;
    std::vector<double> lse;

    Problem(Backend& be, AttentionShape shape, std::vector<int32_t> doc_starts, uint64_t seed)
        : s(shape), starts(std::move(doc_starts)), qkv(random_tensor(f64, {s.rows(), s.qkv_width()}, seed, -2, 2)),
          dout(random_tensor(f64, {s.rows(), s.out_width()}, seed + 1)), out(f64, {s.rows(), s.out_width()}), dqkv(f64, {s.rows(), s.qkv_width()}) {
        const OwnedTensor saved(f64, be.attention_saved_shape(s));
        const OwnedTensor doc = starts.empty() ? OwnedTensor() : i32_tensor(starts);
        be.attention_fwd({.out = out, .saved = saved, .qkv = qkv, .shape = s, .doc_starts = doc});
        be.attention_bwd({.dqkv = dqkv, .dout = dout, .qkv = qkv, .out = out, .saved = saved, .shape = s, .doc_starts = doc});
        lse = reference_lse(qkv, s, starts);
    }
};

// The queries of rows `q_pos` against the keys split into the blocks `blocks` (in that order,
// the first one overwriting), forward then backward; checks acc, lse, dq against the whole-
// sequence reference and returns dk, dv per block added into dkv_total [B*T, 2*Hkv*D].
void run_query_rows(Backend& be, const Problem& p, const std::vector<int32_t>& q_pos, const std::vector<std::vector<int32_t>>& blocks,
                    const Tensor& dkv_total) {
    const AttentionShape& s = p.s;
    const int64_t B = s.batch, T = s.seq_len, H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim;
    const auto Tq = static_cast<int64_t>(q_pos.size());
    const AttentionShape local{B, Tq, H, Hkv, D};
    const OwnedTensor qkv = gather(p.qkv, B, T, q_pos, 0, s.qkv_width()), dout = gather(p.dout, B, T, q_pos, 0, H * D);
    const OwnedTensor q_positions = i32_tensor(q_pos);
    const OwnedTensor q_first = p.starts.empty() ? OwnedTensor() : i32_tensor(gather_starts(p.starts, B, T, q_pos));
    const OwnedTensor acc(f64, {B * Tq, H * D}), lse(f64, {B, H, Tq});
    std::vector<OwnedTensor> kvs, kv_positions;
    for (const std::vector<int32_t>& block : blocks) {
        kvs.push_back(gather(p.qkv, B, T, block, H * D, 2 * Hkv * D));
        kv_positions.push_back(i32_tensor(block));
    }
    for (size_t i = 0; i < blocks.size(); ++i)
        be.attention_block_fwd({.acc = acc, .lse = lse, .qkv = qkv, .kv = kvs[i], .shape = local, .kv_len = static_cast<int64_t>(blocks[i].size()),
                                .q_positions = q_positions, .kv_positions = kv_positions[i], .q_first = q_first, .first = i == 0});
    expect_near_all("acc", values(acc), values(gather(p.out, B, T, q_pos, 0, H * D)), kTol);
    std::vector<double> want_lse;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
            for (const int32_t t : q_pos) want_lse.push_back(p.lse[static_cast<size_t>((b * H + h) * T + t)]);
    expect_near_all("lse", values(lse), want_lse, kTol);

    const OwnedTensor dq = filled(f64, {B * Tq, H * D}, 0.0);
    for (size_t i = 0; i < blocks.size(); ++i) {
        const auto Tk = static_cast<int64_t>(blocks[i].size());
        const OwnedTensor dkv = filled(f64, {B * Tk, 2 * Hkv * D}, 0.0);
        be.attention_block_bwd({.dq = dq, .dkv = dkv, .dout = dout, .out = acc, .lse = lse, .qkv = qkv, .kv = kvs[i], .shape = local, .kv_len = Tk,
                                .q_positions = q_positions, .kv_positions = kv_positions[i], .q_first = q_first});
        for (int64_t b = 0; b < B; ++b)
            for (int64_t j = 0; j < Tk; ++j)
                for (int64_t c = 0; c < 2 * Hkv * D; ++c) {
                    const int64_t at = (b * T + blocks[i][static_cast<size_t>(j)]) * 2 * Hkv * D + c;
                    set(dkv_total, at, get(dkv_total, at) + get(dkv, (b * Tk + j) * 2 * Hkv * D + c));
                }
    }
    expect_near_all("dq", values(dq), values(gather(p.dqkv, B, T, q_pos, 0, H * D)), kTol);
}

// Context parallelism's ring for every rank of cp: rank r's queries against the blocks of
// ranks r, r - 1, ... (mod cp); dk and dv of every block summed over the ranks.
void expect_ring_matches(const Problem& p, int64_t cp) {
    SCOPED_TRACE(cat("cp ", cp, p.starts.empty() ? " causal" : " document starts"));
    auto be = make_cpu_backend(1);
    const AttentionShape& s = p.s;
    const int64_t W = s.qkv_width(), H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim;
    const OwnedTensor dkv_total = filled(f64, {s.rows(), 2 * Hkv * D}, 0.0);
    for (int64_t r = 0; r < cp; ++r) {
        SCOPED_TRACE(cat("rank ", r));
        std::vector<std::vector<int32_t>> blocks;
        for (int64_t i = 0; i < cp; ++i) blocks.push_back(cp_positions(s.seq_len, cp, (r - i + cp) % cp));
        run_query_rows(*be, p, cp_positions(s.seq_len, cp, r), blocks, dkv_total);
    }
    std::vector<double> want;
    for (int64_t n = 0; n < s.rows(); ++n)
        for (int64_t c = 0; c < 2 * Hkv * D; ++c) want.push_back(get(p.dqkv, n * W + H * D + c));
    expect_near_all("dk, dv", values(dkv_total), want, kTol);
}

std::vector<int32_t> starts_with_ends(int64_t B, int64_t T, const std::vector<std::vector<int64_t>>& ends) {
    std::vector<int32_t> starts;
    for (int64_t b = 0; b < B; ++b) {
        int32_t start = 0;
        for (int64_t t = 0; t < T; ++t) {
            starts.push_back(start);
            for (const int64_t e : ends[static_cast<size_t>(b)])
                if (e == t) start = static_cast<int32_t>(t + 1);
        }
    }
    return starts;
}

TEST(CpuAttentionBlockOps, ContextParallelRingAtCp2AndCp4_EqualsWholeAttentionForwardAndBackward) {
    auto be = make_cpu_backend(1);
    const Problem gqa(*be, {2, 16, 4, 2, 4}, {}, 100);
    expect_ring_matches(gqa, 2);
    expect_ring_matches(gqa, 4);
    const Problem mqa(*be, {1, 24, 3, 1, 6}, {}, 110);
    expect_ring_matches(mqa, 2);
    expect_ring_matches(mqa, 4);
}

TEST(CpuAttentionBlockOps, ContextParallelRingWithDocumentStarts_EqualsWholeDocumentMaskedAttention) {
    auto be = make_cpu_backend(1);
    // Boundaries inside chunks, on chunk edges, and a document spanning the two chunks of a rank.
    const Problem p(*be, {2, 16, 4, 2, 4}, starts_with_ends(2, 16, {{2, 7, 8}, {11}}), 120);
    expect_ring_matches(p, 2);
    expect_ring_matches(p, 4);
}

TEST(CpuAttentionBlockOps, UnevenBlocksInAnyOrder_EqualWholeAttention) {
    auto be = make_cpu_backend(1);
    for (const bool documents : {false, true}) {
        const Problem p(*be, {2, 13, 2, 2, 5}, documents ? starts_with_ends(2, 13, {{4}, {0, 9}}) : std::vector<int32_t>{}, 130);
        std::vector<int32_t> all(13);
        std::iota(all.begin(), all.end(), 0);
        const OwnedTensor dkv_total = filled(f64, {p.s.rows(), 2 * p.s.n_kv_heads * p.s.head_dim}, 0.0);
        // Keys in blocks of 5, 1 and 7 rows (one not contiguous), the future block first.
        run_query_rows(*be, p, all, {{8, 9, 10, 11, 12, 6}, {0, 2, 4, 1, 3}, {5, 7}}, dkv_total);
        std::vector<double> want;
        const int64_t W = p.s.qkv_width(), KV = 2 * p.s.n_kv_heads * p.s.head_dim, HD = p.s.n_heads * p.s.head_dim;
        for (int64_t n = 0; n < p.s.rows(); ++n)
            for (int64_t c = 0; c < KV; ++c) want.push_back(get(p.dqkv, n * W + HD + c));
        expect_near_all("dk, dv", values(dkv_total), want, kTol);
    }
}

TEST(CpuAttentionBlockOps, BlockNoQuerySees_LeavesAccLseAndGradientsUnchanged) {
    auto be = make_cpu_backend(1);
    const AttentionShape s{2, 4, 2, 1, 4};
    const OwnedTensor qkv = random_tensor(f64, {s.rows(), s.qkv_width()}, 140), kv = random_tensor(f64, {s.batch * 3, 2 * s.head_dim}, 141);
    const OwnedTensor q_pos = i32_tensor({0, 1, 2, 3}), future = i32_tensor({4, 5, 6}), past = i32_tensor({0, 1, 2});
    const OwnedTensor q_first = i32_tensor({3, 3, 3, 3, 3, 3, 3, 3});  // documents start at 3: keys 0-2 are another document's
    const OwnedTensor acc = random_tensor(f64, {s.rows(), s.out_width()}, 142), lse = random_tensor(f64, {2, 2, 4}, 143);
    const OwnedTensor acc0 = copy_of(acc), lse0 = copy_of(lse);
    be->attention_block_fwd({.acc = acc, .lse = lse, .qkv = qkv, .kv = kv, .shape = s, .kv_len = 3, .q_positions = q_pos, .kv_positions = future, .q_first = Tensor()});
    be->attention_block_fwd(
        {.acc = acc, .lse = lse, .qkv = qkv, .kv = kv, .shape = s, .kv_len = 3, .q_positions = q_pos, .kv_positions = past, .q_first = q_first});
    EXPECT_TRUE(bitwise_equal(acc, acc0));
    EXPECT_TRUE(bitwise_equal(lse, lse0));

    const OwnedTensor dq = random_tensor(f64, {s.rows(), s.out_width()}, 144), dkv = random_tensor(f64, {s.batch * 3, 2 * s.head_dim}, 145);
    const OwnedTensor dq0 = copy_of(dq), dkv0 = copy_of(dkv), dout = random_tensor(f64, {s.rows(), s.out_width()}, 146);
    be->attention_block_bwd({.dq = dq, .dkv = dkv, .dout = dout, .out = acc, .lse = lse, .qkv = qkv, .kv = kv, .shape = s, .kv_len = 3,
                             .q_positions = q_pos, .kv_positions = future, .q_first = Tensor()});
    EXPECT_TRUE(bitwise_equal(dq, dq0));
    EXPECT_TRUE(bitwise_equal(dkv, dkv0));

    // As the first block: out 0 and lse -inf, which the next block's merge replaces.
    be->attention_block_fwd({.acc = acc, .lse = lse, .qkv = qkv, .kv = kv, .shape = s, .kv_len = 3, .q_positions = q_pos, .kv_positions = future,
                             .q_first = Tensor(), .first = true});
    for (int64_t i = 0; i < acc.numel(); ++i) ASSERT_EQ(get(acc, i), 0.0) << i;
    for (int64_t i = 0; i < lse.numel(); ++i) ASSERT_EQ(get(lse, i), -std::numeric_limits<double>::infinity()) << i;
}

// Positions t - start(t), given explicitly, against the same restarts from doc_starts.
TEST(CpuAttentionBlockOps, ExplicitPositionsInRopeAndEmbedding_EqualTheDocumentStartsPath) {
    auto be = make_cpu_backend(1);
    const int64_t B = 2, T = 9, C = 6, V = 11, D = 8, heads = 2, width = 3 * D;
    const std::vector<int32_t> starts = starts_with_ends(B, T, {{3}, {0, 6}});
    std::vector<int32_t> positions;
    for (int64_t n = 0; n < B * T; ++n) positions.push_back(static_cast<int32_t>(n % T - starts[static_cast<size_t>(n)]));
    const OwnedTensor doc = i32_tensor(starts), pos = i32_tensor(positions);

    const OwnedTensor table(f64, {T, D});
    fill_rope_table(table, 10000.0);
    for (const bool backward : {false, true}) {
        const OwnedTensor x = random_tensor(f64, {B * T, width}, 150), by_starts = copy_of(x), by_positions = copy_of(x);
        if (backward) {
            be->rope_bwd({.x = by_starts, .table = table, .seq_len = T, .n_heads = heads, .head_dim = D, .doc_starts = doc, .positions = Tensor()});
            be->rope_bwd({.x = by_positions, .table = table, .seq_len = T, .n_heads = heads, .head_dim = D, .doc_starts = Tensor(), .positions = pos});
        } else {
            be->rope_fwd({.x = by_starts, .table = table, .seq_len = T, .n_heads = heads, .head_dim = D, .doc_starts = doc, .positions = Tensor()});
            be->rope_fwd({.x = by_positions, .table = table, .seq_len = T, .n_heads = heads, .head_dim = D, .doc_starts = Tensor(), .positions = pos});
        }
        EXPECT_TRUE(bitwise_equal(by_starts, by_positions)) << (backward ? "rope_bwd" : "rope_fwd");
        EXPECT_FALSE(bitwise_equal(by_starts, x));
    }

    const OwnedTensor tokens = random_tokens(B * T, V, 151), wte = random_tensor(f64, {V, C}, 152), wpe = random_tensor(f64, {T, C}, 153);
    const OwnedTensor out_starts(f64, {B * T, C}), out_positions(f64, {B * T, C});
    be->embedding_fwd({.out = out_starts, .tokens = tokens, .wte = wte, .wpe = wpe, .seq_len = T, .vocab = {}, .doc_starts = doc, .positions = Tensor()});
    be->embedding_fwd({.out = out_positions, .tokens = tokens, .wte = wte, .wpe = wpe, .seq_len = T, .vocab = {}, .doc_starts = Tensor(), .positions = pos});
    EXPECT_TRUE(bitwise_equal(out_starts, out_positions));
    const OwnedTensor dout = random_tensor(f64, {B * T, C}, 154);
    const OwnedTensor dwte_s = filled(f64, {V, C}, 0.5), dwpe_s = filled(f64, {T, C}, 0.5), dwte_p = filled(f64, {V, C}, 0.5), dwpe_p = filled(f64, {T, C}, 0.5);
    be->embedding_bwd({.dwte = dwte_s, .dwpe = dwpe_s, .dout = dout, .tokens = tokens, .seq_len = T, .vocab = {}, .doc_starts = doc, .positions = Tensor()});
    be->embedding_bwd({.dwte = dwte_p, .dwpe = dwpe_p, .dout = dout, .tokens = tokens, .seq_len = T, .vocab = {}, .doc_starts = Tensor(), .positions = pos});
    EXPECT_TRUE(bitwise_equal(dwte_s, dwte_p));
    EXPECT_TRUE(bitwise_equal(dwpe_s, dwpe_p));
}

// Context parallelism's positions reach the table's last row; one past it is refused naming the row.
TEST(CpuAttentionBlockOps, ExplicitPositions_ReachTheTablesLastRowAndOnePastIsRefused) {
    auto be = make_cpu_backend(1);
    const int64_t T = 8, C = 4;
    const std::vector<int32_t> rank0 = cp_positions(T, 2, 0);  // 0, 1, 6, 7
    const OwnedTensor tokens = random_tokens(4, 5, 160), wte = random_tensor(f64, {5, C}, 161), wpe = random_tensor(f64, {T, C}, 162);
    const OwnedTensor out(f64, {4, C});
    be->embedding_fwd({.out = out, .tokens = tokens, .wte = wte, .wpe = wpe, .seq_len = 4, .vocab = {}, .doc_starts = Tensor(), .positions = i32_tensor(rank0)});
    for (int64_t i = 0; i < 4; ++i)
        for (int64_t c = 0; c < C; ++c)
            EXPECT_EQ(get(out, i * C + c), get(wte, tokens.data<int32_t>()[i] * C + c) + get(wpe, rank0[static_cast<size_t>(i)] * C + c));
    try {
        be->embedding_fwd({.out = out, .tokens = tokens, .wte = wte, .wpe = wpe, .seq_len = 4, .vocab = {}, .doc_starts = Tensor(), .positions = i32_tensor({0, 1, 7, 8})});
        FAIL() << "a position past the table was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("position 8 at row 3"), std::string::npos) << e.what();
    }
}

TEST(CpuAttentionBlockOps, CopyColumns_CopiesAndConvertsOnlyItsColumns) {
    auto be = make_cpu_backend(1);
    const OwnedTensor src = random_tensor(f64, {3, 7}, 170), dst = filled(DType::f32, {3, 5}, 9.0);
    be->copy_columns({.dst = dst, .dst_col = 1, .src = src, .src_col = 2, .cols = 3});
    for (int64_t n = 0; n < 3; ++n)
        for (int64_t c = 0; c < 5; ++c) {
            const double want = c >= 1 && c < 4 ? static_cast<double>(static_cast<float>(get(src, n * 7 + c + 1))) : 9.0;
            EXPECT_EQ(get(dst, n * 5 + c), want) << n << ", " << c;
        }
    const OwnedTensor back = filled(f64, {3, 2}, 0.0);
    be->copy_columns({.dst = back, .dst_col = 0, .src = dst, .src_col = 1, .cols = 2});
    for (int64_t n = 0; n < 3; ++n)
        for (int64_t c = 0; c < 2; ++c) EXPECT_EQ(get(back, n * 2 + c), get(dst, n * 5 + 1 + c));
    EXPECT_THROW(be->copy_columns({.dst = back, .dst_col = 1, .src = dst, .src_col = 0, .cols = 2}), Error);
}

}  // namespace
