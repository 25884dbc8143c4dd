// The run configuration: one TOML file -> typed structs, every key validated with its
// allowed range before anything is allocated. Errors name the file, the key path and what
// is allowed. `--set key.path=value` overrides pass through the very same checks.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace llmtrain {

enum class ModelFamily { gpt2, llama };
const char* family_name(ModelFamily family);

// The attention kernels of the CUDA backend: auto takes cuDNN's fused flash attention where
// libcudnn loads and supports the shape, else the native kernels (said once in the log);
// cudnn insists (a clear error where it cannot run); native never loads cuDNN.
enum class AttentionImpl { automatic, cudnn, native };
const char* attention_impl_name(AttentionImpl impl);

// Mixture of Experts ([model.moe], llama family: Mixtral / Qwen2-MoE-shaped layers). The
// router scores each token's experts (softmax over all E, as Mixtral and Qwen2-MoE; or sigmoid
// per expert, as DeepSeek-V3), takes the top_k, and gates their outputs by the chosen scores,
// renormalized over the k when normalize_top_k (Mixtral, Qwen3, DeepSeek-V3; Qwen2-MoE's
// norm_topk_prob = false keeps them). Router math in fp32 on every backend.
enum class MoeRouter { softmax, sigmoid };
const char* moe_router_name(MoeRouter router);
// aux_loss: Switch/GShard's loss over each micro-batch; seq_aux_loss: DeepSeek-V3's per
// sequence; expert_bias: DeepSeek-V3's auxiliary-loss-free balancing (a bias per expert added
// to the scores when choosing, never to a gate, moved by bias_update_rate towards the mean
// load after each step); none: nothing but the statistics.
enum class MoeBalancing { aux_loss, seq_aux_loss, expert_bias, none };
const char* moe_balancing_name(MoeBalancing balancing);
struct MoeConfig {
    int64_t n_experts = 0;          // 0: a dense model
    int64_t top_k = 2;
    int64_t d_ff_expert = 0;        // each expert's SwiGLU width; default model.d_ff
    int64_t n_shared_experts = 0;   // experts every token passes through, fused into one SwiGLU MLP n_shared_experts * d_ff_expert wide
    bool shared_expert_gate = false; // the shared experts' output times sigmoid(x . w) (Qwen2-MoE); false: added as it is (DeepSeek-V3)
    int64_t first_dense_layers = 0; // layers [0, first_dense_layers) keep the dense MLP
    int64_t every = 1;              // from there on, every `every`-th layer is a MoE layer
    MoeRouter router = MoeRouter::softmax;
    bool normalize_top_k = true;
    MoeBalancing load_balancing = MoeBalancing::aux_loss;
    double aux_loss_coeff = 0.01;
    double bias_update_rate = 0.001; // expert_bias: each step's change of a bias (DeepSeek-V3's gamma)
    double z_loss_coeff = 0;        // ST-MoE's router z-loss; 0: off
    double capacity_factor = 0;     // 0: dropless; else each expert takes ceil(factor * tokens * top_k / n_experts) assignments
    bool enabled() const { return n_experts > 0; }
    int64_t shared_d_ff() const { return n_shared_experts * d_ff_expert; }
    bool is_moe_layer(int64_t layer) const { return enabled() && layer >= first_dense_layers && (layer - first_dense_layers) % every == 0; }
};

struct ModelConfig {
    ModelFamily family = ModelFamily::gpt2;
    int64_t n_layers = 0;
    int64_t d_model = 0;
    int64_t n_heads = 0;
    int64_t n_kv_heads = 0;        // defaults to n_heads; llama may use fewer (GQA)
    int64_t d_ff = 0;              // defaults: gpt2 4*d_model; llama 8/3*d_model rounded up to 64
    int64_t vocab_size = 0;        // the real vocabulary (the tokenizer's)
    int64_t pad_vocab_to = 1;      // the model's vocabulary rows: vocab_size rounded up to a multiple of tp * this
    int64_t max_seq_len = 0;
    double norm_eps = 1e-5;
    double rope_theta = 10000.0;   // llama only
    bool qkv_bias = false;         // llama only (Qwen2 style); gpt2 always has biases
    bool tied_embeddings = true;   // default: true for gpt2, false for llama
    double init_std = 0.02;
    AttentionImpl attention = AttentionImpl::automatic;  // CUDA: cuDNN's fused attention or the native kernels
    MoeConfig moe;
    int64_t head_dim() const { return d_model / n_heads; }
    // Rows of the embedding and the LM head (Megatron's make-vocab-size-divisible-by): a
    // multiple of tp * pad_vocab_to, so that tensor parallelism splits them evenly. The rows
    // from vocab_size on are padding: zero, masked out of the loss and the sampler.
    int64_t padded_vocab_size(int64_t tp) const {
        const int64_t multiple = tp * pad_vocab_to;
        return (vocab_size + multiple - 1) / multiple * multiple;
    }
};

// text, tokens: the whole file in memory, random windows (batch_windows.h).
// shards (llmtrain prepare), megatron, llmc, nanogpt: the data loader (loader.h).
enum class DataFormat { text, tokens, shards, megatron, llmc, nanogpt };
// Which keys a query sees (docs/data.md): causal, every earlier token of the sequence; document,
// the earlier tokens of its own document only (documents end with the end-of-text token).
enum class AttentionMask { causal, document };
const char* attention_mask_name(AttentionMask mask);
struct DataConfig;
// Whether the model needs each sequence's document starts: a document mask or position reset.
bool splits_documents(const DataConfig& data);

// A block of a token shard that fails its checksum while training (data/loader.h): stop the
// run naming it, or replace the samples that touch it and train on.
enum class CorruptBlockPolicy { abort, skip };

struct DataConfig {
    DataFormat format = DataFormat::text;  // text: bytes, vocab 256 + EOS (id 256)
    std::string train_path;                // shards: dataset.json; megatron: the .bin or .idx
    std::string val_path;                  // empty: the dataset's val split (shards) or the last val_fraction of train_path
    double val_fraction = 0.05;
    std::string token_dtype = "u16";       // tokens format: "u16" or "i32"
    std::string document_separator;        // text format: each occurrence becomes an EOS token
    double train_weight = 1.0;             // train_path's share when blended with data.blend
    std::string blend;                     // more training sources: "PATH=WEIGHT, PATH=WEIGHT" (same format)
    std::string tokenizer;                 // tokenizer.json to print samples; shards default: the dataset's
    int64_t prefetch = 4;                  // micro-batches the loader thread prepares ahead
    AttentionMask attention_mask = AttentionMask::causal;
    bool reset_position_ids = false;       // positions restart at 0 after each end-of-text token
    CorruptBlockPolicy on_corrupt_block = CorruptBlockPolicy::abort;
};

// A training source and its blending weight.
struct WeightedPath {
    std::string path;
    double weight = 1.0;
};
// train_path with train_weight, then each data.blend entry. Throws Error(config) naming
// data.blend on a malformed entry or a weight that is not > 0.
std::vector<WeightedPath> training_sources(const DataConfig& data);

// Where the model computes: the CPU reference (fp32) or one GPU per rank.
enum class ComputeDevice { cpu, cuda };
// Compute dtype: auto is fp32 on the CPU and bf16 on CUDA; fp16 uses dynamic loss scaling.
// Master weights, gradients and AdamW state are fp32 in every case.
// fp8: the compute dtype of auto (bf16 on CUDA, f32 on the CPU), with the blocks' linear
// layers in FP8 as [fp8] says (model/fp8_linear.h; emulated exactly on the CPU).
enum class Precision { automatic, fp32, bf16, fp16, fp8 };
// Activation recomputation (see model/transformer.h).
enum class Recompute { none, selective, full };
const char* precision_name(Precision precision);
const char* recompute_name(Recompute recompute);

struct TrainConfig {
    uint64_t seed = 1337;
    int64_t steps = 0;
    int64_t batch_size = 0;                // sequences per micro-batch
    int64_t seq_len = 0;
    // Sequences per optimizer step over the whole job (Megatron's global batch size); 0: unset,
    // batch_size * grad_accum * dp.
    int64_t global_batch_size = 0;
    // Micro-batches per optimizer step on each dp rank; 0: derived, global_batch_size /
    // (batch_size * dp) or 1 without a global batch size (see micro_batches_per_step).
    int64_t grad_accum = 0;
    int64_t eval_every = 0;                // steps between evaluations (0: none); a fresh run also evaluates before its first step, every run after its last
    int64_t eval_sequences = 128;          // validation sequences per evaluation, whatever batch_size and layout
    int64_t log_every = 1;
    int64_t threads = 0;                   // 0: all cores
    double memory_limit_gb = 0;            // memory one rank may hold (the plan's check and every allocation); 0: the device's or the node's
    int64_t sample_tokens = 200;           // generated after training; 0: none
    std::string sample_prompt;
    double sample_temperature = 0.8;
    ComputeDevice device = ComputeDevice::cpu;
    Precision precision = Precision::automatic;
    Recompute recompute = Recompute::none;
    double loss_scale = 65536;             // fp16: initial dynamic loss scale
    int64_t loss_scale_window = 1000;      // fp16: finite steps before the scale doubles
    std::string init_from;                 // Hugging Face weights (model.safetensors or its directory) to start from
};

// FP8 linear layers (train.precision = "fp8"; model/fp8_linear.h states the recipes), with
// Transformer Engine's names. current: each tensor scaled from its own amax as it is cast;
// delayed: activations and gradients from the amax history of the steps before (weights, cast
// once per step, always from their own amax). hybrid: e4m3 forward, e5m2 gradients.
enum class Fp8Recipe { current, delayed };
enum class Fp8Formats { hybrid, e4m3 };
enum class Fp8AmaxCompute { max, most_recent };
const char* fp8_recipe_name(Fp8Recipe recipe);
struct Fp8Config {
    Fp8Recipe recipe = Fp8Recipe::current;
    int64_t amax_history_len = 1024;       // delayed: steps of amax kept (Transformer Engine's default)
    Fp8AmaxCompute amax_compute = Fp8AmaxCompute::max;  // delayed: the history's max or its newest entry
    int64_t margin = 0;                    // scale = fp8 max / amax / 2^margin
    Fp8Formats format = Fp8Formats::hybrid;
    int64_t bf16_first_layers = 1;         // the first and last layers keep their linears in the compute dtype
    int64_t bf16_last_layers = 1;
    bool param_gather = false;             // ZeRO-3: gather the FP8 linears' weights in FP8 (parallel/fully_sharded.h)
};

enum class LrDecay { cosine, linear, constant };
// adamw: AdamW on gradients all-reduced over dp. onebit_adam: 1-bit Adam (Tang et al. 2021):
// AdamW for freeze_step steps, then the variance is frozen and the momentum travels as signs.
enum class OptimizerName { adamw, onebit_adam };

struct OptimizerConfig {
    OptimizerName name = OptimizerName::adamw;
    int64_t freeze_step = 100;             // onebit_adam: AdamW steps before the variance freezes
    double lr = 0.0;
    double min_lr_ratio = 0.1;             // floor of the decay, as a fraction of lr
    int64_t warmup_steps = 0;
    LrDecay decay = LrDecay::cosine;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.1;             // decoupled; applied to matrices only
    double grad_clip = 1.0;                // max global gradient norm; 0: no clipping
};

// Who carries the device tensors' collectives: NCCL on its own stream, ordered by events
// (CUDA runs), or MPI on host memory (GPU tensors staged through pinned buffers).
enum class CommBackend { automatic, nccl, mpi };

// The dtype the data-parallel gradient collectives carry: f32 (the master dtype), or bf16
// (half the bytes: each rank's f32 gradients rounded to bf16, summed in bf16 over the dp
// group, the sum widened back into the f32 gradients).
enum class GradReduceDtype { f32, bf16 };

struct ParallelConfig {
    int64_t tp = 1;
    int64_t pp = 1;
    int64_t dp = 0;                        // 0: world size / (tp * cp * pp)
    int64_t cp = 1;                        // context parallel: each sequence split over cp ranks in 2 x cp chunks
    int64_t ep = 1;                        // expert parallel: each expert group of ep ranks splits a MoE layer's experts
    std::string order = "tp-dp-pp";        // mesh dims, fastest first
    int64_t zero_stage = 1;                // 0: none; 1: AdamW state sharded; 2: gradients too; 3: parameters too
    int64_t shard_size = 0;                // ZeRO-2/3: shard within groups of this many consecutive dp ranks, replicate across them; 0: dp
    int64_t prefetch_layers = 1;           // ZeRO-3: parameter groups whose all-gathers start before the current group computes
    bool overlap_param_gather = false;     // ZeRO-1/2: the updated parameters' all-gathers run behind the next forward
    bool sequence_parallel = false;        // split the tokens across tp ranks outside the tp matmuls
    bool tp_overlap = false;               // sequence parallelism's collectives in tp pieces behind the matmuls
    double bucket_mb = 25;                 // gradient bucket size for the overlapped dp reduction
    std::string stage_layers;              // e.g. "3,3,2": layers per pipeline stage; empty: balanced
    int64_t virtual_stages = 1;            // model chunks per pipeline stage (interleaved 1F1B)
    double timeout_seconds = 300;          // a collective or transfer that takes longer ends the job
    CommBackend comm = CommBackend::automatic;  // auto: nccl on CUDA, mpi on the CPU
    GradReduceDtype grad_reduce_dtype = GradReduceDtype::f32;  // the dtype of the dp gradient reductions
};

enum class SaveErrorPolicy { warn, abort };

// A local snapshot falling due while the one before is still being written or copied: defer
// it to the first step boundary after that one completes (the step loop never waits), or
// wait for that one (every due step is snapshotted).
enum class SnapshotWhenBusy { defer, wait };

// Node-local snapshots ([checkpoint.local], checkpoint/local_snapshots.h): each rank's state in
// node-local storage every few steps, copied to peers on other nodes, so that a restart loses
// minutes of work rather than the interval between persistent checkpoints.
struct LocalSnapshotConfig {
    int64_t every_steps = 0;               // 0: no local snapshots
    // Node-local root; the run's snapshots go to <dir>/<run id>. "{node}" becomes the node's
    // name (a shared file system can then hold one directory per node).
    std::string dir = "/dev/shm/llmtrain";
    int64_t replicas = 1;                  // copies of each rank's piece on other nodes
    int64_t keep = 2;                      // newest complete snapshots kept per node
    SnapshotWhenBusy when_busy = SnapshotWhenBusy::defer;
};

struct CheckpointConfig {
    std::string dir = "checkpoints";
    int64_t every_steps = 0;               // 0: no checkpoints
    int64_t keep_last = 3;                 // newest committed checkpoints kept
    int64_t keep_every = 0;                // also keep steps that are multiples of this forever; 0: none
    bool async = true;                     // write in the background; false: the step loop waits
    SaveErrorPolicy on_save_error = SaveErrorPolicy::warn;
    int64_t max_failed_saves = 3;          // that many failed saves in a row stop the run (exit 74) whatever on_save_error says
    LocalSnapshotConfig local;
};

// What the run does about a health event (monitor/health_monitor.h).
enum class HealthAction { abort, skip, rollback, lower_lr };

struct MonitorConfig {
    HealthAction on_nonfinite = HealthAction::abort;
    HealthAction on_spike = HealthAction::skip;          // a loss or gradient-norm z-score above its threshold
    HealthAction on_divergence = HealthAction::abort;    // the window's mean loss rose by divergence_factor
    int64_t window = 128;                  // steps in the rolling window of the z-scores and of divergence
    int64_t warmup_steps = 100;            // applied steps before the spike and divergence detectors judge
    double loss_zscore = 6;                // a log loss this many standard deviations above the window's mean is a spike
    double grad_zscore = 8;                // the same for the log gradient norm, whose tail is heavier
    double divergence_factor = 1.5;        // mean loss of the last window / mean of the window before it
    // MoE: a layer whose busiest expert took at least router_collapse_share of the tokens for
    // router_collapse_steps applied steps in a row has a collapsed router.
    HealthAction on_router_collapse = HealthAction::abort;
    double router_collapse_share = 0.9;
    int64_t router_collapse_steps = 100;
    int64_t skip_batches = 0;              // rollback: global batches skipped beyond the offending step's
    double lr_factor = 0.5;                // lower_lr: the learning rate is multiplied by this from then on
    int64_t max_consecutive_skips = 5;     // that many skipped steps in a row: roll back
    int64_t max_rollbacks = 3;             // that many rollbacks within rollback_window steps: abort
    int64_t rollback_window = 1000;
    bool rerun_on_anomaly = false;         // re-run a suspicious step to tell a real anomaly from a transient fault
};

enum class MetricsServe { automatic, on, off };
const char* health_action_name(HealthAction action);  // "skip", ...

struct MetricsConfig {
    bool jsonl = true;                     // write <run_dir>/log.jsonl
    MetricsServe enabled = MetricsServe::automatic;  // Prometheus /metrics on every rank; auto: runs of more than one rank
    std::string listen = "0.0.0.0";        // address /metrics is served on (an IPv4 or IPv6 literal)
    int64_t port = 9480;                   // rank r serves on port + local rank r; 0: a free port, written to the run directory
    double peak_tflops = 0;                // per device, for MFU; 0: the device's data-sheet figure (none on the CPU: no MFU series)
    double gpu_interval_seconds = 5;       // NVML sampling period
    int64_t straggler_interval_steps = 50; // steps between straggler scores; 0: none
    double straggler_threshold = 0.75;     // a rank scoring below it is logged
    double linger_seconds = 0;             // keep serving this long after the last step (a last scrape)
};

struct Config {
    ModelConfig model;
    DataConfig data;
    TrainConfig train;
    OptimizerConfig optimizer;
    ParallelConfig parallel;
    CheckpointConfig checkpoint;
    MonitorConfig monitor;
    MetricsConfig metrics;
    Fp8Config fp8;                         // read only under train.precision = "fp8"
    std::string source_path;               // the file it was read from
    // The keys the file or a --set gave ("train.global_batch_size"); every other key holds its
    // default or a value derived from the given ones.
    std::set<std::string> given_keys;
    bool states(const std::string& key) const { return given_keys.count(key) > 0; }
};

// Reads, overrides and validates. Throws Error(ErrorKind::config) with a one-line message
// "<file>: <key.path>: <problem> (allowed: ...)" on the first problem found; a missing data
// file is an Error(ErrorKind::data) naming the key and the path.
// DataFiles::unchecked skips that check (`bench` runs on synthetic tokens).
enum class DataFiles { checked, unchecked };
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {}, DataFiles data_files = DataFiles::checked);
// Same, from TOML text (source_name stands in for the file name in messages).
Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {}, DataFiles data_files = DataFiles::checked);
// The communication backend the config resolves to (comm auto: nccl on CUDA, mpi on the CPU).
CommBackend comm_backend(const Config& config);
const char* comm_backend_name(CommBackend comm);
// The compute dtype the config resolves to (precision auto: f32 on the CPU, bf16 on CUDA).
DType compute_dtype(const TrainConfig& train);
// The dtype the data-parallel gradient collectives carry: the gradients' own (master) dtype
// under parallel.grad_reduce_dtype = "f32", bf16 under "bf16".
DType grad_reduce_dtype(const ParallelConfig& parallel, DType master);
const char* grad_reduce_dtype_name(GradReduceDtype dtype);
// Layers per pipeline stage from parallel.stage_layers ("3,3,2"; empty: balanced, the
// first stages taking one more when stages do not divide n_layers). Throws a config error.
std::vector<int64_t> parse_stage_layers(const std::string& text, int64_t stages, int64_t n_layers);

// Micro-batches per optimizer step on each of dp data-parallel ranks: train.grad_accum, or
// train.global_batch_size / (train.batch_size * dp). dp is known only once the world size
// is (parallel.dp = 0), so the trainer asks this of the run's mesh (dp >= 1). Throws
// Error(config) naming the file, the keys and the numbers when the global batch does not
// split into whole micro-batches on dp ranks, or disagrees with an explicit train.grad_accum.
int64_t micro_batches_per_step(const Config& config, int64_t dp);
// The config a run on dp data-parallel ranks computes with: `config` with train.grad_accum
// resolved (micro_batches_per_step, never 0). The user's config stays as given (a checkpoint
// records it; another layout resolves it again).
Config resolve_on_mesh(const Config& config, int64_t dp);
// Interleaved 1F1B (parallel.virtual_stages > 1) runs micro-batches in groups of parallel.pp:
// throws Error(config) naming the keys when micro_batches_per_step(config, dp) is not a
// multiple of pp. The layer rules are checked when the config is read.
void require_interleavable_micro_batches(const Config& config, int64_t dp);

// Throws Error(config) naming the key at the first combination of values parse_config would
// refuse: for a config made in code (`plan --search`'s layouts), checked as a file would be.
void require_possible_combination(const Config& config);
// Layouts the config accepts and `plan` sizes but this build does not train: parallel.ep > 1
// on a mixture-of-experts model. The reason naming the key, or "" when it trains; the
// trainer calls require_trainable_in_this_build (a config error) before allocating.
std::string untrainable_in_this_build(const Config& config);
void require_trainable_in_this_build(const Config& config);

// The --set texts ("parallel.tp=8", "train.recompute=selective") that make `base`, given the
// same file, into `target`: each key of `keys` whatever its value, and every other key whose
// value differs, in schema order.
std::vector<std::string> overrides_between(const Config& base, const Config& target, const std::vector<std::string_view>& keys);

// The effective config (defaults filled in) as TOML that parse_config accepts again.
std::string dump_config(const Config& config);

}  // namespace llmtrain
