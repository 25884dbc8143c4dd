// The step-time model of the plan: the work one rank of a pipeline stage does per step
// (GEMM and attention FLOPs, bytes moved by memory-bound ops, collectives), and the time
// that takes on a cluster.
//
//   micro-batch time  t_mb = GEMM FLOPs / (peak x gemm efficiency of the shape class)
//                          + attention FLOPs / (peak x attention efficiency)
//                          + memory-bound bytes / (bandwidth x memory efficiency)
//                          + tensor-parallel collectives + pipeline sends (with
//                            parallel.tp_overlap on GPUs, less what runs behind a GEMM)
//                          + context-parallel ring sends (on GPUs, less what runs behind
//                            the attention block computing meanwhile)
//   step time         (m + (pp - 1) / V) x max over stages of t_mb  (bubble (pp - 1) / (V x m + pp - 1);
//                     V = parallel.virtual_stages, 1 for plain 1F1B; pipeline sends V times as many)
//                   + data-parallel reduce-scatter (all-reduce without ZeRO-1) over the data group
//                     (dp x cp ranks) not hidden by the backward of the last micro-batch, + the
//                     parameter all-gather (overlapped: what the next step's first forward does
//                     not hide, on GPUs)
//                   + optimizer bytes / (bandwidth x memory efficiency)
//   context parallel  (parallel.cp) a rank computes b x s / cp tokens: every per-token term
//                     falls by cp, and causal attention's b s^2 term too (chunks r and 2cp - 1 - r
//                     balance it); per layer the ring sends keys and values forward, keys, values
//                     and their f32 gradients backward (add_layer_ring_sends), each send
//                     latency + bytes / link GB/s, on GPUs exposed only beyond the time of its
//                     attention block, 2 b s^2 hd (h / tp) / cp^2 FLOPs (twice in backward)
//   CPU cores         ranks beyond a node's cores share them: each runs at its share of a core
//                     (DeviceShare), and collectives among them go over the node's shared memory
//   collectives       ring: all-reduce 2(n-1)/n x bytes / busbw + 2(n-1) x latency; reduce-scatter
//                     and all-gather (n-1)/n x bytes / busbw + (n-1) x latency (nccl-tests' busbw)
//   FP8               (train.precision = "fp8") the blocks' linears (QKV, out, a dense MLP's;
//                     not in the fp8.bf16_first/last_layers, not attention, norms, embedding,
//                     head, a MoE layer's router or experts) at the FP8 peak x efficiency.fp8_gemm
//                     (a CPU emulates them: at its compute peak), plus their casts' bytes
//                     (fp8_cast_bytes_of) at bandwidth x memory efficiency: the activations' and
//                     gradients' in each micro-batch, the weights' once per step. MFU stays a
//                     share of the compute dtype's (bf16) peak.
//   mixture of experts (moe_plan.h) a MoE layer computes the attention, the router and its
//                     local experts' GEMMs on the routed rows (top_k per token: the active FLOPs),
//                     one call per expert and projection, each at least kernel_launch_seconds on
//                     GPUs; the all-to-alls over the ep group (ep > 1) are exposed, at the
//                     intra-node link while the group stays in a node, else the peers on other
//                     nodes at the inter-node one; each host synchronization costs
//                     host_sync_seconds on GPUs (the device drains its queue and waits for the
//                     next launches). MFU: PaLM's formula with N the active parameters.
// The same counts calibrate the cluster: `bench` divides them by what it measured.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "plan/cluster.h"
#include "parallel/mesh.h"

namespace llmtrain {

struct CollectiveCall {
    Collective op = Collective::all_reduce;
    double bytes = 0;  // the whole buffer, as nccl-tests' size
    double count = 0;  // calls of this size
    // Overlapped (parallel.tp_overlap): each call is in flight while a GEMM of these FLOPs (of
    // class behind_class) runs, and at least exposed_share of it waits anyway (the first or
    // last piece). Hidden only on GPUs, where the collective runs beside the compute stream.
    double behind_flops = 0;
    GemmClass behind_class = GemmClass::large;
    double exposed_share = 1;
    // The size of each message the call is sent as (ZeRO-1's buckets, ZeRO-2/3's layer groups;
    // 0: bytes), at whose measured bandwidth it runs (Link::busbw_gbps(op, bytes)).
    double message_bytes = 0;
};

// One step of context parallelism's ring: each rank of the cp group sends `bytes` to the next
// and receives as much from the previous, while an attention block of behind_flops computes
// (hidden on GPUs, where the send runs beside the compute stream; 0: nothing computes
// meanwhile, exposed).
struct RingSend {
    double bytes = 0;
    double count = 0;  // per micro-batch
    double behind_flops = 0;
};

// One rank of one pipeline stage.
struct StageWork {
    // Per micro-batch: forward, backward and recomputation.
    std::map<GemmClass, double> gemm_flops;
    double attention_flops = 0;
    double memory_bytes = 0;
    std::vector<CollectiveCall> tp_collectives;
    double pp_send_bytes = 0;  // each pipeline send (activations forward, gradients backward)
    int pp_sends = 0;          // per micro-batch: 0, 2 (an end stage) or 4
    std::vector<RingSend> cp_sends;
    // Mixture of experts (moe_plan.h): the experts' GEMMs apart from gemm_flops (one call per
    // expert and projection: on GPUs a call takes at least a launch), the all-to-alls over
    // the ep group (each rank sending ep_all_to_all_bytes), the host synchronizations.
    std::map<GemmClass, double> expert_gemm_flops;
    double expert_gemm_calls = 0;
    double ep_all_to_all_bytes = 0;
    double ep_all_to_alls = 0;
    double host_syncs = 0;
    // FP8 (train.precision = "fp8"): the FP8 linears' GEMMs apart from gemm_flops, and the
    // bytes their casts move (fp8_cast_bytes_of below): the activations' and output
    // gradients' per micro-batch, the weights' once per step.
    std::map<GemmClass, double> fp8_gemm_flops;
    double fp8_cast_bytes = 0;
    double fp8_weight_cast_bytes = 0;  // per step
    double fp8_weight_elements = 0;    // the FP8 linears' weights on one tp rank (fp8.param_gather gathers them in e4m3)
    // Per step.
    double update_bytes = 0;         // what AdamW's update of the owned elements reads and writes
    double gradient_pass_bytes = 0;  // zeroing every gradient, reading their norm, refreshing a 16-bit copy
    double optimizer_bytes() const { return update_bytes + gradient_pass_bytes; }
    double dp_gradient_bytes = 0;  // the flat gradient buffer reduced over the data group, dp x cp ranks (in the master dtype: what its buckets are cut from)
    double dp_reduce_bytes = 0;    // what the dp gradient collectives carry: that buffer in parallel.grad_reduce_dtype
    double dp_parameter_bytes = 0; // the parameters all-gathered over the data group after the update (ZeRO-1)
    double compute_parameter_bytes = 0;  // what ZeRO-3 gathers per micro-batch: the parameters in the compute dtype, the FP8 linears' in e4m3 under fp8.param_gather
    double expert_reduce_bytes = 0;      // ep > 1: the rank's experts' gradients, reduced over the edp ranks
    double expert_parameter_bytes = 0;   // ep > 1 under ZeRO-1/2: their updated weights all-gathered over edp
    double tp_gradient_sum_bytes = 0;    // ep = 1, sequence parallel: the MoE weights' gradients summed over tp
    double tp_gradient_sums = 0;         // in this many all-reduces per step
    double total_gemm_flops() const;  // the GEMMs in the compute dtype (not the FP8 ones)
    double total_fp8_gemm_flops() const;
};

// The bytes the casts of one FP8 linear move (model/fp8_linear.h; backend.h's Fp8Amax and
// Fp8Cast), its input x [m, k] and output gradient [m, n] in the compute dtype of c bytes,
// the FP8 copies 1 byte per element:
//   forward   x: an amax pass (read, current recipe only), the cast (read, write xq)
//   backward  x again: amax pass (current), the cast (read, write xq and its transpose xq^T)
//             dout: amax pass (current), the cast (read, write gq and gq^T)
//   per step  the weight [n, k]: amax pass (both recipes: weights scale from their own amax),
//             the cast (read, write wq and wq^T)
// Per micro-batch (x's forward cast `forwards` times: 2 under full recomputation):
//   forwards ((a + 1) c + 1) m k + ((a + 1) c + 2) m k + ((a + 1) c + 2) m n,  a = 1 current, 0 delayed
// per step: (2 c + 2) n k. The GEMMs read the FP8 copies (their bytes are the GEMMs').
struct Fp8CastBytes {
    double per_micro_batch = 0, per_step = 0;
};
Fp8CastBytes fp8_cast_bytes_of(double m, double k, double n, double compute_bytes, bool current_scaling, double forwards);

StageWork stage_work(const Config& config, const Mesh& mesh, int stage);
// The share of one device a rank computes on: 1 on GPUs; on a CPU cluster its threads
// (train.threads, 0: the node's cores shared by its ranks), at most its share of the cores.
// Ranks beyond the cores take turns, and how many want a core differs in the step's two phases.
struct DeviceShare {
    double pipeline = 1;  // the micro-batches: stages idle in the 1F1B bubble leave their cores to the others
    double step_end = 1;  // the data-parallel collectives and the optimizer: every rank of the node at once
};
DeviceShare device_share(const Config& config, const Mesh& mesh, const Cluster& cluster);

struct StepTime {
    double compute_seconds = 0;     // m micro-batches of the slowest stage
    double tp_comm_seconds = 0;     // tensor-parallel collectives, exposed (m micro-batches; and the MoE gradients' sum over tp per step)
    double cp_comm_seconds = 0;     // context-parallel ring sends, exposed (m micro-batches)
    double cp_hidden_seconds = 0;   // context-parallel ring sends behind attention blocks (not in the step)
    double pp_comm_seconds = 0;     // pipeline sends on the critical path
    double bubble_seconds = 0;      // (pp - 1) / virtual_stages micro-batch times
    double dp_exposed_seconds = 0;  // data-parallel traffic not hidden by backward (with ep > 1, the experts' over edp too)
    double ep_comm_seconds = 0;     // expert-parallel all-to-alls (exposed: the experts wait for their tokens, the next layer for theirs)
    bool ep_intra_node = true;      // whether the ep group stays inside a node
    double host_sync_seconds = 0;   // MoE routing's host synchronizations
    double host_syncs = 0;          // of them per step
    double optimizer_seconds = 0;
    // FP8 (train.precision = "fp8"): the FP8 linears' GEMMs, at the FP8 peak x
    // efficiency.fp8_gemm on GPUs (the compute peak x GEMM efficiency on a CPU, which emulates
    // them), and their casts' memory traffic; the first two are part of compute_seconds.
    bool fp8 = false;
    double fp8_gemm_seconds = 0;         // m micro-batches of the slowest stage
    double fp8_cast_seconds = 0;         // likewise, the activations' and gradients' casts
    double fp8_weight_cast_seconds = 0;  // the weights' casts, once per step (in the step beside compute)
    double step_seconds = 0;
    double tokens_per_step = 0;
    double tokens_per_second_per_device = 0;
    double model_flops_per_token = 0;  // PaLM, N the active parameters (all of a dense model's)
    double active_parameters = 0;
    double mfu = 0;                    // of the cluster's dense peak in the compute dtype (bf16 on GPUs, also under FP8)
    int slowest_stage = 0;
};

// parameters: model_parameter_count(config.model); MFU counts the active ones (moe_plan.h).
// Throws Error(config) naming the cluster file for train.precision = "fp8" on a GPU without
// FP8 tensor cores (no device.fp8_peak_tflops).
StepTime predict_step_time(const Config& config, const Mesh& mesh, const Cluster& cluster, double parameters);
// The refusal above on its own: nothing when the run is not FP8 or the cluster has FP8 tensor cores.
void require_fp8_tensor_cores(const Config& config, const Cluster& cluster);

// Model FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B): 6 N + 12 L H Q T, N all
// parameters (embeddings included, as llm.c counts), recomputation not counted.
double model_flops_per_token(const Config& config, double parameters);
// The parameters of the whole model, unpadded by tensor parallelism.
double model_parameter_count(const ModelConfig& model);
// Why the parameters the ranks of a tp x pp layout hold together (`held`) outnumber the
// model's: " (the model's 0.843M + 0.004M vocabulary padding rows for tp 2 + ...)", naming the
// vocabulary rows padded for tp and a tied embedding's copy on the last pipeline stage; ""
// when they do not.
std::string parameters_beyond_the_model(const ModelConfig& model, int64_t tp, int64_t pp, double held);

// A checkpoint of the layout on the cluster's shared storage ([storage]). The checkpoint is
// the fp32 master weights and AdamW's two moments (12 bytes per parameter), written by
// placement: every rank about 1/world of it. A save blocks the step loop for the copy of the
// rank's share into host memory; the writes then go on in the background at the slower of
// the storage's aggregate bandwidth and the nodes' links to it. A resume reads every byte
// twice (the verification of its checksums, then the load, each spread over the ranks) and
// all-gathers the master weights over the data group (below ZeRO-3: each of its dp x cp
// ranks holds them whole).
struct CheckpointTime {
    double bytes = 0;               // the whole checkpoint
    double bytes_per_rank = 0;
    double blocked_seconds = 0;     // the step loop waits for the copy to host memory
    double background_seconds = 0;  // the writes and their checksums, while training goes on
    double checksum_seconds = 0;    // of which each rank's checksum passes over its file
    double resume_seconds = 0;      // verification, load and the dp exchange
    double exchange_seconds = 0;    // of which the dp exchange (the master weights' all-gather below ZeRO-3)
};
// The whole checkpoint's bytes: the master weights and AdamW's two moments in the master dtype.
double planned_checkpoint_bytes(const Config& config, double parameters);
// Throws Error(config) naming the cluster file when it has no [storage].
CheckpointTime predict_checkpoint_time(const Config& config, const Mesh& mesh, const Cluster& cluster, double parameters);

// The ranks the layout puts on one node (a GPU node: one per device; a CPU node: the job's
// ranks spread evenly), and the nodes the job takes.
int planned_ranks_per_node(const Mesh& mesh, const Cluster& cluster);
int planned_nodes(const Mesh& mesh, const Cluster& cluster);

// Assumed, not measured: the least a GEMM call takes on a GPU (cuBLASLt's host-side launch),
// and what one host synchronization costs the device (its queue drained, then idle until the
// host launches again).
inline constexpr double kernel_launch_seconds = 5e-6;
inline constexpr double host_sync_seconds = 25e-6;

// The seconds a collective takes on a link among n ranks.
double collective_seconds(const CollectiveCall& call, int ranks, const Link& link);

}  // namespace llmtrain
