#include "backend/cudnn/cudnn_attention.h"

#include <cmath>
#include <type_traits>

#include "core/error.h"

namespace llmtrain {

namespace {

constexpr size_t kAlignment = 256;
size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

cudnn::Enum io_type(DType dtype) {
    if (dtype == DType::bf16) return cudnn::kBFloat16;
    if (dtype == DType::f16) return cudnn::kHalf;
    fail(ErrorKind::unsupported, "cuDNN attention: dtype ", dtype_name(dtype), "; it computes in bf16 or f16");
}

std::string shape_text(const AttentionShape& s, DType dtype) {
    return cat("batch ", s.batch, ", seq_len ", s.seq_len, ", ", s.n_heads, " heads (", s.n_kv_heads, " kv) of ", s.head_dim, ", ", dtype_name(dtype));
}

// Element offsets of K and V in a packed qkv row.
int64_t k_offset(const AttentionShape& s) { return s.n_heads * s.head_dim; }
int64_t v_offset(const AttentionShape& s) { return (s.n_heads + s.n_kv_heads) * s.head_dim; }

template <class T>
T* shifted(T* base, int64_t elements, DType dtype) {
    using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
    return reinterpret_cast<T*>(reinterpret_cast<Byte*>(base) + elements * static_cast<int64_t>(dtype_size(dtype)));
}

}  // namespace

size_t cudnn_attention_delta_bytes(const AttentionShape& s) { return aligned(static_cast<size_t>(s.batch * s.n_heads * s.seq_len) * sizeof(float)); }

std::unique_ptr<CudnnAttention> CudnnAttention::open(void* stream, std::string& why_not) {
    std::unique_ptr<cudnn::Library> library = cudnn::Library::load(why_not);
    if (!library) return nullptr;
    cudnn::Handle handle = nullptr;
    if (const cudnn::Status s = library->api().create(&handle); s != cudnn::kSuccess) {
        why_not = cat("cudnnCreate failed: ", library->describe(s));
        return nullptr;
    }
    if (const cudnn::Status s = library->api().set_stream(handle, stream); s != cudnn::kSuccess) {
        why_not = cat("cudnnSetStream failed: ", library->describe(s));
        library->api().destroy(handle);
        return nullptr;
    }
    return std::unique_ptr<CudnnAttention>(new CudnnAttention(std::move(library), handle));
}

CudnnAttention::~CudnnAttention() {
    plans_.clear();  // plans and graphs before the handle and the library
    if (handle_) library_->api().destroy(handle_);
}

std::string CudnnAttention::describe() const { return cat("cuDNN ", library_->version(), " (", library_->path(), ")"); }

void CudnnAttention::build(ShapePlans& p, const AttentionShape& shape, DType dtype) {
    const cudnn::Enum io = io_type(dtype);
    std::string failures;
    for (const cudnn::MaskForm form : cudnn::kMaskForms) {
        try {
            auto fwd_graph = cudnn::forward_graph(*library_, handle_, shape, io, form);
            cudnn::Plan fwd = cudnn::make_plan(*fwd_graph, handle_);
            auto bwd_graph = cudnn::backward_graph(*library_, handle_, shape, io, form);
            cudnn::Plan bwd = cudnn::make_plan(*bwd_graph, handle_);
            p.form = form;
            p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
            p.fill = cudnn::mask_fill_value(form);
            p.report.planned = true;
            p.report.mask_form = cudnn::mask_form_name(form);
            p.report.forward = fwd.engine;
            p.report.backward = bwd.engine;
            p.report.workspace_bytes = std::max(aligned(static_cast<size_t>(fwd.engine.workspace_bytes)),
                                                cudnn_attention_delta_bytes(shape) + aligned(static_cast<size_t>(bwd.engine.workspace_bytes)));
            p.forward_graph = std::move(fwd_graph);
            p.backward_graph = std::move(bwd_graph);
            p.forward = std::move(fwd);
            p.backward = std::move(bwd);
            return;
        } catch (const Error& e) {
            failures += cat(failures.empty() ? "" : " | ", e.what());
        }
    }
    p.report.failure = cat(shape_text(shape, dtype), ": ", failures);
}

const CudnnAttentionReport& CudnnAttention::plan(const AttentionShape& shape, DType dtype) {
    const Key key{shape.batch, shape.seq_len, shape.n_heads, shape.n_kv_heads, shape.head_dim, dtype};
    auto found = plans_.find(key);
    if (found == plans_.end()) {
        found = plans_.emplace(key, ShapePlans{}).first;
        build(found->second, shape, dtype);
    }
    return found->second.report;
}

CudnnAttention::ShapePlans& CudnnAttention::planned(const AttentionShape& shape, DType dtype, const char* op) {
    plan(shape, dtype);
    ShapePlans& p = plans_.at(Key{shape.batch, shape.seq_len, shape.n_heads, shape.n_kv_heads, shape.head_dim, dtype});
    if (!p.report.planned) fail(ErrorKind::unsupported, op, ": cuDNN cannot run ", p.report.failure);
    return p;
}

const cudnn::Owned& CudnnAttention::pack(ShapePlans& p, const std::vector<int64_t>& uids, std::vector<void*> pointers) {
    auto found = p.packs.find(pointers);
    if (found != p.packs.end()) return found->second;
    if (p.packs.size() >= 256) p.packs.clear();  // addresses that keep changing: no reuse to keep
    void* workspace = pointers.back();
    pointers.pop_back();
    cudnn::Owned built = cudnn::variant_pack(*library_, uids, pointers, workspace);
    pointers.push_back(workspace);
    return p.packs.emplace(std::move(pointers), std::move(built)).first->second;
}

void CudnnAttention::forward(const AttentionShape& shape, DType dtype, void* out, float* stats, const void* qkv, void* workspace) {
    ShapePlans& p = planned(shape, dtype, "attention_fwd");
    static const std::vector<int64_t> uids{cudnn::kUidQ, cudnn::kUidK, cudnn::kUidV, cudnn::kUidO, cudnn::kUidStats, cudnn::kUidScale, cudnn::kUidMaskFill};
    const std::vector<void*> pointers{const_cast<void*>(qkv), const_cast<void*>(shifted(qkv, k_offset(shape), dtype)),
                                      const_cast<void*>(shifted(qkv, v_offset(shape), dtype)), out, stats, &p.scale, &p.fill, workspace};
    cudnn::execute(*library_, handle_, *p.forward, pack(p, uids, pointers));
}

void CudnnAttention::backward(const AttentionShape& shape, DType dtype, void* dqkv, const void* dout, const void* qkv, const void* out,
                              const float* stats, void* workspace) {
    ShapePlans& p = planned(shape, dtype, "attention_bwd");
    void* delta = workspace;
    void* plan_workspace = static_cast<char*>(workspace) + cudnn_attention_delta_bytes(shape);
    const auto in = [](const void* pointer) { return const_cast<void*>(pointer); };
    static const std::vector<int64_t> uids{cudnn::kUidQ,  cudnn::kUidK,  cudnn::kUidV,  cudnn::kUidO,  cudnn::kUidStats,       cudnn::kUidScale, cudnn::kUidMaskFill,
                                           cudnn::kUidDO, cudnn::kUidDQ, cudnn::kUidDK, cudnn::kUidDV, cudnn::kUidSoftmaxSum, cudnn::kUidOne};
    const std::vector<void*> pointers{in(qkv), in(shifted(qkv, k_offset(shape), dtype)), in(shifted(qkv, v_offset(shape), dtype)), in(out),
                                      in(stats), &p.scale, &p.fill, in(dout), dqkv, shifted(dqkv, k_offset(shape), dtype),
                                      shifted(dqkv, v_offset(shape), dtype), delta, &p.one, plan_workspace};
    cudnn::execute(*library_, handle_, *p.backward, pack(p, uids, pointers));
}

}  // namespace llmtrain
