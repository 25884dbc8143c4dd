// Packed documents under context parallelism (parallel.cp = 2): the sequence [A, B] of 12
// tokens is cut into 4 chunks of 3; rank 0 holds positions 0-2 and 9-11, rank 1 positions
// 3-8, so B (positions 5-11) starts in rank 1's chunk and ends in rank 0's, whose rows learn
// where B starts from the whole sequence. B's share of the loss and of every parameter
// gradient, summed over the cp ranks, equals B alone at the start of a sequence in one
// process (support/document_pair.h); with the mask off they differ.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "support/document_pair.h"
#include "support/parallel_test.h"

using namespace llmtrain;
using namespace llmtrain::test::document_pair;

namespace {

// The run over the whole sequence, its loss and gradients summed over the cp ranks: each
// rank's mean covers its T / cp tokens, so each is weighted by T / cp.
RunResult run_over_cp(Transformer& model, Comm& cp, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
    const auto T = static_cast<int64_t>(tokens.size());
    RunResult r = run(model, tokens, targets, static_cast<double>(T / cp.size()), 0);
    cp.all_reduce(Tensor(&r.weighted_loss, DType::f64, {1}), ReduceOp::sum);
    for (std::vector<double>& g : r.weighted_grads) cp.all_reduce(Tensor(g.data(), DType::f64, {static_cast<int64_t>(g.size())}), ReduceOp::sum);
    return r;
}

Isolation isolate_document_b_over_cp(ModelFamily family, bool mask, bool reset) {
    ParallelConfig layout;
    layout.cp = 2;
    ParallelContext ctx = make_mpi_context(layout);
    auto backend = make_cpu_backend(1);
    const ModelConfig config = tiny(family);
    ModelPartition split = documents(mask, reset);
    split.cp_size = ctx.mesh.cp();
    split.cp_rank = ctx.coord()[mesh_dim::cp];
    Transformer over_cp(config, *backend, DType::f64, 1, config.max_seq_len, split, nullptr, ctx.cp.get());
    Transformer whole(config, *backend, DType::f64, 1, config.max_seq_len, documents(mask, reset));
    over_cp.initialize(7);
    whole.initialize(7);
    const RunResult both = run_over_cp(over_cp, *ctx.cp, joined(kDocA, kDocB), joined(kTargetsA, kTargetsB));
    const RunResult a = run(whole, kDocA, kTargetsA), b = run(whole, kDocB, kTargetsB);
    ctx.world->barrier();
    return share_of_b(both, a, b);
}

void expect_document_isolated_over_cp(ModelFamily family) {
    const Isolation masked = isolate_document_b_over_cp(family, true, true);
    EXPECT_LT(masked.loss_error, 1e-12);
    EXPECT_LT(masked.grad_error, 1e-10);
    const Isolation causal = isolate_document_b_over_cp(family, false, false);
    EXPECT_GT(causal.loss_error, 1e-4);
    EXPECT_GT(causal.grad_error, 1e-3);
}

}  // namespace

PARALLEL_TEST(ContextParallelDocumentMask, Gpt2DocumentAfterAnother_HasTheLossAndGradientsOfItAlone, 2) { expect_document_isolated_over_cp(ModelFamily::gpt2); }
PARALLEL_TEST(ContextParallelDocumentMask, LlamaGqaDocumentAfterAnother_HasTheLossAndGradientsOfItAlone, 2) {
    expect_document_isolated_over_cp(ModelFamily::llama);
}
