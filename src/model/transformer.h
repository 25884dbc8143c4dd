// A decoder-only transformer with explicit forward and backward passes over activations
// planned up front in an Arena. Its layers are compositions of parts (model/block.h) that a
// BlockSpec, derived once from the config, chooses:
//
//   x = embed(tok) (+ learned positions);  per layer: h = x + Attention(Norm1(x));  x = h + Mlp(Norm2(h))
//   logits = head(Norm_f(x)), head = the embedding when tied;  loss = mean cross-entropy.
//
//   gpt2:  LayerNorm, learned positions, biases everywhere, GELU MLP, tied embeddings by default.
//   llama: RMSNorm, RoPE inside attention, grouped-query attention, optional QKV bias (Qwen2),
//          SwiGLU MLP, no other biases.
// Each part registers its parameters (in Hugging Face's names), plans its activation slots
// and runs its forward and backward; the layer loop (layer_fwd, layer_bwd) calls them in
// order and runs the attention proper between the attention part's projections (over the
// micro-batch, around the context-parallel ring, or against a KV cache). Each layer holds its
// own MLP part, so layers of another kind (experts) can sit beside dense ones.
//
// A Transformer may hold only part of the model (ModelPartition):
//  - Pipeline parallel: the layers [first_layer, last_layer); the first stage embeds, the
//    last one holds the final norm, the head and the loss. A stage's input and output are the
//    residual stream [B*T, d_model] (hidden_in / hidden_out, grad_output / grad_input).
//    Interleaved pipelines hold several chunks of as many layers each, chunk_stride layers
//    apart (chunk c: [first_layer + c * chunk_stride, last_layer + c * chunk_stride)); an
//    activation set belongs to one chunk, and forward / backward of a set run that chunk's
//    layers only. The embedding belongs to chunk 0, the head to the last chunk.
//  - Tensor parallel (Megatron-LM, Shoeybi et al. 2019): the heads and the MLP hidden units
//    are split across the tp ranks. QKV and MLP-up are column-parallel (their weight rows are
//    split, the input is whole: the input gradient is all-reduced in backward); attention-out
//    and MLP-down are row-parallel (their weight columns are split: the output is all-reduced
//    in forward). The embedding and the head are vocab-parallel: each rank holds a slice of
//    the vocabulary, the embedding output is all-reduced, and the cross-entropy reduces its
//    row max and sum of exponentials across ranks, so the full logits never exist anywhere.
//    The vocabulary rows are padded to a multiple of tp * model.pad_vocab_to (Megatron's
//    make-vocab-size-divisible-by): the padded rows start at zero, and the loss masks their
//    classes out of the softmax, so they change no loss and no gradient of a real row.
//  - Sequence parallel (Korthikanti et al. 2022), an option of tensor parallelism: outside
//    the tensor-parallel matmuls (norms, residual adds) each tp rank holds only its 1/tp of
//    the tokens. The whole rows are all-gathered before a column-parallel matmul (and again
//    in its backward), and a row-parallel output is reduce-scattered instead of all-reduced.
//    The norms' parameter gradients are then partial sums over the tp ranks (flagged in the
//    registry: the trainer sums them). Stage inputs and outputs are this rank's tokens.
//  - Several activation sets: a pipeline stage keeps the activations of every micro-batch in
//    flight between its forward and its backward.
//
// Activation recomputation trades compute for memory (Korthikanti et al. 2022):
//  - none: every layer keeps what its backward reads.
//  - selective: the norm outputs and the MLP activation (GELU / SwiGLU output) are not kept;
//    one scratch copy serves every layer and backward recomputes them (cheap, elementwise).
//  - full: a layer keeps only its input; backward re-runs the layer's forward into one
//    shared scratch set (about one more forward pass of compute).
// The recomputed values are bitwise those of the forward: the losses do not change.
//
// Precision: activations and the weights they meet are in the compute dtype (bf16 / f16 on
// CUDA, f32 or f64 on the CPU); parameter gradients are in the master dtype (f32); norm
// statistics, attention's saved values and losses in the backend's statistics dtype.
//
// The model knows nothing of MPI: it is handed the tp group's Comm.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "core/arena.h"
#include "model/block.h"
#include "model/fp8_linear.h"
#include "model/kv_cache.h"
#include "model/parameters.h"
#include "parallel/comm.h"
#include "parallel/parameter_store.h"

namespace llmtrain {

struct ModelPartition {
    int64_t first_layer = 0;
    int64_t last_layer = -1;       // exclusive; -1: n_layers (with chunks: chunk 0's layers)
    int64_t chunks = 1;            // model chunks held (interleaved pipeline), alike in size
    int64_t chunk_stride = 0;      // global layers from one chunk's first layer to the next's
    bool has_embedding = true;     // chunk 0 of the first pipeline stage
    bool has_head = true;          // the last chunk of the last pipeline stage
    // Per chunk: micro-batches whose activations are kept at once.
    std::vector<int64_t> activation_sets = {1};
    int64_t param_pad_multiple = 1;  // the flat parameter buffer's length is a multiple of this (dp)
    GradStorage grad_storage = GradStorage::flat;  // bound: no flat gradient buffer (ZeRO-2 binds group buffers)
    ValueStorage value_storage = ValueStorage::flat;  // bound: no flat compute copy (ZeRO-3 binds gathered groups)
    bool sequence_parallel = false;  // with tp > 1: split the tokens outside the tp matmuls
    bool tp_overlap = false;         // with sequence_parallel: its collectives overlapped with the matmuls
    Recompute recompute = Recompute::none;  // activation recomputation (see above)
    // Packed documents (data.attention_mask = "document", data.reset_position_ids): each
    // forward derives every sequence's document starts from its tokens (document_starts
    // below) and keeps them with the set's activations, so every stage needs the tokens.
    bool document_mask = false;       // attention stays inside each token's document
    bool reset_position_ids = false;  // positions restart at each document
    int32_t document_end_token = -1;  // the end-of-text id that ends a document (>= 0 when either is on)
    bool splits_documents() const { return document_mask || reset_position_ids; }
    // Context parallelism (parallel.cp): each sequence is cut into 2 * cp_size equal chunks
    // and this part holds chunks cp_rank and 2 * cp_size - 1 - cp_rank of every sequence
    // (context_parallel.cpp); activations are planned for seq_len / cp_size tokens.
    int64_t cp_size = 1;
    int cp_rank = 0;
    // Expert parallelism (parallel.ep): each MoE layer holds its ep_rank-th share of the experts,
    // n_experts / ep_size of them, and its routed rows travel over the ep group (moe_mlp.h).
    int64_t ep_size = 1;
    int ep_rank = 0;
    // train.precision = "fp8": the blocks' linears in FP8 as the recipe says (model/fp8_linear.h),
    // but those of the first fp8.bf16_first_layers and last fp8.bf16_last_layers layers.
    std::optional<Fp8Config> fp8;
};

// Megatron's reset_attention_mask convention: the end-of-text token is the last token of its
// document. For tokens [batch * seq_len], sequences back to back, entry b*T + t is the
// position in sequence b where t's document starts: one past the last end_token at a
// position < t of that sequence, 0 if none.
std::vector<int32_t> document_starts(const int32_t* tokens, int64_t batch, int64_t seq_len, int32_t end_token);

// The master weights' dtype for a compute dtype: f32 under 16-bit compute; the CPU's f32 or
// f64 compute is its own master.
DType master_dtype(DType compute);

// What a part of the model holds, before anything is allocated: its parameters registered
// (names, shapes, places in the flat buffer) and its activations planned in the arena. The
// Transformer allocates exactly this; the memory plan (ops/memory_plan.h) reads its sizes
// without allocating anything.
class TransformerLayout {
public:
    // device: whose tensor layouts the activations follow (attention's saved tensor);
    // tp_group_rank of tp_group_size: which part of the tensor-parallel split this holds.
    // Throws a config error for a model or partition that cannot be laid out.
    TransformerLayout(const ModelConfig& config, Device device, DType dtype, int64_t max_batch, int64_t max_seq_len, ModelPartition partition,
                      int tp_group_rank, int tp_group_size);

    const ModelConfig& config() const { return config_; }
    const ModelPartition& partition() const { return part_; }
    Parameters& parameters() { return params_; }
    const Parameters& parameters() const { return params_; }
    DType compute_dtype() const { return dtype_; }
    size_t activation_bytes() const { return arena_.total_bytes(); }
    int64_t max_batch() const { return max_batch_; }
    int64_t max_seq_len() const { return max_seq_len_; }  // this part's tokens per sequence (seq_len / cp)
    int64_t chunk_layers() const { return part_.last_layer - part_.first_layer; }
    int64_t local_layers() const { return part_.chunks * chunk_layers(); }
    // The activation set that micro-batch m of `chunk` uses: a chunk's micro-batches run
    // forward and backward in order, so those in flight are consecutive and m modulo the
    // chunk's sets never collide.
    int64_t activation_set(int64_t chunk, int64_t micro_batch) const;
    // Which gradient buffer backward(set) works in (sets share one under a single chunk): a
    // send from it must complete before another backward on that buffer receives into it.
    int64_t grad_buffer(int64_t set) const;
    // The rows of the embedding and the head: model.vocab_size rounded up to a multiple of
    // tp * model.pad_vocab_to. Rows from vocab_size on are padding (zero, masked in the loss).
    int64_t padded_vocab_size() const { return config_.padded_vocab_size(tp_size()); }
    // The index of the token embedding (shared with the head when tied), if this part has it.
    std::optional<size_t> embedding_param() const;
    // Under partition.fp8: the linears the recipe casts (model/transformer_linear.cpp), in
    // flat order (an FP8 linear's id is its index), and each one's weight's flat elements.
    std::vector<LinearWeight> fp8_linears() const;
    std::vector<FlatRange> fp8_weight_ranges() const;
    // Their weights' shapes (this rank's part; a fused QKV's rows summed), whether they arrive
    // gathered in FP8 (fp8.param_gather where ZeRO-3 binds the values), and the bytes their
    // Fp8Linears allocate (fp8_buffers; 0 without FP8).
    std::vector<Fp8LinearShape> fp8_linear_shapes() const;
    bool fp8_weights_gathered() const { return part_.fp8 && part_.fp8->param_gather && part_.value_storage == ValueStorage::bound; }
    size_t fp8_bytes() const;
    // Parameter indices [begin, end) whose gradients backward writes together, in the order
    // it writes them: the final norm and head, each layer from the last, the embedding part.
    // The hooks of a backward are called with exactly these groups. (A head tied to this
    // stage's embedding writes the embedding's gradient too, before its group begins.)
    struct ParamGroup {
        size_t begin = 0, end = 0;
    };
    std::vector<ParamGroup> gradient_groups() const;

protected:
    // A layer's parts (model/block.h), in the order they run, and its parameter indices.
    struct LayerParts {
        Norm norm1;
        Attention attention;
        Norm norm2;
        std::unique_ptr<MlpPart> mlp;
        size_t begin = 0, end = 0;
        bool experts = false;  // the MLP is a mixture of experts (model.moe)
    };
    struct LayerSlots {
        NormSlots norm1;
        AttentionSlots attention;
        Arena::Slot resid_mid;  // x + attention's output
        NormSlots norm2;
        MlpSlots mlp;
    };
    // What one micro-batch keeps between its forward and its backward.
    struct ActivationSet {
        Arena::Slot tokens, targets;
        Arena::Slot doc_starts;  // i32 [B*T] when the partition splits documents (without cp)
        // Context parallelism: each row's position in its sequence (restarts applied) for
        // rope and the learned positions, and the first position it may attend to (its
        // document's start; document mask only). i32 [B*T] of this rank's chunks.
        Arena::Slot positions, first_position;
        std::vector<Arena::Slot> residual;  // entering each local layer; the last is the stage output
        std::vector<LayerSlots> layers;
        NormSlots norm_f;
        Arena::Slot logits, losses, lse, row_max, xent_partial;
        Arena::Slot d_resid;  // the residual stream's gradient in backward (shared under one chunk)
        int64_t chunk = 0;
        bool embeds = false, heads = false;  // chunk 0 with the embedding; the last chunk with the head
        int64_t batch = 0, seq_len = 0;  // seq_len: this rank's tokens per sequence (the sequence's / cp)
        bool has_targets = false;
        bool logits_hold_gradient = false;  // the fused classifier ran: backward starts from them
    };

    // The embedding (with learned positions), each layer's parts, the final norm and the head.
    void register_params();
    LayerParts make_layer(int64_t layer) const;  // the parts of a layer, their parameters not yet registered
    // One layer's parts of each MLP kind this part holds (dense, experts): the shared slots of
    // recomputation and backward serve every kind.
    std::vector<LayerParts> layer_kinds() const;
    LayerParts register_layer(int64_t layer);
    ParamAdder param_adder() { return {params_, sp_}; }
    // The token embedding or the head: padded vocabulary rows, split by rows across tp.
    ParamSpan add_vocab_rows(const std::string& name);

    void plan_activations();
    std::vector<int64_t> global_layers() const;  // the layers held, chunk by chunk
    ActivationSet reserve_set(int64_t set, int64_t chunk);
    // The index in layers_ of a set's local layer l.
    size_t param_layer(const ActivationSet& a, int64_t l) const { return static_cast<size_t>(a.chunk * chunk_layers() + l); }
    LayerSlots reserve_layer(const std::string& prefix, bool keep_recomputed, const LayerParts& parts);
    SlotPlanner slot_planner() { return {arena_, dtype_, stat_dtype_, max_batch_ * max_seq_len_, local_tokens(max_batch_, max_seq_len_)}; }
    int64_t local_tokens(int64_t batch, int64_t seq_len) const;
    int tp_rank() const { return tp_rank_; }
    int tp_size() const { return tp_size_; }

    ModelConfig config_;
    BlockSpec spec_;  // the parts a layer is made of
    Device device_;
    DType dtype_;       // activations and compute weights
    DType stat_dtype_;  // norm statistics, attention's saved values, losses
    int64_t max_batch_, max_seq_len_;
    ModelPartition part_;
    int tp_rank_, tp_size_;
    bool sp_;                       // sequence parallel
    int64_t n_heads_, n_kv_heads_;  // this rank's heads

    Parameters params_;
    ParamSpan wte_, wpe_, head_w_;  // wpe_: learned positions only
    Norm final_norm_;
    size_t head_begin_ = 0;  // first parameter index of the final norm and head
    std::vector<LayerParts> layers_;

    Arena arena_;
    Arena::Slot rope_table_;
    Arena::Slot loss_sum_, balance_loss_sum_;
    LayerSlots shared_layer_;  // recomputation's scratch (unused with Recompute::none)
    AttentionScratch attention_grad_;  // the layers' backward scratch
    MlpScratch mlp_grad_;
    std::vector<ActivationSet> sets_;  // chunk by chunk
    std::vector<int64_t> chunk_first_set_;
    Arena::Slot proj_out_, proj_local_, gathered_, d_norm_, d_norm_local_, d_gathered_;
    // Context parallelism's ring (context_parallel.cpp): two key/value blocks [B*T, 2*Hkv*D]
    // (the one computing, the one arriving), the f32 output (forward) or query-gradient
    // (backward) accumulator [B*T, H*D], two f32 key/value-gradient blocks being summed and
    // the one arriving, and every cp rank's chunk positions [cp, T].
    struct RingSlots {
        std::array<Arena::Slot, 2> kv, dkv;
        Arena::Slot acc, dkv_in, chunk_positions;
    };
    RingSlots ring_;
    bool context_parallel() const { return part_.cp_size > 1; }
    void plan_ring();
};

// The parts of a layer compute through LayerOps (model/block.h): the backend, the rows of
// this micro-batch, the parameters and the tensor-parallel matmuls (sequence_parallel.cpp).
class Transformer : public TransformerLayout, private LayerOps {
public:
    // Activations are planned for micro-batches of up to max_batch sequences of up to
    // max_seq_len tokens (<= config.max_seq_len). tp: the tensor-parallel group (null: none).
    // dtype: the compute dtype; the master weights are f32 when it is a 16-bit type.
    // cp: the context-parallel group, whose size and rank are partition.cp_size and cp_rank
    // (null: none) ep: the expert group, whose size and rank are partition.ep_size and ep_rank (null: none).
    Transformer(const ModelConfig& config, Backend& backend, DType dtype, int64_t max_batch, int64_t max_seq_len,
                ModelPartition partition = {}, Comm* tp = nullptr, Comm* cp = nullptr, Comm* ep = nullptr);

    void initialize(uint64_t seed) { params_.initialize(seed, config_.init_std, config_.n_layers); }
    // The same initial master weights for flat elements `range` alone, into `out` (a shard of them).
    void initialize_range(uint64_t seed, FlatRange range, const Tensor& out) const { params_.initialize_range(seed, config_.init_std, config_.n_layers, range, out); }

    // Runs this part of the model on activation set `set`. seq_len is the whole sequence's
    // length: under context parallelism tokens and targets hold whole sequences too, and
    // this part takes its chunks of them. tokens (i32 [batch * seq_len],
    // sequences back to back) are read by the first stage (and by every stage when the
    // partition splits documents), targets by the last one (empty: logits only). A stage without the embedding reads hidden_in(set). On the last stage
    // with targets the mean loss is added to loss_sum() on the device; nothing is read back.
    // backward_loss_scale: the loss scale the set's backward will take, given by a training
    // step: the classifier then computes the loss and the logits' gradient in one pass (the
    // logits hold that gradient afterwards). Without it the logits stay logits.
    void forward_pass(int64_t set, const Tensor& tokens, const Tensor& targets, int64_t batch, int64_t seq_len,
                      std::optional<double> backward_loss_scale = std::nullopt);
    // forward_pass, then the mean loss read to the host (a host synchronization) on the last
    // stage with targets, NaN otherwise: evaluation and tools, not the training step.
    double forward(int64_t set, const Tensor& tokens, const Tensor& targets, int64_t batch, int64_t seq_len);
    // The sum of the mean losses of the forwards since reset_loss_sum(): f64 [1] in the
    // backend's memory (the training step's, read once when the step closes).
    Tensor loss_sum() const { return arena_.tensor(loss_sum_); }
    // The sum of the balancing losses (a MoE layer's aux and z losses, with their
    // coefficients) of the forwards since reset_loss_sum(): f64 [1], in the backend's memory.
    // They are part of what backward differentiates, not of the mean loss. Empty for a dense model.
    Tensor balance_loss_sum() const { return arena_.tensor(balance_loss_sum_); }
    // Also the experts' loads (expert_loads), on every stage: a training step starts here.
    void reset_loss_sum();
    // Each MoE layer this part holds (its global index) with its routing since reset_loss_sum().
    std::vector<std::pair<int64_t, ExpertLoad>> expert_loads() const;
    // A MoE layer's expert biases (load_balancing = "expert_bias"), if this part holds it.
    void set_expert_bias(int64_t layer, const std::vector<float>& bias);
    // Accumulates d(loss_scale * mean loss)/d(parameters) of set's last forward into the
    // parameter gradients. A stage without the head first reads grad_output(); a stage
    // without the embedding leaves d(loss)/d(input) in grad_input(). Overwrites the logits.
    void backward(int64_t set, double loss_scale);
    // FP8 (partition.fp8; null otherwise): the linears' scaling state. After each optimizer
    // step the trainer agrees on its step amaxes and closes its step (Fp8Linears::close_step).
    Fp8Linears* fp8() const { return fp8_.get(); }

    // One micro-batch, set 0: the whole-model interface.
    double forward(const Tensor& tokens, const Tensor& targets, int64_t batch, int64_t seq_len) { return forward(0, tokens, targets, batch, seq_len); }
    void backward(double loss_scale) { backward(0, loss_scale); }

    // A non-first stage's input [tokens, d_model] (tokens: batch * seq_len, or this rank's
    // share of them under sequence parallelism), filled before forward(set).
    Tensor hidden_in(int64_t set, int64_t batch, int64_t seq_len) const;
    Tensor hidden_out(int64_t set) const;  // a non-last stage's output, after forward(set)
    // d(loss)/d(hidden_out) of set's micro-batch, filled before backward(set).
    Tensor grad_output(int64_t set, int64_t batch, int64_t seq_len) const;
    Tensor grad_input(int64_t set) const;  // d(loss)/d(hidden_in), after backward(set)
    // Logits [batch * seq_len, padded vocab / tp] of set 0's last forward (this rank's vocab
    // slice). Columns of padded classes (global index >= vocab_size) are not predictions.
    Tensor logits() const;
    // One row of those logits, on the host (from device memory and 16-bit as needed).
    std::vector<double> logits_row(int64_t row) const;
    VocabShard vocab_shard() const;
    Backend& backend() const override { return backend_; }

    // Incremental decoding (model/kv_cache.h): runs position cache.length of one sequence on
    // `token`, its attention reading the cached keys and values of the positions before it,
    // and appends its own; the logits are then row 0 of logits(). Needs the whole model in
    // this process (no tensor or pipeline parallelism).
    KvCache make_kv_cache() const;
    void decode(int32_t token, KvCache& cache);

    // Called during backward with [begin, end) parameter indices whose gradients are final
    // for this backward: data parallelism starts reducing them while backward goes on.
    void set_grads_ready_hook(std::function<void(size_t begin, size_t end)> hook) { grads_ready_ = std::move(hook); }
    // Called during backward with a group of gradient_groups() before backward first writes
    // its gradients: ZeRO-2 binds their storage there.
    void set_grads_begin_hook(std::function<void(size_t begin, size_t end)> hook) { grads_begin_ = std::move(hook); }
    // Where each group of gradient_groups() that a pass (one forward or backward of a set, or
    // one decoding step) computes with gets its weights: before the group runs, the model asks
    // for them and holds the handle while it computes. `pass` lists those groups by their
    // first parameter in the order the pass takes them, `position` the one about to run.
    // ZeRO-3's parameter store gathers the group's values there and starts the gathers of the
    // groups after it. A backward lists the groups whose backward reads their values: not the
    // embedding's (its gradient needs only the tokens). Unset: the values are in place.
    using GroupWeightsSource = std::function<GroupWeights(const std::vector<size_t>& pass, size_t position)>;
    void set_group_weights(GroupWeightsSource source) { group_weights_ = std::move(source); }
    // The groups a forward (or backward) of `set` computes with, in order.
    std::vector<ParamGroup> forward_groups(int64_t set) const;
    std::vector<ParamGroup> backward_groups(int64_t set) const;

private:
    // Rebuilds what recomputation dropped, before layer l's backward.
    void recompute_layer(const ActivationSet& a, int64_t l);
    // Copies i32 ids from the host into a slot, checking each is inside the vocabulary.
    void load_ids(const char* what, Arena::Slot slot, const Tensor& ids);
    double mean_loss(const ActivationSet& a) const;

    Tensor value(ParamSpan p) const override { return p.present ? params_.value_span(p.first, p.last) : Tensor(); }
    Tensor grad(ParamSpan p) const override { return p.present ? params_.grad_span(p.first, p.last) : Tensor(); }
    // Row-parallel biases are added once: by tp rank 0, before the output's all-reduce.
    Tensor row_parallel_bias(ParamSpan p) const override { return tp_rank() == 0 ? value(p) : Tensor(); }
    Tensor rows(Arena::Slot slot) const override;        // the first batch * seq_len rows of a slot
    Tensor local_rows(Arena::Slot slot) const override;  // the first local_tokens() rows of a slot
    Tensor planned(Arena::Slot slot) const override { return arena_.tensor(slot); }
    Tensor part_output(int64_t n) const override;  // proj_local_ (sequence parallel) or proj_out_
    int64_t sequence_tokens() const override { return seq_len_; }
    double backward_loss_scale() const override { return backward_loss_scale_ * static_cast<double>(part_.cp_size); }
    int64_t token_shards() const override { return (sp_ ? tp_size() : 1) * part_.cp_size; }
    void sum_over_token_shards(std::initializer_list<Tensor> tensors) override;
    Comm* expert_group() const override { return ep_; }
    void add_balance_loss(const Tensor& loss, double scale) override;
    bool recomputing() const override { return recomputing_; }
    // Starts gathering this rank's rows `local` into `whole` (rank r's at rows r * local.dim(0)).
    CommHandle start_gather(const Tensor& local, const Tensor& whole);
    // Whole rows for a column-parallel matmul from this rank's rows (sequence parallel:
    // all-gathered into `scratch`; otherwise the rows are whole already).
    Tensor gather_rows(const Tensor& local, Arena::Slot scratch);
    // The sum over the tp ranks of a row-parallel output: this rank's rows of it (sequence
    // parallel: reduce-scattered into `local`; otherwise all-reduced in place).
    Tensor reduce_rows(const Tensor& partial, Arena::Slot local);
    Tensor gather_output_grad(const Tensor& d_local) override { return gather_rows(d_local, d_gathered_); }
    // The row block of sequence parallelism's forward matmuls for n rows per rank: the
    // overlap's piece (n / tp rows) on a backend that keeps row blocks, so that the plain and
    // the overlapped matmuls sum alike; 0 otherwise.
    int64_t forward_row_block(int64_t n) const;
    // A column-parallel matmul of this rank's rows `local`: whole rows under sequence
    // parallelism, with parallel.tp_overlap gathered in tp pieces, each piece's all-gather in
    // flight while the previous piece multiplies (sequence_parallel.cpp).
    void column_parallel(const Tensor& local, const RowsMatmul& matmul) override;
    // A row-parallel matmul writing its partial output into proj_out_'s rows; returns this
    // rank's rows of the sum over tp (reduce_rows, into proj_local_ under sequence
    // parallelism). With parallel.tp_overlap the output is made in tp pieces, each piece
    // reduce-scattered while the next multiplies.
    Tensor row_parallel(const RowsMatmul& matmul) override;
    // The backward of a column-parallel matmul whose input is this rank's rows `local_x`:
    // args.dx (whole rows, partial over tp) reduced to this rank's rows (in d_norm_local_
    // under sequence parallelism), and args.dw / args.dbias from the gathered input. With
    // parallel.tp_overlap the input's all-gather runs behind the dx matmul and dx's
    // reduce-scatter behind the dw matmul.
    Tensor column_parallel_bwd(MatmulBwd args, const Tensor& local_x, ParamSpan w = {}) override;
    // The linears' seam (transformer_linear.cpp): FP8 for a weight fp8_ids_ holds, else the
    // backend's matmuls.
    void linear_fwd(ParamSpan w, const MatmulFwd& args) override;
    void linear_bwd(ParamSpan w, const MatmulBwd& args) override;
    void linear_gelu_fwd(ParamSpan w, const MatmulGeluFwd& args) override;
    void gelu_linear_bwd(ParamSpan w, const GeluMatmulBwd& args) override;
    // The FP8 linear of weight w, or -1 when it runs in the compute dtype.
    int fp8_linear(ParamSpan w) const;
    // Under partition.fp8: an FP8 linear for each linear of the layers the recipe casts.
    void plan_fp8();
    Tensor att_saved(Arena::Slot slot) const;
    AttentionShape attention_shape() const;
    ActivationSet& use_set(int64_t set);
    void ready(size_t begin, size_t end) const;
    void writing(size_t begin, size_t end) const;
    [[nodiscard]] GroupWeights computing(const std::vector<size_t>& pass, size_t position) const;
    // What the group-compute hook is given for a forward (or backward) of `set`: each group's
    // first parameter; nothing without a hook.
    std::vector<size_t> hooked_pass(bool forward, int64_t set) const;
    ParamGroup head_group() const { return {head_begin_, params_.count()}; }
    ParamGroup layer_group(const ActivationSet& a, int64_t l) const {
        const LayerParts& p = layers_[param_layer(a, l)];
        return {p.begin, p.end};
    }
    ParamGroup embedding_group() const { return {0, layers_.empty() ? head_begin_ : layers_.front().begin}; }

    // Positions start at 0, or (decoding) at the cache's length.
    void embed(const ActivationSet& a, const KvCache* cache = nullptr);
    // The set's document starts where attention masks documents (or positions restart), else
    // empty: causal attention, positions n % seq_len.
    Tensor attention_doc_starts(const ActivationSet& a) const { return part_.document_mask ? rows(a.doc_starts) : Tensor(); }
    Tensor position_doc_starts(const ActivationSet& a) const { return part_.reset_position_ids ? rows(a.doc_starts) : Tensor(); }
    // Derives the set's document starts from the micro-batch's tokens (host i32).
    void load_document_starts(const ActivationSet& a, const Tensor& tokens);
    // Context parallelism (context_parallel.cpp). This rank's chunks of whole sequences
    // [batch * seq_len] (host i32), empty if `whole` is.
    std::vector<int32_t> context_chunks(const Tensor& whole, int64_t seq_len) const;
    // The set's positions (and first positions under a document mask) from the whole
    // sequences' tokens (needed only when documents split them) and the chunk positions.
    void load_context_positions(const ActivationSet& a, const Tensor& whole_tokens, int64_t seq_len);
    // Position rows for rope and the embedding: the set's explicit positions under cp.
    Tensor explicit_positions(const ActivationSet& a) const { return context_parallel() ? rows(a.positions) : Tensor(); }
    // Attention over the ring of cp ranks: s.out and the merged log-sum-exp in s.saved
    // (forward); attention_grad_.d_qkv from its d_out (backward).
    void ring_attention_fwd(const ActivationSet& a, const AttentionSlots& s);
    struct RingPass {
        AttentionShape shape;
        int64_t q_width = 0, kv_width = 0;
        Tensor qkv;
        std::array<Tensor, 2> kv;
        Tensor chunk_positions, first;
        Tensor positions_of(int rank, int64_t rows) const { return chunk_positions.slice_rows(rank * rows, rows); }
    };
    RingPass ring_pass(const ActivationSet& a, const AttentionSlots& s) const;
    void ring_attention_bwd(const ActivationSet& a, const AttentionSlots& s);
    // The final norm, the head and (with targets) the loss, its mean added to loss_sum(); with
    // a backward loss scale the logits' gradient too (see forward_pass).
    void head_and_loss(ActivationSet& a, std::optional<double> backward_loss_scale = std::nullopt);
    void head_backward(const ActivationSet& a, double loss_scale);
    // d(loss_scale * mean loss) / d(loss_n) for each of the set's tokens.
    double loss_gradient(double loss_scale) const;
    // The layer's parts in order: norm1, attention (its projections around attend), the
    // residual add fused with norm2, the MLP, the residual add. cache: decoding one position
    // against it (else the whole sequence attends to itself).
    void layer_fwd(const ActivationSet& a, int64_t local, KvCache* cache = nullptr);
    // Causal (or document-masked) attention over the layer's packed, rotated QKV rows into
    // s.out: over the micro-batch, around the cp ring, or (decoding with a cache) over the
    // cached positions of its one sequence.
    void attend(const ActivationSet& a, const AttentionSlots& s, int64_t local, KvCache* cache);
    void attend_bwd(const ActivationSet& a, const AttentionSlots& s);
    // The positions rotary embeddings rotate the set's rows by (all but Rope::x and the heads):
    // from the cache's length when decoding, explicit under context parallelism.
    Rope rope_positions(const ActivationSet& a, const KvCache* cache) const;
    Rope rope_positions_bwd(const ActivationSet& a) const;
    // d_resid: on entry the gradient w.r.t. the layer's output, on exit w.r.t. its input.
    void layer_bwd(const ActivationSet& a, int64_t local, const Tensor& d_resid);

    Backend& backend_;
    Comm* tp_;                      // null without tensor parallelism
    Comm* cp_;                      // null without context parallelism
    Comm* ep_;                      // null without expert parallelism
    int64_t chunk_positions_len_ = 0;  // the sequence length ring_.chunk_positions was filled for
    int64_t batch_ = 0, seq_len_ = 0;
    double backward_loss_scale_ = 1;  // the backward running now's
    bool recomputing_ = false;        // full recomputation's forward of a layer
    std::function<void(size_t, size_t)> grads_ready_, grads_begin_;
    GroupWeightsSource group_weights_;
    std::unique_ptr<Fp8Linears> fp8_;          // null unless partition.fp8
    std::unordered_map<size_t, int> fp8_ids_;  // a linear's first weight parameter -> its FP8 linear
};

}  // namespace llmtrain
