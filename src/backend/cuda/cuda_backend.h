// The CUDA backend: one GPU, one stream. Every op checks shapes and dtypes on the host, then
// enqueues kernels (kernels/*.cu) or cuBLASLt GEMMs on the stream; nothing waits for the
// GPU but copy_to_host, sum_squares and synchronize.
//
// Memory: allocate() is cudaMalloc at set-up (the model plans its activations up front);
// ops that need scratch share one workspace, sized by the first step's largest request
// (fixed afterwards: the shapes of a run do not grow), and cuBLASLt has its own 32 MiB.
//
// Host to device: copy_from_host of up to staging_max_bytes goes through a ring of pinned
// host buffers (the token batches, every micro-batch): the copy is truly asynchronous, and a
// buffer is written again only once its copy has completed (an event), so the host never
// waits for the stream there. Larger copies (weights at start-up) go straight from pageable
// memory.
//
// Profile: while set_profiling(true), each op is bracketed by a pair of CUDA events;
// synchronize() turns the pairs into per-op GPU seconds in profile(). Off by default.
//
// Attention: cuDNN's fused flash attention (backend/cudnn) where model.attention allows it,
// libcudnn loads and cuDNN plans the shape; else the native kernels (kernels/attention.cu).
// The choice is per shape and the same for forward and backward.
//
// LLMTRAIN_CUDA_CHECK=sync (cuda_host_rules.h): every op ends with a stream synchronize and
// an error check, so an asynchronous fault is reported with the op that caused it.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "kernels/kernels.h"

namespace llmtrain {

class CublasLtMatmul;
class CudnnAttention;

class CudaBackend final : public Backend {
public:
    CudaBackend(int device_index, AttentionImpl attention);
    ~CudaBackend() override;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    std::string name() const override;
    Device device() const override { return Device::cuda; }
    Memory allocate(size_t bytes) override;
    void copy_from_host(const Tensor& dst, const void* src) override;
    void copy_to_host(void* dst, const Tensor& src) override;
    std::shared_ptr<void> pin_host_memory(void* p, size_t bytes) override;
    void synchronize() override;
    void* device_stream() const override { return stream_; }
    size_t workspace_bytes() const override;
    void set_profiling(bool on) override { profiling_ = on; }
    size_t peak_memory_bytes() const override { return peak_allocated_bytes_; }
    double peak_bf16_tflops() const override;
    std::optional<GpuDevice> gpu_device() const override { return GpuDevice{device_name_, sm_major_, sm_minor_}; }
    std::string describe_attention(const AttentionShape& shape, DType dtype) override;

    void embedding_fwd(const EmbeddingFwd& args) override;
    void embedding_bwd(const EmbeddingBwd& args) override;
    void layernorm_fwd(const LayerNormFwd& args) override;
    void layernorm_bwd(const LayerNormBwd& args) override;
    void rmsnorm_fwd(const RmsNormFwd& args) override;
    void rmsnorm_bwd(const RmsNormBwd& args) override;
    void matmul_fwd(const MatmulFwd& args) override;
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
    void matmul_gelu_fwd(const MatmulGeluFwd& args) override;
    void gelu_matmul_bwd(const GeluMatmulBwd& args) override;
    void xent_fwd_bwd(const XentFwdBwd& args) override;
    void add_norm_fwd(const AddNormFwd& args) override;
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
    friend class CudaOpScope;
    // The workspace, grown (with a synchronize) when a request is larger than it.
    void* workspace(size_t bytes);
    // cudaStreamSynchronize, counted as a host synchronization.
    void wait_for_stream(const char* what);
    // The next pinned staging buffer of at least `bytes`, its last copy completed.
    struct StagingSlot {
        void* host = nullptr;
        size_t capacity = 0;
        cudaEvent_t copied = nullptr;
    };
    StagingSlot& staging_slot(size_t bytes);
    cudaEvent_t take_event();
    void resolve_profile();
    void open_cudnn();
    // Whether cuDNN runs attention at this shape (planning it on the first ask); refuses a
    // shape cuDNN cannot plan when model.attention = "cudnn".
    bool cudnn_runs(const AttentionShape& shape, DType dtype, const char* op);

    int device_index_;
    std::string device_name_;
    int sm_major_ = 0, sm_minor_ = 0, sm_count_ = 0;
    cudaStream_t stream_ = nullptr;
    Memory cublas_workspace_;
    std::unique_ptr<CublasLtMatmul> gemm_;
    Memory workspace_;
    size_t workspace_size_ = 0;
    size_t allocated_bytes_ = 0, peak_allocated_bytes_ = 0;
    Memory sum_result_;  // one device double for sum_squares
    AttentionImpl attention_impl_;
    std::unique_ptr<CudnnAttention> cudnn_;  // null: the native kernels only
    bool profiling_ = false;
    bool sync_check_ = false;
    bool pin_failure_said_ = false;  // a failed cudaHostRegister is logged once
    struct PendingOp {
        Op op;
        cudaEvent_t start, stop;
    };
    std::vector<PendingOp> pending_;
    std::vector<cudaEvent_t> free_events_;
    std::vector<StagingSlot> staging_;
    size_t next_staging_ = 0;
};

// Throws "<what>: <CUDA error>" unless status is cudaSuccess.
void check_cuda(cudaError_t status, const char* what);

}  // namespace llmtrain
