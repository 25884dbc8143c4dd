// Token and position embedding on the CPU.
//   forward:  out[n] = wte[tokens[n]] + wpe[pos(n)]
//   backward: dwte[tokens[n]] += dout[n];  dwpe[pos(n)] += dout[n]
// pos(n) = n % T, less the start of n's document when positions restart (doc_starts), or
// explicit positions[n].
// With a vocabulary shard, wte holds rows [begin, begin + V_local): a token outside them
// contributes a zero row and no gradient.
// The backward scatters rows into shared gradient rows, so it runs over column blocks:
// each gradient element is summed by one thread in row order (deterministic).
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace llmtrain {

namespace {

template <class T>
void embedding_fwd_rows(T* out, const int32_t* tokens, const T* wte, const T* wpe, cpu::RowPositions position, cpu::VocabRows local, int64_t rows, int64_t C,
                        int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
        const T* e = local.holds(tokens[n]) ? wte + (tokens[n] - local.begin) * C : nullptr;
        const T* p = wpe ? wpe + position(n) * C : nullptr;
        T* o = out + n * C;
        for (int64_t c = 0; c < C; ++c) o[c] = (e ? e[c] : T(0)) + (p ? p[c] : T(0));
    }
}

template <class T>
void embedding_bwd_columns(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, cpu::RowPositions position, cpu::VocabRows local, int64_t rows,
                           int64_t C, int threads) {
    const int64_t blocks = cpu::column_block_count(C);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
        const int64_t c0 = block * cpu::column_block, c1 = cpu::column_block_end(block, C);
        for (int64_t n = 0; n < rows; ++n) {
            const T* d = dout + n * C;
            if (local.holds(tokens[n])) {
                T* g = dwte + (tokens[n] - local.begin) * C;
                for (int64_t c = c0; c < c1; ++c) g[c] += d[c];
            }
            if (dwpe) {
                T* p = dwpe + position(n) * C;
                for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
            }
        }
    }
}

}  // namespace

void CpuBackend::embedding_fwd(const EmbeddingFwd& a) {
    const Tensor &out = a.out, &tokens = a.tokens, &wte = a.wte, &wpe = a.wpe;
    const int64_t seq_len = a.seq_len;
    const VocabShard shard = a.vocab;
    cpu::OpTimer timer(profile_, Op::embedding_fwd);
    const char* op = timer.name();
    cpu::expect_rank(op, "wte", wte, 2);
    cpu::expect_rank(op, "tokens", tokens, 1);
    const int64_t N = tokens.dim(0), V = wte.dim(0), C = wte.dim(1);
    cpu::dispatch_float(op, "wte", wte, [&]<class T>() {
        cpu::expect_tensor(op, "tokens", tokens, {N}, DType::i32);
        cpu::expect_tensor(op, "out", out, {N, C}, wte.dtype());
        if (!wpe.empty()) {
            cpu::expect_rank(op, "wpe", wpe, 2);
            cpu::expect_tensor(op, "wpe", wpe, {wpe.dim(0), C}, wte.dtype());
        }
        expect_positions(op, "wpe", wpe, seq_len);
        const cpu::VocabRows local(shard, V);
        cpu::expect_vocab_rows(op, local);
        cpu::expect_ids_in_vocab(op, "token id", tokens.data<int32_t>(), N, local.total);
        const cpu::RowPositions positions = cpu::row_positions(op, a.doc_starts, a.positions, N, seq_len, wpe.empty() ? 0 : wpe.dim(0));
        embedding_fwd_rows(out.data<T>(), tokens.data<int32_t>(), wte.data<T>(), cpu::data_or_null<T>(wpe), positions, local, N, C, threads_);
    });
}

void CpuBackend::embedding_bwd(const EmbeddingBwd& a) {
    const Tensor &dwte = a.dwte, &dwpe = a.dwpe, &dout = a.dout, &tokens = a.tokens;
    const int64_t seq_len = a.seq_len;
    const VocabShard shard = a.vocab;
    cpu::OpTimer timer(profile_, Op::embedding_bwd);
    const char* op = timer.name();
    cpu::expect_rank(op, "dwte", dwte, 2);
    cpu::expect_rank(op, "tokens", tokens, 1);
    const int64_t N = tokens.dim(0), V = dwte.dim(0), C = dwte.dim(1);
    cpu::dispatch_float(op, "dwte", dwte, [&]<class T>() {
        cpu::expect_tensor(op, "tokens", tokens, {N}, DType::i32);
        cpu::expect_tensor(op, "dout", dout, {N, C}, dwte.dtype());
        if (!dwpe.empty()) {
            cpu::expect_rank(op, "dwpe", dwpe, 2);
            cpu::expect_tensor(op, "dwpe", dwpe, {dwpe.dim(0), C}, dwte.dtype());
        }
        expect_positions(op, "dwpe", dwpe, seq_len);
        const cpu::VocabRows local(shard, V);
        cpu::expect_vocab_rows(op, local);
        cpu::expect_ids_in_vocab(op, "token id", tokens.data<int32_t>(), N, local.total);
        const cpu::RowPositions positions = cpu::row_positions(op, a.doc_starts, a.positions, N, seq_len, dwpe.empty() ? 0 : dwpe.dim(0));
        embedding_bwd_columns(dwte.data<T>(), cpu::data_or_null<T>(dwpe), dout.data<T>(), tokens.data<int32_t>(), positions, local, N, C, threads_);
    });
}

}  // namespace llmtrain
