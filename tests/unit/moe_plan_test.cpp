// The plan of a mixture-of-experts model (plan/moe_plan.h): the active parameters behind MFU,
// the experts' FLOPs (top_k per token, not n_experts), the all-to-alls of expert parallelism
// inside and across nodes, the host synchronizations of dropless routing, the state an
// ep > 1 rank holds, and the search over ep, whose ep > 1 layouts say this build does not
// train them.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "model/transformer.h"
#include "plan/layout_plan.h"
#include "plan/memory_plan.h"
#include "plan/moe_plan.h"
#include "plan/step_model.h"
#include "parallel/context.h"

using namespace llmtrain;

namespace {

// A llama of 6 layers, the first dense, then 16 experts (top 2) of width 64.
Config moe(std::vector<std::string> extra = {}) {
    std::vector<std::string> overrides = {"model.family=\"llama\"", "model.n_layers=6", "model.d_model=128", "model.n_heads=4", "model.n_kv_heads=2",
                                          "model.vocab_size=512", "model.max_seq_len=256", "train.seq_len=256", "train.batch_size=2",
                                          "train.device=\"cuda\"", "model.moe.n_experts=16", "model.moe.top_k=2", "model.moe.d_ff_expert=64",
                                          "model.moe.first_dense_layers=1"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return load_config("configs/tiny.toml", overrides, DataFiles::unchecked);
}

Cluster h100() { return load_cluster("configs/clusters/h100-sxm.toml"); }

StepTime predict(const Config& config, int devices, const Cluster& cluster = h100()) {
    return predict_step_time(config, make_mesh(config.parallel, devices), cluster, model_parameter_count(config.model));
}

double expert_flops(const StageWork& w) {
    double total = 0;
    for (const auto& [cls, flops] : w.expert_gemm_flops) total += flops;
    return total;
}

}  // namespace

// N of MFU's 6 N: everything but the n_experts - top_k experts a token skips in each MoE layer.
TEST(MoePlan, ActiveParameters_AreTheModelLessTheExpertsATokenSkips) {
    const Config config = moe();
    const double all = model_parameter_count(config.model), expert = 3.0 * 64 * 128;
    EXPECT_DOUBLE_EQ(active_parameter_count(config.model, all), all - 5 * (16 - 2) * expert);
    const Config dense = load_config("configs/tiny.toml", {}, DataFiles::unchecked);
    EXPECT_DOUBLE_EQ(active_parameter_count(dense.model, 1e6), 1e6);
    const StepTime t = predict(config, 1);
    EXPECT_DOUBLE_EQ(t.active_parameters, active_parameter_count(config.model, all));
    EXPECT_DOUBLE_EQ(t.model_flops_per_token, model_flops_per_token(config, t.active_parameters));
}

// The step model counts a stage's parameters without registering every expert: the same
// count as the layout that registers them, for whole and split stages.
TEST(MoePlan, StageParameterCount_EqualsTheLayoutsRegistration) {
    for (const std::vector<std::string>& layout : {std::vector<std::string>{}, {"parallel.pp=2"}, {"parallel.tp=2", "parallel.pp=3"}}) {
        const Config config = moe(layout);
        const Mesh mesh = make_mesh(config.parallel, static_cast<int>(config.parallel.tp * config.parallel.pp));
        for (int stage = 0; stage < mesh.pp(); ++stage) {
            SCOPED_TRACE(cat("tp ", mesh.tp(), " pp ", mesh.pp(), " stage ", stage));
            const ModelPartition part = stage_partition(config, mesh, mesh.world_rank({{mesh_dim::pp, stage}}));
            const TransformerLayout whole(config.model, Device::cpu, DType::f32, 2, 256, part, 0, mesh.tp());
            EXPECT_EQ(stage_parameter_count(config, part, mesh.tp()), whole.parameters().total_numel());
        }
    }
}

// The experts' FLOPs are the active ones: the routed rows (tokens x top_k) through one
// expert's SwiGLU, whatever n_experts; the router's GEMM is the only part that grows with it.
TEST(MoePlan, ExpertFlops_AreTopKPerTokenWhateverTheExpertCount) {
    const Config sixteen = moe(), sixty_four = moe({"model.moe.n_experts=64"});
    const Mesh one = make_mesh(sixteen.parallel, 1);
    const StageWork a = stage_work(sixteen, one, 0), b = stage_work(sixty_four, one, 0);
    const double tokens = 2 * 256, rows = tokens * 2, passes = 3;
    EXPECT_DOUBLE_EQ(expert_flops(a), 5 * passes * (2 * rows * 128 * 2 * 64 + 2 * rows * 64 * 128));
    EXPECT_DOUBLE_EQ(expert_flops(b), expert_flops(a));
    EXPECT_DOUBLE_EQ(b.total_gemm_flops() - a.total_gemm_flops(), 5 * passes * 2 * tokens * 128 * (64 - 16));
    // One call per expert and projection: forward, and two in backward.
    EXPECT_DOUBLE_EQ(a.expert_gemm_calls, 5 * 16 * 2 * passes);
    // Full recomputation runs the forward again.
    EXPECT_DOUBLE_EQ(expert_flops(stage_work(moe({"train.recompute=\"full\""}), one, 0)), expert_flops(a) * 4 / 3);
}

// Shared experts add a dense SwiGLU MLP of their width (n_shared_experts x d_ff_expert, split
// over tp) and, with the gate, its GEMM of the layer's tokens by one, to each MoE layer; the
// stage's parameters count them as the layout registers them.
TEST(MoePlan, SharedExperts_AddTheirMlpAndGateGemmsAndParameters) {
    const Config plain = moe(), shared = moe({"model.moe.n_shared_experts=2", "model.moe.shared_expert_gate=true"});
    const Mesh one = make_mesh(plain.parallel, 1);
    const double tokens = 2 * 256, F = 2 * 64, passes = 3;
    const double mlp = 2 * tokens * 128 * 2 * F + 2 * tokens * F * 128, gate = 2 * tokens * 128 * 1;
    EXPECT_DOUBLE_EQ(stage_work(shared, one, 0).total_gemm_flops() - stage_work(plain, one, 0).total_gemm_flops(), 5 * passes * (mlp + gate));
    EXPECT_DOUBLE_EQ(expert_flops(stage_work(shared, one, 0)), expert_flops(stage_work(plain, one, 0)));
    const Config tp2 = moe({"model.moe.n_shared_experts=2", "parallel.tp=2"}), tp2_plain = moe({"parallel.tp=2"});
    const Mesh two = make_mesh(tp2.parallel, 2);
    EXPECT_DOUBLE_EQ(stage_work(tp2, two, 0).total_gemm_flops() - stage_work(tp2_plain, two, 0).total_gemm_flops(), 5 * passes * mlp / 2);
    const ModelPartition part = stage_partition(shared, one, 0);
    const TransformerLayout whole(shared.model, Device::cpu, DType::f32, 2, 256, part, 0, 1);
    EXPECT_EQ(stage_parameter_count(shared, part, 1), whole.parameters().total_numel());
    // Always active: MFU's N keeps them.
    const double all = model_parameter_count(shared.model), expert = 3.0 * 64 * 128;
    EXPECT_DOUBLE_EQ(active_parameter_count(shared.model, all), all - 5 * (16 - 2) * expert);
}

// Dropless routing reads the counts on the host once per MoE layer per forward (a full
// recomputation's too); a capacity reads its tally once per forward, not when recomputing.
TEST(MoePlan, HostSynchronizations_OnePerMoeLayerPerForward) {
    const int64_t micro_batches = 3;
    const std::string accum = cat("train.grad_accum=", micro_batches);
    EXPECT_DOUBLE_EQ(predict(moe({accum}), 1).host_syncs, 5 * micro_batches);
    EXPECT_DOUBLE_EQ(predict(moe({accum, "train.recompute=\"full\""}), 1).host_syncs, 2 * 5 * micro_batches);
    EXPECT_DOUBLE_EQ(predict(moe({accum, "train.recompute=\"full\"", "model.moe.capacity_factor=1.25"}), 1).host_syncs, 5 * micro_batches);
    const StepTime t = predict(moe({accum}), 1);
    EXPECT_DOUBLE_EQ(t.host_sync_seconds, 5 * micro_batches * host_sync_seconds);
    const Config dense = load_config("configs/tiny.toml", {"model.family=\"llama\"", "model.n_kv_heads=2", "train.device=\"cuda\""}, DataFiles::unchecked);
    EXPECT_EQ(predict(dense, 1).host_syncs, 0);
}

// ep > 1: four all-to-alls per MoE layer and micro-batch (dispatch and combine, forward and
// backward), each rank sending its routed rows; inside a node of 8 GPUs at NVLink's rate,
// across nodes the peers elsewhere at the network's, and none at ep = 1.
TEST(MoePlan, AllToAlls_OnlyWithEpAndAtTheInterNodeLinkBeyondANode) {
    const Cluster cluster = h100();
    EXPECT_EQ(predict(moe({"parallel.dp=16"}), 16).ep_comm_seconds, 0);
    const StepTime in_node = predict(moe({"parallel.dp=16", "parallel.ep=8"}), 16), across = predict(moe({"parallel.dp=16", "parallel.ep=16"}), 16);
    EXPECT_TRUE(in_node.ep_intra_node);
    EXPECT_FALSE(across.ep_intra_node);
    const double bytes = 2 * 256 * 2 * 128 * 2.0;  // tokens x top_k rows of d_model, bf16
    const double one = 7.0 / 8 * bytes / (cluster.intra_node.gbps * 1e9) + cluster.intra_node.latency_us * 1e-6;
    EXPECT_NEAR(in_node.ep_comm_seconds, 5 * 4 * one, 1e-12);
    const double remote = 8.0 / 16 * bytes / (cluster.inter_node.gbps * 1e9) + cluster.inter_node.latency_us * 1e-6;
    EXPECT_NEAR(across.ep_comm_seconds, 5 * 4 * remote, 1e-12);
}

// ep > 1 holds n_experts / ep experts per rank: their weights and gradients fall by ep; their
// optimizer state was already spread over the stage's tp x cp x dp ranks under ZeRO-1 (the
// experts over edp = dp / ep ranks of ep ranks each), so it stays, padding aside.
TEST(MoePlan, ExpertParallel_HoldsItsExpertsAndKeepsTheirMomentsSpreadOverTheStage) {
    const double expert = 3.0 * 64 * 128, moe_layers = 5, padding = 4 * 16;
    const auto memory = [](int ep) {
        const Config config = moe({"parallel.dp=4", "parallel.zero_stage=1", cat("parallel.ep=", ep)});
        return plan_memory(config, make_mesh(config.parallel, 4), 0).memory;
    };
    const RankMemory ep1 = memory(1), ep2 = memory(2), ep4 = memory(4);
    // bf16 compute: f32 master weights and the bf16 copy; f32 gradients.
    EXPECT_NEAR(static_cast<double>(ep1.parameter_bytes - ep2.parameter_bytes), moe_layers * 16 * expert / 2 * 6, padding * 6);
    EXPECT_NEAR(static_cast<double>(ep1.parameter_bytes - ep4.parameter_bytes), moe_layers * 16 * expert * 3 / 4 * 6, padding * 6);
    EXPECT_NEAR(static_cast<double>(ep1.gradient_bytes - ep4.gradient_bytes), moe_layers * 16 * expert * 3 / 4 * 4, padding * 8);
    EXPECT_NEAR(static_cast<double>(ep4.optimizer_bytes), static_cast<double>(ep1.optimizer_bytes), padding * 8);
    // The all-to-all's staging: two buffers of tokens x top_k rows of d_model, bf16.
    EXPECT_NEAR(static_cast<double>(ep4.activation_bytes - ep1.activation_bytes), 2 * (2 * 256 * 2) * 128 * 2.0, 4096);
}

// The search weighs ep (dividing n_experts and tp x cp x dp) for a mixture of experts; every
// ep > 1 layout it ranks says this build does not train it, every ep = 1 layout trains.
TEST(MoePlan, Search_WeighsEpAndMarksEpAboveOneAsNotTrainable) {
    const Config config = moe({"train.global_batch_size=16"});
    const LayoutSearch search = search_layouts(config, h100(), 8, PlanOptions{}, model_parameter_count(config.model));
    ASSERT_FALSE(search.ranked.empty());
    std::vector<int> eps;
    for (const LayoutPlan& p : search.ranked) {
        eps.push_back(p.ep);
        EXPECT_EQ(16 % p.ep, 0);
        EXPECT_EQ((p.tp * p.cp * p.dp) % p.ep, 0);
        EXPECT_EQ(p.not_trainable.empty(), p.ep == 1) << layout_name(p);
        if (p.ep > 1) EXPECT_NE(p.not_trainable.find("planned, not trainable in this build"), std::string::npos);
        EXPECT_EQ(layout_name(p).find(", ep "), p.ep > 1 ? layout_name(p).find(", ep ") : std::string::npos);
    }
    EXPECT_NE(std::find(eps.begin(), eps.end(), 1), eps.end());
    EXPECT_NE(std::find(eps.begin(), eps.end(), 8), eps.end());
    // A dense model is searched at ep = 1 only.
    const Config dense = load_config("configs/tiny.toml", {"train.global_batch_size=16", "train.device=\"cuda\""}, DataFiles::unchecked);
    for (const LayoutPlan& p : search_layouts(dense, h100(), 8, PlanOptions{}, model_parameter_count(dense.model)).ranked) EXPECT_EQ(p.ep, 1);
}

// parallel.ep > 1 on a mixture of experts is a layout the config accepts (so that `plan` can
// size it) and the trainer refuses, naming the key.
TEST(MoePlan, ExpertParallelConfig_ParsesForThePlanAndIsRefusedForTraining) {
    const Config config = moe({"parallel.dp=2", "parallel.ep=2", "train.device=\"cpu\""});
    EXPECT_EQ(config.parallel.ep, 2);
    EXPECT_NE(untrainable_in_this_build(config).find("parallel.ep: = 2"), std::string::npos);
    try {
        require_trainable_in_this_build(config);
        FAIL() << "expected a config error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_NE(std::string(e.what()).find("every expert on every rank"), std::string::npos) << e.what();
    }
    EXPECT_EQ(untrainable_in_this_build(moe({"parallel.dp=2"})), "");
}
