// The run configuration. One schema table (key path, rule with the allowed values, how the
// default arises, accessor into Config, description) drives parsing, unknown-key detection,
// range checks and dump_config, so each key is declared exactly once. The checks run in a
// fixed order and the first problem is thrown: syntax, --set syntax and keys, unknown keys,
// each key in schema order (missing, type, range), impossible combinations, data files.
#include "config/config.h"

#include <arpa/inet.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <variant>

#include "core/attention_head_dims.h"
#include "core/error.h"

namespace llmtrain {

namespace {

// ---- Enum names, indexed by the enum's value ----

constexpr const char* kFamilyNames[] = {"gpt2", "llama"};
constexpr const char* kFormatNames[] = {"text", "tokens", "shards", "megatron", "llmc", "nanogpt"};
constexpr const char* kDecayNames[] = {"cosine", "linear", "constant"};
constexpr const char* kOptimizerNames[] = {"adamw", "onebit_adam"};
constexpr const char* kHealthActionNames[] = {"abort", "skip", "rollback", "lower_lr"};
constexpr const char* kSaveErrorNames[] = {"warn", "abort"};
constexpr const char* kSnapshotWhenBusyNames[] = {"defer", "wait"};
constexpr const char* kDeviceNames[] = {"cpu", "cuda"};
constexpr const char* kPrecisionNames[] = {"auto", "fp32", "bf16", "fp16", "fp8"};
constexpr const char* kFp8RecipeNames[] = {"current", "delayed"};
constexpr const char* kFp8FormatNames[] = {"hybrid", "e4m3"};
constexpr const char* kFp8AmaxComputeNames[] = {"max", "most_recent"};
constexpr const char* kRecomputeNames[] = {"none", "selective", "full"};
constexpr const char* kAttentionNames[] = {"auto", "cudnn", "native"};
constexpr const char* kTokenDtypeNames[] = {"u16", "i32"};
constexpr const char* kCommNames[] = {"auto", "nccl", "mpi"};
constexpr const char* kGradReduceDtypeNames[] = {"f32", "bf16"};
constexpr const char* kMetricsServeNames[] = {"auto", "on", "off"};
constexpr const char* kAttentionMaskNames[] = {"causal", "document"};
constexpr const char* kCorruptBlockNames[] = {"abort", "skip"};
constexpr const char* kMoeRouterNames[] = {"softmax", "sigmoid"};
constexpr const char* kMoeBalancingNames[] = {"aux_loss", "seq_aux_loss", "expert_bias", "none"};
constexpr const char* kMeshOrderNames[] = {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"};

using Names = std::span<const char* const>;
Names names_of(ModelFamily) { return kFamilyNames; }
Names names_of(DataFormat) { return kFormatNames; }
Names names_of(LrDecay) { return kDecayNames; }
Names names_of(OptimizerName) { return kOptimizerNames; }
Names names_of(HealthAction) { return kHealthActionNames; }
Names names_of(SaveErrorPolicy) { return kSaveErrorNames; }
Names names_of(SnapshotWhenBusy) { return kSnapshotWhenBusyNames; }
Names names_of(ComputeDevice) { return kDeviceNames; }
Names names_of(Precision) { return kPrecisionNames; }
Names names_of(Recompute) { return kRecomputeNames; }
Names names_of(AttentionImpl) { return kAttentionNames; }
Names names_of(CommBackend) { return kCommNames; }
Names names_of(GradReduceDtype) { return kGradReduceDtypeNames; }
Names names_of(MetricsServe) { return kMetricsServeNames; }
Names names_of(AttentionMask) { return kAttentionMaskNames; }
Names names_of(CorruptBlockPolicy) { return kCorruptBlockNames; }
Names names_of(MoeRouter) { return kMoeRouterNames; }
Names names_of(MoeBalancing) { return kMoeBalancingNames; }
Names names_of(Fp8Recipe) { return kFp8RecipeNames; }
Names names_of(Fp8Formats) { return kFp8FormatNames; }
Names names_of(Fp8AmaxCompute) { return kFp8AmaxComputeNames; }

// ---- Values and the rules they must satisfy ----

// A key's value as TOML holds it; enums travel as their names.
using Value = std::variant<int64_t, double, bool, std::string>;

struct Bound {
    double value;
    bool open;
};
Bound incl(double value) { return {value, false}; }
Bound excl(double value) { return {value, true}; }

struct IntRule { int64_t lo, hi; };
struct NumberRule { Bound lo, hi; };   // a TOML float, or an integer taken as one
struct BoolRule {};
struct StringRule {};
struct ChoiceRule { Names names; };
struct FileRule { bool may_be_empty; };  // an input file; checked to exist after all else
using Rule = std::variant<IntRule, NumberRule, BoolRule, StringRule, ChoiceRule, FileRule>;

template <class... F>
struct Overloaded : F... { using F::operator()...; };
template <class... F>
Overloaded(F...) -> Overloaded<F...>;  // clang before 17 deduces no aggregate's arguments

constexpr int64_t kTrillion = 1'000'000'000'000;
constexpr int64_t kMillion = 1'000'000;

// Shortest text that reads back as the same double: plain digits for everyday magnitudes
// (500000, 0.0006), an exponent for the rest (1e-08).
std::string number_text(double value) {
    const double magnitude = std::fabs(value);
    const bool plain = magnitude == 0 || (magnitude >= 1e-4 && magnitude < 1e15);
    char buf[64];
    const auto result = plain ? std::to_chars(buf, buf + sizeof buf, value, std::chars_format::fixed)
                              : std::to_chars(buf, buf + sizeof buf, value);
    return std::string(buf, result.ptr);
}

// TOML floats need a '.' or an exponent.
std::string float_literal(double value) {
    std::string text = number_text(value);
    if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
    return text;
}

std::string quoted_names(Names names) {
    std::string text;
    for (const char* name : names) text += cat(text.empty() ? "" : ", ", '"', name, '"');
    return text;
}

// What a rule allows, e.g. "integer in [1, 1024]".
std::string describe(const Rule& rule) {
    return std::visit(Overloaded{
        [](const IntRule& r) { return cat("integer in [", r.lo, ", ", r.hi, "]"); },
        [](const NumberRule& r) {
            return cat("number in ", r.lo.open ? "(" : "[", number_text(r.lo.value), ", ",
                       number_text(r.hi.value), r.hi.open ? ")" : "]");
        },
        [](const BoolRule&) { return std::string("true or false"); },
        [](const StringRule&) { return std::string("a string"); },
        [](const ChoiceRule& r) { return cat("one of ", quoted_names(r.names)); },
        [](const FileRule& r) { return std::string(r.may_be_empty ? "path of a readable file, or \"\"" : "path of a readable file"); },
    }, rule);
}

std::string type_phrase(const toml::node& node) {
    switch (node.type()) {
        case toml::node_type::string: return "a string";
        case toml::node_type::integer: return "an integer";
        case toml::node_type::floating_point: return "a float";
        case toml::node_type::boolean: return "a boolean";
        case toml::node_type::table: return "a table";
        case toml::node_type::array: return "an array";
        case toml::node_type::date: return "a date";
        case toml::node_type::time: return "a time";
        case toml::node_type::date_time: return "a date-time";
        default: return "nothing";
    }
}

// ---- Accessors between Value and the Config members ----

template <class T>
Value to_value(const T& member) {
    if constexpr (std::is_enum_v<T>) return std::string(names_of(member)[static_cast<size_t>(member)]);
    else if constexpr (std::is_same_v<T, uint64_t>) return static_cast<int64_t>(member);
    else return member;
}

template <class T>
void from_value(const Value& value, T& member) {
    if constexpr (std::is_enum_v<T>) {
        const Names names = names_of(T{});
        const std::string& name = std::get<std::string>(value);
        member = static_cast<T>(std::find(names.begin(), names.end(), name) - names.begin());
    } else if constexpr (std::is_same_v<T, uint64_t>) {
        member = static_cast<uint64_t>(std::get<int64_t>(value));
    } else {
        member = std::get<T>(value);
    }
}

// ---- The schema ----

struct Field {
    std::string_view path;  // "section.key"
    Value (*load)(const Config&) = nullptr;
    void (*store)(Config&, const Value&) = nullptr;
    Rule rule = StringRule{};
    bool is_required = false;
    void (*derive)(Config&) = nullptr;      // default computed from keys above it in the schema
    std::optional<ModelFamily> only_for;    // the key means something for this family only
    std::string_view doc;

    template <auto Section, auto Member>
    static Field of(std::string_view path) {
        Field f{};
        f.path = path;
        f.load = [](const Config& c) { return to_value((c.*Section).*Member); };
        f.store = [](Config& c, const Value& v) { from_value(v, (c.*Section).*Member); };
        return f;
    }
    // A key of a table inside a section ("checkpoint.local.every_steps").
    template <auto Section, auto Table, auto Member>
    static Field of(std::string_view path) {
        Field f{};
        f.path = path;
        f.load = [](const Config& c) { return to_value(((c.*Section).*Table).*Member); };
        f.store = [](Config& c, const Value& v) { from_value(v, ((c.*Section).*Table).*Member); };
        return f;
    }
    Field integer(int64_t lo, int64_t hi) const { return with_rule(IntRule{lo, hi}); }
    Field number(Bound lo, Bound hi) const { return with_rule(NumberRule{lo, hi}); }
    Field boolean() const { return with_rule(BoolRule{}); }
    Field string() const { return with_rule(StringRule{}); }
    Field choice(Names names) const { return with_rule(ChoiceRule{names}); }
    Field file(bool may_be_empty) const { return with_rule(FileRule{may_be_empty}); }
    Field required() const { Field f = *this; f.is_required = true; return f; }
    Field derived(void (*fn)(Config&)) const { Field f = *this; f.derive = fn; return f; }
    Field family_only(ModelFamily family) const { Field f = *this; f.only_for = family; return f; }
    Field describe(std::string_view text) const { Field f = *this; f.doc = text; return f; }
    Field with_rule(Rule r) const { Field f = *this; f.rule = r; return f; }

    // The table the key is in ("checkpoint" or "checkpoint.local") and its name there.
    std::string_view section() const { return path.substr(0, path.rfind('.')); }
    std::string_view key() const { return path.substr(path.rfind('.') + 1); }
};

void default_n_kv_heads(Config& c) { c.model.n_kv_heads = c.model.n_heads; }

// gpt2: 4 * d_model. llama: the SwiGLU MLP has three matrices instead of two, so 2/3 of
// 4 * d_model keeps the parameter count; rounded up to a multiple of 64 for the GEMMs.
void default_d_ff(Config& c) {
    const int64_t d = c.model.d_model;
    if (c.model.family == ModelFamily::gpt2) { c.model.d_ff = 4 * d; return; }
    const int64_t two_thirds_of_4d = (8 * d + 2) / 3;
    c.model.d_ff = (two_thirds_of_4d + 63) / 64 * 64;
}

void default_d_ff_expert(Config& c) { c.model.moe.d_ff_expert = c.model.d_ff; }

void default_tied_embeddings(Config& c) { c.model.tied_embeddings = c.model.family == ModelFamily::gpt2; }

// CONFIG_KEY(model, n_heads): accessors of config.model.n_heads under the key "model.n_heads",
// so a key's name cannot drift from its member's.
#define CONFIG_KEY(section, key) \
    Field::of<&Config::section, &decltype(Config::section)::key>(#section "." #key)
// CONFIG_SUBKEY(checkpoint, local, every_steps): config.checkpoint.local.every_steps under
// "checkpoint.local.every_steps", the key of the TOML table [checkpoint.local].
#define CONFIG_SUBKEY(section, table, key) \
    Field::of<&Config::section, &decltype(Config::section)::table, &decltype(decltype(Config::section)::table)::key>(#section "." #table "." #key)

const std::vector<Field>& schema() {
    static const std::vector<Field> fields = {
        CONFIG_KEY(model, family).choice(kFamilyNames).required()
            .describe("gpt2: LayerNorm, GELU, learned positions; llama: RMSNorm, SwiGLU, RoPE"),
        CONFIG_KEY(model, n_layers).integer(1, 1024).required().describe("transformer blocks"),
        CONFIG_KEY(model, d_model).integer(1, 65536).required().describe("width of the residual stream"),
        CONFIG_KEY(model, n_heads).integer(1, 1024).required().describe("query heads; divides d_model"),
        CONFIG_KEY(model, n_kv_heads).integer(1, 1024).derived(default_n_kv_heads)
            .describe("key/value heads, fewer than n_heads for grouped-query attention (llama); default n_heads"),
        CONFIG_KEY(model, d_ff).integer(1, 1048576).derived(default_d_ff)
            .describe("MLP hidden width; default gpt2 4*d_model, llama 8/3*d_model rounded up to 64"),
        CONFIG_KEY(model, vocab_size).integer(2, 2147483647).required().describe("token ids are 0 .. vocab_size-1"),
        CONFIG_KEY(model, pad_vocab_to).integer(1, 65536)
            .describe("embedding and LM-head rows are vocab_size rounded up to a multiple of parallel.tp * pad_vocab_to; the padding is masked out of the loss and sampling"),
        CONFIG_KEY(model, max_seq_len).integer(1, 1048576).required().describe("longest sequence the model accepts"),
        CONFIG_KEY(model, norm_eps).number(excl(0), excl(1)).describe("epsilon of LayerNorm / RMSNorm"),
        CONFIG_KEY(model, rope_theta).number(excl(0), incl(1e9)).family_only(ModelFamily::llama)
            .describe("RoPE base frequency"),
        CONFIG_KEY(model, qkv_bias).boolean().family_only(ModelFamily::llama)
            .describe("biases on the q, k, v projections (Qwen2 style)"),
        CONFIG_KEY(model, tied_embeddings).boolean().derived(default_tied_embeddings)
            .describe("output projection shares the token embedding; default true for gpt2, false for llama"),
        CONFIG_KEY(model, init_std).number(excl(0), incl(1)).describe("standard deviation of the initial weights"),
        CONFIG_KEY(model, attention).choice(kAttentionNames)
            .describe("CUDA attention kernels: auto (cuDNN's fused attention where libcudnn loads and takes the shape, else native), cudnn, native"),
        CONFIG_SUBKEY(model, moe, n_experts).integer(0, 4096).family_only(ModelFamily::llama)
            .describe("experts of each mixture-of-experts layer; 0: a dense model"),
        CONFIG_SUBKEY(model, moe, top_k).integer(1, 64).family_only(ModelFamily::llama).describe("experts each token is routed to"),
        CONFIG_SUBKEY(model, moe, d_ff_expert).integer(1, 1048576).derived(default_d_ff_expert).family_only(ModelFamily::llama)
            .describe("each expert's SwiGLU hidden width; default model.d_ff"),
        CONFIG_SUBKEY(model, moe, n_shared_experts).integer(0, 64).family_only(ModelFamily::llama)
            .describe("experts every token passes through beside its routed ones, as one SwiGLU MLP n_shared_experts * d_ff_expert wide "
                      "(DeepSeek-V3, Qwen2-MoE); 0: none"),
        CONFIG_SUBKEY(model, moe, shared_expert_gate).boolean().family_only(ModelFamily::llama)
            .describe("the shared experts' output is scaled by sigmoid(x . w), a learned gate per token (Qwen2-MoE); false: added as it is (DeepSeek-V3)"),
        CONFIG_SUBKEY(model, moe, first_dense_layers).integer(0, 1024).family_only(ModelFamily::llama)
            .describe("the first layers keep the dense MLP (DeepSeek-V3's first_k_dense_replace)"),
        CONFIG_SUBKEY(model, moe, every).integer(1, 1024).family_only(ModelFamily::llama)
            .describe("after the dense ones, every this-many-th layer is a mixture-of-experts layer, starting with the first"),
        CONFIG_SUBKEY(model, moe, router).choice(kMoeRouterNames).family_only(ModelFamily::llama)
            .describe("softmax over all experts (Mixtral, Qwen2-MoE) or a sigmoid per expert (DeepSeek-V3); in fp32"),
        CONFIG_SUBKEY(model, moe, normalize_top_k).boolean().family_only(ModelFamily::llama)
            .describe("gates are the chosen scores divided by their sum (Mixtral, Qwen3, DeepSeek-V3); false: the scores as they are (Qwen2-MoE)"),
        CONFIG_SUBKEY(model, moe, load_balancing).choice(kMoeBalancingNames).family_only(ModelFamily::llama)
            .describe("aux_loss: Switch/GShard's loss over each micro-batch's tokens; seq_aux_loss: the same per sequence (DeepSeek-V3); "
                      "expert_bias: a bias per expert on the choice only, moved towards the mean load after each step (DeepSeek-V3's "
                      "auxiliary-loss-free balancing); none"),
        CONFIG_SUBKEY(model, moe, bias_update_rate).number(excl(0), incl(1)).family_only(ModelFamily::llama)
            .describe("expert_bias: each step, an expert's bias falls by this much if it took more than the mean load, rises if less"),
        CONFIG_SUBKEY(model, moe, aux_loss_coeff).number(incl(0), incl(1e3)).family_only(ModelFamily::llama)
            .describe("weight of the load-balancing loss in the training loss"),
        CONFIG_SUBKEY(model, moe, z_loss_coeff).number(incl(0), incl(1e3)).family_only(ModelFamily::llama)
            .describe("weight of the router z-loss, mean (logsumexp of the logits)^2 (ST-MoE); 0: off"),
        CONFIG_SUBKEY(model, moe, capacity_factor).number(incl(0), incl(1e3)).family_only(ModelFamily::llama)
            .describe("0: dropless; else each expert takes at most ceil(factor * tokens * top_k / n_experts) assignments, the rest dropped and counted"),

        CONFIG_KEY(data, format).choice(kFormatNames)
            .describe("text: bytes, vocabulary 256 + end-of-document; tokens: a flat file of token ids"),
        CONFIG_KEY(data, train_path).file(false).required().describe("training data"),
        CONFIG_KEY(data, val_path).file(true).describe("held-out data; empty: the last val_fraction of train_path"),
        CONFIG_KEY(data, val_fraction).number(incl(0), incl(0.5)).describe("share of train_path held out when val_path is empty"),
        CONFIG_KEY(data, token_dtype).choice(kTokenDtypeNames).describe("element type of a tokens file"),
        CONFIG_KEY(data, document_separator).string().describe("text format: each occurrence becomes an end-of-document token"),
        CONFIG_KEY(data, train_weight).number(excl(0), incl(1e6)).describe("train_path's blending weight against the data.blend sources"),
        CONFIG_KEY(data, blend).string().describe("more training sources of the same format: \"PATH=WEIGHT, PATH=WEIGHT\""),
        CONFIG_KEY(data, tokenizer).file(true).describe("tokenizer.json to print samples as text; empty: the dataset's own (shards, whose recorded hash it must match)"),
        CONFIG_KEY(data, prefetch).integer(0, 64).describe("micro-batches the loader thread prepares ahead (shards, megatron, llmc, nanogpt)"),
        CONFIG_KEY(data, attention_mask).choice(kAttentionMaskNames)
            .describe("causal: every earlier token of the sequence; document: only those of the token's own document (after the last end-of-text token)"),
        CONFIG_KEY(data, reset_position_ids).boolean().describe("positions (learned or rotary) restart at 0 after each end-of-text token"),
        CONFIG_KEY(data, on_corrupt_block).choice(kCorruptBlockNames)
            .describe("a token shard block that fails its checksum (shards): abort the run naming it (exit 2), or skip: each sample touching it "
                      "becomes the next clean sample of its source, the same on every layout and restart, logged and counted"),

        CONFIG_KEY(train, seed).integer(0, std::numeric_limits<int64_t>::max())
            .describe("seed of initialization, data order and sampling"),
        CONFIG_KEY(train, steps).integer(1, kTrillion).required().describe("optimizer steps"),
        CONFIG_KEY(train, batch_size).integer(1, 65536).required().describe("sequences per micro-batch"),
        CONFIG_KEY(train, seq_len).integer(1, 1048576).required().describe("tokens per sequence"),
        CONFIG_KEY(train, global_batch_size).integer(0, kTrillion)
            .describe("sequences per optimizer step over the whole job; 0: batch_size * grad_accum * dp"),
        CONFIG_KEY(train, grad_accum).integer(0, 65536)
            .describe("micro-batches per optimizer step on each dp rank; 0: global_batch_size / (batch_size * dp), or 1"),
        CONFIG_KEY(train, eval_every).integer(0, kTrillion)
            .describe("steps between evaluations; a fresh run also evaluates before its first step, every run after its last; 0: only those two"),
        CONFIG_KEY(train, eval_sequences).integer(1, kTrillion)
            .describe("validation sequences per evaluation: the same set whatever batch_size and the layout"),
        CONFIG_KEY(train, log_every).integer(1, kTrillion).describe("steps between log lines"),
        CONFIG_KEY(train, threads).integer(0, 4096).describe("CPU threads; 0: all cores"),
        CONFIG_KEY(train, memory_limit_gb).number(incl(0), incl(1e6))
            .describe("GB one rank may hold: the memory plan must fit in it before anything is allocated, and the backend refuses an allocation beyond it; "
                      "0: what the GPU or the node has"),
        CONFIG_KEY(train, sample_tokens).integer(0, kMillion).describe("tokens generated after training; 0: none"),
        CONFIG_KEY(train, sample_prompt).string().describe("text the sample continues"),
        CONFIG_KEY(train, sample_temperature).number(excl(0), incl(10)).describe("sampling temperature"),
        CONFIG_KEY(train, device).choice(kDeviceNames).describe("cpu: the fp32 reference backend; cuda: one GPU per rank (the node-local rank's)"),
        CONFIG_KEY(train, precision).choice(kPrecisionNames)
            .describe("compute dtype: auto (cpu fp32, cuda bf16), fp32 (cpu), bf16 or fp16 (cuda; fp16 with dynamic loss scaling), or fp8: auto's "
                      "dtype with the blocks' linear layers in FP8 as [fp8] says (emulated exactly on the cpu)"),
        CONFIG_KEY(train, recompute).choice(kRecomputeNames)
            .describe("activation recomputation: none, selective (norms and MLP activation) or full (whole layers)"),
        CONFIG_KEY(train, loss_scale).number(incl(1), incl(16777216)).describe("fp16: initial dynamic loss scale"),
        CONFIG_KEY(train, loss_scale_window).integer(1, kMillion).describe("fp16: steps without overflow before the loss scale doubles"),
        CONFIG_KEY(train, init_from).string()
            .describe("weights to start from (step 0, fresh optimizer), verified first: a .safetensors file, a directory holding model.safetensors, "
                      "or an llmtrain checkpoint directory; empty: random initialization; a checkpoint found by --resume wins"),

        CONFIG_KEY(optimizer, name).choice(kOptimizerNames)
            .describe("adamw, or onebit_adam: 1-bit Adam, AdamW for freeze_step steps, then frozen variance and the momentum all-reduced as sign bits "
                      "with error feedback (needs parallel.zero_stage = 0 when dp > 1)"),
        CONFIG_KEY(optimizer, freeze_step).integer(1, kTrillion)
            .describe("onebit_adam: full AdamW steps (gradients all-reduced) before the variance is frozen and the momentum is compressed"),
        CONFIG_KEY(optimizer, lr).number(excl(0), incl(10)).required().describe("peak learning rate"),
        CONFIG_KEY(optimizer, min_lr_ratio).number(incl(0), incl(1)).describe("floor of the decay, as a fraction of lr"),
        CONFIG_KEY(optimizer, warmup_steps).integer(0, kTrillion)
            .describe("steps of linear warmup to lr; a run with fewer train.steps warms up over all of them"),
        CONFIG_KEY(optimizer, decay).choice(kDecayNames).describe("learning-rate schedule after warmup"),
        CONFIG_KEY(optimizer, beta1).number(incl(0), excl(1)).describe("AdamW decay of the first moment"),
        CONFIG_KEY(optimizer, beta2).number(incl(0), excl(1)).describe("AdamW decay of the second moment"),
        CONFIG_KEY(optimizer, eps).number(excl(0), excl(1)).describe("AdamW epsilon"),
        CONFIG_KEY(optimizer, weight_decay).number(incl(0), incl(10)).describe("decoupled weight decay, on matrices only"),
        CONFIG_KEY(optimizer, grad_clip).number(incl(0), incl(1e6)).describe("max global gradient norm; 0: no clipping"),

        CONFIG_KEY(parallel, tp).integer(1, 65536).describe("tensor-parallel ranks; divides n_heads, n_kv_heads and d_ff (the vocabulary is padded, see model.pad_vocab_to)"),
        CONFIG_KEY(parallel, pp).integer(1, 65536).describe("pipeline stages (1F1B, interleaved with virtual_stages > 1); at most n_layers; fewer micro-batches than stages widen the bubble"),
        CONFIG_KEY(parallel, dp).integer(0, 65536).describe("data-parallel replicas; 0: world size / (tp * cp * pp)"),
        CONFIG_KEY(parallel, cp).integer(1, 65536)
            .describe("context-parallel ranks: each sequence is cut into 2 x cp equal chunks and rank r of the cp group holds chunks r and 2cp - 1 - r "
                      "(balanced causal work); attention runs as a ring passing keys and values around the group, merged by log-sum-exp; the "
                      "cp ranks sit just inside dp in the mesh and read the same sequences; train.seq_len must be a multiple of 2 x cp"),
        CONFIG_KEY(parallel, ep).integer(1, 65536)
            .describe("expert-parallel ranks: the experts of a mixture-of-experts layer are split over ep ranks, which exchange tokens by all-to-all; "
                      "the expert layers fold the tp x cp x dp ranks of a pipeline stage into ep x (tp * cp * dp / ep), ep dividing tp * cp * dp"),
        CONFIG_KEY(parallel, order).choice(kMeshOrderNames).describe("mesh dimensions, fastest-varying rank first"),
        CONFIG_KEY(parallel, zero_stage).integer(0, 3)
            .describe("0: replicated; 1: AdamW state sharded over dp (ZeRO-1); 2: gradients reduce-scattered and sharded too (ZeRO-2); 3: parameters "
                      "sharded too, all-gathered group by group before each forward and backward (ZeRO-3 / FSDP)"),
        CONFIG_KEY(parallel, shard_size).integer(0, 65536)
            .describe("zero_stage 2 or 3: shard within groups of this many consecutive dp ranks (e.g. a node) and replicate across the groups (hybrid "
                      "sharding); divides dp; 0: dp (one group)"),
        CONFIG_KEY(parallel, prefetch_layers).integer(0, 64)
            .describe("zero_stage 3: parameter groups (layers) whose all-gathers are started before the current group computes, hiding them "
                      "behind its compute; each holds one more gather buffer; 0: every group gathered when it runs"),
        CONFIG_KEY(parallel, overlap_param_gather).boolean()
            .describe("zero_stage 1 or 2: the all-gathers of the updated parameters start after the update and each is waited for just before "
                      "the next forward's first layer that reads it, hiding them behind the forward (ZeRO-2: two in flight, through the "
                      "gradient pool's buffers); false: they complete before the step ends"),
        CONFIG_KEY(parallel, sequence_parallel).boolean()
            .describe("with tp > 1: norms and residuals hold 1/tp of the tokens per rank (batch_size * seq_len divisible by tp)"),
        CONFIG_KEY(parallel, tp_overlap).boolean()
            .describe("with sequence_parallel: each all-gather before a column-parallel matmul and each reduce-scatter after a row-parallel "
                      "one runs in tp pieces (each rank's tokens / tp, at least 16), a piece's transfer behind the previous piece's matmul, and in backward the input's all-gather "
                      "runs behind the input-gradient matmul and its reduce-scatter behind the weight-gradient matmul; the same sums in "
                      "the same order (losses bitwise those without it)"),
        CONFIG_KEY(parallel, bucket_mb).number(excl(0), incl(65536)).describe("MB of gradients per overlapped dp reduction"),
        CONFIG_KEY(parallel, stage_layers).string().describe("layers per pipeline stage, e.g. \"3,3,2\"; empty: balanced"),
        CONFIG_KEY(parallel, virtual_stages).integer(1, 1024)
            .describe("model chunks per pipeline stage (interleaved 1F1B): the bubble falls to (pp - 1) / (virtual_stages x grad_accum + pp - 1); "
                      "needs pp > 1, n_layers a multiple of pp x virtual_stages, grad_accum a multiple of pp"),
        CONFIG_KEY(parallel, timeout_seconds).number(excl(0), incl(86400))
            .describe("a collective or transfer that takes longer ends the whole job with a message naming the rank"),
        CONFIG_KEY(parallel, comm).choice(kCommNames)
            .describe("collectives of device tensors: nccl (own stream, ordered by CUDA events), mpi (host staging); auto: nccl on cuda, mpi on cpu"),
        CONFIG_KEY(parallel, grad_reduce_dtype).choice(kGradReduceDtypeNames)
            .describe("dtype of the data-parallel gradient reductions (all-reduce, reduce-scatter): f32, or bf16 for half the bytes (each rank still "
                      "accumulates its micro-batches in f32; the sum over dp is rounded to bf16)"),

        CONFIG_KEY(fp8, recipe).choice(kFp8RecipeNames)
            .describe("train.precision = \"fp8\": current (each tensor scaled from its own amax as it is cast) or delayed (activations and "
                      "gradients from the amax history of the steps before; weights always from their own amax, cast once per step)"),
        CONFIG_KEY(fp8, amax_history_len).integer(1, kMillion).describe("delayed: steps of amax history per tensor"),
        CONFIG_KEY(fp8, amax_compute).choice(kFp8AmaxComputeNames).describe("delayed: the scale from the history's max or its most recent amax"),
        CONFIG_KEY(fp8, margin).integer(0, 16).describe("scale = fp8 max / amax / 2^margin: binary orders of headroom"),
        CONFIG_KEY(fp8, format).choice(kFp8FormatNames).describe("hybrid: e4m3 weights and activations, e5m2 gradients; e4m3: e4m3 everywhere"),
        CONFIG_KEY(fp8, bf16_first_layers).integer(0, 1024).describe("first layers whose linears stay in the compute dtype"),
        CONFIG_KEY(fp8, bf16_last_layers).integer(0, 1024).describe("last layers whose linears stay in the compute dtype"),
        CONFIG_KEY(fp8, param_gather).boolean().describe("parallel.zero_stage = 3: gather the FP8 linears' weights in FP8, one byte per element"),

        CONFIG_KEY(checkpoint, dir).string().describe("directory of checkpoints"),
        CONFIG_KEY(checkpoint, every_steps).integer(0, kTrillion).describe("steps between checkpoints; 0: none"),
        CONFIG_KEY(checkpoint, keep_last).integer(1, kMillion).describe("newest checkpoints kept on disk"),
        CONFIG_KEY(checkpoint, keep_every).integer(0, kTrillion).describe("also keep every checkpoint whose step is a multiple of this forever; 0: none"),
        CONFIG_KEY(checkpoint, async).boolean().describe("write checkpoints in the background while training goes on"),
        CONFIG_KEY(checkpoint, on_save_error).choice(kSaveErrorNames).describe("a failed save: warn and train on, or abort the run (exit 74)"),
        CONFIG_KEY(checkpoint, max_failed_saves).integer(1, kMillion)
            .describe("failed saves in a row that stop the run with exit 74 (fix the storage), even under on_save_error = \"warn\""),
        CONFIG_SUBKEY(checkpoint, local, every_steps).integer(0, kTrillion)
            .describe("steps between node-local snapshots (restored on the same layout only); 0: none"),
        CONFIG_SUBKEY(checkpoint, local, dir).string()
            .describe("node-local directory of the snapshots (the run's go to DIR/<run id>); \"{node}\" becomes the node's name; a directory "
                      "every node sees is refused"),
        CONFIG_SUBKEY(checkpoint, local, replicas).integer(0, 16).describe("copies of each rank's snapshot kept on other nodes"),
        CONFIG_SUBKEY(checkpoint, local, keep).integer(1, 1000).describe("newest complete local snapshots kept on each node"),
        CONFIG_SUBKEY(checkpoint, local, when_busy).choice(kSnapshotWhenBusyNames)
            .describe("a snapshot falling due while the one before is still written or copied: defer it to the first step boundary after that one "
                      "completes (the step loop never waits), or wait for that one (every due step is snapshotted)"),

        CONFIG_KEY(monitor, on_nonfinite).choice(kHealthActionNames)
            .describe("on a NaN or Inf loss or gradient on any rank: abort (exit 3), skip the update, rollback to the last checkpoint, or lower_lr"),
        CONFIG_KEY(monitor, on_spike).choice(kHealthActionNames).describe("on a loss or gradient-norm spike: abort, skip, rollback or lower_lr"),
        CONFIG_KEY(monitor, on_divergence).choice(kHealthActionNames).describe("on divergence: abort, skip, rollback or lower_lr"),
        CONFIG_KEY(monitor, on_router_collapse).choice(kHealthActionNames)
            .describe("mixture of experts: on a collapsed router (monitor.router_collapse_share of a layer's tokens on one expert for "
                      "monitor.router_collapse_steps steps): abort, skip, rollback or lower_lr"),
        CONFIG_KEY(monitor, router_collapse_share).number(excl(0), incl(1))
            .describe("collapsed router: the share of a MoE layer's tokens its busiest expert takes (1: every token)"),
        CONFIG_KEY(monitor, router_collapse_steps).integer(1, kMillion).describe("collapsed router: applied steps in a row"),
        CONFIG_KEY(monitor, window).integer(2, kMillion).describe("steps in the rolling window of the spike z-scores and of the divergence means"),
        CONFIG_KEY(monitor, warmup_steps).integer(0, kTrillion).describe("applied steps before the spike and divergence detectors judge"),
        CONFIG_KEY(monitor, loss_zscore).number(excl(0), incl(1e6)).describe("loss spike: standard deviations of the log loss above the window's mean"),
        CONFIG_KEY(monitor, grad_zscore).number(excl(0), incl(1e6)).describe("gradient-norm spike: standard deviations of the log norm above the window's mean"),
        CONFIG_KEY(monitor, divergence_factor).number(excl(1), incl(1e6)).describe("divergence: mean loss of the last window over the mean of the one before"),
        CONFIG_KEY(monitor, skip_batches).integer(0, kTrillion).describe("rollback: global batches skipped beyond the offending step's"),
        CONFIG_KEY(monitor, lr_factor).number(excl(0), excl(1)).describe("lower_lr: the learning rate is multiplied by this from then on"),
        CONFIG_KEY(monitor, max_consecutive_skips).integer(1, kMillion).describe("that many health skips in a row roll back (abort without a checkpoint)"),
        CONFIG_KEY(monitor, max_rollbacks).integer(1, kMillion).describe("that many rollbacks within monitor.rollback_window steps abort the run"),
        CONFIG_KEY(monitor, rollback_window).integer(1, kTrillion).describe("steps over which monitor.max_rollbacks counts"),
        CONFIG_KEY(monitor, rerun_on_anomaly).boolean()
            .describe("re-run an anomalous step from its starting state: the same numbers apply the policy, others name the faulty rank (exit 76)"),

        CONFIG_KEY(metrics, jsonl).boolean().describe("write <run_dir>/log.jsonl"),
        CONFIG_KEY(metrics, enabled).choice(kMetricsServeNames)
            .describe("serve Prometheus metrics on every rank; auto: when the run has more than one rank (true and false mean on and off)"),
        CONFIG_KEY(metrics, listen).string().describe("address /metrics is served on: an IPv4 or IPv6 literal (\"0.0.0.0\", \"127.0.0.1\", \"::\")"),
        CONFIG_KEY(metrics, port).integer(0, 65535)
            .describe("each rank serves on port + its node-local rank; 0: free ports, logged and written to <run_dir>/metrics_targets.json"),
        CONFIG_KEY(metrics, peak_tflops).number(incl(0), incl(1e6))
            .describe("dense peak TFLOP/s per device in the compute dtype, for the MFU series; 0: the GPU's data-sheet figure (none on the CPU)"),
        CONFIG_KEY(metrics, gpu_interval_seconds).number(incl(0.05), incl(3600)).describe("seconds between NVML readings of the GPU series"),
        CONFIG_KEY(metrics, straggler_interval_steps).integer(0, kMillion)
            .describe("steps between straggler scores (median compute time of each rank against the fastest); 0: none"),
        CONFIG_KEY(metrics, straggler_threshold).number(excl(0), incl(1)).describe("a rank whose straggler score falls below this is logged"),
        CONFIG_KEY(metrics, linger_seconds).number(incl(0), incl(3600))
            .describe("keep serving /metrics this long after the last step, so that a scraper sees the final values"),
    };
    return fields;
}

#undef CONFIG_KEY

const Field* find_field(std::string_view path) {
    for (const Field& field : schema())
        if (field.path == path) return &field;
    return nullptr;
}

std::vector<std::string_view> section_names() {
    std::vector<std::string_view> names;
    for (const Field& field : schema())
        if (names.empty() || names.back() != field.section()) names.push_back(field.section());
    return names;
}

bool is_section(std::string_view name) {
    const auto names = section_names();
    return std::find(names.begin(), names.end(), name) != names.end();
}

// ---- Unknown names and suggestions ----

size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
            diagonal = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
        }
    }
    return row[b.size()];
}

// The candidate nearest to `word`, if one is within two edits.
std::optional<std::string_view> closest(std::string_view word, const std::vector<std::string_view>& candidates) {
    std::optional<std::string_view> best;
    size_t best_distance = 3;
    for (std::string_view candidate : candidates) {
        const size_t distance = edit_distance(word, candidate);
        if (distance < best_distance) best = candidate, best_distance = distance;
    }
    return best;
}

std::string joined(const std::vector<std::string_view>& names) {
    std::string text;
    for (std::string_view name : names) text += cat(text.empty() ? "" : ", ", name);
    return text;
}

// The field elsewhere whose key is within two edits of `key`, e.g. "steps" -> train.steps.
std::optional<std::string_view> closest_field_by_key(std::string_view key) {
    std::vector<std::string_view> keys;
    for (const Field& field : schema()) keys.push_back(field.key());
    const auto best = closest(key, keys);
    if (!best) return std::nullopt;
    for (const Field& field : schema())
        if (field.key() == *best) return field.path;
    return std::nullopt;
}

std::string did_you_mean(std::optional<std::string_view> suggestion) {
    return suggestion ? cat("; did you mean ", *suggestion, "?") : std::string();
}

struct Problem {
    std::string where;  // the key path (or section) the problem is about
    std::string text;
};

// Keys of earlier versions, and what took their place.
constexpr std::pair<std::string_view, std::string_view> kRetiredKeys[] = {
    {"train.eval_batches", "replaced by train.eval_sequences, the number of validation sequences whatever train.batch_size "
                           "(eval_batches x batch_size gives the same validation set)"},
    {"parallel.zero1", "replaced by parallel.zero_stage (zero1 = true is zero_stage = 1, the default; false is zero_stage = 0)"},
};

// Why `path` names no config key, with the known names around it and the nearest one.
// A top-level name is an unknown section when it holds a table, else a key outside sections.
Problem unknown_name(std::string_view path, bool holds_table) {
    for (const auto& [retired, replacement] : kRetiredKeys)
        if (path == retired) return {std::string(path), std::string(replacement)};
    const auto sections = section_names();
    const size_t dot = path.rfind('.');
    const std::string_view section = path.substr(0, dot);
    if (dot == std::string_view::npos && !holds_table) {
        const std::string what = is_section(path) ? "is a section, not a key" : "unknown key outside any section";
        return {std::string(path), cat(what, " (known sections: ", joined(sections), ")", did_you_mean(closest_field_by_key(path)))};
    }
    if (!is_section(section)) {
        const auto best = closest(section, sections);
        return {std::string(section), cat("unknown section (known sections: ", joined(sections), ")",
                                          best ? cat("; did you mean [", *best, "]?") : std::string())};
    }
    std::vector<std::string_view> keys;
    for (const Field& field : schema())
        if (field.section() == section) keys.push_back(field.key());
    const std::string_view key = path.substr(dot + 1);
    const auto near = closest(key, keys);
    const auto suggestion = near ? std::optional<std::string_view>(find_field(cat(section, ".", *near))->path) : closest_field_by_key(key);
    return {std::string(path), cat("unknown key (known keys in [", section, "]: ", joined(keys), ")", did_you_mean(suggestion))};
}

// ---- Where problems are reported ----

// The file and, for keys set by --set, the override that set them last.
struct Origin {
    std::string source;
    std::map<std::string, std::string, std::less<>> overrides;  // key path -> "key.path=value"

    [[noreturn]] void fail_at(const Problem& problem, ErrorKind kind = ErrorKind::config) const {
        const auto it = overrides.find(problem.where);
        const std::string via = it == overrides.end() ? std::string() : cat("--set ", it->second, ": ");
        fail(kind, source, ": ", via, problem.where, ": ", problem.text);
    }
};

// ---- Parsing ----

toml::table parse_toml(const std::string& text, const std::string& source) {
    try {
        return toml::parse(std::string_view(text), std::string_view(source));
    } catch (const toml::parse_error& e) {
        std::string description(e.description());
        std::replace(description.begin(), description.end(), '\n', ' ');
        fail(ErrorKind::config, source, ":", e.source().begin.line, ":", e.source().begin.column, ": ", description);
    }
}

std::string trimmed(std::string_view text) {
    const size_t begin = text.find_first_not_of(" \t");
    if (begin == std::string_view::npos) return {};
    return std::string(text.substr(begin, text.find_last_not_of(" \t") - begin + 1));
}

// The value of one --set: TOML if it parses as a TOML value, else the text as a string
// (so paths need no quotes). A string key keeps the text even where it reads as TOML
// (--set data.train_path=2024).
void assign_override(toml::table& section, const Field& field, const std::string& text) {
    const bool wants_string = std::holds_alternative<StringRule>(field.rule) || std::holds_alternative<ChoiceRule>(field.rule) ||
                              std::holds_alternative<FileRule>(field.rule);
    try {
        const std::string document = "v = " + text;
        toml::table parsed = toml::parse(std::string_view(document));
        toml::node* value = parsed.get("v");
        if (parsed.size() == 1 && value && (value->is_string() || !wants_string)) {
            value->visit([&](auto&& node) { section.insert_or_assign(field.key(), std::move(node)); });
            return;
        }
    } catch (const toml::parse_error&) {
    }
    section.insert_or_assign(field.key(), text);
}

// The node at a table path ("checkpoint" or "checkpoint.local") under root; null where a
// part of it is missing or is no table.
const toml::node* node_at(const toml::table& root, std::string_view section) {
    const toml::node* node = &root;
    for (size_t start = 0; node;) {
        const size_t dot = section.find('.', start);
        const std::string_view part = section.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
        node = node->is_table() ? node->as_table()->get(part) : nullptr;
        if (dot == std::string_view::npos) break;
        start = dot + 1;
    }
    return node;
}

// The table at a table path, made where missing; null where a part is no table.
toml::table* table_for_override(toml::table& root, std::string_view section) {
    toml::table* table = &root;
    for (size_t start = 0; table;) {
        const size_t dot = section.find('.', start);
        const std::string part(section.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
        if (!table->contains(part)) table->insert(part, toml::table{});
        table = table->get_as<toml::table>(part);
        if (dot == std::string_view::npos) break;
        start = dot + 1;
    }
    return table;
}

// Applies each "key.path=value" onto the parsed file, so overrides meet the file's checks.
void apply_overrides(toml::table& root, const std::vector<std::string>& overrides, Origin& origin) {
    for (const std::string& text : overrides) {
        const size_t eq = text.find('=');
        const std::string path = trimmed(std::string_view(text).substr(0, eq));
        if (eq == std::string::npos || path.empty())
            fail(ErrorKind::config, origin.source, ": --set '", text, "': expected key.path=value");
        const Field* field = find_field(path);
        if (!field) {
            const Problem problem = unknown_name(path, false);
            fail(ErrorKind::config, origin.source, ": --set ", text, ": ", problem.where, ": ", problem.text);
        }
        origin.overrides[path] = text;
        // A section that is no table in the file is reported when the keys are read.
        if (toml::table* section = table_for_override(root, field->section()))
            assign_override(*section, *field, text.substr(eq + 1));
    }
}

// Unknown keys come first: a misspelt key would otherwise surface as a missing one.
void reject_unknown_keys(const toml::table& root, const Origin& origin) {
    for (std::string_view section : section_names()) {
        const toml::node* found = node_at(root, section);
        const toml::table* table = found ? found->as_table() : nullptr;
        if (!table) continue;
        for (auto&& [key, node] : *table) {
            const std::string path = cat(section, ".", key.str());
            const bool inner_section = node.is_table() && is_section(path);  // [checkpoint.local] in [checkpoint]
            if (!find_field(path) && !inner_section) origin.fail_at(unknown_name(path, node.is_table()));
        }
    }
    for (auto&& [name, node] : root)
        if (!is_section(name.str())) origin.fail_at(unknown_name(name.str(), node.is_table()));
}

// ---- Each key on its own: type and range ----

struct KeyReader {
    const Field& field;
    const Origin& origin;

    [[noreturn]] void reject(const std::string& problem) const { origin.fail_at({std::string(field.path), problem}); }
    [[noreturn]] void wrong_type(const char* expected, const toml::node& node) const {
        reject(cat("expected ", expected, ", got ", type_phrase(node), " (allowed: ", describe(field.rule), ")"));
    }
    [[noreturn]] void out_of_range(const std::string& value) const {
        reject(cat(value, " is out of range (allowed: ", describe(field.rule), ")"));
    }

    Value operator()(const IntRule& rule, const toml::node& node) const {
        if (!node.is_integer()) wrong_type("an integer", node);
        const int64_t value = node.as_integer()->get();
        if (value < rule.lo || value > rule.hi) out_of_range(cat(value));
        return value;
    }
    Value operator()(const NumberRule& rule, const toml::node& node) const {
        if (!node.is_number()) wrong_type("a number", node);
        const double value = node.is_integer() ? static_cast<double>(node.as_integer()->get()) : node.as_floating_point()->get();
        // Written so that NaN fails both comparisons.
        const bool above = rule.lo.open ? value > rule.lo.value : value >= rule.lo.value;
        const bool below = rule.hi.open ? value < rule.hi.value : value <= rule.hi.value;
        if (!above || !below) out_of_range(number_text(value));
        return value;
    }
    Value operator()(const BoolRule&, const toml::node& node) const {
        if (!node.is_boolean()) wrong_type("a boolean", node);
        return node.as_boolean()->get();
    }
    Value operator()(const StringRule&, const toml::node& node) const { return string_of(node); }
    Value operator()(const FileRule&, const toml::node& node) const { return string_of(node); }
    Value operator()(const ChoiceRule& rule, const toml::node& node) const {
        // A TOML boolean where the choices include the strings "on" and "off" (metrics.enabled =
        // true) means the one it names; the key stays a string for its third choice, "auto".
        const auto allows = [&](const char* name) { return std::find(rule.names.begin(), rule.names.end(), std::string_view(name)) != rule.names.end(); };
        if (node.is_boolean() && allows("on") && allows("off")) return std::string(node.as_boolean()->get() ? "on" : "off");
        const std::string value = string_of(node);
        if (std::find(rule.names.begin(), rule.names.end(), value) == rule.names.end())
            reject(cat('"', value, "\" is not a known value (allowed: ", describe(field.rule), ")"));
        return value;
    }
    std::string string_of(const toml::node& node) const {
        if (!node.is_string()) wrong_type("a string", node);
        return node.as_string()->get();
    }
};

// The key's checked value; nullopt where neither the file nor --set gives it.
std::optional<Value> read_key(const toml::table& root, const Field& field, const Origin& origin) {
    const toml::node* section = node_at(root, field.section());
    if (!section) return std::nullopt;
    if (!section->is_table())
        origin.fail_at({std::string(field.section()), cat("expected a table [", field.section(), "], got ", type_phrase(*section))});
    const toml::node* node = section->as_table()->get(field.key());
    if (!node) return std::nullopt;
    const KeyReader reader{field, origin};
    return std::visit([&](const auto& rule) { return reader(rule, *node); }, field.rule);
}

using GivenKeys = std::set<std::string_view>;

// Reads every key in schema order; a key not given takes its derived or struct default.
GivenKeys read_keys(const toml::table& root, const Origin& origin, Config& config) {
    GivenKeys given;
    for (const Field& field : schema()) {
        if (const auto value = read_key(root, field, origin)) {
            field.store(config, *value);
            given.insert(field.path);
        } else if (field.is_required) {
            origin.fail_at({std::string(field.path), cat("required key is missing (", describe(field.rule), ")")});
        } else if (field.derive) {
            field.derive(config);
        }
    }
    return given;
}

// ---- Impossible combinations ----

// The [fp8] keys are read (and dumped) only under train.precision = "fp8".
bool fp8_key_applies(std::string_view key, const Config& c) { return !key.starts_with("fp8.") || c.train.precision == Precision::fp8; }

// FP8 (train.precision = "fp8", [fp8]): what it cannot run with yet.
std::optional<Problem> fp8_problem(const Config& c) {
    if (c.train.precision != Precision::fp8) return std::nullopt;
    if (c.model.moe.enabled())
        return Problem{"train.precision", cat("= \"fp8\" runs the blocks' dense linears in FP8; a mixture-of-experts model (model.moe.n_experts = ",
                                              c.model.moe.n_experts, ") is not built for it yet (allowed with it: auto, fp32, bf16)")};
    if (c.fp8.param_gather && c.parallel.zero_stage != 3)
        return Problem{"fp8.param_gather", cat("= true gathers ZeRO-3's FP8 weights in FP8: it needs parallel.zero_stage = 3 (got ", c.parallel.zero_stage,
                                               "; allowed with other stages: false)")};
    // Overlapped, a linear's input and output gradient arrive in pieces: a current-scaling
    // amax needs the whole tensor before its cast.
    if (c.parallel.tp_overlap)
        return Problem{"parallel.tp_overlap", "= true runs the tensor-parallel matmuls in pieces; train.precision = \"fp8\" scales each "
                                              "tensor as a whole (allowed with it: false)"};
    return std::nullopt;
}

// Why the global batch does not split into whole micro-batches of train.batch_size on dp
// data-parallel ranks; nullopt if it does. dp = 0 (not known yet): only what must hold for
// every dp is checked.
std::optional<Problem> batch_split_problem(const TrainConfig& t, int64_t dp) {
    const int64_t global = t.global_batch_size, batch = t.batch_size, accum = t.grad_accum;
    if (global == 0) return std::nullopt;
    if (dp == 0) {
        const int64_t unit = batch * std::max<int64_t>(accum, 1);
        if (global % unit == 0) return std::nullopt;
        if (accum == 0)
            return Problem{"train.global_batch_size", cat(global, " sequences per step is not a multiple of train.batch_size = ", batch)};
        return Problem{"train.grad_accum", cat(accum, " micro-batches x train.batch_size = ", batch, " = ", unit,
                                               " sequences per dp rank do not divide train.global_batch_size = ", global,
                                               " (set one of the two; grad_accum = 0 derives it)")};
    }
    const int64_t per_micro_batch = batch * dp;
    if (global % per_micro_batch != 0)
        return Problem{"train.global_batch_size", cat(global, " sequences per step do not split into micro-batches of train.batch_size = ", batch,
                                                      " on dp = ", dp, " ranks (allowed: a multiple of train.batch_size x dp = ", per_micro_batch, ")")};
    if (accum == 0 || accum * per_micro_batch == global) return std::nullopt;
    return Problem{"train.grad_accum", cat(accum, " micro-batches x train.batch_size = ", batch, " x dp = ", dp, " = ", accum * per_micro_batch,
                                           " sequences per step, but train.global_batch_size = ", global, " (gives grad_accum = ", global / per_micro_batch,
                                           "; set one of the two; grad_accum = 0 derives it)")};
}

// Interleaved 1F1B's micro-batches come in groups of pp (Megatron's rule); nullopt also when
// the count is not known yet (a global batch on parallel.dp = 0). The problem names the key
// that gave the count (train.grad_accum, train.global_batch_size, or parallel.virtual_stages
// itself where neither is set and a step is one micro-batch), its value and what to set.
std::optional<Problem> interleaving_micro_batch_problem(const Config& c, int64_t dp) {
    const TrainConfig& t = c.train;
    const int64_t pp = c.parallel.pp, v = c.parallel.virtual_stages;
    if (v == 1 || batch_split_problem(t, dp)) return std::nullopt;
    if (t.grad_accum == 0 && t.global_batch_size > 0 && dp == 0) return std::nullopt;
    const int64_t m = t.grad_accum > 0 ? t.grad_accum : (t.global_batch_size > 0 ? t.global_batch_size / (t.batch_size * dp) : 1);
    if (m % pp == 0) return std::nullopt;
    const std::string groups = cat("; parallel.virtual_stages = ", v, " runs them in groups of parallel.pp = ", pp, " stages");
    if (t.grad_accum > 0) return Problem{"train.grad_accum", cat("gives ", m, " micro-batches per step", groups, " (allowed: a multiple of ", pp, ")")};
    if (t.global_batch_size > 0)
        return Problem{"train.global_batch_size", cat(t.global_batch_size, " sequences / (train.batch_size = ", t.batch_size, " x dp = ", dp, ") gives ", m,
                                                      " micro-batches per step", groups, " (allowed: a multiple of batch_size x dp x pp = ", t.batch_size * dp * pp, ")")};
    return Problem{"parallel.virtual_stages", cat("= ", v, " runs the micro-batches of a step in groups of parallel.pp = ", pp,
                                                  " stages, but a step is 1 micro-batch (neither train.grad_accum nor train.global_batch_size is set): "
                                                  "set train.grad_accum to a multiple of ", pp, ", or parallel.virtual_stages = 1")};
}

// The key that asks for document boundaries, for errors: the mask, else the position reset.
const char* document_key(const DataConfig& data) {
    return data.attention_mask == AttentionMask::document ? "data.attention_mask" : "data.reset_position_ids";
}

using Check = std::optional<Problem> (*)(const Config&);

// In the order of the key each one names.
constexpr Check kChecks[] = {
    [](const Config& c) -> std::optional<Problem> {
        if (c.model.d_model % c.model.n_heads == 0) return std::nullopt;
        return Problem{"model.n_heads", cat("must divide model.d_model = ", c.model.d_model, " (got ", c.model.n_heads, ")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        // RoPE rotates pairs of dimensions within each head.
        if (c.model.family != ModelFamily::llama || c.model.head_dim() % 2 == 0) return std::nullopt;
        return Problem{"model.n_heads", cat("gives an odd head dimension model.d_model / model.n_heads = ", c.model.head_dim(),
                                            "; family = \"llama\" needs it even for RoPE (got ", c.model.n_heads, ")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        if (c.model.family != ModelFamily::gpt2 || c.model.n_kv_heads == c.model.n_heads) return std::nullopt;
        return Problem{"model.n_kv_heads", cat("grouped-query attention needs family = \"llama\"; gpt2 requires model.n_kv_heads = "
                                               "model.n_heads = ", c.model.n_heads, " (got ", c.model.n_kv_heads, ")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        if (c.model.n_heads % c.model.n_kv_heads == 0) return std::nullopt;
        return Problem{"model.n_kv_heads", cat("must divide model.n_heads = ", c.model.n_heads, " (got ", c.model.n_kv_heads, ")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        if (c.data.format != DataFormat::text || c.model.vocab_size >= 257) return std::nullopt;
        return Problem{"model.vocab_size", cat("data.format = \"text\" needs at least 257 token ids, 256 byte values + "
                                               "end-of-document (got ", c.model.vocab_size, ")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        if ((c.data.format != DataFormat::tokens && c.data.format != DataFormat::nanogpt) || c.data.token_dtype != "u16" || c.model.vocab_size <= 65536)
            return std::nullopt;
        return Problem{"data.token_dtype", cat("\"u16\" holds token ids below 65536 but model.vocab_size = ", c.model.vocab_size,
                                               " (allowed: \"i32\")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        if (!c.data.val_path.empty() || c.data.val_fraction > 0 || c.data.format == DataFormat::shards) return std::nullopt;
        return Problem{"data.val_fraction", "evaluation needs held-out data: set data.val_path or a val_fraction > 0 (got 0)"};
    },
    [](const Config& c) -> std::optional<Problem> {
        if (c.data.blend.empty()) return std::nullopt;
        if (c.data.format == DataFormat::text || c.data.format == DataFormat::tokens)
            return Problem{"data.blend", cat("blending needs a loader format (allowed with data.format = \"shards\", \"megatron\", \"llmc\", \"nanogpt\"; got \"",
                                             kFormatNames[static_cast<size_t>(c.data.format)], "\")")};
        try {
            for (const WeightedPath& source : training_sources(c.data))
                if (!std::filesystem::is_regular_file(source.path)) return Problem{"data.blend", cat("no such file '", source.path, "'")};
        } catch (const Error& e) {
            return Problem{"data.blend", std::string(e.what()).substr(std::string_view("data.blend: ").size())};
        }
        return std::nullopt;
    },
    [](const Config& c) -> std::optional<Problem> {
        // Documents end at the end-of-text token: the byte vocabulary's, or a tokenizer's.
        const DataFormat f = c.data.format;
        if (!splits_documents(c.data) || f == DataFormat::text || f == DataFormat::shards || !c.data.tokenizer.empty()) return std::nullopt;
        return Problem{document_key(c.data), cat("needs the end-of-text token that ends each document: data.format = \"",
                                                 kFormatNames[static_cast<size_t>(f)], "\" has no tokenizer; set data.tokenizer to the tokenizer.json "
                                                 "that made the data (allowed without one: \"causal\", false)")};
    },
    [](const Config& c) -> std::optional<Problem> {
        // cuDNN's graphs mask causally; with model.attention = "auto" the native kernels run.
        if (c.data.attention_mask != AttentionMask::document || c.model.attention != AttentionImpl::cudnn) return std::nullopt;
        return Problem{"data.attention_mask", "= \"document\" runs on the native attention kernels; model.attention = \"cudnn\" cannot take it "
                                              "(allowed with it: \"causal\"; or model.attention = \"auto\" or \"native\")"};
    },
    [](const Config& c) -> std::optional<Problem> {
        if (!splits_documents(c.data) || c.parallel.virtual_stages == 1) return std::nullopt;
        return Problem{document_key(c.data), cat("needs every model chunk to see its micro-batch's tokens; parallel.virtual_stages = ",
                                                 c.parallel.virtual_stages, " gives later chunks none (allowed with it: \"causal\", false)")};
    },
    [](const Config& c) -> std::optional<Problem> {
        if (c.train.seq_len <= c.model.max_seq_len) return std::nullopt;
        return Problem{"train.seq_len", cat("must be <= model.max_seq_len = ", c.model.max_seq_len, " (got ", c.train.seq_len, ")")};
    },
    // parallel.dp = 0 (derived from the world size): the trainer checks again on the run's mesh.
    [](const Config& c) { return batch_split_problem(c.train, c.parallel.dp); },
    [](const Config& c) -> std::optional<Problem> {
        const bool cpu = c.train.device == ComputeDevice::cpu;
        const Precision p = c.train.precision;
        if (p == Precision::automatic || p == Precision::fp8 || (cpu ? p == Precision::fp32 : p != Precision::fp32)) return std::nullopt;
        return Problem{"train.precision", cpu ? cat("\"", precision_name(p), "\" needs train.device = \"cuda\"; the CPU backend computes in fp32 (allowed: auto, fp32, fp8)")
                                              : cat("\"fp32\" is the CPU backend's; train.device = \"cuda\" computes in bf16 or fp16 (allowed: auto, bf16, fp16, fp8)")};
    },
    [](const Config& c) { return fp8_problem(c); },
    [](const Config& c) -> std::optional<Problem> {
        // The native flash kernels are instantiated for a few head dimensions; cuDNN takes
        // multiples of 8 (core/attention_head_dims.h).
        const int64_t d = c.model.head_dim();
        if (c.train.device != ComputeDevice::cuda) return std::nullopt;
        if (c.model.attention == AttentionImpl::cudnn) {
            if (cudnn_attention_takes(d)) return std::nullopt;
            return Problem{"model.n_heads", cat(c.model.n_heads, " heads give head dimension model.d_model / model.n_heads = ", c.model.d_model, " / ",
                                                c.model.n_heads, " = ", d, "; model.attention = \"cudnn\" needs a multiple of 8 up to ", cudnn_max_head_dim)};
        }
        if (native_attention_takes(d)) return std::nullopt;
        const std::string suggestion = c.model.d_model % 64 == 0 ? cat(" (model.n_heads = ", c.model.d_model / 64, " gives 64)") : "";
        return Problem{"model.n_heads", cat(c.model.n_heads, " heads give head dimension model.d_model / model.n_heads = ", c.model.d_model, " / ",
                                            c.model.n_heads, " = ", d, "; train.device = \"cuda\" needs ", native_attention_head_dims_text(), suggestion,
                                            cudnn_attention_takes(d) ? " or model.attention = \"cudnn\"" : "")};
    },
    [](const Config& c) -> std::optional<Problem> {
        if (c.model.attention != AttentionImpl::cudnn || c.train.device == ComputeDevice::cuda) return std::nullopt;
        return Problem{"model.attention", "\"cudnn\" is the CUDA backend's; set train.device = \"cuda\", or model.attention = \"auto\" or \"native\""};
    },
    [](const Config& c) -> std::optional<Problem> {
        const int64_t tp = c.parallel.tp;
        const ModelConfig& m = c.model;
        // The vocabulary needs no check: its rows are padded to a multiple of tp (model.pad_vocab_to).
        if (m.n_heads % tp == 0 && m.n_kv_heads % tp == 0 && m.d_ff % tp == 0) return std::nullopt;
        return Problem{"parallel.tp", cat("must divide model.n_heads = ", m.n_heads, ", model.n_kv_heads = ", m.n_kv_heads, " and model.d_ff = ",
                                          m.d_ff, " (got ", tp, ")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        const MoeConfig& moe = c.model.moe;
        if (!moe.enabled() || moe.n_shared_experts == 0 || moe.shared_d_ff() % c.parallel.tp == 0) return std::nullopt;
        return Problem{"parallel.tp", cat("must divide the shared experts' width model.moe.n_shared_experts x model.moe.d_ff_expert = ", moe.n_shared_experts,
                                          " x ", moe.d_ff_expert, " = ", moe.shared_d_ff(), " (got ", c.parallel.tp,
                                          "; they are split over tp as a dense MLP is)")};
    },
    [](const Config& c) -> std::optional<Problem> {
        const MoeConfig& moe = c.model.moe;
        if (!moe.shared_expert_gate || moe.n_shared_experts > 0) return std::nullopt;
        return Problem{"model.moe.shared_expert_gate", "= true gates the shared experts, but model.moe.n_shared_experts = 0 (allowed: false, or n_shared_experts >= 1)"};
    },
    [](const Config& c) -> std::optional<Problem> {
        const int64_t cp = c.parallel.cp, T = c.train.seq_len;
        if (cp == 1 || T % (2 * cp) == 0) return std::nullopt;
        return Problem{"parallel.cp", cat("= ", cp, " cuts each sequence into 2 x cp = ", 2 * cp, " equal chunks, but train.seq_len = ", T,
                                          " is not a multiple of ", 2 * cp, " (allowed: a cp with seq_len a multiple of 2 x cp)")};
    },
    [](const Config& c) -> std::optional<Problem> {
        if (c.parallel.cp == 1 || c.model.attention != AttentionImpl::cudnn) return std::nullopt;
        return Problem{"parallel.cp", cat("= ", c.parallel.cp, " runs attention as a ring of blocks on the native kernels; model.attention = \"cudnn\" "
                                          "cannot take it (allowed with cp > 1: model.attention = \"auto\" or \"native\")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        const int64_t tokens = c.train.batch_size * c.train.seq_len / c.parallel.cp;
        if (!c.parallel.sequence_parallel || tokens % c.parallel.tp == 0) return std::nullopt;
        return Problem{"parallel.sequence_parallel", cat("splits the train.batch_size * train.seq_len", c.parallel.cp > 1 ? " / parallel.cp" : "", " = ", tokens,
                                                         " tokens of a micro-batch across parallel.tp = ", c.parallel.tp, " ranks: they must divide evenly")};
    },
    [](const Config& c) -> std::optional<Problem> {
        if (!c.parallel.tp_overlap || (c.parallel.sequence_parallel && c.parallel.tp > 1)) return std::nullopt;
        return Problem{"parallel.tp_overlap", cat("= true overlaps the collectives of sequence parallelism and needs parallel.sequence_parallel = true "
                                                  "with parallel.tp > 1 (got sequence_parallel = ", c.parallel.sequence_parallel ? "true" : "false",
                                                  ", tp = ", c.parallel.tp, "; allowed: false)")};
    },
    [](const Config& c) -> std::optional<Problem> {
        // The last evaluation micro-batch holds the remainder of the sequences.
        const int64_t rows = c.train.eval_sequences % c.train.batch_size, tokens = rows * c.train.seq_len / c.parallel.cp;
        if (!c.parallel.sequence_parallel || tokens % c.parallel.tp == 0) return std::nullopt;
        return Problem{"train.eval_sequences", cat("leaves a last evaluation micro-batch of ", rows, " sequences x train.seq_len = ", tokens,
                                                   " tokens, which parallel.sequence_parallel cannot split across parallel.tp = ", c.parallel.tp,
                                                   " ranks (allowed: a multiple of train.batch_size = ", c.train.batch_size, ", or a remainder whose tokens tp divides)")};
    },
    [](const Config& c) -> std::optional<Problem> {
        in6_addr address6{};
        in_addr address4{};
        const std::string& listen = c.metrics.listen;
        if (inet_pton(AF_INET, listen.c_str(), &address4) == 1 || inet_pton(AF_INET6, listen.c_str(), &address6) == 1) return std::nullopt;
        return Problem{"metrics.listen", cat("\"", listen, "\" is not an IPv4 or IPv6 address (allowed: e.g. \"0.0.0.0\", \"127.0.0.1\", \"::\")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        // A rollback restores the last checkpoint: there must be checkpoints.
        const MonitorConfig& m = c.monitor;
        if (c.checkpoint.every_steps > 0) return std::nullopt;
        for (const auto& [key, action] : {std::pair{"monitor.on_nonfinite", m.on_nonfinite}, {"monitor.on_spike", m.on_spike}, {"monitor.on_divergence", m.on_divergence},
                                         {"monitor.on_router_collapse", m.on_router_collapse}})
            if (action == HealthAction::rollback)
                return Problem{key, "\"rollback\" restores the last checkpoint and needs checkpoint.every_steps > 0 (allowed without checkpoints: abort, skip, lower_lr)"};
        return std::nullopt;
    },
    [](const Config& c) -> std::optional<Problem> {
        // dp = 0 is derived from the world: make_mesh checks it then.
        const int64_t ep = c.parallel.ep, stage = c.parallel.tp * c.parallel.cp * c.parallel.dp;
        if (c.parallel.dp == 0 || stage % ep == 0) return std::nullopt;
        return Problem{"parallel.ep", cat("= ", ep, " does not divide the ranks of a pipeline stage, tp * cp * dp = ", c.parallel.tp, " * ", c.parallel.cp,
                                          " * ", c.parallel.dp, " = ", stage, " (allowed: a divisor of ", stage, ")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        // Experts are split over ep ranks; a model without them has nothing to split.
        if (c.parallel.ep == 1) return std::nullopt;
        if (!c.model.moe.enabled())
            return Problem{"parallel.ep", cat("= ", c.parallel.ep, " splits the experts of a mixture-of-experts model; this model (model.family = \"",
                                              family_name(c.model.family), "\"", c.model.family == ModelFamily::llama ? ", model.moe.n_experts = 0" : "",
                                              ") has none (allowed: 1)")};
        if (c.model.moe.n_experts % c.parallel.ep != 0)
            return Problem{"parallel.ep", cat("= ", c.parallel.ep, " does not divide model.moe.n_experts = ", c.model.moe.n_experts,
                                              " (allowed: a divisor of it; each ep rank holds n_experts / ep experts)")};
        // A valid layout: `plan` sizes it; the trainer refuses it (require_trainable_in_this_build).
        return std::nullopt;
    },
    [](const Config& c) -> std::optional<Problem> {
        const MoeConfig& moe = c.model.moe;
        if (!moe.enabled() || moe.top_k <= moe.n_experts) return std::nullopt;
        return Problem{"model.moe.top_k", cat("= ", moe.top_k, " is more than model.moe.n_experts = ", moe.n_experts, " (allowed: 1 to ", moe.n_experts, ")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        const MoeConfig& moe = c.model.moe;
        if (!moe.enabled() || moe.first_dense_layers < c.model.n_layers) return std::nullopt;
        return Problem{"model.moe.first_dense_layers", cat("= ", moe.first_dense_layers, " leaves no mixture-of-experts layer of model.n_layers = ",
                                                           c.model.n_layers, " (allowed: 0 to ", c.model.n_layers - 1, ")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        // seq_aux_loss's groups are whole sequences; sequence parallelism cuts a micro-batch's
        // rows across the tp ranks regardless of where its sequences end.
        const MoeConfig& moe = c.model.moe;
        if (!moe.enabled() || moe.load_balancing != MoeBalancing::seq_aux_loss || !c.parallel.sequence_parallel || c.parallel.tp == 1) return std::nullopt;
        return Problem{"model.moe.load_balancing", cat("= \"seq_aux_loss\" balances each sequence's tokens, which parallel.sequence_parallel = true cuts "
                                                       "across parallel.tp = ", c.parallel.tp, " ranks (allowed with sequence parallelism: \"aux_loss\", \"expert_bias\" or \"none\")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        if (c.parallel.pp <= c.model.n_layers) return std::nullopt;
        return Problem{"parallel.pp", cat("more pipeline stages than model.n_layers = ", c.model.n_layers, " (got ", c.parallel.pp, ")")};
    },
    [](const Config& c) -> std::optional<Problem> {
        if (c.parallel.stage_layers.empty()) return std::nullopt;
        std::string why;
        try {
            const std::vector<int64_t> layers = parse_stage_layers(c.parallel.stage_layers, c.parallel.pp, c.model.n_layers);
        } catch (const Error& e) {
            why = e.what();
        }
        if (why.empty()) return std::nullopt;
        return Problem{"parallel.stage_layers", why};
    },
    [](const Config& c) -> std::optional<Problem> {
        const int64_t v = c.parallel.virtual_stages, pp = c.parallel.pp, layers = c.model.n_layers;
        if (v == 1) return std::nullopt;
        if (pp == 1) return Problem{"parallel.virtual_stages", cat("= ", v, " interleaves pipeline stages and needs parallel.pp > 1 (allowed with pp = 1: 1)")};
        if (!c.parallel.stage_layers.empty())
            return Problem{"parallel.stage_layers", cat("sets uneven stages; parallel.virtual_stages = ", v, " needs balanced ones (leave stage_layers empty)")};
        if (layers % (pp * v) == 0) return std::nullopt;
        return Problem{"parallel.virtual_stages", cat("= ", v, " must divide the layers of each of the parallel.pp = ", pp, " stages (model.n_layers = ",
                                                      layers, " must be a multiple of pp x virtual_stages = ", pp * v, ")")};
    },
    [](const Config& c) { return interleaving_micro_batch_problem(c, c.parallel.dp); },
    [](const Config& c) -> std::optional<Problem> {
        if (c.parallel.comm != CommBackend::nccl || c.train.device == ComputeDevice::cuda) return std::nullopt;
        return Problem{"parallel.comm", "\"nccl\" carries GPU memory and needs train.device = \"cuda\" (allowed on the CPU: auto, mpi)"};
    },
    [](const Config& c) -> std::optional<Problem> {
        // Below stage 2 nothing is reduce-scattered within a shard group: the key would do nothing.
        if (c.parallel.shard_size == 0 || c.parallel.zero_stage >= 2) return std::nullopt;
        return Problem{"parallel.shard_size", cat(c.parallel.shard_size, " shards the gradients and the AdamW state within groups of dp ranks and needs "
                                                  "parallel.zero_stage = 2 or 3 (got ", c.parallel.zero_stage, "; allowed below stage 2: 0)")};
    },
    [](const Config& c) -> std::optional<Problem> {
        // Stage 0 gathers nothing; stage 3 gathers in every forward (parallel.prefetch_layers).
        if (!c.parallel.overlap_param_gather || c.parallel.zero_stage == 1 || c.parallel.zero_stage == 2) return std::nullopt;
        return Problem{"parallel.overlap_param_gather", cat("= true overlaps the all-gathers of the updated parameters of parallel.zero_stage = 1 or 2 (got ",
                                                            c.parallel.zero_stage, c.parallel.zero_stage == 3 ? ": stage 3 prefetches with parallel.prefetch_layers" : ": stage 0 gathers nothing",
                                                            "; allowed: false)")};
    },
};

void reject_impossible_combinations(const Config& config, const GivenKeys& given, const Origin& origin) {
    for (const Field& field : schema()) {
        if (!field.only_for || !given.count(field.path) || config.model.family == *field.only_for) continue;
        origin.fail_at({std::string(field.path), cat("applies to family = \"", family_name(*field.only_for), "\" only (model.family = \"",
                                                     family_name(config.model.family), "\")")});
    }
    // [fp8] without FP8 says so rather than being ignored.
    for (const std::string_view key : given)
        if (!fp8_key_applies(key, config))
            origin.fail_at({std::string(key), cat("is read only under train.precision = \"fp8\" (got \"", precision_name(config.train.precision), "\")")});
    for (const Check check : kChecks)
        if (auto problem = check(config)) origin.fail_at(*problem);
}

// ---- Data files ----

void require_readable_file(const Field& field, const std::string& path, const Origin& origin) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    const std::string where(field.path);
    if (!fs::exists(status)) origin.fail_at({where, cat("no such file '", path, "'")}, ErrorKind::data);
    if (!fs::is_regular_file(status)) origin.fail_at({where, cat("'", path, "' is not a regular file")}, ErrorKind::data);
    if (!std::ifstream(path, std::ios::binary)) origin.fail_at({where, cat("cannot read '", path, "'")}, ErrorKind::data);
}

void require_data_files(const Config& config, const Origin& origin) {
    for (const Field& field : schema()) {
        const auto* rule = std::get_if<FileRule>(&field.rule);
        if (!rule) continue;
        const std::string path = std::get<std::string>(field.load(config));
        if (!(path.empty() && rule->may_be_empty)) require_readable_file(field, path, origin);
    }
}

// ---- Dump ----

std::string toml_literal(const Value& value) {
    return std::visit(Overloaded{
        [](int64_t v) { return std::to_string(v); },
        [](double v) { return float_literal(v); },
        [](bool v) { return std::string(v ? "true" : "false"); },
        [](const std::string& v) {
            // Basic strings with escapes, never multi-line ones: one key per line.
            std::ostringstream out;
            out << toml::toml_formatter{toml::value<std::string>(v), toml::format_flags::allow_unicode_strings};
            return out.str();
        },
    }, value);
}

}  // namespace

const char* family_name(ModelFamily family) { return kFamilyNames[static_cast<size_t>(family)]; }
const char* moe_router_name(MoeRouter router) { return kMoeRouterNames[static_cast<size_t>(router)]; }
const char* moe_balancing_name(MoeBalancing balancing) { return kMoeBalancingNames[static_cast<size_t>(balancing)]; }
const char* comm_backend_name(CommBackend comm) { return kCommNames[static_cast<size_t>(comm)]; }

CommBackend comm_backend(const Config& config) {
    if (config.parallel.comm != CommBackend::automatic) return config.parallel.comm;
    return config.train.device == ComputeDevice::cuda ? CommBackend::nccl : CommBackend::mpi;
}

DType grad_reduce_dtype(const ParallelConfig& parallel, DType master) { return parallel.grad_reduce_dtype == GradReduceDtype::bf16 ? DType::bf16 : master; }
const char* grad_reduce_dtype_name(GradReduceDtype dtype) { return kGradReduceDtypeNames[static_cast<size_t>(dtype)]; }

const char* precision_name(Precision precision) { return kPrecisionNames[static_cast<size_t>(precision)]; }
const char* fp8_recipe_name(Fp8Recipe recipe) { return kFp8RecipeNames[static_cast<size_t>(recipe)]; }
const char* recompute_name(Recompute recompute) { return kRecomputeNames[static_cast<size_t>(recompute)]; }
bool splits_documents(const DataConfig& data) { return data.attention_mask == AttentionMask::document || data.reset_position_ids; }
const char* attention_mask_name(AttentionMask mask) { return kAttentionMaskNames[static_cast<size_t>(mask)]; }
const char* attention_impl_name(AttentionImpl impl) { return kAttentionNames[static_cast<size_t>(impl)]; }
const char* health_action_name(HealthAction action) { return kHealthActionNames[static_cast<size_t>(action)]; }

DType compute_dtype(const TrainConfig& train) {
    switch (train.precision) {
        case Precision::fp32: return DType::f32;
        case Precision::bf16: return DType::bf16;
        case Precision::fp16: return DType::f16;
        case Precision::automatic:
        case Precision::fp8: break;
    }
    return train.device == ComputeDevice::cuda ? DType::bf16 : DType::f32;
}

std::vector<WeightedPath> training_sources(const DataConfig& data) {
    std::vector<WeightedPath> sources{{data.train_path, data.train_weight}};
    std::string_view rest = data.blend;
    while (!rest.empty()) {
        const size_t comma = rest.find(',');
        const std::string entry = trimmed(rest.substr(0, comma));
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        const size_t eq = entry.rfind('=');
        double weight = 0;
        const std::string weight_text = eq == std::string::npos ? "" : trimmed(std::string_view(entry).substr(eq + 1));
        const auto parsed = std::from_chars(weight_text.data(), weight_text.data() + weight_text.size(), weight);
        if (eq == std::string::npos || eq == 0 || parsed.ec != std::errc() || parsed.ptr != weight_text.data() + weight_text.size() || !(weight > 0))
            fail(ErrorKind::config, "data.blend: entry '", entry, "' is not PATH=WEIGHT with a weight > 0");
        sources.push_back({trimmed(std::string_view(entry).substr(0, eq)), weight});
    }
    return sources;
}

int64_t micro_batches_per_step(const Config& config, int64_t dp) {
    const TrainConfig& t = config.train;
    if (const auto problem = batch_split_problem(t, dp))
        fail(ErrorKind::config, config.source_path.empty() ? "" : config.source_path + ": ", problem->where, ": ", problem->text);
    if (t.grad_accum > 0) return t.grad_accum;
    return t.global_batch_size > 0 ? t.global_batch_size / (t.batch_size * dp) : 1;
}

Config resolve_on_mesh(const Config& config, int64_t dp) {
    Config resolved = config;
    resolved.train.grad_accum = micro_batches_per_step(config, dp);
    return resolved;
}

void require_interleavable_micro_batches(const Config& config, int64_t dp) {
    if (const auto problem = interleaving_micro_batch_problem(config, dp))
        fail(ErrorKind::config, config.source_path.empty() ? "" : config.source_path + ": ", problem->where, ": ", problem->text);
}

std::vector<int64_t> parse_stage_layers(const std::string& text, int64_t stages, int64_t n_layers) {
    std::vector<int64_t> layers;
    if (text.empty()) {
        // Balanced: the first n_layers % stages stages take one layer more.
        for (int64_t s = 0; s < stages; ++s) layers.push_back(n_layers / stages + (s < n_layers % stages ? 1 : 0));
        return layers;
    }
    std::istringstream in(text);
    std::string item;
    int64_t total = 0;
    while (std::getline(in, item, ',')) {
        const std::string digits = trimmed(item);
        int64_t value = 0;
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
        if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || value < 1)
            fail(ErrorKind::config, "\"", text, "\" is not a comma-separated list of positive layer counts");
        layers.push_back(value);
        total += value;
    }
    if (static_cast<int64_t>(layers.size()) != stages || total != n_layers)
        fail(ErrorKind::config, "\"", text, "\" gives ", layers.size(), " stages with ", total, " layers; expected parallel.pp = ", stages,
             " stages with model.n_layers = ", n_layers, " layers in all");
    return layers;
}

Config parse_config(const std::string& toml_text, const std::string& source_name, const std::vector<std::string>& overrides, DataFiles data_files) {
    toml::table root = parse_toml(toml_text, source_name);
    Origin origin{source_name, {}};
    apply_overrides(root, overrides, origin);
    reject_unknown_keys(root, origin);
    Config config;
    const GivenKeys given = read_keys(root, origin, config);
    reject_impossible_combinations(config, given, origin);
    if (data_files == DataFiles::checked) require_data_files(config, origin);
    for (const std::string_view key : given) config.given_keys.emplace(key);
    return config;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, DataFiles data_files) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(path, ec)) fail(ErrorKind::config, "cannot read config file '", path, "': no such file");
    if (fs::is_directory(path, ec)) fail(ErrorKind::config, "cannot read config file '", path, "': it is a directory");
    std::ifstream in(path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.is_open() || in.bad()) fail(ErrorKind::io, "cannot read config file '", path, "'");
    Config config = parse_config(text, path, overrides, data_files);
    config.source_path = path;
    return config;
}

std::string untrainable_in_this_build(const Config& config) {
    // The model splits the experts over an ep group and exchanges their rows (moe_mlp.h); what
    // training them so still needs is the experts' own parameter group (reduced and sharded over
    // the expert-data ranks, checkpointed by expert): this build keeps every expert on every rank.
    if (!config.model.moe.enabled() || config.parallel.ep == 1) return "";
    return cat("parallel.ep: = ", config.parallel.ep, ": this build trains mixture-of-experts models with every expert on every rank ",
               "(allowed: 1; tp, cp, dp and pp apply as to a dense model; `plan` sizes ep > 1 layouts)");
}

void require_trainable_in_this_build(const Config& config) {
    const std::string why = untrainable_in_this_build(config);
    if (!why.empty()) fail(ErrorKind::config, config.source_path.empty() ? "config" : config.source_path, ": ", why);
}

void require_possible_combination(const Config& config) {
    const Origin origin{config.source_path.empty() ? "config" : config.source_path, {}};
    for (const Check check : kChecks)
        if (auto problem = check(config)) origin.fail_at(*problem);
}

namespace {

// A value as --set reads it back: a plain word bare (a string key takes its text as it is),
// anything else as its TOML literal.
std::string override_literal(const Value& value) {
    if (const auto* text = std::get_if<std::string>(&value);
        text && !text->empty() && std::all_of(text->begin(), text->end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_-./", c); }))
        return *text;
    return toml_literal(value);
}

}  // namespace

std::vector<std::string> overrides_between(const Config& base, const Config& target, const std::vector<std::string_view>& keys) {
    std::vector<std::string> overrides;
    for (const Field& field : schema()) {
        if (field.only_for && *field.only_for != target.model.family) continue;
        const Value value = field.load(target);
        if (std::find(keys.begin(), keys.end(), field.path) != keys.end() || value != field.load(base))
            overrides.push_back(cat(field.path, "=", override_literal(value)));
    }
    return overrides;
}

// Keys in schema order, one per line with its description; keys that do not apply to the
// model family are left out, since setting them is an error.
std::string dump_config(const Config& config) {
    std::ostringstream out;
    std::string_view section;
    for (const Field& field : schema()) {
        if (field.only_for && *field.only_for != config.model.family) continue;
        if (!fp8_key_applies(field.path, config)) continue;
        if (field.section() != section) {
            out << (section.empty() ? "" : "\n") << "[" << field.section() << "]\n";
            section = field.section();
        }
        std::string line = cat(field.key(), " = ", toml_literal(field.load(config)));
        line.resize(std::max<size_t>(line.size() + 2, 40), ' ');
        out << line << "# " << field.doc << "\n";
    }
    return out.str();
}

}  // namespace llmtrain
