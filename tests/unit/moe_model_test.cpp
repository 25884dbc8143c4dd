// The mixture-of-experts layer inside the model (model/moe_mlp.h): the whole model's
// gradients against central finite differences in f64, with the balancing losses part of the
// objective; routing that sends every token to one expert; dropped assignments; the
// parameters it registers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/moe_mlp.h"
#include "model/transformer.h"
#include "support/model_gradients.h"

using namespace llmtrain;

namespace {

ModelConfig tiny_moe() {
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
    m.init_std = 0.3;  // large enough that every gradient is well above rounding noise
    m.moe.n_experts = 4;
    m.moe.top_k = 2;
    m.moe.d_ff_expert = 6;
    return m;
}

using Batch = test::TokenBatch;

// The objective backward differentiates: the mean cross-entropy plus the balancing losses.
double objective(Transformer& model, const Batch& batch, int64_t B, int64_t T) {
    model.reset_loss_sum();
    const double loss = model.forward(batch.tokens, batch.targets, B, T);
    double balance = 0;
    model.backend().copy_to_host(&balance, model.balance_loss_sum());
    return loss + balance;
}

void expect_gradients_match_finite_differences(const ModelConfig& config) { test::expect_gradients_match_finite_differences(config, objective, 5); }

}  // namespace

TEST(MoeModel, SoftmaxRouterWithAuxLossGradients_MatchFiniteDifferences) { expect_gradients_match_finite_differences(tiny_moe()); }

TEST(MoeModel, SigmoidRouterWithSequenceAuxAndZLossGradients_MatchFiniteDifferences) {
    ModelConfig m = tiny_moe();
    m.moe.router = MoeRouter::sigmoid;
    m.moe.load_balancing = MoeBalancing::seq_aux_loss;
    m.moe.aux_loss_coeff = 0.3;
    m.moe.z_loss_coeff = 0.05;
    expect_gradients_match_finite_differences(m);
}

TEST(MoeModel, UnnormalizedGatesTopOneAndADenseFirstLayerGradients_MatchFiniteDifferences) {
    ModelConfig m = tiny_moe();
    m.moe.normalize_top_k = false;
    m.moe.top_k = 1;
    m.moe.first_dense_layers = 1;
    m.moe.load_balancing = MoeBalancing::none;
    expect_gradients_match_finite_differences(m);
}

// Capacity 0.5: half of the assignments fit, the rest are dropped; the gradient of what is
// kept is still exact (a dropped assignment contributes nothing either way).
TEST(MoeModel, CapacityThatDropsAssignmentsGradients_MatchFiniteDifferences) {
    ModelConfig m = tiny_moe();
    m.moe.capacity_factor = 0.5;
    expect_gradients_match_finite_differences(m);
}

TEST(MoeModel, Parameters_AreQwen2MoeNamedRouterAndExpertsOnMoeLayersOnly) {
    ModelConfig m = tiny_moe();
    m.moe.first_dense_layers = 1;
    auto backend = make_cpu_backend(1);
    Transformer model(m, *backend, DType::f32, 1, 4);
    const Parameters& p = model.parameters();
    EXPECT_EQ(p.info(p.index_of("model.layers.0.mlp.gate_proj.weight")).shape, (Shape{10, 8}));
    EXPECT_EQ(p.info(p.index_of("model.layers.1.mlp.gate.weight")).shape, (Shape{4, 8}));
    for (int e = 0; e < 4; ++e) {
        const std::string expert = "model.layers.1.mlp.experts." + std::to_string(e) + ".";
        EXPECT_EQ(p.info(p.index_of(expert + "gate_proj.weight")).shape, (Shape{6, 8}));
        EXPECT_EQ(p.info(p.index_of(expert + "up_proj.weight")).shape, (Shape{6, 8}));
        EXPECT_EQ(p.info(p.index_of(expert + "down_proj.weight")).shape, (Shape{8, 6}));
    }
    EXPECT_THROW(p.index_of("model.layers.1.mlp.gate_proj.weight"), std::exception);
}

// A router of zero weights ties every expert for every token, and ties go to the lower
// index: every token goes to expert 0 (and its second choice to expert 1). The dropless
// buffer holds them all, a capacity drops the excess; neither overruns, and both train on.
TEST(MoeModel, EveryTokenToOneExpert_RunsDroplessAndWithACapacity) {
    for (const double capacity : {0.0, 1.0}) {
        ModelConfig m = tiny_moe();
        m.moe.capacity_factor = capacity;
        auto backend = make_cpu_backend(1);
        const int64_t B = 2, T = 6;
        Transformer model(m, *backend, DType::f64, B, T);
        model.initialize(3);
        Parameters& p = model.parameters();
        for (const int64_t layer : {0, 1}) {
            const Tensor router = p.value(p.index_of("model.layers." + std::to_string(layer) + ".mlp.gate.weight"));
            std::fill(router.data<double>(), router.data<double>() + router.numel(), 0.0);
        }
        Batch batch(B * T, m.vocab_size, 4);
        const double loss = objective(model, batch, B, T);
        EXPECT_TRUE(std::isfinite(loss)) << "capacity " << capacity;
        model.backward(1.0);
        double norm = 0;
        for (size_t i = 0; i < p.count(); ++i) {
            const Tensor g = p.grad(i);
            for (int64_t k = 0; k < g.numel(); ++k) norm += g.data<double>()[k] * g.data<double>()[k];
        }
        EXPECT_TRUE(std::isfinite(norm)) << "capacity " << capacity;
    }
}
