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

ModelConfig tiny_moe() { return test::tiny_moe_model(4); }

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

// DeepSeek-V3's shared experts: added as they are, beside a sigmoid router.
TEST(MoeModel, SharedExpertsUngatedWithASigmoidRouterGradients_MatchFiniteDifferences) {
    ModelConfig m = tiny_moe();
    m.moe.n_shared_experts = 2;
    m.moe.router = MoeRouter::sigmoid;
    m.moe.load_balancing = MoeBalancing::none;
    expect_gradients_match_finite_differences(m);
}

// Qwen2-MoE's: one shared expert weighed by its sigmoid gate, unnormalized top-k gates.
TEST(MoeModel, SharedExpertWithItsSigmoidGateGradients_MatchFiniteDifferences) {
    ModelConfig m = tiny_moe();
    m.moe.n_shared_experts = 1;
    m.moe.shared_expert_gate = true;
    m.moe.normalize_top_k = false;
    m.moe.z_loss_coeff = 0.05;
    expect_gradients_match_finite_differences(m);
}

// The shared experts are a term of the output: zeroing their down projection gives the model
// without them (same routed experts, same loss), and their gate's weight moves the loss.
TEST(MoeModel, SharedExpertsWithZeroDownProjection_ComputeTheModelWithoutThem) {
    const int64_t B = 2, T = 6;
    ModelConfig plain = tiny_moe(), shared = tiny_moe();
    shared.moe.n_shared_experts = 1;
    shared.moe.shared_expert_gate = true;
    auto backend = make_cpu_backend(1);
    Transformer without(plain, *backend, DType::f64, B, T), with(shared, *backend, DType::f64, B, T);
    without.initialize(3);
    with.initialize(3);
    Parameters &a = without.parameters(), &b = with.parameters();
    for (size_t i = 0; i < a.count(); ++i) {
        const Tensor from = a.value(i), to = b.value(b.index_of(a.info(i).name));
        std::copy(from.data<double>(), from.data<double>() + from.numel(), to.data<double>());
    }
    const auto zero = [&](const std::string& name) {
        const Tensor t = b.value(b.index_of(name));
        std::fill(t.data<double>(), t.data<double>() + t.numel(), 0.0);
    };
    for (const int layer : {0, 1}) zero("model.layers." + std::to_string(layer) + ".mlp.shared_expert.down_proj.weight");
    Batch batch(B * T, plain.vocab_size, 4);
    const double loss_without = objective(without, batch, B, T);
    EXPECT_EQ(objective(with, batch, B, T), loss_without);
    // With its down projection back, the shared expert changes the loss.
    with.initialize(3);
    for (size_t i = 0; i < a.count(); ++i) {
        const Tensor from = a.value(i), to = b.value(b.index_of(a.info(i).name));
        std::copy(from.data<double>(), from.data<double>() + from.numel(), to.data<double>());
    }
    EXPECT_NE(objective(with, batch, B, T), loss_without);
}

TEST(MoeModel, SharedExperts_AreQwen2MoeNamedOneMlpNSharedTimesTheExpertWidthAndTheirGate) {
    ModelConfig m = tiny_moe();
    m.moe.n_shared_experts = 2;
    m.moe.shared_expert_gate = true;
    auto backend = make_cpu_backend(1);
    Transformer model(m, *backend, DType::f32, 1, 4);
    const Parameters& p = model.parameters();
    const std::string mlp = "model.layers.1.mlp.";
    EXPECT_EQ(p.info(p.index_of(mlp + "shared_expert.gate_proj.weight")).shape, (Shape{12, 8}));
    EXPECT_EQ(p.info(p.index_of(mlp + "shared_expert.up_proj.weight")).shape, (Shape{12, 8}));
    EXPECT_EQ(p.info(p.index_of(mlp + "shared_expert.down_proj.weight")).shape, (Shape{8, 12}));
    EXPECT_EQ(p.info(p.index_of(mlp + "shared_expert_gate.weight")).shape, (Shape{1, 8}));
    // Hugging Face's order: the router, the experts, the shared expert, its gate.
    EXPECT_LT(p.index_of(mlp + "experts.3.down_proj.weight"), p.index_of(mlp + "shared_expert.gate_proj.weight"));
    EXPECT_LT(p.index_of(mlp + "shared_expert.down_proj.weight"), p.index_of(mlp + "shared_expert_gate.weight"));
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
