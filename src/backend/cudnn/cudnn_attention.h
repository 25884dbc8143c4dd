// Causal attention through cuDNN's fused flash-attention engines (attention_graphs.h): the
// forward and backward graphs of each (shape, dtype), their deterministic plans built on
// the first use and cached, and their execution on the CUDA backend's stream. Host code
// only (pointers and the stream are opaque), so that a stand-in libcudnn tests it on any
// machine.
//
// Workspace: each plan's own, and for the backward the Delta rows [B, H, T] fp32 in front
// of it; attention_workspace_bytes (backend.h) is the memory plan's bound of the total.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cudnn/attention_graphs.h"
#include "backend/cudnn/cudnn_graph.h"

namespace llmtrain {

// What the plans of a shape are, for logs and `bench attention`.
struct CudnnAttentionReport {
    bool planned = false;
    std::string mask_form;                  // the graph form that planned
    cudnn::EngineInfo forward, backward;
    std::string failure;                    // why no form planned (cuDNN's errors included)
    size_t workspace_bytes = 0;             // what forward and backward need (the larger)
};

class CudnnAttention {
public:
    // Loads libcudnn (cudnn_api.h) and makes a handle on `stream` (a cudaStream_t); null, with
    // why_not set, where either fails.
    static std::unique_ptr<CudnnAttention> open(void* stream, std::string& why_not);
    ~CudnnAttention();
    CudnnAttention(const CudnnAttention&) = delete;
    CudnnAttention& operator=(const CudnnAttention&) = delete;

    // "cuDNN 9.19.0 (libcudnn.so.9)"
    std::string describe() const;
    // Plans the shape on the first ask (both directions, each mask form in turn until one
    // plans); the report says whether it did, and why not.
    const CudnnAttentionReport& plan(const AttentionShape& shape, DType dtype);

    // The shape must have planned. stats [B, H, T] fp32 (the log-sum-exp rows); workspace at
    // least report.workspace_bytes, 256-byte aligned.
    void forward(const AttentionShape& shape, DType dtype, void* out, float* stats, const void* qkv, void* workspace);
    void backward(const AttentionShape& shape, DType dtype, void* dqkv, const void* dout, const void* qkv, const void* out, const float* stats,
                  void* workspace);

private:
    struct ShapePlans {
        CudnnAttentionReport report;
        cudnn::MaskForm form = cudnn::MaskForm::int32_indices;
        std::unique_ptr<cudnn::Graph> forward_graph, backward_graph;
        std::optional<cudnn::Plan> forward, backward;
        // The by-value scalars, where the variant packs point (read at each execution).
        float scale = 0, fill = 0, one = 1;
        // Finalized variant packs by their bindings: a layer's activations keep their
        // addresses from step to step, so each is built once.
        std::map<std::vector<void*>, cudnn::Owned> packs;
    };
    using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, DType>;

    CudnnAttention(std::unique_ptr<cudnn::Library> library, cudnn::Handle handle) : library_(std::move(library)), handle_(handle) {}
    ShapePlans& planned(const AttentionShape& shape, DType dtype, const char* op);
    // The variant pack binding these pointers (the workspace last), built on the first use.
    const cudnn::Owned& pack(ShapePlans& p, const std::vector<int64_t>& uids, std::vector<void*> pointers);
    void build(ShapePlans& plans, const AttentionShape& shape, DType dtype);

    std::unique_ptr<cudnn::Library> library_;
    cudnn::Handle handle_ = nullptr;
    std::map<Key, ShapePlans> plans_;
};

// Bytes of the Delta rows the backward keeps in front of its plan's workspace.
size_t cudnn_attention_delta_bytes(const AttentionShape& shape);

}  // namespace llmtrain
