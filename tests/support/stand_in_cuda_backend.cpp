#include "support/stand_in_cuda_backend.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "core/attention_head_dims.h"

namespace llmtrain::test {

namespace {

bool is_half(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

[[noreturn]] void refuse(const char* op, const char* name, const std::string& why) { fail(ErrorKind::shape, "stand-in cuda ", op, ": ", name, " ", why); }

void expect_device(const char* op, const char* name, const Tensor& t) {
    if (!t.empty() && t.device() != Device::cuda) refuse(op, name, "is not in device memory");
}

void expect_f32(const char* op, const char* name, const Tensor& t) {
    expect_device(op, name, t);
    if (!t.empty() && t.dtype() != DType::f32) refuse(op, name, cat("has dtype ", dtype_name(t.dtype()), ", expected f32"));
}

void expect_half(const char* op, const char* name, const Tensor& t) {
    expect_device(op, name, t);
    if (!t.empty() && !is_half(t.dtype())) refuse(op, name, cat("has dtype ", dtype_name(t.dtype()), ", expected bf16 or f16"));
}

void expect_ids(const char* op, const char* name, const Tensor& t) {
    expect_device(op, name, t);
    if (t.dtype() != DType::i32) refuse(op, name, "is not i32");
}

// The same memory seen as host memory, for the CPU reference (f32 and i32 tensors).
Tensor host_view(const Tensor& t) { return t.empty() ? Tensor() : Tensor(t.raw(), t.dtype(), t.shape(), Device::cpu); }

float element(const Tensor& t, int64_t i) {
    if (t.dtype() == DType::f32) return static_cast<const float*>(t.raw())[i];
    const uint16_t bits = static_cast<const uint16_t*>(t.raw())[i];
    return t.dtype() == DType::bf16 ? bf16_to_float(bits) : f16_to_float(bits);
}

// An f32 host copy of a 16-bit or f32 device tensor (empty stays empty).
OwnedTensor widened(const Tensor& t) {
    if (t.empty()) return OwnedTensor();
    OwnedTensor out(DType::f32, t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) out.data<float>()[i] = element(t, i);
    return out;
}

Tensor view_or_empty(const OwnedTensor& owned, const Tensor& original) { return original.empty() ? Tensor() : owned.view(); }

// dst (16-bit or f32 device memory) = src (f32 host), rounded to nearest even.
void store(const Tensor& dst, const Tensor& src) {
    for (int64_t i = 0; i < dst.numel(); ++i) {
        const float v = src.data<float>()[i];
        if (dst.dtype() == DType::f32) static_cast<float*>(dst.raw())[i] = v;
        else if (dst.dtype() == DType::bf16) static_cast<uint16_t*>(dst.raw())[i] = float_to_bf16(v);
        else static_cast<uint16_t*>(dst.raw())[i] = float_to_f16(v);
    }
}

// lse [B, H, T] of causal (or document-masked: doc_starts) attention over the f32 qkv, as
// the flash kernels save it.
void attention_lse(const Tensor& lse, const Tensor& qkv, const AttentionShape& s, const Tensor& doc_starts) {
    const int32_t* starts = doc_starts.empty() ? nullptr : static_cast<const int32_t*>(doc_starts.raw());
    const float* x = qkv.data<float>();
    const int64_t W = s.qkv_width(), D = s.head_dim, T = s.seq_len, group = s.n_heads / s.n_kv_heads;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t h = 0; h < s.n_heads; ++h)
            for (int64_t t = 0; t < T; ++t) {
                std::vector<double> scores;
                double max_score = -std::numeric_limits<double>::infinity();
                for (int64_t j = starts ? starts[b * T + t] : 0; j <= t; ++j) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += double(x[(b * T + t) * W + h * D + d]) * x[(b * T + j) * W + (s.n_heads + h / group) * D + d];
                    scores.push_back(dot * scale);
                    max_score = std::max(max_score, scores.back());
                }
                double sum = 0;
                for (double v : scores) sum += std::exp(v - max_score);
                static_cast<float*>(lse.raw())[(b * s.n_heads + h) * T + t] = static_cast<float>(max_score + std::log(sum));
            }
}

class StandInCudaBackend final : public Backend {
public:
    StandInCudaBackend(int cpu_threads, GpuDevice gpu) : cpu_(make_cpu_backend(cpu_threads)), gpu_(std::move(gpu)) {}
    std::string name() const override { return "stand-in cuda (CPU)"; }
    std::optional<GpuDevice> gpu_device() const override { return gpu_; }
    Device device() const override { return Device::cuda; }
    Memory allocate(size_t bytes) override { return allocate_host_memory(bytes); }
    void copy_from_host(const Tensor& dst, const void* src) override {
        expect_device("copy_from_host", "dst", dst);
        if (dst.numel() > 0) std::memcpy(dst.raw(), src, dst.bytes());
    }
    // The host waits the CUDA backend would make, counted as it counts them.
    void copy_to_host(void* dst, const Tensor& src) override {
        expect_device("copy_to_host", "src", src);
        ++profile_.host_syncs;
        if (src.numel() > 0) std::memcpy(dst, src.raw(), src.bytes());
    }
    void synchronize() override { ++profile_.host_syncs; }

    void embedding_fwd(const EmbeddingFwd& a) override {
        const Tensor &out = a.out, &tokens = a.tokens, &wte = a.wte, &wpe = a.wpe;
        const int64_t seq_len = a.seq_len;
        const VocabShard shard = a.vocab;
        const char* op = "embedding_fwd";
        expect_half(op, "out", out); expect_half(op, "wte", wte); expect_half(op, "wpe", wpe); expect_ids(op, "tokens", tokens);
        const OwnedTensor result(DType::f32, out.shape()), positions = widened(wpe);
        cpu_->embedding_fwd({.out = result, .tokens = host_view(tokens), .wte = widened(wte), .wpe = view_or_empty(positions, wpe),
                             .seq_len = seq_len, .vocab = shard, .doc_starts = host_view(a.doc_starts), .positions = host_view(a.positions)});
        store(out, result);
    }
    void embedding_bwd(const EmbeddingBwd& a) override {
        const Tensor &dwte = a.dwte, &dwpe = a.dwpe, &dout = a.dout, &tokens = a.tokens;
        const int64_t seq_len = a.seq_len;
        const VocabShard shard = a.vocab;
        const char* op = "embedding_bwd";
        expect_f32(op, "dwte", dwte); expect_f32(op, "dwpe", dwpe); expect_half(op, "dout", dout); expect_ids(op, "tokens", tokens);
        cpu_->embedding_bwd({.dwte = host_view(dwte), .dwpe = host_view(dwpe), .dout = widened(dout), .tokens = host_view(tokens), .seq_len = seq_len,
                             .vocab = shard, .doc_starts = host_view(a.doc_starts), .positions = host_view(a.positions)});
    }
    void layernorm_fwd(const LayerNormFwd& a) override {
        const Tensor &out = a.out, &mean = a.mean, &rstd = a.rstd, &x = a.x, &w = a.w, &b = a.b;
        const double eps = a.eps;
        const char* op = "layernorm_fwd";
        expect_half(op, "out", out); expect_half(op, "x", x); expect_half(op, "w", w); expect_half(op, "b", b);
        expect_f32(op, "mean", mean); expect_f32(op, "rstd", rstd);
        const OwnedTensor result(DType::f32, out.shape()), bias = widened(b);
        cpu_->layernorm_fwd({.out = result, .mean = host_view(mean), .rstd = host_view(rstd), .x = widened(x), .w = widened(w),
                             .b = view_or_empty(bias, b), .eps = eps});
        store(out, result);
    }
    void layernorm_bwd(const LayerNormBwd& a) override {
        const Tensor &dx = a.dx, &dw = a.dw, &db = a.db, &dout = a.dout, &x = a.x, &w = a.w, &mean = a.mean, &rstd = a.rstd;
        const bool accumulate_dx = a.accumulate_dx;
        const char* op = "layernorm_bwd";
        expect_half(op, "dx", dx); expect_half(op, "dout", dout); expect_half(op, "x", x); expect_half(op, "w", w);
        expect_f32(op, "dw", dw); expect_f32(op, "db", db); expect_f32(op, "mean", mean); expect_f32(op, "rstd", rstd);
        const OwnedTensor grad = widened(dx);
        cpu_->layernorm_bwd({.dx = grad, .dw = host_view(dw), .db = host_view(db), .dout = widened(dout), .x = widened(x), .w = widened(w),
                             .mean = host_view(mean), .rstd = host_view(rstd), .accumulate_dx = accumulate_dx});
        store(dx, grad);
    }
    void rmsnorm_fwd(const RmsNormFwd& a) override {
        const Tensor &out = a.out, &rstd = a.rstd, &x = a.x, &w = a.w;
        const double eps = a.eps;
        const char* op = "rmsnorm_fwd";
        expect_half(op, "out", out); expect_half(op, "x", x); expect_half(op, "w", w); expect_f32(op, "rstd", rstd);
        const OwnedTensor result(DType::f32, out.shape());
        cpu_->rmsnorm_fwd({.out = result, .rstd = host_view(rstd), .x = widened(x), .w = widened(w), .eps = eps});
        store(out, result);
    }
    void rmsnorm_bwd(const RmsNormBwd& a) override {
        const Tensor &dx = a.dx, &dw = a.dw, &dout = a.dout, &x = a.x, &w = a.w, &rstd = a.rstd;
        const bool accumulate_dx = a.accumulate_dx;
        const char* op = "rmsnorm_bwd";
        expect_half(op, "dx", dx); expect_half(op, "dout", dout); expect_half(op, "x", x); expect_half(op, "w", w);
        expect_f32(op, "dw", dw); expect_f32(op, "rstd", rstd);
        const OwnedTensor grad = widened(dx);
        cpu_->rmsnorm_bwd({.dx = grad, .dw = host_view(dw), .dout = widened(dout), .x = widened(x), .w = widened(w), .rstd = host_view(rstd),
                           .accumulate_dx = accumulate_dx});
        store(dx, grad);
    }
    void matmul_fwd(const MatmulFwd& a) override {
        const Tensor &out = a.out, &x = a.x, &w = a.w, &bias = a.bias;
        const char* op = "matmul_fwd";
        // As the CUDA backend: an f32 output (no bias) is the fp32 accumulator as it is.
        if (out.dtype() == DType::f32 && bias.empty()) expect_f32(op, "out", out);
        else expect_half(op, "out", out);
        expect_half(op, "x", x); expect_half(op, "w", w); expect_half(op, "bias", bias);
        const OwnedTensor result(DType::f32, out.shape()), b = widened(bias);
        cpu_->matmul_fwd({.out = result, .x = widened(x), .w = widened(w), .bias = view_or_empty(b, bias)});
        store(out, result);
    }
    // FP8: the scalars are f32 and the FP8 bytes read in place; x and out may be 16-bit.
    void fp8_amax(const Fp8Amax& a) override { cpu_->fp8_amax({.amax = host_view(a.amax), .x = widened(a.x)}); }
    void fp8_update_scale(const Fp8UpdateScale& a) override {
        cpu_->fp8_update_scale({.scale = host_view(a.scale), .scale_inv = host_view(a.scale_inv), .amax = host_view(a.amax), .format = a.format, .margin = a.margin});
    }
    void fp8_cast(const Fp8Cast& a) override {
        if (is_fp8(a.x.dtype())) {  // FP8 bytes relaid out: read in place too
            cpu_->fp8_cast({.out = host_view(a.out), .out_t = host_view(a.out_t), .x = host_view(a.x)});
            return;
        }
        cpu_->fp8_cast({.out = host_view(a.out), .out_t = host_view(a.out_t), .x = widened(a.x), .scale = host_view(a.scale), .amax = host_view(a.amax),
                        .counts = host_view(a.counts)});
    }
    void matmul_fp8(const MatmulFp8& a) override {
        // The bias is added to the f32 product before the output's rounding, as cuBLASLt's epilogue does.
        const OwnedTensor result = widened(a.out), bias = widened(a.bias);
        cpu_->matmul_fp8({.out = result, .a = host_view(a.a), .a_scale_inv = host_view(a.a_scale_inv), .b = host_view(a.b),
                          .b_scale_inv = host_view(a.b_scale_inv), .bias = view_or_empty(bias, a.bias), .accumulate = a.accumulate,
                          .fast_accumulate = a.fast_accumulate});
        store(a.out, result);
    }
    void matmul_bwd(const MatmulBwd& a) override {
        const Tensor &dx = a.dx, &dw = a.dw, &dbias = a.dbias, &dout = a.dout, &x = a.x, &w = a.w;
        const char* op = "matmul_bwd";
        expect_half(op, "dx", dx); expect_half(op, "dout", dout); expect_half(op, "x", x); expect_half(op, "w", w);
        expect_f32(op, "dw", dw); expect_f32(op, "dbias", dbias);
        const OwnedTensor grad = widened(dx);
        cpu_->matmul_bwd({.dx = view_or_empty(grad, dx), .dw = host_view(dw), .dbias = host_view(dbias), .dout = widened(dout), .x = widened(x),
                          .w = widened(w)});
        if (!dx.empty()) store(dx, grad);
    }
    void attention_fwd(const AttentionFwd& a) override {
        const Tensor &out = a.out, &saved = a.saved, &qkv = a.qkv;
        const AttentionShape& s = a.shape;
        const char* op = "attention_fwd";
        expect_half(op, "out", out); expect_half(op, "qkv", qkv); expect_f32(op, "saved", saved);
        if (saved.shape() != attention_saved_shape(s)) refuse(op, "saved", cat("has shape ", saved.shape().str()));
        if (!native_attention_takes(s.head_dim)) refuse(op, "qkv", cat("has head_dim ", s.head_dim, "; the flash kernels take ", native_attention_head_dims_text()));
        const OwnedTensor q = widened(qkv), result(DType::f32, out.shape()), probs(DType::f32, cpu_->attention_saved_shape(s));
        cpu_->attention_fwd({.out = result, .saved = probs, .qkv = q, .shape = s, .doc_starts = host_view(a.doc_starts)});
        store(out, result);
        attention_lse(host_view(saved), q, s, host_view(a.doc_starts));
    }
    // Backward recomputes the probabilities from qkv, as the flash kernels do.
    void attention_bwd(const AttentionBwd& a) override {
        const Tensor &dqkv = a.dqkv, &dout = a.dout, &qkv = a.qkv, &out = a.out, &saved = a.saved;
        const AttentionShape& s = a.shape;
        const char* op = "attention_bwd";
        expect_half(op, "dqkv", dqkv); expect_half(op, "dout", dout); expect_half(op, "qkv", qkv); expect_half(op, "out", out);
        expect_f32(op, "saved", saved);
        const OwnedTensor q = widened(qkv), result(DType::f32, out.shape()), probs(DType::f32, cpu_->attention_saved_shape(s));
        const OwnedTensor grad(DType::f32, dqkv.shape());
        const Tensor starts = host_view(a.doc_starts);
        cpu_->attention_fwd({.out = result, .saved = probs, .qkv = q, .shape = s, .doc_starts = starts});
        cpu_->attention_bwd({.dqkv = grad, .dout = widened(dout), .qkv = q, .out = result, .saved = probs, .shape = s, .doc_starts = starts});
        store(dqkv, grad);
    }
    // The blocks in f32 from 16-bit queries, keys, values and output; the running acc, lse and
    // the gradient accumulators are f32 device tensors, as on CUDA.
    void attention_block_fwd(const AttentionBlockFwd& a) override {
        const char* op = "attention_block_fwd";
        expect_half(op, "qkv", a.qkv); expect_half(op, "kv", a.kv); expect_f32(op, "acc", a.acc); expect_f32(op, "lse", a.lse);
        expect_ids(op, "q_positions", a.q_positions); expect_ids(op, "kv_positions", a.kv_positions);
        if (!a.q_first.empty()) expect_ids(op, "q_first", a.q_first);
        if (!native_attention_takes(a.shape.head_dim))
            refuse(op, "qkv", cat("has head_dim ", a.shape.head_dim, "; the flash kernels take ", native_attention_head_dims_text()));
        cpu_->attention_block_fwd({.acc = host_view(a.acc), .lse = host_view(a.lse), .qkv = widened(a.qkv), .kv = widened(a.kv), .shape = a.shape,
                                   .kv_len = a.kv_len, .q_positions = host_view(a.q_positions), .kv_positions = host_view(a.kv_positions),
                                   .q_first = host_view(a.q_first), .first = a.first});
    }
    void attention_block_bwd(const AttentionBlockBwd& a) override {
        const char* op = "attention_block_bwd";
        expect_half(op, "qkv", a.qkv); expect_half(op, "kv", a.kv); expect_half(op, "dout", a.dout); expect_half(op, "out", a.out);
        expect_f32(op, "lse", a.lse); expect_f32(op, "dq", a.dq); expect_f32(op, "dkv", a.dkv);
        expect_ids(op, "q_positions", a.q_positions); expect_ids(op, "kv_positions", a.kv_positions);
        if (!a.q_first.empty()) expect_ids(op, "q_first", a.q_first);
        if (!native_attention_takes(a.shape.head_dim))
            refuse(op, "qkv", cat("has head_dim ", a.shape.head_dim, "; the flash kernels take ", native_attention_head_dims_text()));
        cpu_->attention_block_bwd({.dq = host_view(a.dq), .dkv = host_view(a.dkv), .dout = widened(a.dout), .out = widened(a.out), .lse = host_view(a.lse),
                                   .qkv = widened(a.qkv), .kv = widened(a.kv), .shape = a.shape, .kv_len = a.kv_len,
                                   .q_positions = host_view(a.q_positions), .kv_positions = host_view(a.kv_positions), .q_first = host_view(a.q_first)});
    }
    void copy_columns(const CopyColumns& a) override {
        const char* op = "copy_columns";
        expect_device(op, "dst", a.dst); expect_device(op, "src", a.src);
        const OwnedTensor dst = widened(a.dst);
        cpu_->copy_columns({.dst = dst, .dst_col = a.dst_col, .src = widened(a.src), .src_col = a.src_col, .cols = a.cols});
        store(a.dst, dst);
    }
    void rope_fwd(const Rope& a) override { rope("rope_fwd", a, false); }
    void rope_bwd(const Rope& a) override { rope("rope_bwd", a, true); }
    void gelu_fwd(const Tensor& out, const Tensor& x) override { unary("gelu_fwd", out, x, [&](const Tensor& o, const Tensor& a) { cpu_->gelu_fwd(o, a); }); }
    void gelu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) override {
        binary("gelu_bwd", dx, dout, x, [&](const Tensor& o, const Tensor& a, const Tensor& b) { cpu_->gelu_bwd(o, a, b); });
    }
    void swiglu_fwd(const Tensor& out, const Tensor& x) override { unary("swiglu_fwd", out, x, [&](const Tensor& o, const Tensor& a) { cpu_->swiglu_fwd(o, a); }); }
    void swiglu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) override {
        binary("swiglu_bwd", dx, dout, x, [&](const Tensor& o, const Tensor& a, const Tensor& b) { cpu_->swiglu_bwd(o, a, b); });
    }
    void add(const Tensor& out, const Tensor& a, const Tensor& b) override {
        if (a.dtype() == DType::f32) {  // a gradient shard's sum over micro-batches (ZeRO-2)
            expect_f32("add", "out", out); expect_f32("add", "b", b); expect_device("add", "a", a);
            return cpu_->add(host_view(out), host_view(a), host_view(b));
        }
        binary("add", out, a, b, [&](const Tensor& o, const Tensor& x, const Tensor& y) { cpu_->add(o, x, y); });
    }
    void xent_fwd(const XentFwd& a) override {
        const Tensor &losses = a.losses, &lse = a.lse, &logits = a.logits, &targets = a.targets;
        const VocabShard vocab = a.vocab;
        expect_f32("xent_fwd", "losses", losses); expect_half("xent_fwd", "logits", logits); expect_ids("xent_fwd", "targets", targets);
        cpu_->xent_fwd({.losses = host_view(losses), .lse = host_view(lse), .logits = widened(logits), .targets = host_view(targets),
                        .vocab = vocab});
    }
    void xent_bwd(const XentBwd& a) override {
        const Tensor &dlogits = a.dlogits, &logits = a.logits, &targets = a.targets, &lse = a.lse;
        const VocabShard shard = a.vocab;
        const double dloss = a.dloss;
        const char* op = "xent_bwd";
        expect_half(op, "dlogits", dlogits); expect_half(op, "logits", logits); expect_ids(op, "targets", targets); expect_f32(op, "lse", lse);
        const OwnedTensor grad(DType::f32, dlogits.shape());
        cpu_->xent_bwd({.dlogits = grad, .logits = widened(logits), .targets = host_view(targets), .lse = host_view(lse), .vocab = shard,
                        .dloss = dloss});
        store(dlogits, grad);
    }
    void logits_row_max(const Tensor& row_max, const Tensor& logits, VocabShard shard) override {
        expect_f32("logits_row_max", "row_max", row_max); expect_half("logits_row_max", "logits", logits);
        cpu_->logits_row_max(host_view(row_max), widened(logits), shard);
    }
    void xent_partial(const XentPartial& a) override {
        const Tensor &partial = a.partial, &logits = a.logits, &targets = a.targets, &row_max = a.row_max;
        const VocabShard shard = a.vocab;
        const char* op = "xent_partial";
        expect_f32(op, "partial", partial); expect_half(op, "logits", logits); expect_ids(op, "targets", targets); expect_f32(op, "row_max", row_max);
        cpu_->xent_partial({.partial = host_view(partial), .logits = widened(logits), .targets = host_view(targets), .row_max = host_view(row_max),
                            .vocab = shard});
    }
    void xent_combine(const XentCombine& a) override {
        const Tensor &losses = a.losses, &lse = a.lse, &partial = a.partial, &row_max = a.row_max;
        const char* op = "xent_combine";
        expect_f32(op, "losses", losses); expect_f32(op, "lse", lse); expect_f32(op, "partial", partial); expect_f32(op, "row_max", row_max);
        cpu_->xent_combine({.losses = host_view(losses), .lse = host_view(lse), .partial = host_view(partial), .row_max = host_view(row_max)});
    }
    void adamw(const AdamWUpdate& a) override {
        const Tensor &param = a.param, &grad = a.grad, &m = a.m, &v = a.v, &param_copy = a.param_copy;
        const AdamWStep& step = a.step;
        const char* op = "adamw";
        expect_f32(op, "param", param); expect_f32(op, "grad", grad); expect_f32(op, "m", m); expect_f32(op, "v", v); expect_half(op, "param_copy", param_copy);
        cpu_->adamw({.param = host_view(param), .grad = host_view(grad), .m = host_view(m), .v = host_view(v), .param_copy = Tensor(), .step = step});
        if (!param_copy.empty()) store(param_copy, host_view(param));
    }
    double sum_squares(const Tensor& x) override {
        expect_f32("sum_squares", "x", x);
        ++profile_.host_syncs;
        return cpu_->sum_squares(host_view(x));
    }
    void accumulate_sum(const Tensor& total, const Tensor& x, double scale) override {
        expect_f32("accumulate_sum", "x", x);
        expect_total("accumulate_sum", total);
        cpu_->accumulate_sum(host_view(total), host_view(x), scale);
    }
    void accumulate_sum_squares(const Tensor& total, const std::vector<Tensor>& pieces) override {
        expect_total("accumulate_sum_squares", total);
        std::vector<Tensor> host;
        for (const Tensor& p : pieces) {
            expect_f32("accumulate_sum_squares", "piece", p);
            host.push_back(host_view(p));
        }
        cpu_->accumulate_sum_squares(host_view(total), host);
    }
    void fill_zero(const Tensor& x) override {
        expect_device("fill_zero", "x", x);
        if (x.numel() > 0) std::memset(x.raw(), 0, x.bytes());
    }
    void copy(const Tensor& out, const Tensor& in) override {
        expect_device("copy", "out", out); expect_device("copy", "in", in);
        if (out.numel() != in.numel()) refuse("copy", "out", "has another element count than in");
        if (out.dtype() == in.dtype()) {
            if (in.numel() > 0) std::memcpy(out.raw(), in.raw(), in.bytes());
            return;
        }
        store(out, widened(in));
    }

private:
    static void expect_total(const char* op, const Tensor& t) {
        expect_device(op, "total", t);
        if (t.dtype() != DType::f64 || t.numel() != 1) refuse(op, "total", "is not an f64 scalar");
    }
    void rope(const char* op, const Rope& a, bool inverse) {
        expect_half(op, "x", a.x); expect_f32(op, "table", a.table);
        const OwnedTensor values = widened(a.x);
        const Rope on_host{.x = values, .table = host_view(a.table), .seq_len = a.seq_len, .n_heads = a.n_heads, .head_dim = a.head_dim,
                           .doc_starts = host_view(a.doc_starts), .positions = host_view(a.positions)};
        if (inverse) cpu_->rope_bwd(on_host);
        else cpu_->rope_fwd(on_host);
        store(a.x, values);
    }
    // Mixture of Experts: the router tensors are f32 (read in place), the activations 16-bit.
    void moe_route_fwd(const MoeRouteFwd& a) override {
        expect_f32("moe_route_fwd", "logits", a.logits); expect_f32("moe_route_fwd", "gates", a.gates); expect_ids("moe_route_fwd", "experts", a.experts);
        cpu_->moe_route_fwd({.experts = host_view(a.experts), .gates = host_view(a.gates), .scores = host_view(a.scores), .logits = host_view(a.logits),
                             .expert_bias = host_view(a.expert_bias), .score = a.score, .normalize_top_k = a.normalize_top_k});
    }
    void moe_route_bwd(const MoeRouteBwd& a) override {
        expect_f32("moe_route_bwd", "d_logits", a.d_logits); expect_f32("moe_route_bwd", "scores", a.scores);
        cpu_->moe_route_bwd({.d_logits = host_view(a.d_logits), .d_gates = host_view(a.d_gates), .gates = host_view(a.gates), .scores = host_view(a.scores),
                             .experts = host_view(a.experts), .score = a.score, .normalize_top_k = a.normalize_top_k, .accumulate = a.accumulate});
    }
    void moe_load_stats(const MoeLoadStats& a) override {
        expect_f32("moe_load_stats", "scores", a.scores);
        cpu_->moe_load_stats({.counts = host_view(a.counts), .score_sums = host_view(a.score_sums), .experts = host_view(a.experts),
                              .scores = host_view(a.scores), .seq_len = a.seq_len});
    }
    void moe_aux_loss_fwd(const MoeAuxLossFwd& a) override {
        expect_f32("moe_aux_loss_fwd", "score_sums", a.score_sums);
        cpu_->moe_aux_loss_fwd({.loss = host_view(a.loss), .counts = host_view(a.counts), .score_sums = host_view(a.score_sums),
                                .tokens_per_group = a.tokens_per_group, .top_k = a.top_k, .coeff = a.coeff});
    }
    void moe_aux_loss_bwd(const MoeAuxLossBwd& a) override {
        expect_f32("moe_aux_loss_bwd", "scores", a.scores);
        cpu_->moe_aux_loss_bwd({.d_logits = host_view(a.d_logits), .scores = host_view(a.scores), .counts = host_view(a.counts), .seq_len = a.seq_len,
                                .tokens_per_group = a.tokens_per_group, .top_k = a.top_k, .coeff = a.coeff, .dloss = a.dloss, .score = a.score});
    }
    void moe_z_loss_fwd(const MoeZLossFwd& a) override {
        expect_f32("moe_z_loss_fwd", "logits", a.logits);
        cpu_->moe_z_loss_fwd({.loss = host_view(a.loss), .logits = host_view(a.logits), .coeff = a.coeff});
    }
    void moe_z_loss_bwd(const MoeZLossBwd& a) override {
        expect_f32("moe_z_loss_bwd", "logits", a.logits);
        cpu_->moe_z_loss_bwd({.d_logits = host_view(a.d_logits), .logits = host_view(a.logits), .coeff = a.coeff, .dloss = a.dloss});
    }
    void moe_permute_plan(const MoePermutePlan& a) override {
        expect_ids("moe_permute_plan", "experts", a.experts);
        cpu_->moe_permute_plan({.rows = host_view(a.rows), .sources = host_view(a.sources), .counts = host_view(a.counts), .dropped = host_view(a.dropped),
                                .experts = host_view(a.experts), .capacity = a.capacity});
    }
    void moe_permute_fwd(const MoePermuteFwd& a) override {
        expect_half("moe_permute_fwd", "x", a.x); expect_half("moe_permute_fwd", "x_perm", a.x_perm);
        const OwnedTensor result(DType::f32, a.x_perm.shape());
        cpu_->moe_permute_fwd({.x_perm = result, .x = widened(a.x), .sources = host_view(a.sources), .top_k = a.top_k});
        store(a.x_perm, result);
    }
    void moe_permute_bwd(const MoePermuteBwd& a) override {
        expect_half("moe_permute_bwd", "dx", a.dx); expect_half("moe_permute_bwd", "d_x_perm", a.d_x_perm);
        const OwnedTensor result(DType::f32, a.dx.shape());
        cpu_->moe_permute_bwd({.dx = result, .d_x_perm = widened(a.d_x_perm), .rows = host_view(a.rows)});
        store(a.dx, result);
    }
    void moe_combine_fwd(const MoeCombineFwd& a) override {
        expect_half("moe_combine_fwd", "out", a.out); expect_half("moe_combine_fwd", "y_perm", a.y_perm); expect_f32("moe_combine_fwd", "gates", a.gates);
        const OwnedTensor result(DType::f32, a.out.shape());
        cpu_->moe_combine_fwd({.out = result, .y_perm = widened(a.y_perm), .gates = host_view(a.gates), .rows = host_view(a.rows)});
        store(a.out, result);
    }
    void moe_combine_bwd(const MoeCombineBwd& a) override {
        expect_half("moe_combine_bwd", "d_y_perm", a.d_y_perm); expect_half("moe_combine_bwd", "d_out", a.d_out); expect_f32("moe_combine_bwd", "d_gates", a.d_gates);
        const OwnedTensor result(DType::f32, a.d_y_perm.shape());
        cpu_->moe_combine_bwd({.d_y_perm = result, .d_gates = host_view(a.d_gates), .d_out = widened(a.d_out), .y_perm = widened(a.y_perm),
                               .gates = host_view(a.gates), .rows = host_view(a.rows), .sources = host_view(a.sources)});
        store(a.d_y_perm, result);
    }
    template <class Fn>
    void unary(const char* op, const Tensor& out, const Tensor& x, Fn&& fn) {
        expect_half(op, "out", out); expect_half(op, "x", x);
        const OwnedTensor result(DType::f32, out.shape());
        fn(result, widened(x));
        store(out, result);
    }
    template <class Fn>
    void binary(const char* op, const Tensor& out, const Tensor& a, const Tensor& b, Fn&& fn) {
        expect_half(op, "out", out); expect_half(op, "a", a); expect_half(op, "b", b);
        const OwnedTensor result(DType::f32, out.shape());
        fn(result, widened(a), widened(b));
        store(out, result);
    }

    std::unique_ptr<Backend> cpu_;
    GpuDevice gpu_;
};

}  // namespace

std::unique_ptr<Backend> make_stand_in_cuda_backend(int cpu_threads, GpuDevice gpu) { return std::make_unique<StandInCudaBackend>(cpu_threads, std::move(gpu)); }

}  // namespace llmtrain::test
