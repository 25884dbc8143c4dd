// Whole-model gradients against central finite differences in f64, shared by the dense and the
// mixture-of-experts model tests: random token batches and the check itself.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "backend/backend.h"
#include "model/transformer.h"

namespace llmtrain::test {

// Random tokens and targets in [0, vocab).
struct TokenBatch {
    OwnedTensor tokens, targets;
    TokenBatch(int64_t n, int64_t vocab, uint32_t seed) : tokens(DType::i32, {n}), targets(DType::i32, {n}) {
        std::mt19937 rng(seed);
        for (int64_t i = 0; i < n; ++i) {
            tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
            targets.data<int32_t>()[i] = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
        }
    }
};

// A Llama with GQA whose MLPs are n_experts SwiGLU experts, top 2 (model.moe), small enough
// for finite differences in f64: init_std 0.3 keeps every gradient well above rounding noise.
inline ModelConfig tiny_moe_model(int64_t n_experts) {
    ModelConfig m;
    m.family = ModelFamily::llama;
    m.n_layers = 2;
    m.d_model = 8;
    m.n_heads = 2;
    m.n_kv_heads = 1;
    m.d_ff = 10;
    m.vocab_size = 11;
    m.max_seq_len = 7;
    m.rope_theta = 100.0;
    m.tied_embeddings = false;
    m.init_std = 0.3;
    m.moe.n_experts = n_experts;
    m.moe.top_k = 2;
    m.moe.d_ff_expert = 6;
    return m;
}

// What backward differentiates, computed by a forward of the batch (B sequences of T).
using Objective = std::function<double(Transformer& model, const TokenBatch& batch, int64_t B, int64_t T)>;

inline double mean_loss(Transformer& model, const TokenBatch& batch, int64_t B, int64_t T) { return model.forward(batch.tokens, batch.targets, B, T); }

// Checks d(objective)/d(theta) for `per_parameter` elements spread over every parameter: the
// backward's gradient against (f(theta + h) - f(theta - h)) / 2h, within 1e-5 relative.
inline void expect_gradients_match_finite_differences(const ModelConfig& config, const Objective& objective = mean_loss, int64_t per_parameter = 7) {
    const int64_t B = 2, T = config.max_seq_len - 1;
    auto backend = make_cpu_backend(1);
    Transformer model(config, *backend, DType::f64, B, T);
    model.initialize(5);
    const TokenBatch batch(B * T, config.vocab_size, 11);
    Parameters& p = model.parameters();
    objective(model, batch, B, T);
    model.backward(1.0);
    for (size_t i = 0; i < p.count(); ++i) {
        double* values = p.value(i).data<double>();
        const double* grads = p.grad(i).data<double>();
        const int64_t n = p.value(i).numel();
        for (int64_t k = 0; k < n; k += std::max<int64_t>(1, n / per_parameter)) {
            const double saved = values[k], h = 1e-5;
            values[k] = saved + h;
            const double up = objective(model, batch, B, T);
            values[k] = saved - h;
            const double down = objective(model, batch, B, T);
            values[k] = saved;
            const double numeric = (up - down) / (2 * h);
            const double scale = std::max({std::abs(numeric), std::abs(grads[k]), 1e-4});
            EXPECT_LT(std::abs(numeric - grads[k]) / scale, 1e-5) << p.info(i).name << "[" << k << "]: analytic " << grads[k] << ", numeric " << numeric;
        }
    }
}

}  // namespace llmtrain::test
