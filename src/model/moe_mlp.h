// A mixture-of-experts MLP (model.moe): an MlpPart that routes each token to top_k of E
// SwiGLU experts and sums their outputs weighted by the gates (Shazeer et al. 2017; Mixtral,
// Qwen2-MoE, DeepSeek-V3; Megatron-Core's token-choice MoE layer):
//
//   logits = x Wr^T                  [n, E], fp32 (the router GEMM accumulates and writes fp32)
//   experts, gates = top_k(score(logits))       (backend.h: MoeRouteFwd)
//   x_perm = x's rows by expert, a stable order  (MoePermutePlan, MoePermuteFwd)
//   y_perm[rows of e] = down_e(silu(gate_e x) * up_e x)   one GEMM per expert and projection
//   out[t] = sum_j gates[t, j] y_perm[row of (t, j)]       (MoeCombineFwd)
//
// plus, for the gradient only, the load-balancing loss (Switch's aux loss over the layer's
// tokens, or DeepSeek-V3's per sequence) and ST-MoE's router z-loss, each with its
// coefficient and the backward's loss scale.
//
// Dropless (capacity_factor 0): expert e's rows are a run of the permuted buffer whose length
// only the routing knows, so the experts' GEMMs read the counts on the host: one host
// synchronization per MoE layer per forward (the backward reuses them, and so does the load
// tally below). With a capacity c every expert runs c rows (padding rows are zero and stay
// zero: SwiGLU(0) = 0, no biases), the buffer is E c rows, and assignments beyond c are
// dropped and counted; the GEMMs need nothing from the host, and the one read of the kept and
// dropped counts per forward is the load tally's.
//
// The load (load(): assignments per expert and those dropped, since reset_load()) is what
// the trainer reports per layer; a full recomputation's re-run of the forward adds nothing. Why one GEMM per expert: each is an ordinary matmul_fwd / matmul_bwd of the
// backend (cuBLASLt on CUDA, with its algorithm cache), bitwise the same on every run, and a
// zero-row expert costs nothing; a grouped GEMM would save the launches, not the FLOPs.
//
// Shared experts (model.moe.n_shared_experts, DeepSeek-V3 and Qwen2-MoE): every token also
// passes through one dense SwiGLU MLP n_shared_experts * d_ff_expert wide (the shared experts
// fused, as both models store them), split over tp as a dense layer's MLP is:
//
//   out[t] += g[t] shared(x)[t],   g[t] = sigmoid(x[t] . w_g)  (shared_expert_gate; else g = 1)
//
// The gate runs as a router of one expert with sigmoid scores, unnormalized: its logit GEMM
// writes fp32, its score is the gate, and the combine of one choice per token weighs the
// shared output by it; so its forward and backward are the routed path's verified ops.
//
// Expert parallelism (an ep group of P ranks, LayerOps::expert_group): rank p holds experts
// [p E / P, (p + 1) E / P), their parameters under their global names. Each rank routes and
// permutes its own tokens over all E experts as above; since x_perm is sorted by expert, the
// rows for rank q's experts are one run of it, and an all-to-all with per-destination counts
// sends each run to its rank (Megatron-Core's all-to-all token dispatcher):
//
//   x_recv = [rows from rank 0 for my experts | rows from rank 1 ... ], each block by expert
//   y_recv[chunk (source s, my expert j)] = expert_j(x_recv[that chunk])
//   y_perm = the reverse all-to-all of y_recv          (then combine, as above)
//
// The backward sends d_y_perm the same way, runs the experts' backward chunk by chunk (their
// weight gradients accumulate over the sources in rank order: deterministic), and sends the
// input gradients back. Dropless, the counts of the whole group are gathered (one all-gather
// of [2, E] integers) before the one host read the layer makes anyway; the received rows are
// planned for the worst case, every rank's n tokens each sending min(k, E / P) rows here (a
// token's k experts are distinct). With a capacity every rank sends E/P x capacity rows to
// each rank and no count is read.
// The expert weights' gradients are this rank's tokens' and the other ranks' sent here: what
// reduces them further is the ranks holding the same experts (the expert-data group).
//
// Parallelism within an expert group, and with ep = 1, the part works on this rank's
// tokens: the whole micro-batch, or its 1/tp under sequence parallelism, where the experts'
// and the router's gradients are partial sums over the tp ranks (flagged, as the norms'), and
// its 1/cp under context parallelism. The balancing losses are the micro-batch's
// (Megatron-Core's per-micro-batch loss: a dp run is one process accumulating the same
// micro-batches): where the micro-batch's tokens are split (tp under sequence parallelism,
// cp) the load statistics [G, E] are summed over the ranks holding them before the aux loss
// is formed (its value is then the micro-batch's on each of them), and each rank adds its
// tokens' part of the z-loss's mean. So a split run computes what the unsplit one does;
// seq_aux_loss with sequence parallelism is refused (its rows cut sequences anywhere). A
// capacity caps each rank's own tokens: under sequence or context parallelism it drops other
// assignments than one process would (as in Megatron-Core).
//
// Parameters, in Qwen2-MoE's names: mlp.gate.weight [E, d_model] (the router), then per
// expert mlp.experts.{e}.gate_proj.weight, up_proj.weight [d_ff_expert, d_model] (one fused
// [2 F, d_model] matrix) and down_proj.weight [d_model, d_ff_expert]; then the shared experts'
// mlp.shared_expert.{gate_proj, up_proj, down_proj}.weight (S = n_shared_experts *
// d_ff_expert rows) and their gate mlp.shared_expert_gate.weight [1, d_model].
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "model/block.h"

namespace llmtrain {

struct MoeShape {
    int64_t d_model = 0, n_experts = 0, top_k = 0, d_ff = 0;  // d_ff: each expert's
    int64_t seq_len = 0;  // the planned tokens of a sequence on this rank (seq_aux_loss's groups)
    // Expert parallelism: the ep group's size, among whose ranks the experts are shared out in
    // order, and this rank's place in it (the ep group's rank).
    int64_t ep_size = 1;
    int ep_rank = 0;
    int64_t local_experts() const { return n_experts / ep_size; }
    int64_t first_expert() const { return ep_rank * local_experts(); }
};

// shared_experts: the dense MLP of the shared experts (make_mlp of width
// config.shared_d_ff()), or null when config.n_shared_experts is 0.
std::unique_ptr<MlpPart> make_moe_mlp(const MoeConfig& config, MoeShape shape, std::unique_ptr<MlpPart> shared_experts);

// The planned rows of the permuted buffer for up to `tokens` tokens: tokens * top_k
// (dropless) or n_experts * capacity(tokens).
int64_t moe_permuted_rows(const MoeConfig& config, int64_t tokens);
// Assignments each expert takes of `tokens` tokens: ceil(capacity_factor * tokens * top_k /
// n_experts); 0 when dropless.
int64_t moe_capacity(const MoeConfig& config, int64_t tokens);

}  // namespace llmtrain
