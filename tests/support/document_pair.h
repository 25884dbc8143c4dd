// Two packed documents for the document-mask tests: A ends with the end-of-text token, B
// follows it. A run over [A, B] with the mask and reset positions must give B's tokens the
// loss and parameter gradients of B alone: the mean loss over T tokens is
// (la mean_A + lb mean_B) / T, so
//   T * run([A, B]) - la * run([A] alone) = lb * run([B] alone)
// for the loss and for every parameter gradient when A and B do not see each other.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/transformer.h"

namespace llmtrain::test::document_pair {

constexpr int32_t kEnd = 3;  // the end-of-text id of these tests

// A tiny model with 13 classes and sequences of up to 12 tokens.
inline ModelConfig tiny(ModelFamily family) {
    ModelConfig m;
    m.family = family;
    m.n_layers = 2;
    m.d_model = 16;
    m.n_heads = 4;
    m.n_kv_heads = family == ModelFamily::llama ? 2 : 4;
    m.d_ff = 12;
    m.vocab_size = 13;
    m.max_seq_len = 12;
    m.rope_theta = 100.0;
    m.tied_embeddings = family == ModelFamily::gpt2;
    m.init_std = 0.3;
    return m;
}

inline const std::vector<int32_t> kDocA = {5, 9, 1, 7, kEnd};
inline const std::vector<int32_t> kDocB = {4, 4, 11, 2, 8, 6, 10};
// Each token's target: the next token of its own document, or an arbitrary id at the end.
inline const std::vector<int32_t> kTargetsA = {9, 1, 7, kEnd, 12};
inline const std::vector<int32_t> kTargetsB = {4, 11, 2, 8, 6, 10, 0};

inline std::vector<int32_t> joined(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    std::vector<int32_t> out = a;
    out.insert(out.end(), b.begin(), b.end());
    return out;
}

inline ModelPartition documents(bool mask, bool reset) {
    ModelPartition part;
    part.document_mask = mask;
    part.reset_position_ids = reset;
    part.document_end_token = kEnd;
    return part;
}

// One run of the model over one sequence: its mean loss and its parameter gradients, each
// scaled by `weight` (the tokens the model holds, to undo the mean), and the logits of each
// row it holds.
struct RunResult {
    double weighted_loss = 0;
    std::vector<std::vector<double>> weighted_grads;
    std::vector<std::vector<double>> logits;
};

inline RunResult run(Transformer& model, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, double weight, int64_t rows) {
    const auto T = static_cast<int64_t>(tokens.size());
    OwnedTensor tok(DType::i32, {T}), tgt(DType::i32, {T});
    std::copy(tokens.begin(), tokens.end(), tok.data<int32_t>());
    std::copy(targets.begin(), targets.end(), tgt.data<int32_t>());
    Parameters& p = model.parameters();
    model.backend().fill_zero(p.all_grads());
    RunResult r;
    r.weighted_loss = weight * model.forward(tok.view(), tgt.view(), 1, T);
    for (int64_t row = 0; row < rows; ++row) r.logits.push_back(model.logits_row(row));
    model.backward(1.0);
    for (size_t i = 0; i < p.count(); ++i) {
        const double* g = p.grad(i).data<double>();
        std::vector<double> scaled(g, g + p.grad(i).numel());
        for (double& x : scaled) x *= weight;
        r.weighted_grads.push_back(std::move(scaled));
    }
    return r;
}

// The whole sequence in one model.
inline RunResult run(Transformer& model, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
    const auto T = static_cast<int64_t>(tokens.size());
    return run(model, tokens, targets, static_cast<double>(T), T);
}

// The largest relative difference between B alone and B's share of [A, B] (loss and every
// gradient element).
struct Isolation {
    double loss_error = 0, grad_error = 0, logits_error = 0;
};

inline double relative(double x, double y) { return std::abs(x - y) / std::max({std::abs(x), std::abs(y), 1e-6}); }

inline Isolation share_of_b(const RunResult& both, const RunResult& a, const RunResult& b) {
    Isolation out;
    out.loss_error = relative(both.weighted_loss - a.weighted_loss, b.weighted_loss);
    for (size_t i = 0; i < b.weighted_grads.size(); ++i) {
        double scale = 1e-6;
        for (double g : b.weighted_grads[i]) scale = std::max(scale, std::abs(g));
        for (size_t k = 0; k < b.weighted_grads[i].size(); ++k) {
            const double share = both.weighted_grads[i][k] - a.weighted_grads[i][k];
            out.grad_error = std::max(out.grad_error, std::abs(share - b.weighted_grads[i][k]) / scale);
        }
    }
    return out;
}

}  // namespace llmtrain::test::document_pair
