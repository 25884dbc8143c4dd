// The CPU reference backend: every Backend op for f32 and f64, BLAS for the GEMMs and
// OpenMP over rows (over (batch, head) groups for attention). Results are bitwise
// reproducible for a given thread count: no reduction's order depends on scheduling.
// One file per op family (cpu_embedding.cpp, cpu_norm.cpp, ...) implements its members.
#pragma once

#include <string>

#include "backend/backend.h"

namespace llmtrain {

class CpuBackend final : public Backend {
public:
    // threads <= 0: every core (omp_get_max_threads()).
    explicit CpuBackend(int threads);

    std::string name() const override;
    bool supports(Op op, DType dtype) const override;
    int threads() const { return threads_; }
    Device device() const override { return Device::cpu; }
    Memory allocate(size_t bytes) override { return allocate_host_memory(bytes); }
    void copy_from_host(const Tensor& dst, const void* src) override;
    void copy_to_host(void* dst, const Tensor& src) override;

    void embedding_fwd(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t seq_len, VocabShard shard) override;
    void embedding_bwd(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens, int64_t seq_len, VocabShard shard) override;

    void layernorm_fwd(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b, double eps) override;
    void layernorm_bwd(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                       bool accumulate_dx) override;
    void rmsnorm_fwd(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w, double eps) override;
    void rmsnorm_bwd(const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& rstd, bool accumulate_dx) override;

    void matmul_fwd(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias) override;
    void matmul_bwd(const Tensor& dx, const Tensor& dw, const Tensor& dbias, const Tensor& dout, const Tensor& x, const Tensor& w) override;

    void attention_fwd(const Tensor& out, const Tensor& saved, const Tensor& qkv, const AttentionShape& shape) override;
    void attention_bwd(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& saved, const AttentionShape& shape) override;

    void rope_fwd(const Tensor& x, const Tensor& table, int64_t seq_len, int64_t n_heads, int64_t head_dim) override;
    void rope_bwd(const Tensor& dx, const Tensor& table, int64_t seq_len, int64_t n_heads, int64_t head_dim) override;

    void gelu_fwd(const Tensor& out, const Tensor& x) override;
    void gelu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) override;
    void swiglu_fwd(const Tensor& out, const Tensor& x) override;
    void swiglu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) override;
    void add(const Tensor& out, const Tensor& a, const Tensor& b) override;

    void xent_fwd(const Tensor& losses, const Tensor& lse, const Tensor& logits, const Tensor& targets, VocabShard vocab) override;
    void xent_bwd(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse, VocabShard shard, double dloss) override;
    void logits_row_max(const Tensor& row_max, const Tensor& logits, VocabShard shard) override;
    void xent_partial(const Tensor& partial, const Tensor& logits, const Tensor& targets, const Tensor& row_max, VocabShard shard) override;
    void xent_combine(const Tensor& losses, const Tensor& lse, const Tensor& partial, const Tensor& row_max) override;

    void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& param_copy, const AdamWStep& step) override;
    double sum_squares(const Tensor& x) override;
    void accumulate_sum(const Tensor& total, const Tensor& x, double scale) override;
    void accumulate_sum_squares(const Tensor& total, const std::vector<Tensor>& pieces) override;
    void fill_zero(const Tensor& x) override;
    void copy(const Tensor& out, const Tensor& in) override;

private:
    int threads_;
};

}  // namespace llmtrain
