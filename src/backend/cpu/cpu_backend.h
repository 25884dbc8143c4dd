// The CPU reference backend: every Backend op for f32 and f64, BLAS for the GEMMs and
// OpenMP over rows (over (batch, head) groups for attention). Results are bitwise
// reproducible for a given thread count: no reduction's order depends on scheduling.
// One file per op family (cpu_embedding.cpp, cpu_norm.cpp, ...) implements its members.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace llmtrain {

class CpuBackend final : public Backend {
public:
    // threads <= 0: every core (omp_get_max_threads()).
    explicit CpuBackend(int threads);

    std::string name() const override;
    int threads() const { return threads_; }
    Device device() const override { return Device::cpu; }
    Memory allocate(size_t bytes) override;
    void copy_from_host(const Tensor& dst, const void* src) override;
    void copy_to_host(void* dst, const Tensor& src) override;

    void embedding_fwd(const EmbeddingFwd& args) override;
    void embedding_bwd(const EmbeddingBwd& args) override;

    void layernorm_fwd(const LayerNormFwd& args) override;
    void layernorm_bwd(const LayerNormBwd& args) override;
    void rmsnorm_fwd(const RmsNormFwd& args) override;
    void rmsnorm_bwd(const RmsNormBwd& args) override;

    void matmul_fwd(const MatmulFwd& args) override;
    bool keeps_row_blocks() const override { return true; }
    void matmul_bwd(const MatmulBwd& args) override;

    void attention_fwd(const AttentionFwd& args) override;
    void attention_bwd(const AttentionBwd& args) override;

    void attention_block_fwd(const AttentionBlockFwd& args) override;
    void attention_block_bwd(const AttentionBlockBwd& args) override;
    void copy_columns(const CopyColumns& args) override;
    void rope_fwd(const Rope& args) override;
    void rope_bwd(const Rope& args) override;

    void gelu_fwd(const Tensor& out, const Tensor& x) override;
    void gelu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) override;
    void swiglu_fwd(const Tensor& out, const Tensor& x) override;
    void swiglu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) override;
    void add(const Tensor& out, const Tensor& a, const Tensor& b) override;

    void xent_fwd(const XentFwd& args) override;
    void xent_bwd(const XentBwd& args) override;
    void logits_row_max(const Tensor& row_max, const Tensor& logits, VocabShard shard) override;
    void xent_partial(const XentPartial& args) override;
    void xent_combine(const XentCombine& args) override;

    void adamw(const AdamWUpdate& args) override;
    double sum_squares(const Tensor& x) override;
    void accumulate_sum(const Tensor& total, const Tensor& x, double scale) override;
    void accumulate_sum_squares(const Tensor& total, const std::vector<Tensor>& pieces) override;
    void fill_zero(const Tensor& x) override;
    void copy(const Tensor& out, const Tensor& in) override;

    void moe_route_fwd(const MoeRouteFwd& args) override;
    void moe_route_bwd(const MoeRouteBwd& args) override;
    void moe_load_stats(const MoeLoadStats& args) override;
    void moe_aux_loss_fwd(const MoeAuxLossFwd& args) override;
    void moe_aux_loss_bwd(const MoeAuxLossBwd& args) override;
    void moe_z_loss_fwd(const MoeZLossFwd& args) override;
    void moe_z_loss_bwd(const MoeZLossBwd& args) override;
    void moe_permute_plan(const MoePermutePlan& args) override;
    void moe_permute_fwd(const MoePermuteFwd& args) override;
    void moe_permute_bwd(const MoePermuteBwd& args) override;
    void moe_combine_fwd(const MoeCombineFwd& args) override;
    void moe_combine_bwd(const MoeCombineBwd& args) override;

    void fp8_amax(const Fp8Amax& args) override;
    void fp8_update_scale(const Fp8UpdateScale& args) override;
    void fp8_cast(const Fp8Cast& args) override;
    void matmul_fp8(const MatmulFp8& args) override;

private:
    int threads_;
    // Bytes held through allocate() now: shared with the memory's deleters, which may outlive the backend.
    std::shared_ptr<std::atomic<size_t>> held_ = std::make_shared<std::atomic<size_t>>(0);
};

}  // namespace llmtrain
