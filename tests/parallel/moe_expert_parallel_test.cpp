// Expert parallelism inside the model (model/moe_mlp.h): on an ep group of P ranks, each holding
// E / P experts of every MoE layer, a rank's loss equals that of one process holding every expert
// on the same tokens, and so do its gradients: those of the parameters every rank holds (router,
// attention, norms, embedding, head) are its own tokens', and those of its experts are the sum of
// the group's (an expert runs every rank's rows routed to it). In f64 on the CPU, over the MPI
// group of the mesh's ep dimension, dropless and with a capacity, with shared experts, both
// recomputations, and a router that sends every row of the group to one rank. Then the CUDA
// path's host logic: bf16 on the CPU stand-in of the CUDA backend, the counts and rows moving
// as device tensors through MPI's staging.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "model/transformer.h"
#include "parallel/context.h"
#include "support/host_staging.h"
#include "support/model_gradients.h"
#include "support/parallel_test.h"
#include "support/stand_in_cuda_backend.h"

using namespace llmtrain;

namespace {

constexpr int64_t kBatch = 2, kSeqLen = 6;

ModelConfig tiny_moe() { return test::tiny_moe_model(8); }

// Every rank of the world in one expert group (dp = world, ep = world).
ParallelContext expert_group_context(std::shared_ptr<DeviceStaging> staging = nullptr) {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    ParallelConfig parallel;
    parallel.ep = world;
    return make_mpi_context(parallel, std::move(staging));
}

struct Variant {
    ModelConfig model = tiny_moe();
    Recompute recompute = Recompute::none;
    bool router_to_first_experts = false;  // a zero router: every row to experts 0 and 1 (ep rank 0's)
};

void zero_routers(Transformer& model) {
    Parameters& p = model.parameters();
    for (size_t i = 0; i < p.count(); ++i)
        if (p.info(i).name.ends_with(".mlp.gate.weight")) std::fill(p.value(i).data<double>(), p.value(i).data<double>() + p.value(i).numel(), 0.0);
}

// Forward and backward of this rank's tokens; returns the loss plus the balancing losses.
double forward_backward(Transformer& model, const test::TokenBatch& batch) {
    model.reset_loss_sum();
    const double loss = model.forward(batch.tokens, batch.targets, kBatch, kSeqLen);
    double balance = 0;
    model.backend().copy_to_host(&balance, model.balance_loss_sum());
    model.backward(1.0);
    return loss + balance;
}

// The largest gradient difference relative to the largest magnitude of the parameter's
// reference gradient (1e-30 floor), over every parameter the expert-parallel model holds.
void expect_matches_one_process(const Variant& v) {
    const ParallelContext ctx = expert_group_context();
    Comm& ep = *ctx.ep;
    auto backend = make_cpu_backend(1);
    ModelPartition part;
    part.recompute = v.recompute;
    Transformer one(v.model, *backend, DType::f64, kBatch, kSeqLen, part);
    part.ep_size = ep.size();
    part.ep_rank = ep.rank();
    Transformer split(v.model, *backend, DType::f64, kBatch, kSeqLen, part, nullptr, nullptr, &ep);
    one.initialize(5);
    split.initialize(5);
    if (v.router_to_first_experts) zero_routers(one), zero_routers(split);
    const test::TokenBatch batch(kBatch * kSeqLen, v.model.vocab_size, static_cast<uint32_t>(31 + 7 * ctx.world_rank));
    const double loss_one = forward_backward(one, batch), loss_split = forward_backward(split, batch);
    EXPECT_NEAR(loss_split, loss_one, 1e-12 * std::abs(loss_one)) << "rank " << ctx.world_rank;

    Parameters &p1 = one.parameters(), &ps = split.parameters();
    EXPECT_EQ(ps.count(), p1.count() - static_cast<size_t>(3 * v.model.n_layers * v.model.moe.n_experts * (ep.size() - 1) / ep.size()))
        << "the split model holds its share of the experts (three tensors each: gate, up and down projections)";
    // The experts' reference gradients summed over the group: what each expert saw.
    for (size_t i = 0; i < p1.count(); ++i)
        if (p1.info(i).name.find(".experts.") != std::string::npos) ep.all_reduce(p1.grad(i), ReduceOp::sum);
    for (size_t i = 0; i < ps.count(); ++i) {
        const std::string& name = ps.info(i).name;
        const Tensor want = p1.grad(p1.index_of(name)), got = ps.grad(i);
        ASSERT_EQ(want.numel(), got.numel()) << name;
        double scale = 1e-30, worst = 0;
        for (int64_t k = 0; k < want.numel(); ++k) {
            scale = std::max(scale, std::abs(want.data<double>()[k]));
            worst = std::max(worst, std::abs(want.data<double>()[k] - got.data<double>()[k]));
        }
        EXPECT_LT(worst / scale, 1e-10) << "rank " << ctx.world_rank << ": " << name;
    }
}

}  // namespace

PARALLEL_TEST(MoeExpertParallel, DroplessOnTwoRanks_LossAndGradientsMatchOneProcess, 2) { expect_matches_one_process({}); }

PARALLEL_TEST(MoeExpertParallel, DroplessOnFourRanks_LossAndGradientsMatchOneProcess, 4) { expect_matches_one_process({}); }

// A capacity: every rank sends each rank E / P x capacity rows (padding included), no count read.
PARALLEL_TEST(MoeExpertParallel, CapacityThatDropsOnTwoRanks_LossAndGradientsMatchOneProcess, 2) {
    Variant v;
    v.model.moe.capacity_factor = 0.5;
    expect_matches_one_process(v);
}

PARALLEL_TEST(MoeExpertParallel, SigmoidRouterSharedExpertAndZLossOnFourRanks_MatchOneProcess, 4) {
    Variant v;
    v.model.moe.router = MoeRouter::sigmoid;
    v.model.moe.n_shared_experts = 1;
    v.model.moe.shared_expert_gate = true;
    v.model.moe.z_loss_coeff = 0.05;
    expect_matches_one_process(v);
}

// Selective recomputation rebuilds the experts' activation from the received rows; full
// recomputation runs the layer's forward again inside the backward, all-to-alls included.
PARALLEL_TEST(MoeExpertParallel, SelectiveRecomputeOnTwoRanks_MatchesOneProcess, 2) {
    Variant v;
    v.recompute = Recompute::selective;
    expect_matches_one_process(v);
}

PARALLEL_TEST(MoeExpertParallel, FullRecomputeWithACapacityOnFourRanks_MatchesOneProcess, 4) {
    Variant v;
    v.recompute = Recompute::full;
    v.model.moe.capacity_factor = 1.0;
    expect_matches_one_process(v);
}

// The dropless worst case: every rank sends all its rows to ep rank 0 (experts 0 and 1), which
// receives P n k rows, what its buffers are planned for; with a capacity the same routing drops.
// With top_k 4 over ranks of 2 experts each, a token sends a rank at most 2 rows: ranks 0 and 1
// receive P n 2 rows each, the planned bound (P n min(top_k, E / P)), and ranks 2 and 3 none.
PARALLEL_TEST(MoeExpertParallel, EveryRowToOneRankDroplessAndWithACapacityOnFourRanks_MatchOneProcess, 4) {
    for (const int64_t top_k : {2, 4})
        for (const double capacity : {0.0, 1.0}) {
            Variant v;
            v.router_to_first_experts = true;
            v.model.moe.top_k = top_k;
            v.model.moe.capacity_factor = capacity;
            SCOPED_TRACE(cat("top_k ", top_k, ", capacity ", capacity));
            expect_matches_one_process(v);
        }
}

namespace {

// A host tensor's copy in the backend's memory.
OwnedTensor on_device(Backend& backend, const Tensor& host) {
    OwnedTensor t(host.dtype(), host.shape(), backend.device(), [&backend](size_t bytes) { return backend.allocate(bytes); });
    backend.copy_from_host(t.view(), host.raw());
    return t;
}

std::vector<float> host_floats(Backend& backend, const Tensor& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    backend.copy_to_host(out.data(), t);
    return out;
}

}  // namespace

// bf16 activations, f32 gradients: the same rows meet the same weights on one rank or
// another, so the loss is the one process's to rounding; the experts' weight gradients sum
// their chunks in another order (1e-4 of the largest).
PARALLEL_TEST(MoeExpertParallel, StandInCudaBf16DroplessOnTwoRanks_MatchesOneProcess, 2) {
    const ParallelContext ctx = expert_group_context(std::make_shared<test::HostStaging>());
    Comm& ep = *ctx.ep;
    auto backend = test::make_stand_in_cuda_backend();
    ModelConfig model = tiny_moe();
    model.d_model = 64;  // heads of 32: the flash kernels' smallest
    model.moe.d_ff_expert = 32;
    ModelPartition part;
    Transformer one(model, *backend, DType::bf16, kBatch, kSeqLen, part);
    part.ep_size = ep.size();
    part.ep_rank = ep.rank();
    Transformer split(model, *backend, DType::bf16, kBatch, kSeqLen, part, nullptr, nullptr, &ep);
    one.initialize(5);
    split.initialize(5);
    const test::TokenBatch batch(kBatch * kSeqLen, model.vocab_size, static_cast<uint32_t>(31 + 7 * ctx.world_rank));
    const OwnedTensor tokens = on_device(*backend, batch.tokens), targets = on_device(*backend, batch.targets);
    const auto step = [&](Transformer& m) {
        m.reset_loss_sum();
        const double loss = m.forward(tokens, targets, kBatch, kSeqLen);
        m.backward(1.0);
        return loss;
    };
    const double loss_one = step(one), loss_split = step(split);
    EXPECT_NEAR(loss_split, loss_one, 1e-6 * std::abs(loss_one)) << "rank " << ctx.world_rank;
    Parameters &p1 = one.parameters(), &ps = split.parameters();
    for (size_t i = 0; i < p1.count(); ++i)
        if (p1.info(i).name.find(".experts.") != std::string::npos) ep.all_reduce(p1.grad(i), ReduceOp::sum);
    for (size_t i = 0; i < ps.count(); ++i) {
        const std::string& name = ps.info(i).name;
        const std::vector<float> want = host_floats(*backend, p1.grad(p1.index_of(name))), got = host_floats(*backend, ps.grad(i));
        ASSERT_EQ(want.size(), got.size()) << name;
        float scale = 1e-30f, worst = 0;
        for (size_t k = 0; k < want.size(); ++k) {
            scale = std::max(scale, std::abs(want[k]));
            worst = std::max(worst, std::abs(want[k] - got[k]));
        }
        EXPECT_LT(worst / scale, 1e-4f) << "rank " << ctx.world_rank << ": " << name;
    }
}
