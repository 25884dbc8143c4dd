#include "plan/step_model.h"

#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "model/transformer.h"
#include "parallel/placement.h"
#include "plan/memory_plan.h"
#include "plan/moe_plan.h"
#include "parallel/pipeline_schedule.h"

namespace llmtrain {

namespace {

struct Shapes {
    double b, s, n, d, h, kv, hd, f, up, vocab;  // n = b * s / cp tokens per micro-batch on this rank; up: MLP-up width
    double cp;  // context-parallel ranks sharing each sequence
    double t, compute_bytes, master_bytes, reduce_bytes;  // reduce_bytes: per element of the dp gradient collectives
    bool sequence_parallel, tp_overlap, llama;
    Recompute recompute;
    // train.precision = "fp8": the layers [fp8_first, fp8_end) run their linears in FP8
    // (Transformer::plan_fp8); current scaling reads each activation and gradient once more for its amax.
    bool fp8, fp8_current;
    int64_t fp8_first, fp8_end;
    // A MoE layer (moe_plan.h): its tokens on this rank (1/tp under sequence parallelism, else
    // all of them on every tp rank), the permuted rows its experts run (planned_routed_rows),
    // the experts, those this rank holds (n_experts / ep), each one's width; the shared
    // experts' width (n_shared_experts x d_ff_expert, split over tp as a dense MLP; 0: none)
    // and whether their gate runs.
    double moe_tokens, routed_rows, experts, local_experts, f_expert, ep, f_shared;
    bool dropless, shared_gate;
};

Shapes shapes_of(const Config& config, const Mesh& mesh) {
    const ModelConfig& m = config.model;
    Shapes x{};
    x.b = static_cast<double>(config.train.batch_size);
    x.s = static_cast<double>(config.train.seq_len);
    x.cp = mesh.cp();
    x.n = x.b * x.s / x.cp;
    x.d = static_cast<double>(m.d_model);
    x.h = static_cast<double>(m.n_heads);
    x.kv = static_cast<double>(m.n_kv_heads);
    x.hd = static_cast<double>(m.head_dim());
    x.f = static_cast<double>(m.d_ff);
    x.llama = m.family == ModelFamily::llama;
    x.up = x.llama ? 2 * x.f : x.f;  // SwiGLU's gate and up are one GEMM
    x.t = mesh.tp();
    x.vocab = static_cast<double>(m.padded_vocab_size(mesh.tp()));
    const DType compute = compute_dtype(config.train);
    x.compute_bytes = static_cast<double>(dtype_size(compute));
    x.master_bytes = static_cast<double>(dtype_size(master_dtype(compute)));
    x.reduce_bytes = static_cast<double>(dtype_size(grad_reduce_dtype(config.parallel, master_dtype(compute))));
    x.sequence_parallel = config.parallel.sequence_parallel && mesh.tp() > 1;
    x.tp_overlap = x.sequence_parallel && config.parallel.tp_overlap;
    x.recompute = config.train.recompute;
    x.fp8 = config.train.precision == Precision::fp8;
    x.fp8_current = config.fp8.recipe == Fp8Recipe::current;
    x.fp8_first = config.fp8.bf16_first_layers;
    x.fp8_end = m.n_layers - config.fp8.bf16_last_layers;
    const MoeConfig& moe = m.moe;
    x.moe_tokens = x.sequence_parallel ? x.n / x.t : x.n;
    x.routed_rows = moe.enabled() ? static_cast<double>(planned_routed_rows(moe, static_cast<int64_t>(x.moe_tokens))) : 0;
    x.experts = static_cast<double>(moe.n_experts);
    x.ep = mesh.ep();
    x.local_experts = moe.enabled() ? x.experts / x.ep : 0;
    x.f_expert = static_cast<double>(moe.d_ff_expert);
    x.dropless = moe.capacity_factor <= 0;
    x.f_shared = moe.enabled() ? static_cast<double>(moe.shared_d_ff()) : 0;
    x.shared_gate = moe.enabled() && moe.shared_expert_gate;
    return x;
}

// Forward, backward (two GEMMs per forward one: input and weight gradients) and, under full
// recomputation, the forward again.
double gemm_passes(Recompute recompute) { return recompute == Recompute::full ? 4 : 3; }

void add_gemm(std::map<GemmClass, double>& flops, double m, double k, double n, double passes) { flops[gemm_class(m, n, k)] += 2 * m * k * n * passes; }

// A linear of the blocks: in the compute dtype, or in FP8 with its casts.
void add_linear(StageWork& w, const Shapes& x, double k, double n, double passes, bool fp8) {
    if (!fp8) return add_gemm(w.gemm_flops, x.n, k, n, passes);
    add_gemm(w.fp8_gemm_flops, x.n, k, n, passes);
    w.fp8_weight_elements += k * n;
    const Fp8CastBytes casts = fp8_cast_bytes_of(x.n, k, n, x.compute_bytes, x.fp8_current, x.recompute == Recompute::full ? 2 : 1);
    w.fp8_cast_bytes += casts.per_micro_batch;
    w.fp8_weight_cast_bytes += casts.per_step;
}

// One layer's GEMMs on one tp rank: QKV and MLP-up column-parallel, out and down row-parallel.
// A MoE layer has the attention's, the router's (the layer's tokens by n_experts, fp32 out)
// and its local experts': one GEMM per expert and projection (gate|up, down) on the rows
// routed to it, the balanced load (routed rows / local experts) or a capacity's rows, each a
// call of its own (StageWork::expert_gemm_calls: forward one, backward two, a full
// recomputation's forward one more); its shared experts' as a dense SwiGLU MLP's of their
// width, and their gate's (the layer's tokens by one). Under FP8 (fp8 = true) the linears FP8
// runs: QKV, out and a dense MLP's; a MoE layer's router and experts stay in the compute dtype.
void add_layer_gemms(StageWork& w, const Shapes& x, bool moe, bool fp8) {
    const double passes = gemm_passes(x.recompute);
    add_linear(w, x, x.d, (x.h + 2 * x.kv) * x.hd / x.t, passes, fp8);
    add_linear(w, x, x.h * x.hd / x.t, x.d, passes, fp8);
    if (!moe) {
        add_linear(w, x, x.d, x.up / x.t, passes, fp8);
        add_linear(w, x, x.f / x.t, x.d, passes, fp8);
        return;
    }
    add_gemm(w.gemm_flops, x.moe_tokens, x.d, x.experts, passes);
    const double rows = x.routed_rows / x.local_experts;
    w.expert_gemm_flops[gemm_class(rows, 2 * x.f_expert, x.d)] += 2 * x.routed_rows * x.d * 2 * x.f_expert * passes;
    w.expert_gemm_flops[gemm_class(rows, x.d, x.f_expert)] += 2 * x.routed_rows * x.f_expert * x.d * passes;
    w.expert_gemm_calls += 2 * x.local_experts * passes;
    if (x.f_shared <= 0) return;
    add_linear(w, x, x.d, 2 * x.f_shared / x.t, passes, false);
    add_linear(w, x, x.f_shared / x.t, x.d, passes, false);
    if (x.shared_gate) add_gemm(w.gemm_flops, x.moe_tokens, x.d, 1, passes);
}

// Causal attention does half of the 4 b s^2 hd FLOPs per head of the full score matrix;
// the backward twice the forward. Under context parallelism each of the cp ranks does 1/cp of
// it: its chunks r and 2cp - 1 - r pair a short causal prefix with a long one.
double layer_attention_forward_flops(const Shapes& x) { return 2 * x.b * x.s * x.s * x.hd * (x.h / x.t) / x.cp; }
double layer_attention_flops(const Shapes& x) { return layer_attention_forward_flops(x) * gemm_passes(x.recompute); }

// Elements read and written by one layer's memory-bound forward ops: two norms (read x,
// write y), two residual adds (two reads, a write), the MLP activation (GELU: read, write;
// SwiGLU: two reads, a write), RoPE on Q and K. Norms and residuals act on this rank's
// tokens under sequence parallelism. The backward moves about twice as much; selective
// recomputation repeats the norms and the activation, full recomputation the whole forward.
// A MoE layer's: the router's scores (read the logits, write the scores), the permutation
// (read the routed rows of x, write them), SwiGLU on the routed rows and the combine (read
// the experts' rows, write the layer's tokens); shared experts add a SwiGLU of their width
// and the add of their output (read two, write one; the gate's weighing reads and writes one more).
double layer_memory_bytes(const Shapes& x, bool moe) {
    const double rows = x.sequence_parallel ? x.n / x.t : x.n;
    const double norms = 2 * 2 * rows * x.d, residuals = 2 * 3 * rows * x.d;
    const double activation = !moe ? (x.llama ? 3 : 2) * x.n * x.f / x.t
                                   : 2 * x.moe_tokens * x.experts + 3 * x.routed_rows * x.d + 3 * x.routed_rows * x.f_expert + x.moe_tokens * x.d +
                                         (x.f_shared > 0 ? 3 * x.n * x.f_shared / x.t + (x.shared_gate ? 5 : 3) * x.moe_tokens * x.d : 0);
    const double rope = x.llama ? 2 * x.n * (x.h + x.kv) * x.hd / x.t : 0;
    const double forward = norms + residuals + activation + rope;
    const double again = x.recompute == Recompute::full ? forward : x.recompute == Recompute::selective ? norms + activation : 0;
    return (3 * forward + again) * x.compute_bytes;
}

// Tensor-parallel traffic of one layer and micro-batch (Megatron): two all-reduces of the
// residual stream forward, two backward; with sequence parallelism, all-gathers before the
// column-parallel GEMMs (again in backward, for the weight gradient) and reduce-scatters
// after the row-parallel ones, in the same volume per call.
//
// With parallel.tp_overlap, forward: each gather (reduce-scatter) in tp pieces behind the
// pieces of its column-parallel (row-parallel) GEMM, one piece's share exposed; backward: a
// column-parallel input's gather behind the input-gradient GEMM and the input gradient's
// reduce-scatter behind the weight-gradient GEMM (the same FLOPs as the forward GEMM each);
// the gathers of the row-parallel GEMMs' output gradients stay exposed.
//
// A MoE layer (moe = true) has the attention's half: its MLP works on the rank's own rows
// under sequence parallelism, and without it every tp rank runs the whole layer on all the
// tokens (moe_mlp.h), neither needing a tp collective; its shared experts, split over tp as a
// dense MLP, add that MLP's half at their width.
void add_layer_collectives(std::vector<CollectiveCall>& calls, const Shapes& x, double layers, bool moe) {
    if (x.t <= 1 || layers <= 0) return;
    const bool split_mlp = !moe || x.f_shared > 0;
    const double bytes = x.n * x.d * x.compute_bytes, forwards = x.recompute == Recompute::full ? 2 : 1, parts = split_mlp ? 2 : 1;
    if (!x.sequence_parallel) {
        calls.push_back({Collective::all_reduce, bytes, layers * parts * (forwards + 1)});
        return;
    }
    if (!x.tp_overlap) {
        calls.push_back({Collective::all_gather, bytes, layers * parts * (forwards + 2)});
        calls.push_back({Collective::reduce_scatter, bytes, layers * parts * (forwards + 1)});
        return;
    }
    // Per rank: QKV and MLP-up (column-parallel), attention-out and MLP-down (row-parallel),
    // as {FLOPs, class} of one pass (m = tokens, k = inputs, n = outputs).
    struct Gemm {
        double flops;
        GemmClass cls;
    };
    const auto gemm = [&](double k, double n) { return Gemm{2 * x.n * k * n, gemm_class(x.n, n, k)}; };
    const double mlp_f = moe ? x.f_shared : x.f, mlp_up = moe ? 2 * x.f_shared : x.up;
    const Gemm qkv = gemm(x.d, (x.h + 2 * x.kv) * x.hd / x.t), up = gemm(x.d, mlp_up / x.t);
    const Gemm out = gemm(x.h * x.hd / x.t, x.d), down = gemm(mlp_f / x.t, x.d);
    const double piece = 1 / x.t, hidden_pieces = (x.t - 1) / x.t;
    const std::vector<Gemm> columns = split_mlp ? std::vector<Gemm>{qkv, up} : std::vector<Gemm>{qkv},
                            row_gemms = split_mlp ? std::vector<Gemm>{out, down} : std::vector<Gemm>{out};
    for (const Gemm& column : columns) {
        calls.push_back({Collective::all_gather, bytes, layers * forwards, column.flops * hidden_pieces, column.cls, piece});
        calls.push_back({Collective::all_gather, bytes, layers, column.flops, column.cls, 0});
        calls.push_back({Collective::reduce_scatter, bytes, layers, column.flops, column.cls, 0});
    }
    for (const Gemm& row : row_gemms)
        calls.push_back({Collective::reduce_scatter, bytes, layers * forwards, row.flops * hidden_pieces, row.cls, piece});
    calls.push_back({Collective::all_gather, bytes, layers * parts});
}

// A MoE layer's traffic beyond the attention's, per micro-batch. With ep > 1 its tokens go to
// their experts and back by an all-to-all over the ep group: dispatch and combine forward,
// their gradients backward, the forward's again under full recomputation; each rank sends its
// routed rows (d_model wide, compute dtype). Dropless routing reads the expert counts on the
// host once per MoE layer per forward (a full recomputation's forward too); a capacity reads
// its load tally once per forward (moe_mlp.h).
void add_moe_layer_traffic(StageWork& w, const Shapes& x, double moe_layers) {
    const double forwards = x.recompute == Recompute::full ? 2 : 1;
    if (x.ep > 1) {
        w.ep_all_to_all_bytes = x.routed_rows * x.d * x.compute_bytes;
        w.ep_all_to_alls += moe_layers * 2 * (forwards + 1);
    }
    w.host_syncs += moe_layers * (x.dropless ? forwards : 1);
}

// Context parallelism's ring attention (Liu et al. 2023; Megatron-Core's p2p ring) of one layer
// and micro-batch. Rank r holds chunks r and 2cp - 1 - r of each sequence (2cp chunks of s / 2cp
// tokens), so each of its cp attention blocks (its own keys and values, then each other rank's)
// holds two full chunk-by-chunk products: 1/cp of its attention. Forward: cp - 1 steps, each
// passing the keys and values it holds, [n, 2 kv/t hd] in the compute dtype, to the next rank
// while the current block computes. Backward: cp - 1 steps passing keys and values and cp hops
// of their gradients' f32 accumulators, each behind a block's backward (twice its forward)
// except the last hop, which brings dK/dV home after the last block: exposed. Full
// recomputation runs the forward ring again.
void add_layer_ring_sends(std::vector<RingSend>& sends, const Shapes& x, double layers) {
    if (x.cp <= 1) return;
    const double kv_elements = x.n * 2 * (x.kv / x.t) * x.hd, steps = x.cp - 1;
    const double kv_bytes = kv_elements * x.compute_bytes, dkv_bytes = kv_elements * 4;
    const double block_forward = layer_attention_forward_flops(x) / x.cp, forwards = x.recompute == Recompute::full ? 2 : 1;
    sends.push_back({kv_bytes, layers * forwards * steps, block_forward});
    sends.push_back({kv_bytes + dkv_bytes, layers * steps, 2 * block_forward});
    sends.push_back({dkv_bytes, layers, 0});
}

int first_rank_of_stage(const Mesh& mesh, int stage) { return mesh.world_rank({{mesh_dim::pp, stage}}); }

// The global layers a stage holds, chunk by chunk (ModelPartition).
std::vector<int64_t> held_layers(const ModelConfig& model, const ModelPartition& part) {
    const int64_t last = part.last_layer < 0 ? model.n_layers : part.last_layer;
    std::vector<int64_t> layers;
    for (int64_t c = 0; c < part.chunks; ++c)
        for (int64_t layer = part.first_layer; layer < last; ++layer) layers.push_back(layer + c * part.chunk_stride);
    return layers;
}

// A GPU node holds one rank per device; a CPU node holds the job's ranks spread evenly over
// the nodes, however many cores it has (ranks beyond the cores share them).
int ranks_per_node(const Mesh& mesh, const Cluster& cluster) {
    if (cluster.kind == ClusterKind::gpu) return cluster.devices_per_node;
    return std::max(1, (mesh.world_size() + cluster.nodes - 1) / cluster.nodes);
}

// With ep > 1 (moe_plan.h) a rank holds n_experts / ep experts of each MoE layer, reduced
// over the edp ranks holding the same (StageWork::expert_*) and, under ZeRO, updated in 1/edp
// pieces; the rest over the data group as without experts. With ep = 1 under sequence
// parallelism the MoE layers' weights (router and experts, whole on each tp rank) saw only
// the rank's tokens: their gradients are summed over tp, one all-reduce per tensor
// (trainer.cpp's grads-ready hook), at the step's last micro-batch (every micro-batch under
// ZeRO-2/3).
void add_step_work(StageWork& w, const Config& config, const Mesh& mesh, int stage, const Shapes& x) {
    const ModelPartition part = stage_partition(config, mesh, first_rank_of_stage(mesh, stage));
    const int64_t padded = Parameters::padded_length(stage_parameter_count(config, part, mesh.tp()), part.param_pad_multiple);
    const double moe_layers = static_cast<double>(moe_layers_in(config.model, part));
    // The router, the experts and the shared experts' gate act on each rank's own tokens.
    const double moe_weights = moe_layers * (expert_parameters_per_layer(config.model) + x.experts * x.d + (x.shared_gate ? x.d : 0));
    const double elsewhere = x.ep > 1 ? moe_layers * expert_parameters_per_layer(config.model) * (1 - 1 / x.ep) : 0;
    const double expert_held = x.ep > 1 ? moe_layers * expert_parameters_per_layer(config.model) / x.ep : 0;
    // ZeRO (stage >= 1) updates 1/(dp cp) of the buffer on each rank of the data group: its
    // piece of every bucket or group.
    const bool sharded = config.parallel.zero_stage >= 1 && mesh.data_size() > 1;
    const double dense = static_cast<double>(padded) - elsewhere - expert_held;
    const double p = dense + expert_held, o = sharded ? dense / mesh.data_size() + expert_held / mesh.edp() : p;
    if (x.ep > 1) {
        w.expert_reduce_bytes = expert_held * x.reduce_bytes;
        w.expert_parameter_bytes = sharded ? expert_held * x.master_bytes : 0;
    } else if (x.sequence_parallel && moe_layers > 0) {
        w.tp_gradient_sum_bytes = moe_weights * x.master_bytes;
        w.tp_gradient_sums = moe_layers * (1 + 3 * x.experts + (x.shared_gate ? 1 : 0)) *
                          (config.parallel.zero_stage >= 2 && mesh.data_size() > 1 ? static_cast<double>(micro_batches_per_step(config, mesh.dp())) : 1);
    }
    // AdamW reads the weight, gradient and two moments and writes three of them; every
    // gradient is zeroed (the flat buffer, or ZeRO-2/3's group buffers and shard), the norm
    // reads the owned ones only (each rank its reduced piece: the sum over ranks is the whole
    // norm); 16-bit compute refreshes its copy.
    w.update_bytes = 7 * o * x.master_bytes;
    w.gradient_pass_bytes = (p + o) * x.master_bytes + (x.compute_bytes != x.master_bytes ? p * x.compute_bytes : 0);
    // A narrower reduction dtype rounds the gradients into their copy and widens what this
    // rank keeps of the sum back (counted once a step, though ZeRO-2/3 round every micro-batch's).
    if (x.reduce_bytes != x.master_bytes && mesh.data_size() > 1) w.gradient_pass_bytes += (p + o) * (x.master_bytes + x.reduce_bytes);
    w.dp_gradient_bytes = dense * x.master_bytes;
    w.dp_reduce_bytes = dense * x.reduce_bytes;
    w.dp_parameter_bytes = sharded ? dense * x.master_bytes : 0;
    w.compute_parameter_bytes = dense * x.compute_bytes;
    // fp8.param_gather: ZeRO-3 gathers the FP8 linears' weights in e4m3, one byte per element.
    if (x.fp8 && config.fp8.param_gather) w.compute_parameter_bytes -= w.fp8_weight_elements * (x.compute_bytes - 1);
}

}  // namespace

double StageWork::total_gemm_flops() const {
    double total = 0;
    for (const auto& [c, flops] : gemm_flops) total += flops;
    return total;
}

double StageWork::total_fp8_gemm_flops() const {
    double total = 0;
    for (const auto& [c, flops] : fp8_gemm_flops) total += flops;
    return total;
}

Fp8CastBytes fp8_cast_bytes_of(double m, double k, double n, double compute_bytes, bool current_scaling, double forwards) {
    const double reads = (current_scaling ? 2 : 1) * compute_bytes;
    return {.per_micro_batch = forwards * (reads + 1) * m * k + (reads + 2) * m * k + (reads + 2) * m * n, .per_step = (2 * compute_bytes + 2) * n * k};
}

StageWork stage_work(const Config& config, const Mesh& mesh, int stage) {
    const Shapes x = shapes_of(config, mesh);
    const std::vector<int64_t> per_stage = parse_stage_layers(config.parallel.stage_layers, mesh.pp(), config.model.n_layers);
    const double layers = static_cast<double>(per_stage[static_cast<size_t>(stage)]);
    const double moe_layers = static_cast<double>(moe_layers_in(config.model, stage_partition(config, mesh, first_rank_of_stage(mesh, stage))));
    const double dense_layers = layers - moe_layers;
    StageWork w;
    // (parallel.tp_overlap, whose collectives hide behind the GEMMs, is refused with FP8.)
    for (const int64_t layer : held_layers(config.model, stage_partition(config, mesh, first_rank_of_stage(mesh, stage))))
        add_layer_gemms(w, x, config.model.moe.is_moe_layer(layer), x.fp8 && layer >= x.fp8_first && layer < x.fp8_end);
    w.attention_flops = layers * layer_attention_flops(x);
    w.memory_bytes = dense_layers * layer_memory_bytes(x, false) + moe_layers * layer_memory_bytes(x, true);
    add_layer_collectives(w.tp_collectives, x, dense_layers, false);
    add_layer_collectives(w.tp_collectives, x, moe_layers, true);
    add_moe_layer_traffic(w, x, moe_layers);
    add_layer_ring_sends(w.cp_sends, x, layers);
    const double rows = x.sequence_parallel ? x.n / x.t : x.n;
    if (stage == 0) {
        // The embedding: a gather forward, a scatter-add into the master-dtype gradient backward.
        w.memory_bytes += x.n * x.d * (2 * x.compute_bytes + 2 * x.master_bytes);
        if (x.t > 1) w.tp_collectives.push_back({x.sequence_parallel ? Collective::reduce_scatter : Collective::all_reduce, x.n * x.d * x.compute_bytes, 1});
    }
    if (stage == mesh.pp() - 1) {
        add_gemm(w.gemm_flops, x.n, x.d, x.vocab / x.t, 3);
        // The final norm, then the fused cross-entropy: logits read twice, their gradient written.
        w.memory_bytes += 3 * 2 * rows * x.d * x.compute_bytes + 3 * x.n * (x.vocab / x.t) * x.compute_bytes;
        if (x.t > 1) w.tp_collectives.push_back({Collective::all_reduce, x.n * 4, 3});  // row max, sum of exponentials, target logit
    }
    if (mesh.pp() > 1) {
        w.pp_send_bytes = rows * x.d * x.compute_bytes;
        // On the critical path per micro-batch: its activations in, its gradient back, once per
        // model chunk under interleaving.
        w.pp_sends = 2 * static_cast<double>(config.parallel.virtual_stages);
    }
    add_step_work(w, config, mesh, stage, x);
    return w;
}

DeviceShare device_share(const Config& config, const Mesh& mesh, const Cluster& cluster) {
    if (cluster.kind == ClusterKind::gpu) return {};
    const int ranks_on_node = ranks_per_node(mesh, cluster);
    const double cores = cluster.devices_per_node, fair = cores / ranks_on_node;
    const double threads = config.train.threads > 0 ? static_cast<double>(config.train.threads) : std::max(1.0, std::floor(fair));
    // A pipeline stage waiting in the bubble (a share (pp - 1) / (v m + pp - 1) of the
    // micro-batch phase) leaves its core to the others; at the step's end nobody waits.
    const double bubble = pipeline_bubble_fraction(mesh.pp(), micro_batches_per_step(config, mesh.dp()), config.parallel.virtual_stages);
    const double busy = ranks_on_node * (1 - bubble);
    return {std::min(threads, std::max(fair, cores / busy)), std::min(threads, fair)};
}

double collective_seconds(const CollectiveCall& call, int ranks, const Link& link) {
    if (ranks <= 1 || call.count <= 0) return 0;
    const double message = call.message_bytes > 0 ? call.message_bytes : call.bytes;
    const double n = ranks, busbw = link.busbw_gbps(call.op, message) * 1e9, latency = link.latency_us * 1e-6;
    const double steps = call.op == Collective::all_reduce ? 2 * (n - 1) : n - 1;
    return call.count * (steps / n * call.bytes / busbw + steps * latency);
}

double model_flops_per_token(const Config& config, double parameters) {
    const ModelConfig& m = config.model;
    return 6.0 * parameters + 12.0 * static_cast<double>(m.n_layers * m.n_heads * m.head_dim() * config.train.seq_len);
}

double model_parameter_count(const ModelConfig& model) {
    const TransformerLayout whole(model, Device::cpu, DType::f32, 1, 1, ModelPartition{}, 0, 1);
    return static_cast<double>(whole.parameters().total_numel());
}

std::string parameters_beyond_the_model(const ModelConfig& m, int64_t tp, int64_t pp, double held) {
    const double model = model_parameter_count(m);
    if (held <= model) return "";
    // Padding: rows beyond vocab_size in the embedding and, untied, the head too; a tied
    // embedding is held by the first stage and, as the head, by the last; what remains under
    // tp are the tensors each tp rank holds whole (norms, biases after a row-parallel matmul,
    // position embeddings), counted once per tp rank.
    const int64_t padded = m.padded_vocab_size(tp);
    const double padding = static_cast<double>((padded - m.vocab_size) * m.d_model * (m.tied_embeddings ? 1 : 2));
    const double tied_copy = pp > 1 && m.tied_embeddings ? static_cast<double>(padded * m.d_model) : 0;
    const double replicated = tp > 1 ? held - model - padding - tied_copy : 0;
    const auto millions = [](double n) { return cat(fixed(n / 1e6, 3), "M"); };
    std::string why;
    if (replicated > 0) why += cat(" + ", millions(replicated), " of tensors each of the ", tp, " tp ranks holds whole");
    if (padding > 0) why += cat(" + ", millions(padding), " vocabulary padding rows for tp ", tp);
    if (tied_copy > 0) why += cat(" + ", millions(tied_copy), " the tied embedding's copy on the last pipeline stage");
    return cat(" (the model's ", millions(model), why, ")");
}

namespace {

struct StageTime {
    double compute = 0, tp = 0, pp = 0, dp = 0, optimizer = 0;
    double cp = 0, cp_hidden = 0;  // context-parallel ring sends of a micro-batch: exposed, behind attention
    double dp_micro = 0;  // ZeRO-2/3: data-parallel collectives of each micro-batch, exposed
    double ep = 0, host_sync = 0, host_syncs = 0;  // a micro-batch's all-to-alls and host synchronizations (seconds, count)
    double tp_step = 0;            // per step: the MoE gradients' sum over tp
    double fp8_gemm = 0, fp8_cast = 0;  // of compute: the FP8 GEMMs and casts of a micro-batch
    double fp8_weights = 0;             // per step: the weights' FP8 casts
    bool ep_intra_node = true;
    double micro_batch() const { return compute + tp + cp + pp + dp_micro + ep + host_sync; }
};

// Attention's share of peak: under context parallelism every block runs on the ring's kernels.
double attention_efficiency(const Cluster& c, const Mesh& mesh) { return mesh.cp() > 1 ? c.efficiency.ring_attention_or_attention() : c.efficiency.attention; }

// The FP8 GEMMs' time: at the FP8 peak x efficiency.fp8_gemm on a GPU (peak: the compute
// dtype's, at this rank's share of the device); on a CPU, which emulates FP8 by decoding into
// f32 GEMMs, as the compute dtype's.
double fp8_gemm_seconds(const StageWork& w, const Cluster& c, double peak) {
    double seconds = 0;
    for (const auto& [cls, flops] : w.fp8_gemm_flops)
        seconds += c.kind == ClusterKind::gpu ? flops / (peak * c.fp8_peak_tflops / c.peak_tflops * c.efficiency.fp8_gemm) : flops / (peak * c.efficiency.gemm_for(cls));
    return seconds;
}

double compute_seconds(const StageWork& w, const Cluster& c, const Mesh& mesh, double peak, double bandwidth) {
    double seconds = fp8_gemm_seconds(w, c, peak) + w.fp8_cast_bytes / (bandwidth * c.efficiency.memory), experts = 0;
    for (const auto& [cls, flops] : w.gemm_flops) seconds += flops / (peak * c.efficiency.gemm_for(cls));
    for (const auto& [cls, flops] : w.expert_gemm_flops) experts += flops / (peak * c.efficiency.gemm_for(cls));
    seconds += c.kind == ClusterKind::gpu ? std::max(experts, w.expert_gemm_calls * kernel_launch_seconds) : experts;
    return seconds + w.attention_flops / (peak * attention_efficiency(c, mesh)) + w.memory_bytes / (bandwidth * c.efficiency.memory);
}

// Ranks are numbered tp fastest, then cp, dp, then pp: a group of `span` consecutive ranks
// stays inside a node when the node holds them all. (Four ranks on a node of two cores talk
// over its shared memory, not over the inter-node network.)
const Link& link_for(const Cluster& c, const Mesh& mesh, int span) { return span <= ranks_per_node(mesh, c) ? c.intra_node : c.inter_node; }

// The consecutive world ranks a group along dim spans, from its first to its last: a cp group
// spans tp x cp ranks (tp x pp x cp with the order tp-pp-dp, pp being inside cp then).
int group_span(const Mesh& mesh, std::string_view dim) {
    const std::vector<int> group = mesh.group(dim, 0);
    return group.back() - group.front() + 1;
}

// On a CPU cluster the ranks' own cores copy the data (MPI over shared memory), at their
// share of a core, and a non-blocking collective progresses only inside MPI calls: nothing
// overlaps with compute. On GPUs, NCCL runs beside the compute stream.
Link shared_link(const Link& link, const Cluster& c, double share) {
    if (c.kind == ClusterKind::gpu || share >= 1) return link;
    Link slower = link;
    slower.gbps *= share;
    for (auto& [op, gbps] : slower.measured_busbw_gbps) gbps *= share;
    for (auto& [op, curve] : slower.measured_busbw_by_size)
        for (auto& point : curve) point.second *= share;
    return slower;
}

// The link the collectives of a group of `group` ranks (spanning `span` consecutive ranks)
// run over. On GPUs: the bandwidth measured for that group size, where one was. On a CPU
// node: a measurement taken with as many ranks as the layout puts on the node includes their
// crowding of the cores and applies as it is; otherwise the general one, scaled by the
// rank's share of a core.
Link collective_link(const Cluster& c, const Mesh& mesh, int group, int span, double share) {
    const Link& link = link_for(c, mesh, span);
    const int crowd = c.kind == ClusterKind::gpu ? group : std::min(ranks_per_node(mesh, c), mesh.world_size());
    if (std::optional<Link> measured = link.as_measured_by(crowd)) return *measured;
    return shared_link(link, c, share);
}

// A collective's time not hidden behind the GEMM it overlaps (CollectiveCall::behind_flops):
// on GPUs, per call, what exceeds the GEMM's time, at least its exposed share; on a CPU the
// cores that would compute move the bytes (and MPI moves them only inside its calls): all.
double exposed_collective_seconds(const CollectiveCall& call, int ranks, const Link& link, const Cluster& c, double peak) {
    const double seconds = collective_seconds(call, ranks, link);
    if (call.behind_flops <= 0 || c.kind != ClusterKind::gpu || call.count <= 0) return seconds;
    const double behind = call.count * call.behind_flops / (peak * c.efficiency.gemm_for(call.behind_class));
    return std::max(seconds - behind, seconds * call.exposed_share);
}

// The updated parameters' all-gather of ZeRO-1/2, `gather` seconds in `cuts` cuts: at the
// step's end; with parallel.overlap_param_gather at the next step's start, behind its first
// forward (a third of a micro-batch's compute) on GPUs, where NCCL runs beside the compute
// stream, the first cut's share always exposed. On a CPU the cores move the bytes
// themselves, between the layers' compute: nothing hides.
double exposed_param_gather(const Config& config, const Cluster& c, double compute, double gather, double cuts) {
    if (!config.parallel.overlap_param_gather || c.kind != ClusterKind::gpu) return gather;
    return std::max(gather - compute / 3.0, gather / std::max(1.0, cuts));
}

// ZeRO-2/3 over blocks of `shard` dp ranks (parallel.shard_size; 0: all of dp). Every
// micro-batch reduce-scatters its gradients within the block as backward produces them
// (behind the rest of backward on GPUs, all but the last bucket); ZeRO-3 also all-gathers
// the compute copy of the parameters before each micro-batch's forward and again before its
// backward, behind the previous group's compute when gathers are prefetched on GPUs (all
// but the first group's). At the step's end the blocks all-reduce their shards (hybrid
// sharding) and ZeRO-2 all-gathers the updated parameters within the block.
void zero_sharded_time(StageTime& t, const Config& config, const Mesh& mesh, const Cluster& c, const StageWork& w, const DeviceShare& share,
                       double hidden, double buckets) {
    // A block holds shard_size dp ranks with their cp ranks (state_placement).
    const int shard = (config.parallel.shard_size > 0 ? static_cast<int>(config.parallel.shard_size) : mesh.dp()) * mesh.cp();
    const Link micro_link = collective_link(c, mesh, shard, mesh.tp() * shard, share.pipeline);
    // Their cuts are the layer groups: every layer, the embedding part, the head.
    const double groups = static_cast<double>(config.model.n_layers) / mesh.pp() + 2;
    const double reduce =
        collective_seconds({.op = Collective::reduce_scatter, .bytes = w.dp_reduce_bytes, .count = 1, .message_bytes = w.dp_reduce_bytes / groups}, shard, micro_link);
    t.dp_micro = std::max(reduce - hidden, reduce / buckets);
    if (config.parallel.zero_stage >= 3) {
        const double gathers = collective_seconds(
            {.op = Collective::all_gather, .bytes = w.compute_parameter_bytes, .count = 2, .message_bytes = w.compute_parameter_bytes / groups}, shard, micro_link);
        const bool overlapped = c.kind == ClusterKind::gpu && config.parallel.prefetch_layers > 0;
        t.dp_micro += overlapped ? std::max(gathers - t.compute, gathers / buckets) : gathers;
    }
    const int blocks = mesh.data_size() / shard;
    const Link end_link = collective_link(c, mesh, blocks, mesh.tp() * mesh.data_size(), share.step_end);
    t.dp = collective_seconds({Collective::all_reduce, w.dp_reduce_bytes / shard, 1}, blocks, end_link);
    if (config.parallel.zero_stage == 2) {
        const double gather = collective_seconds({.op = Collective::all_gather, .bytes = w.dp_parameter_bytes, .count = 1, .message_bytes = w.dp_parameter_bytes / groups},
                                                 shard, collective_link(c, mesh, shard, mesh.tp() * shard, share.step_end));
        t.dp += exposed_param_gather(config, c, t.compute, gather, groups);
    }
}

// The ring sends of a micro-batch over the cp group's link (point to point, as the pipeline's):
// on GPUs each is exposed only by what exceeds its attention block's time; on a CPU the cores
// that would compute move the bytes: all exposed.
void ring_time(StageTime& t, const StageWork& w, const Mesh& mesh, const Cluster& c, double peak, double share) {
    if (w.cp_sends.empty()) return;
    const Link link = shared_link(link_for(c, mesh, group_span(mesh, mesh_dim::cp)), c, share);
    for (const RingSend& send : w.cp_sends) {
        const double seconds = link.latency_us * 1e-6 + send.bytes / (link.gbps * 1e9);
        const double behind = c.kind == ClusterKind::gpu ? send.behind_flops / (peak * attention_efficiency(c, mesh)) : 0;
        const double exposed = std::max(0.0, seconds - behind);
        t.cp += send.count * exposed;
        t.cp_hidden += send.count * (seconds - exposed);
    }
}

// One all-to-all over the ep group, each rank sending `bytes` (1/ep of them to itself): the
// peers in the rank's node over the intra-node link, those on other nodes over the
// inter-node one, both at once; the sends go out together (one latency).
double all_to_all_seconds(double bytes, const Mesh& mesh, const Cluster& c, double share, bool& intra_node) {
    const std::vector<int> group = mesh.expert_group(0);
    const int ep = static_cast<int>(group.size()), per_node = ranks_per_node(mesh, c);
    intra_node = group.back() - group.front() + 1 <= per_node;
    const Link intra = shared_link(c.intra_node, c, share), inter = shared_link(c.inter_node, c, share);
    const double n = ep;
    if (intra_node) return (n - 1) / n * bytes / (intra.gbps * 1e9) + intra.latency_us * 1e-6;
    const double local = std::min(per_node, ep) - 1, remote = n - 1 - local;
    return std::max(local / n * bytes / (intra.gbps * 1e9), remote / n * bytes / (inter.gbps * 1e9)) + inter.latency_us * 1e-6;
}

// ep > 1: the experts' gradients reduced (ZeRO: reduce-scattered, their weights gathered
// back) over the edp ranks holding the same experts: every ep-th rank of the stage, so
// spanning it. Counted after the dense data-parallel traffic, none of it hidden (an upper bound).
double expert_data_seconds(const Config& config, const Mesh& mesh, const Cluster& c, const StageWork& w, double share) {
    if (w.expert_reduce_bytes <= 0 || mesh.edp() <= 1) return 0;
    const Link link = collective_link(c, mesh, mesh.edp(), mesh.tp() * mesh.data_size(), share);
    const bool zero = config.parallel.zero_stage >= 1;
    return collective_seconds({zero ? Collective::reduce_scatter : Collective::all_reduce, w.expert_reduce_bytes, 1}, mesh.edp(), link) +
           collective_seconds({Collective::all_gather, w.expert_parameter_bytes, 1}, mesh.edp(), link);
}

StageTime stage_time(const Config& config, const Mesh& mesh, const Cluster& c, int stage, const DeviceShare& share) {
    const double peak = c.peak_tflops * 1e12 * share.pipeline, bandwidth = c.memory_bandwidth_gbps * 1e9 * share.pipeline;
    const StageWork w = stage_work(config, mesh, stage);
    StageTime t;
    t.compute = compute_seconds(w, c, mesh, peak, bandwidth);
    t.fp8_gemm = fp8_gemm_seconds(w, c, peak);
    t.fp8_cast = w.fp8_cast_bytes / (bandwidth * c.efficiency.memory);
    t.fp8_weights = w.fp8_weight_cast_bytes / (bandwidth * c.efficiency.memory);
    const Link tp_link = collective_link(c, mesh, mesh.tp(), mesh.tp(), share.pipeline);
    for (const CollectiveCall& call : w.tp_collectives) t.tp += exposed_collective_seconds(call, mesh.tp(), tp_link, c, peak);
    ring_time(t, w, mesh, c, peak, share.pipeline);
    const Link pp_link = shared_link(link_for(c, mesh, mesh.world_size()), c, share.pipeline);
    t.pp = w.pp_sends * (pp_link.latency_us * 1e-6 + w.pp_send_bytes / (pp_link.gbps * 1e9));
    if (w.ep_all_to_alls > 0) t.ep = w.ep_all_to_alls * all_to_all_seconds(w.ep_all_to_all_bytes, mesh, c, share.pipeline, t.ep_intra_node);
    t.host_syncs = w.host_syncs;
    if (c.kind == ClusterKind::gpu) t.host_sync = w.host_syncs * host_sync_seconds;
    if (w.tp_gradient_sums > 0)
        t.tp_step = collective_seconds({.op = Collective::all_reduce, .bytes = w.tp_gradient_sum_bytes, .count = 1, .message_bytes = w.tp_gradient_sum_bytes / w.tp_gradient_sums},
                                       mesh.tp(), tp_link) +
                    w.tp_gradient_sums * 2 * (mesh.tp() - 1) * tp_link.latency_us * 1e-6;
    // Buckets go out while the last micro-batch's backward (two thirds of its compute) runs;
    // at least the last bucket waits for the end of backward.
    const double buckets = std::max(1.0, std::ceil(w.dp_gradient_bytes / std::max(1.0, config.parallel.bucket_mb * 1e6)));
    const double hidden = c.kind == ClusterKind::gpu ? t.compute * 2.0 / 3.0 : 0.0;
    // Gradients are reduced over the data group: the dp x cp ranks holding the same weights.
    const int data = mesh.data_size();
    if (data > 1 && config.parallel.zero_stage >= 2) {
        zero_sharded_time(t, config, mesh, c, w, share, hidden, buckets);
    } else {
        const Link dp_link = collective_link(c, mesh, data, mesh.tp() * data, share.step_end);
        const bool zero1 = config.parallel.zero_stage >= 1;
        const double reduce = collective_seconds({.op = zero1 ? Collective::reduce_scatter : Collective::all_reduce, .bytes = w.dp_reduce_bytes, .count = 1,
                                                  .message_bytes = w.dp_reduce_bytes / buckets},
                                                 data, dp_link);
        const double gather = collective_seconds({.op = Collective::all_gather, .bytes = w.dp_parameter_bytes, .count = 1, .message_bytes = w.dp_parameter_bytes / buckets},
                                                 data, dp_link);
        t.dp = std::max(reduce - hidden, reduce / buckets) + exposed_param_gather(config, c, t.compute, gather, buckets);
    }
    t.dp += expert_data_seconds(config, mesh, c, w, share.step_end);
    // AdamW's update has its own efficiency (on a CPU its square root and division per element
    // make it slower per byte), and so do the plain streams over every gradient (zeroing,
    // the norm), which run nearer the bandwidth than the micro-batches' memory-bound ops.
    const double step_end_bandwidth = c.memory_bandwidth_gbps * 1e9 * share.step_end;
    t.optimizer = w.update_bytes / (step_end_bandwidth * c.efficiency.optimizer_or_memory()) +
                  w.gradient_pass_bytes / (step_end_bandwidth * c.efficiency.gradient_pass_or_memory());
    return t;
}

}  // namespace

void require_fp8_tensor_cores(const Config& config, const Cluster& cluster) {
    if (config.train.precision != Precision::fp8 || cluster.kind != ClusterKind::gpu || cluster.fp8_peak_tflops > 0) return;
    fail(ErrorKind::config, cluster.source_path, ": device.fp8_peak_tflops: missing, and train.precision = \"fp8\" needs FP8 tensor cores (sm_89 or later), which ",
         cluster.device_name, " has not (plan it with train.precision = \"bf16\", or on a cluster with FP8)");
}

StepTime predict_step_time(const Config& config, const Mesh& mesh, const Cluster& cluster, double parameters) {
    require_fp8_tensor_cores(config, cluster);
    const DeviceShare share = device_share(config, mesh, cluster);
    const double peak = cluster.peak_tflops * 1e12 * share.pipeline;
    std::vector<StageTime> stages;
    for (int s = 0; s < mesh.pp(); ++s) stages.push_back(stage_time(config, mesh, cluster, s, share));
    const auto slowest = std::max_element(stages.begin(), stages.end(), [](const StageTime& a, const StageTime& b) { return a.micro_batch() < b.micro_batch(); });
    const auto last_to_finish = std::max_element(stages.begin(), stages.end(), [](const StageTime& a, const StageTime& b) { return a.dp + a.tp_step + a.optimizer < b.dp + b.tp_step + b.optimizer; });
    const double m = static_cast<double>(micro_batches_per_step(config, mesh.dp()));
    StepTime r;
    r.slowest_stage = static_cast<int>(slowest - stages.begin());
    r.compute_seconds = m * slowest->compute;
    r.tp_comm_seconds = m * slowest->tp;
    r.cp_comm_seconds = m * slowest->cp;
    r.cp_hidden_seconds = m * slowest->cp_hidden;
    r.pp_comm_seconds = m * slowest->pp;
    r.ep_comm_seconds = m * slowest->ep;
    r.ep_intra_node = slowest->ep_intra_node;
    r.host_sync_seconds = m * slowest->host_sync;
    r.host_syncs = m * slowest->host_syncs;
    // Interleaving idles pp - 1 chunk slots, each 1/V of a micro-batch's time on the stage.
    const double bubble_slots = static_cast<double>(mesh.pp() - 1) / static_cast<double>(config.parallel.virtual_stages);
    r.bubble_seconds = bubble_slots * slowest->micro_batch();
    r.dp_exposed_seconds = last_to_finish->dp + m * slowest->dp_micro;
    r.optimizer_seconds = last_to_finish->optimizer;
    r.tp_comm_seconds += last_to_finish->tp_step;
    // The weights are cast at their first use in the step: each stage's first micro-batch waits
    // for its own, and the slowest of them delays the pipeline.
    r.fp8 = config.train.precision == Precision::fp8;
    r.fp8_gemm_seconds = m * slowest->fp8_gemm;
    r.fp8_cast_seconds = m * slowest->fp8_cast;
    r.fp8_weight_cast_seconds = std::max_element(stages.begin(), stages.end(), [](const StageTime& a, const StageTime& b) { return a.fp8_weights < b.fp8_weights; })->fp8_weights;
    r.step_seconds = (m + bubble_slots) * slowest->micro_batch() + last_to_finish->dp + last_to_finish->tp_step + r.optimizer_seconds + r.fp8_weight_cast_seconds;
    // The cp ranks of one dp rank share its sequences: the step's tokens are the dp ranks'.
    r.tokens_per_step = static_cast<double>(config.train.batch_size * config.train.seq_len) * m * mesh.dp();
    r.tokens_per_second_per_device = r.tokens_per_step / r.step_seconds / mesh.world_size();
    r.active_parameters = active_parameter_count(config.model, parameters);
    r.model_flops_per_token = model_flops_per_token(config, r.active_parameters);
    r.mfu = r.tokens_per_second_per_device * r.model_flops_per_token / peak;
    return r;
}

double planned_checkpoint_bytes(const Config& config, double parameters) {
    return 3 * static_cast<double>(dtype_size(master_dtype(compute_dtype(config.train)))) * parameters;
}

CheckpointTime predict_checkpoint_time(const Config& config, const Mesh& mesh, const Cluster& cluster, double parameters) {
    if (!cluster.storage) fail(ErrorKind::config, cluster.source_path, ": storage: missing (the shared storage checkpoints go to: write_gbps, read_gbps, node_write_gbps, node_read_gbps, host_copy_gbps)");
    const Storage& st = *cluster.storage;
    const double master_bytes = static_cast<double>(dtype_size(master_dtype(compute_dtype(config.train))));
    const int nodes = planned_nodes(mesh, cluster);
    CheckpointTime t;
    t.bytes = planned_checkpoint_bytes(config, parameters);
    t.bytes_per_rank = t.bytes / mesh.world_size();
    // Every node moves its ranks' shares over its own link; together at most the storage's bandwidth.
    const auto transfer = [&](double aggregate_gbps, double node_gbps) { return std::max(t.bytes / (aggregate_gbps * 1e9), t.bytes / nodes / (node_gbps * 1e9)); };
    t.blocked_seconds = t.bytes_per_rank / (st.host_copy_gbps * 1e9);
    // Each rank's writer checksums its file (Fletcher32 as it writes, XXH64 after): its share
    // at one thread's rate, in series with the transfer.
    t.checksum_seconds = t.bytes_per_rank / (st.checksum_gbps * 1e9);
    t.background_seconds = transfer(st.write_gbps, st.node_write_gbps) + t.checksum_seconds;
    const double reads = 2 * transfer(st.read_gbps, st.node_read_gbps);
    // Below ZeRO-3 the data group's dp x cp ranks hold the master weights whole: each loads
    // 1/(dp cp) and the group all-gathers the rest.
    double exchange = 0;
    const int data = mesh.data_size();
    if (data > 1 && config.parallel.zero_stage < 3) {
        const double part_weights = master_bytes * parameters / (mesh.tp() * mesh.pp());
        const Link dp_link = collective_link(cluster, mesh, data, mesh.tp() * data, device_share(config, mesh, cluster).step_end);
        exchange = collective_seconds({Collective::all_gather, part_weights, 1}, data, dp_link);
    }
    t.exchange_seconds = exchange;
    t.resume_seconds = reads + exchange;
    return t;
}

int planned_ranks_per_node(const Mesh& mesh, const Cluster& cluster) { return ranks_per_node(mesh, cluster); }

int planned_nodes(const Mesh& mesh, const Cluster& cluster) {
    const int per_node = ranks_per_node(mesh, cluster);
    return std::max(1, (mesh.world_size() + per_node - 1) / per_node);
}

}  // namespace llmtrain
