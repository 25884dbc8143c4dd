#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "model/moe_mlp.h"

namespace llmtrain {

namespace {
// Host values of any float dtype, as doubles.
std::vector<double> host_doubles(Backend& backend, const Tensor& t) {
    std::vector<char> raw(t.bytes());
    backend.copy_to_host(raw.data(), t);
    std::vector<double> out(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < out.size(); ++i) {
        const char* p = raw.data() + i * dtype_size(t.dtype());
        uint16_t half = 0;
        if (t.dtype() == DType::bf16 || t.dtype() == DType::f16) std::memcpy(&half, p, sizeof half);
        switch (t.dtype()) {
            case DType::f32: { float f; std::memcpy(&f, p, sizeof f); out[i] = f; break; }
            case DType::f64: std::memcpy(&out[i], p, sizeof(double)); break;
            case DType::bf16: out[i] = bf16_to_float(half); break;
            case DType::f16: out[i] = f16_to_float(half); break;
            default: fail(ErrorKind::unsupported, "host_doubles: dtype ", dtype_name(t.dtype()));
        }
    }
    return out;
}

// Writes host doubles into a tensor of any float dtype (rounded to it).
void copy_doubles_to(Backend& backend, const Tensor& t, const std::vector<double>& values) {
    std::vector<char> raw(t.bytes());
    for (size_t i = 0; i < values.size(); ++i) {
        char* p = raw.data() + i * dtype_size(t.dtype());
        const auto f = static_cast<float>(values[i]);
        uint16_t half = 0;
        switch (t.dtype()) {
            case DType::f32: std::memcpy(p, &f, sizeof f); break;
            case DType::f64: std::memcpy(p, &values[i], sizeof(double)); break;
            case DType::bf16: half = float_to_bf16(f); std::memcpy(p, &half, sizeof half); break;
            case DType::f16: half = float_to_f16(f); std::memcpy(p, &half, sizeof half); break;
            default: fail(ErrorKind::unsupported, "copy_doubles_to: dtype ", dtype_name(t.dtype()));
        }
    }
    backend.copy_from_host(t, raw.data());
}

constexpr TensorSplit kRows{TpSplit::rows, 1};
}  // namespace

DType master_dtype(DType compute) { return compute == DType::bf16 || compute == DType::f16 ? DType::f32 : compute; }

TransformerLayout::TransformerLayout(const ModelConfig& config, Device device, DType dtype, int64_t max_batch, int64_t max_seq_len,
                                     ModelPartition partition, int tp_group_rank, int tp_group_size)
    : config_(config), spec_(block_spec(config)), device_(device), dtype_(dtype), stat_dtype_(statistics_dtype(dtype)), max_batch_(max_batch),
      max_seq_len_(max_seq_len / std::max<int64_t>(1, partition.cp_size)),
      part_(partition), tp_rank_(tp_group_rank), tp_size_(tp_group_size), sp_(partition.sequence_parallel && tp_group_size > 1),
      params_(tp_group_rank, tp_group_size) {
    if (max_seq_len > config.max_seq_len)
        fail(ErrorKind::config, "sequence length ", max_seq_len, " exceeds model.max_seq_len = ", config.max_seq_len);
    if (partition.cp_size < 1 || partition.cp_rank < 0 || partition.cp_rank >= partition.cp_size ||
        (partition.cp_size > 1 && max_seq_len % (2 * partition.cp_size) != 0))
        fail(ErrorKind::config, "parallel.cp = ", partition.cp_size, " cuts sequences of ", max_seq_len, " tokens into 2 x cp equal chunks: the length must be a multiple of ",
             2 * partition.cp_size);
    if (partition.ep_size < 1 || partition.ep_rank < 0 || partition.ep_rank >= partition.ep_size ||
        (partition.ep_size > 1 && (!config.moe.enabled() || config.moe.n_experts % partition.ep_size != 0)))
        fail(ErrorKind::config, "parallel.ep = ", partition.ep_size, " shares out the experts of each MoE layer: it must divide model.moe.n_experts = ",
             config.moe.n_experts, " (and needs a mixture-of-experts model)");
    if (part_.last_layer < 0) part_.last_layer = config.n_layers;
    const int64_t last_chunk_end = part_.last_layer + (part_.chunks - 1) * part_.chunk_stride;
    const bool sets_ok = static_cast<int64_t>(part_.activation_sets.size()) == part_.chunks &&
                         std::all_of(part_.activation_sets.begin(), part_.activation_sets.end(), [](int64_t n) { return n >= 1; });
    if (part_.first_layer < 0 || part_.first_layer > part_.last_layer || part_.chunks < 1 || last_chunk_end > config.n_layers ||
        (part_.chunks > 1 && part_.chunk_stride < part_.last_layer - part_.first_layer) || !sets_ok)
        fail(ErrorKind::runtime, "model partition: ", part_.chunks, " chunks of layers [", part_.first_layer, ", ", part_.last_layer, ") every ",
             part_.chunk_stride, " layers of ", config.n_layers, ", activation sets for ", part_.activation_sets.size(), " chunks");
    // The vocabulary rows need no check: padded_vocab_size() is a multiple of tp.
    if (config.n_heads % tp_size() || config.n_kv_heads % tp_size())
        fail(ErrorKind::config, "tp = ", tp_size(), " must divide model.n_heads = ", config.n_heads, " and model.n_kv_heads = ", config.n_kv_heads);
    if (sp_ && (max_batch * max_seq_len) % tp_size() != 0)
        fail(ErrorKind::config, "sequence parallelism splits the ", max_batch * max_seq_len, " tokens of a micro-batch into tp = ", tp_size(),
             " equal parts: batch_size * seq_len must be a multiple of tp");
    n_heads_ = config.n_heads / tp_size();
    n_kv_heads_ = config.n_kv_heads / tp_size();
    register_params();
    plan_activations();
}

Transformer::Transformer(const ModelConfig& config, Backend& backend, DType dtype, int64_t max_batch, int64_t max_seq_len,
                         ModelPartition partition, Comm* tp, Comm* cp, Comm* ep)
    : TransformerLayout(config, backend.device(), dtype, max_batch, max_seq_len, partition, tp ? tp->rank() : 0, tp ? tp->size() : 1),
      backend_(backend), tp_(tp && tp->size() > 1 ? tp : nullptr), cp_(cp && cp->size() > 1 ? cp : nullptr), ep_(ep && ep->size() > 1 ? ep : nullptr) {
    if (context_parallel() != (cp_ != nullptr) || (cp_ && (cp_->size() != part_.cp_size || cp_->rank() != part_.cp_rank)))
        fail(ErrorKind::runtime, "model partition: context parallelism over ", part_.cp_size, " ranks (rank ", part_.cp_rank, ") but the cp group has ",
             cp_ ? cp_->size() : 1, " ranks");
    if ((part_.ep_size > 1) != (ep_ != nullptr) || (ep_ && (ep_->size() != part_.ep_size || ep_->rank() != part_.ep_rank)))
        fail(ErrorKind::runtime, "model partition: expert parallelism over ", part_.ep_size, " ranks (rank ", part_.ep_rank, ") but the ep group has ",
             ep_ ? ep_->size() : 1, " ranks");
    if (part_.splits_documents() && part_.document_end_token < 0)
        fail(ErrorKind::config, part_.document_mask ? "data.attention_mask = \"document\"" : "data.reset_position_ids = true",
             " needs the end-of-text token that ends each document; the run's tokenizer has none");
    params_.allocate(backend, master_dtype(dtype), dtype, part_.param_pad_multiple, part_.grad_storage, part_.value_storage);
    arena_.allocate(backend.device(), [&backend](size_t bytes) { return backend.allocate(bytes); });
    if (spec_.positions == PositionScheme::rotary) {
        const Tensor table = arena_.tensor(rope_table_);
        const OwnedTensor host(table.dtype(), table.shape());
        fill_rope_table(host, config_.rope_theta);
        backend.copy_from_host(table, host.view().raw());
    }
    plan_fp8();
}

// A [padded vocabulary, d_model] table split by rows across tp: its rows from vocab_size
// on are padding, initialized to zero (and kept there: no token reads them and the loss
// gives them no gradient).
ParamSpan TransformerLayout::add_vocab_rows(const std::string& name) {
    const ParamSpan p = param_adder().add(name, {padded_vocab_size(), config_.d_model}, ParamInit::normal, true, kRows);
    params_.set_real_rows(p.first, config_.vocab_size);
    return p;
}

std::optional<size_t> TransformerLayout::embedding_param() const {
    if (part_.has_embedding) return wte_.first;
    if (config_.tied_embeddings && part_.has_head) return head_w_.first;
    return std::nullopt;
}

// In the order of the flat buffer: the embedding (and learned positions), each layer's parts,
// the final norm and the head; names and parts as the block spec says (model/block.cpp).
void TransformerLayout::register_params() {
    const ParamNames& names = spec_.names;
    ParamAdder adder = param_adder();
    if (part_.has_embedding) {
        wte_ = add_vocab_rows(names.embedding + ".weight");
        if (spec_.positions == PositionScheme::learned)
            wpe_ = adder.add(names.positions + ".weight", {config_.max_seq_len, config_.d_model}, ParamInit::normal, true);
    }
    for (const int64_t l : global_layers()) layers_.push_back(register_layer(l));
    if (!part_.has_head) return;
    head_begin_ = params_.count();
    final_norm_ = Norm(spec_.norm, config_.norm_eps);
    final_norm_.register_params(adder, names.final_norm, config_.d_model);
    if (!config_.tied_embeddings) head_w_ = add_vocab_rows(names.head + ".weight");
    else if (part_.has_embedding) head_w_ = wte_;
    else head_w_ = add_vocab_rows(names.embedding + ".weight");  // the last stage's copy
}

TransformerLayout::LayerParts TransformerLayout::make_layer(int64_t layer) const {
    const Attention::Heads heads{.d_model = config_.d_model, .n_heads = config_.n_heads, .n_kv_heads = config_.n_kv_heads,
                                 .head_dim = config_.head_dim(), .local_heads = n_heads_, .local_kv_heads = n_kv_heads_};
    const MoeConfig& moe = config_.moe;
    // A MoE layer's shared experts are a dense MLP of their width (moe_mlp.h).
    const auto dense = [&](int64_t d_ff) { return make_mlp(spec_, {.d_model = config_.d_model, .d_ff = d_ff, .tp_size = tp_size()}); };
    std::unique_ptr<MlpPart> mlp =
        moe.is_moe_layer(layer)
            ? make_moe_mlp(moe,
                           {.d_model = config_.d_model, .n_experts = moe.n_experts, .top_k = moe.top_k, .d_ff = moe.d_ff_expert, .seq_len = max_seq_len_,
                            .ep_size = part_.ep_size, .ep_rank = part_.ep_rank},
                           moe.n_shared_experts > 0 ? dense(moe.shared_d_ff()) : nullptr)
            : dense(config_.d_ff);
    return {.norm1 = Norm(spec_.norm, config_.norm_eps), .attention = Attention(spec_, heads), .norm2 = Norm(spec_.norm, config_.norm_eps),
            .mlp = std::move(mlp), .begin = 0, .end = 0, .experts = moe.is_moe_layer(layer)};
}

std::vector<TransformerLayout::LayerParts> TransformerLayout::layer_kinds() const {
    std::vector<LayerParts> kinds;
    const std::vector<int64_t> held = global_layers();
    for (const bool experts : {false, true}) {
        const auto it = std::find_if(held.begin(), held.end(), [&](int64_t l) { return config_.moe.is_moe_layer(l) == experts; });
        if (it != held.end()) kinds.push_back(make_layer(*it));
    }
    if (kinds.empty()) kinds.push_back(make_layer(0));
    return kinds;
}

namespace {
// One set of shared slots serving several MLP kinds: a dense part plans up and act, a MoE
// part its own (moe), each leaving the other's untouched.
MlpSlots serving_both(MlpSlots shared, const MlpSlots& kind, bool experts) {
    if (experts) shared.moe = kind.moe;
    else shared.up = kind.up, shared.act = kind.act;
    return shared;
}
MlpScratch serving_both(MlpScratch shared, const MlpScratch& kind, bool experts) {
    if (experts) shared.moe = kind.moe;
    else shared.d_act = kind.d_act, shared.d_up = kind.d_up;
    return shared;
}
}  // namespace

TransformerLayout::LayerParts TransformerLayout::register_layer(int64_t layer) {
    const ParamNames& names = spec_.names;
    ParamAdder adder = param_adder();
    LayerParts p = make_layer(layer);
    p.begin = params_.count();
    p.norm1.register_params(adder, names.in_layer(layer, names.norm1), config_.d_model);
    p.attention.register_params(adder, names, layer);
    p.norm2.register_params(adder, names.in_layer(layer, names.norm2), config_.d_model);
    p.mlp->register_params(adder, names, layer);
    p.end = params_.count();
    return p;
}

// A layer's slots, part by part. With keep_recomputed false, the slots selective
// recomputation rebuilds (the norms and the MLP activation) are the shared scratch set's.
TransformerLayout::LayerSlots TransformerLayout::reserve_layer(const std::string& p, bool keep_recomputed, const LayerParts& parts) {
    const SlotPlanner plan = slot_planner();
    const AttentionShape full{max_batch_, max_seq_len_, n_heads_, n_kv_heads_, config_.head_dim()};
    LayerSlots ls = shared_layer_;
    if (keep_recomputed) ls.norm1 = parts.norm1.reserve(plan, p + ".norm1", config_.d_model);
    // Under context parallelism the ring keeps the merged log-sum-exp [B, H, T] whatever the device.
    const Shape saved = context_parallel() ? Shape{max_batch_, n_heads_, max_seq_len_} : attention_saved_shape(device_, full);
    ls.attention = parts.attention.reserve(plan, p, saved);
    ls.resid_mid = arena_.reserve(p + ".resid_mid", dtype_, {plan.local_rows, config_.d_model});
    if (keep_recomputed) ls.norm2 = parts.norm2.reserve(plan, p + ".norm2", config_.d_model);
    ls.mlp = parts.mlp->reserve(plan, p, keep_recomputed ? nullptr : &shared_layer_.mlp);
    return ls;
}

std::vector<int64_t> TransformerLayout::global_layers() const {
    std::vector<int64_t> layers;
    for (int64_t c = 0; c < part_.chunks; ++c)
        for (int64_t l = part_.first_layer; l < part_.last_layer; ++l) layers.push_back(l + c * part_.chunk_stride);
    return layers;
}

TransformerLayout::ActivationSet TransformerLayout::reserve_set(int64_t set, int64_t chunk) {
    const int64_t N = max_batch_ * max_seq_len_, C = config_.d_model;
    const std::string s = cat("set.", set, ".");
    ActivationSet a;
    a.chunk = chunk;
    a.embeds = part_.has_embedding && chunk == 0;
    a.heads = part_.has_head && chunk == part_.chunks - 1;
    a.tokens = arena_.reserve(s + "tokens", DType::i32, {N});
    a.targets = arena_.reserve(s + "targets", DType::i32, {N});
    if (part_.splits_documents() && !context_parallel()) a.doc_starts = arena_.reserve(s + "doc_starts", DType::i32, {N});
    if (context_parallel()) a.positions = arena_.reserve(s + "positions", DType::i32, {N});
    if (context_parallel() && part_.document_mask) a.first_position = arena_.reserve(s + "first_position", DType::i32, {N});
    const int64_t local = local_tokens(max_batch_, max_seq_len_);
    // The input gradient is sent on while later backwards run. Under 1F1B one buffer serves:
    // its send is received before the previous stage sends anything back. Interleaving's ring
    // lets two stages each wait for the other to take a gradient before receiving the next,
    // so there every set has its own.
    a.d_resid = part_.chunks == 1 && !sets_.empty() ? sets_.front().d_resid : arena_.reserve(s + "grad.resid", dtype_, {local, C});
    const int64_t first = part_.first_layer + chunk * part_.chunk_stride;
    for (int64_t l = first; l <= first + chunk_layers(); ++l) a.residual.push_back(arena_.reserve(cat(s, "residual.", l), dtype_, {local, C}));
    // Under full recomputation a layer keeps only its input (the residual above).
    for (int64_t l = first; l < first + chunk_layers(); ++l)
        a.layers.push_back(part_.recompute == Recompute::full ? shared_layer_
                                                              : reserve_layer(cat(s, "layer.", l), part_.recompute == Recompute::none,
                                                                              layers_[static_cast<size_t>(chunk * chunk_layers() + l - first)]));
    if (a.heads) {
        a.norm_f = final_norm_.reserve(slot_planner(), s + "norm_f", config_.d_model);
        a.logits = arena_.reserve(s + "logits", dtype_, {N, padded_vocab_size() / tp_size()});
        a.losses = arena_.reserve(s + "losses", stat_dtype_, {N});
        a.lse = arena_.reserve(s + "lse", stat_dtype_, {N});
        a.row_max = arena_.reserve(s + "row_max", stat_dtype_, {N});
        a.xent_partial = arena_.reserve(s + "xent_partial", stat_dtype_, {N, 2});
    }
    return a;
}

// The shared slots (the rope table, recomputation's scratch), every activation set, then the
// layers' backward scratch. A layer of another kind than `model`'s would add its own.
void TransformerLayout::plan_activations() {
    const int64_t N = max_batch_ * max_seq_len_, C = config_.d_model;
    const SlotPlanner plan = slot_planner();
    const std::vector<LayerParts> kinds = layer_kinds();
    const LayerParts& model = kinds.front();
    rope_table_ = arena_.reserve("rope_table", stat_dtype_, {config_.max_seq_len, config_.head_dim()});
    loss_sum_ = arena_.reserve("loss_sum", DType::f64, {1});
    balance_loss_sum_ = arena_.reserve("balance_loss_sum", DType::f64, {config_.moe.enabled() ? 1 : 0});
    const std::vector<int64_t> held = global_layers();
    for (size_t i = 0; i < layers_.size(); ++i) layers_[i].mlp->reserve_state(arena_, stat_dtype_, cat("layer.", held[i]));
    if (part_.recompute == Recompute::full) {
        shared_layer_ = reserve_layer("recompute", true, model);
        for (size_t k = 1; k < kinds.size(); ++k)
            shared_layer_.mlp = serving_both(shared_layer_.mlp, kinds[k].mlp->reserve(plan, "recompute", nullptr), kinds[k].experts);
    }
    if (part_.recompute == Recompute::selective) {
        shared_layer_.norm1 = model.norm1.reserve(plan, "recompute.norm1", C);
        shared_layer_.norm2 = model.norm2.reserve(plan, "recompute.norm2", C);
        for (const LayerParts& kind : kinds) shared_layer_.mlp = serving_both(shared_layer_.mlp, kind.mlp->reserve_recomputed(plan, "recompute"), kind.experts);
    }
    for (int64_t c = 0; c < part_.chunks; ++c) {
        chunk_first_set_.push_back(static_cast<int64_t>(sets_.size()));
        for (int64_t i = 0; i < part_.activation_sets[static_cast<size_t>(c)]; ++i) sets_.push_back(reserve_set(static_cast<int64_t>(sets_.size()), c));
    }
    const int64_t local = local_tokens(max_batch_, max_seq_len_);
    const int64_t gathered = sp_ ? N : 0;  // the scratch rows of sequence parallelism
    proj_out_ = arena_.reserve("proj_out", dtype_, {N, C});
    proj_local_ = arena_.reserve("proj_local", dtype_, {sp_ ? local : 0, C});
    gathered_ = arena_.reserve("gathered", dtype_, {gathered, C});
    d_norm_ = arena_.reserve("grad.norm", dtype_, {N, C});
    d_norm_local_ = arena_.reserve("grad.norm_local", dtype_, {sp_ ? local : 0, C});
    d_gathered_ = arena_.reserve("grad.gathered", dtype_, {gathered, C});
    attention_grad_ = model.attention.reserve_scratch(plan);
    for (const LayerParts& kind : kinds) mlp_grad_ = serving_both(mlp_grad_, kind.mlp->reserve_scratch(plan), kind.experts);
    if (context_parallel()) plan_ring();
}

Tensor Transformer::rows(Arena::Slot slot) const { return arena_.tensor(slot).slice_rows(0, batch_ * seq_len_); }
Tensor Transformer::local_rows(Arena::Slot slot) const { return arena_.tensor(slot).slice_rows(0, local_tokens(batch_, seq_len_)); }
void Transformer::add_balance_loss(const Tensor& loss, double scale) { backend_.accumulate_sum(balance_loss_sum(), loss, scale); }

void Transformer::reset_loss_sum() {
    backend_.fill_zero(loss_sum());
    if (!config_.moe.enabled()) return;
    backend_.fill_zero(balance_loss_sum());
    for (LayerParts& p : layers_) p.mlp->reset_load();
}

void Transformer::set_expert_bias(int64_t layer, const std::vector<float>& bias) {
    const std::vector<int64_t> held = global_layers();
    for (size_t i = 0; i < layers_.size(); ++i) {
        const std::optional<Arena::Slot> slot = layers_[i].mlp->expert_bias();
        if (held[i] != layer || !slot) continue;
        const Tensor t = arena_.tensor(*slot);
        if (t.numel() != static_cast<int64_t>(bias.size())) fail(ErrorKind::shape, "layer ", layer, ": ", bias.size(), " expert biases for ", t.numel(), " experts");
        std::vector<double> values(bias.begin(), bias.end());
        copy_doubles_to(backend_, t, values);
    }
}

std::vector<std::pair<int64_t, ExpertLoad>> Transformer::expert_loads() const {
    std::vector<std::pair<int64_t, ExpertLoad>> loads;
    const std::vector<int64_t> held = global_layers();
    for (size_t i = 0; i < layers_.size(); ++i)
        if (const ExpertLoad* load = layers_[i].mlp->load()) loads.emplace_back(held[i], *load);
    return loads;
}
// Over tp (sequence parallelism), then cp: the sum over the tp x cp ranks of the micro-batch.
void Transformer::sum_over_token_shards(std::initializer_list<Tensor> tensors) {
    for (Comm* group : {sp_ ? tp_ : nullptr, cp_}) {
        if (!group) continue;
        std::vector<CommHandle> sums;
        for (const Tensor& t : tensors) sums.push_back(group->all_reduce_async(t, ReduceOp::sum));
        for (CommHandle& h : sums) h.wait();
    }
}
Tensor Transformer::part_output(int64_t n) const { return arena_.tensor(sp_ ? proj_local_ : proj_out_).slice_rows(0, n); }
int64_t TransformerLayout::local_tokens(int64_t batch, int64_t seq_len) const { return sp_ ? batch * seq_len / tp_size() : batch * seq_len; }

Tensor Transformer::att_saved(Arena::Slot slot) const {
    // The saved shape for a smaller batch or sequence is a prefix of the planned one.
    const Tensor full = arena_.tensor(slot);
    const Shape shape = context_parallel() ? Shape{batch_, n_heads_, seq_len_} : backend_.attention_saved_shape(attention_shape());
    return Tensor(full.raw(), full.dtype(), shape, full.device());
}

AttentionShape Transformer::attention_shape() const { return {batch_, seq_len_, n_heads_, n_kv_heads_, config_.head_dim()}; }

void Transformer::ready(size_t begin, size_t end) const {
    if (grads_ready_ && begin < end) grads_ready_(begin, end);
}

void Transformer::writing(size_t begin, size_t end) const {
    if (grads_begin_ && begin < end) grads_begin_(begin, end);
}

GroupWeights Transformer::computing(const std::vector<size_t>& pass, size_t position) const {
    return group_weights_ ? group_weights_(pass, position) : GroupWeights();
}

std::vector<size_t> Transformer::hooked_pass(bool forward, int64_t set) const {
    std::vector<size_t> firsts;
    if (!group_weights_) return firsts;
    for (const ParamGroup& g : forward ? forward_groups(set) : backward_groups(set)) firsts.push_back(g.begin);
    return firsts;
}

std::vector<TransformerLayout::ParamGroup> Transformer::forward_groups(int64_t set) const {
    const ActivationSet& a = sets_.at(static_cast<size_t>(set));
    std::vector<ParamGroup> groups;
    if (a.embeds) groups.push_back(embedding_group());
    for (int64_t l = 0; l < chunk_layers(); ++l) groups.push_back(layer_group(a, l));
    if (a.heads) groups.push_back(head_group());
    return groups;
}

std::vector<TransformerLayout::ParamGroup> Transformer::backward_groups(int64_t set) const {
    const ActivationSet& a = sets_.at(static_cast<size_t>(set));
    std::vector<ParamGroup> groups;
    if (a.heads) groups.push_back(head_group());
    for (int64_t l = chunk_layers() - 1; l >= 0; --l) groups.push_back(layer_group(a, l));
    return groups;
}

std::vector<TransformerLayout::ParamGroup> TransformerLayout::gradient_groups() const {
    std::vector<ParamGroup> groups;
    if (part_.has_head) groups.push_back({head_begin_, params_.count()});
    for (auto layer = layers_.rbegin(); layer != layers_.rend(); ++layer) groups.push_back({layer->begin, layer->end});
    if (part_.has_embedding) groups.push_back({0, layers_.empty() ? head_begin_ : layers_.front().begin});
    std::erase_if(groups, [](const ParamGroup& g) { return g.begin >= g.end; });
    return groups;
}

VocabShard Transformer::vocab_shard() const {
    const int64_t padded = padded_vocab_size(), local = padded / tp_size();
    return {tp_rank() * local, padded, config_.vocab_size};
}

Transformer::ActivationSet& Transformer::use_set(int64_t set) {
    if (set < 0 || set >= static_cast<int64_t>(sets_.size())) fail(ErrorKind::runtime, "activation set ", set, " of ", sets_.size());
    ActivationSet& a = sets_[static_cast<size_t>(set)];
    batch_ = a.batch;
    seq_len_ = a.seq_len;
    return a;
}

Tensor Transformer::hidden_in(int64_t set, int64_t batch, int64_t seq_len) const {
    return arena_.tensor(sets_.at(static_cast<size_t>(set)).residual.front()).slice_rows(0, local_tokens(batch, seq_len / part_.cp_size));
}
Tensor Transformer::hidden_out(int64_t set) const {
    const ActivationSet& a = sets_.at(static_cast<size_t>(set));
    return arena_.tensor(a.residual.back()).slice_rows(0, local_tokens(a.batch, a.seq_len));
}
Tensor Transformer::grad_output(int64_t set, int64_t batch, int64_t seq_len) const {
    return arena_.tensor(sets_.at(static_cast<size_t>(set)).d_resid).slice_rows(0, local_tokens(batch, seq_len / part_.cp_size));
}
Tensor Transformer::grad_input(int64_t set) const { return local_rows(sets_.at(static_cast<size_t>(set)).d_resid); }
int64_t TransformerLayout::grad_buffer(int64_t set) const { return part_.chunks == 1 ? 0 : set; }
Tensor Transformer::logits() const { return rows(sets_[static_cast<size_t>(chunk_first_set_.back())].logits); }

int64_t TransformerLayout::activation_set(int64_t chunk, int64_t micro_batch) const {
    if (chunk < 0 || chunk >= part_.chunks || micro_batch < 0) fail(ErrorKind::runtime, "micro-batch ", micro_batch, " of chunk ", chunk, " of ", part_.chunks);
    const auto c = static_cast<size_t>(chunk);
    return chunk_first_set_[c] + micro_batch % part_.activation_sets[c];
}

std::vector<double> Transformer::logits_row(int64_t row) const { return host_doubles(backend_, logits().slice_rows(row, 1)); }

void Transformer::load_ids(const char* what, Arena::Slot slot, const Tensor& ids) {
    expect_dtype("forward", what, ids, DType::i32);
    expect_shape("forward", what, ids, {batch_ * seq_len_});
    const int32_t* host = ids.data<int32_t>();
    for (int64_t i = 0; i < ids.numel(); ++i)
        if (host[i] < 0 || host[i] >= config_.vocab_size)
            fail(ErrorKind::data, "forward: ", what, " ", i, " is ", host[i], ", outside the vocabulary [0, ", config_.vocab_size, ")");
    backend_.copy_from_host(rows(slot), host);
}

double Transformer::mean_loss(const ActivationSet& a) const {
    double total = 0;
    for (double loss : host_doubles(backend_, rows(a.losses))) total += loss;
    return total / static_cast<double>(batch_ * seq_len_);
}

double Transformer::forward(int64_t set, const Tensor& tokens, const Tensor& targets, int64_t batch, int64_t seq_len) {
    forward_pass(set, tokens, targets, batch, seq_len);
    const ActivationSet& a = sets_.at(static_cast<size_t>(set));
    return a.heads && a.has_targets ? mean_loss(a) : std::numeric_limits<double>::quiet_NaN();
}

void Transformer::forward_pass(int64_t set, const Tensor& tokens, const Tensor& targets, int64_t batch, int64_t seq_len,
                               std::optional<double> backward_loss_scale) {
    const int64_t cp = part_.cp_size;
    if (batch < 1 || batch > max_batch_ || seq_len < 1 || seq_len > max_seq_len_ * cp || seq_len % (cp > 1 ? 2 * cp : 1) != 0)
        fail(ErrorKind::shape, "forward: batch ", batch, " x seq_len ", seq_len, " outside the planned ", max_batch_, " x ", max_seq_len_ * cp,
             cp > 1 ? cat(" (or seq_len not a multiple of 2 x cp = ", 2 * cp, ")") : "");
    ActivationSet& a = sets_.at(static_cast<size_t>(set));
    a.batch = batch;
    a.seq_len = seq_len / cp;
    use_set(set);
    const std::vector<size_t> pass = hooked_pass(true, set);
    size_t position = 0;
    // Under context parallelism this part's chunks of the whole sequences.
    const std::vector<int32_t> chunk_tokens = context_parallel() ? context_chunks(tokens, seq_len) : std::vector<int32_t>();
    const std::vector<int32_t> chunk_targets = context_parallel() ? context_chunks(targets, seq_len) : std::vector<int32_t>();
    const auto chunks_of = [&](const Tensor& whole, const std::vector<int32_t>& chunks) {
        return !context_parallel() || whole.empty() ? whole : Tensor(const_cast<int32_t*>(chunks.data()), DType::i32, {batch_ * seq_len_});
    };
    const Tensor local_tokens = chunks_of(tokens, chunk_tokens), local_targets = chunks_of(targets, chunk_targets);
    if (context_parallel()) load_context_positions(a, tokens, seq_len);
    else if (part_.splits_documents()) load_document_starts(a, tokens);
    if (a.embeds) {
        load_ids("tokens", a.tokens, local_tokens);
        const GroupWeights weights = computing(pass, position++);
        embed(a);
    }
    for (int64_t l = 0; l < chunk_layers(); ++l) {
        const GroupWeights weights = computing(pass, position++);
        layer_fwd(a, l);
    }
    a.has_targets = a.heads && !targets.empty();
    if (!a.heads) return;
    if (a.has_targets) load_ids("targets", a.targets, local_targets);
    const GroupWeights weights = computing(pass, position);
    head_and_loss(a, backward_loss_scale);
}

void Transformer::load_document_starts(const ActivationSet& a, const Tensor& tokens) {
    if (tokens.empty())
        fail(ErrorKind::runtime, "forward: the document mask or position reset needs the micro-batch's tokens on every pipeline stage; none were given");
    expect_dtype("forward", "tokens", tokens, DType::i32);
    expect_shape("forward", "tokens", tokens, {batch_ * seq_len_});
    const std::vector<int32_t> starts = document_starts(tokens.data<int32_t>(), batch_, seq_len_, part_.document_end_token);
    backend_.copy_from_host(rows(a.doc_starts), starts.data());
}

std::vector<int32_t> document_starts(const int32_t* tokens, int64_t batch, int64_t seq_len, int32_t end_token) {
    std::vector<int32_t> starts(static_cast<size_t>(batch * seq_len));
    for (int64_t b = 0; b < batch; ++b) {
        int32_t start = 0;
        for (int64_t t = 0; t < seq_len; ++t) {
            const auto n = static_cast<size_t>(b * seq_len + t);
            starts[n] = start;
            if (tokens[n] == end_token) start = static_cast<int32_t>(t + 1);
        }
    }
    return starts;
}

// Each tp rank embeds the tokens of its vocabulary slice (zero rows for the others) and
// rank 0 adds the positions: the sum over ranks is the embedding.
void Transformer::embed(const ActivationSet& a, const KvCache* cache) {
    const int64_t first_position = cache ? cache->length : 0;
    // Explicit positions (context parallelism) index the whole table.
    const bool explicit_rows = context_parallel() && !cache;
    const Tensor wpe = tp_rank() == 0 && wpe_.present ? (explicit_rows ? value(wpe_) : value(wpe_).slice_rows(first_position, seq_len_)) : Tensor();
    const Tensor partial = sp_ ? rows(proj_out_) : rows(a.residual.front());
    backend_.embedding_fwd({.out = partial, .tokens = rows(a.tokens), .wte = value(wte_), .wpe = wpe, .seq_len = seq_len_, .vocab = vocab_shard(),
                            .doc_starts = wpe.empty() || cache || explicit_rows ? Tensor() : position_doc_starts(a),
                            .positions = wpe.empty() || !explicit_rows ? Tensor() : explicit_positions(a)});
    reduce_rows(partial, a.residual.front());
}

void Transformer::head_and_loss(ActivationSet& a, std::optional<double> backward_loss_scale) {
    final_norm_.forward(*this, a.norm_f, local_rows(a.residual.back()));
    const Tensor logits = rows(a.logits);
    column_parallel(local_rows(a.norm_f.out), [&](const Tensor& x, int64_t first, int64_t row_block) {
        backend_.matmul_fwd({.out = logits.slice_rows(first, x.dim(0)), .x = x, .w = value(head_w_), .bias = Tensor(), .row_block = row_block});
    });
    a.logits_hold_gradient = false;
    if (!a.has_targets) return;
    if (!tp_ && backward_loss_scale) {
        backend_.xent_fwd_bwd({.losses = rows(a.losses), .lse = rows(a.lse), .logits = rows(a.logits), .targets = rows(a.targets),
                               .vocab = vocab_shard(), .dloss = loss_gradient(*backward_loss_scale)});
        a.logits_hold_gradient = true;
    } else if (!tp_) {
        backend_.xent_fwd({.losses = rows(a.losses), .lse = rows(a.lse), .logits = rows(a.logits), .targets = rows(a.targets),
                           .vocab = vocab_shard()});
    } else {
        backend_.logits_row_max(rows(a.row_max), rows(a.logits), vocab_shard());
        tp_->all_reduce(rows(a.row_max), ReduceOp::max);
        backend_.xent_partial({.partial = rows(a.xent_partial), .logits = rows(a.logits), .targets = rows(a.targets), .row_max = rows(a.row_max),
                               .vocab = vocab_shard()});
        tp_->all_reduce(rows(a.xent_partial), ReduceOp::sum);
        backend_.xent_combine({.losses = rows(a.losses), .lse = rows(a.lse), .partial = rows(a.xent_partial), .row_max = rows(a.row_max)});
    }
    backend_.accumulate_sum(loss_sum(), rows(a.losses), 1.0 / static_cast<double>(batch_ * seq_len_));
}

void Transformer::layer_fwd(const ActivationSet& a, int64_t l, KvCache* cache) {
    const LayerParts& p = layers_[param_layer(a, l)];
    const LayerSlots& s = a.layers[static_cast<size_t>(l)];
    const Tensor x = local_rows(a.residual[static_cast<size_t>(l)]);
    p.norm1.forward(*this, s.norm1, x);
    p.attention.project_qkv(*this, s.attention, local_rows(s.norm1.out));
    p.attention.rotate(*this, s.attention, rope_positions(a, cache));
    attend(a, s.attention, l, cache);
    const Tensor attention = p.attention.project_out(*this, s.attention);
    p.norm2.add_forward(*this, s.norm2, {.sum = local_rows(s.resid_mid), .a = x, .b = attention});
    const Tensor mlp = p.mlp->forward(*this, s.mlp, local_rows(s.norm2.out));
    backend_.add(local_rows(a.residual[static_cast<size_t>(l + 1)]), local_rows(s.resid_mid), mlp);
}

// Explicit positions (context parallelism) index the whole table; decoding starts at the
// cache's length.
Rope Transformer::rope_positions(const ActivationSet& a, const KvCache* cache) const {
    const bool explicit_rows = context_parallel() && !cache;
    const Tensor table = arena_.tensor(rope_table_);
    return {.x = Tensor(), .table = explicit_rows ? table : table.slice_rows(cache ? cache->length : 0, seq_len_), .seq_len = seq_len_,
            .n_heads = 0, .head_dim = 0, .doc_starts = cache || explicit_rows ? Tensor() : position_doc_starts(a),
            .positions = explicit_rows ? explicit_positions(a) : Tensor()};
}

Rope Transformer::rope_positions_bwd(const ActivationSet& a) const {
    return {.x = Tensor(), .table = arena_.tensor(rope_table_), .seq_len = seq_len_, .n_heads = 0, .head_dim = 0,
            .doc_starts = context_parallel() ? Tensor() : position_doc_starts(a), .positions = explicit_positions(a)};
}

void Transformer::attend(const ActivationSet& a, const AttentionSlots& s, int64_t l, KvCache* cache) {
    const AttentionShape shape = attention_shape();
    if (context_parallel() && !cache) return ring_attention_fwd(a, s);
    if (!cache)
        return backend_.attention_fwd({.out = rows(s.out), .saved = att_saved(s.saved), .qkv = rows(s.qkv), .shape = shape,
                                       .doc_starts = attention_doc_starts(a)});
    // One position: its key and value join the cache, its query attends to every cached one.
    const std::vector<double> qkv = host_doubles(backend_, rows(s.qkv));
    const int64_t q_width = shape.out_width(), at = cache->length * cache->kv_width;
    const auto layer = static_cast<size_t>(l);
    std::copy_n(qkv.begin() + q_width, cache->kv_width, cache->keys[layer].begin() + at);
    std::copy_n(qkv.begin() + q_width + cache->kv_width, cache->kv_width, cache->values[layer].begin() + at);
    std::vector<double> out(static_cast<size_t>(q_width));
    cached_attention(out.data(), qkv.data(), cache->keys[layer], cache->values[layer], cache->length + 1, shape.n_heads, shape.n_kv_heads, shape.head_dim);
    copy_doubles_to(backend_, rows(s.out), out);
}

KvCache Transformer::make_kv_cache() const { return KvCache(local_layers(), max_seq_len_, n_kv_heads_ * config_.head_dim()); }

void Transformer::decode(int32_t token, KvCache& cache) {
    if (tp_ || !part_.has_embedding || !part_.has_head || part_.chunks != 1 || local_layers() != config_.n_layers)
        fail(ErrorKind::unsupported, "decoding with a KV cache needs the whole model in one process (no tensor or pipeline parallelism)");
    if (cache.length >= cache.capacity) fail(ErrorKind::runtime, "decode: the KV cache holds ", cache.capacity, " positions already");
    ActivationSet& a = sets_.front();
    a.batch = a.seq_len = 1;
    a.has_targets = false;
    use_set(0);
    OwnedTensor id(DType::i32, {1});
    id.data<int32_t>()[0] = token;
    load_ids("token", a.tokens, id.view());
    const std::vector<size_t> pass = hooked_pass(true, 0);
    size_t position = 0;
    {
        const GroupWeights weights = computing(pass, position++);
        embed(a, &cache);
    }
    for (int64_t l = 0; l < local_layers(); ++l) {
        const GroupWeights weights = computing(pass, position++);
        layer_fwd(a, l, &cache);
    }
    ++cache.length;
    const GroupWeights weights = computing(pass, position);
    head_and_loss(a);
}

void Transformer::backward(int64_t set, double loss_scale) {
    const ActivationSet& a = use_set(set);
    backward_loss_scale_ = loss_scale;
    const std::vector<size_t> pass = hooked_pass(false, set);
    size_t position = 0;
    if (a.heads) {
        if (!a.has_targets) fail(ErrorKind::runtime, "backward called after a forward without targets");
        const GroupWeights weights = computing(pass, position++);
        head_backward(a, loss_scale);
    }
    const Tensor d_resid = local_rows(a.d_resid);
    for (int64_t l = chunk_layers() - 1; l >= 0; --l) {
        const LayerParts& p = layers_[param_layer(a, l)];
        const GroupWeights weights = computing(pass, position++);
        writing(p.begin, p.end);
        layer_bwd(a, l, d_resid);
        ready(p.begin, p.end);
    }
    if (a.embeds) {
        const ParamGroup g = embedding_group();
        writing(g.begin, g.end);
        const Tensor dwpe = grad(wpe_);
        backend_.embedding_bwd({.dwte = grad(wte_), .dwpe = dwpe, .dout = gather_output_grad(d_resid), .tokens = rows(a.tokens),
                                .seq_len = seq_len_, .vocab = vocab_shard(),
                                .doc_starts = dwpe.empty() || context_parallel() ? Tensor() : position_doc_starts(a),
                                .positions = dwpe.empty() ? Tensor() : explicit_positions(a)});
        ready(g.begin, g.end);
    }
}

// d(mean loss)/d(loss_n) = 1 / N for every token; the head is column-parallel over the
// vocabulary, so the gradient of its (whole) input is summed over the tp ranks. The forward
// kept each row's logsumexp (lse), so the backward reads the logits once.
double Transformer::loss_gradient(double loss_scale) const { return loss_scale / static_cast<double>(batch_ * seq_len_); }

void Transformer::head_backward(const ActivationSet& a, double loss_scale) {
    writing(head_begin_, params_.count());
    if (!a.logits_hold_gradient) backend_.xent_bwd({.dlogits = rows(a.logits), .logits = rows(a.logits), .targets = rows(a.targets),
                                                    .lse = rows(a.lse), .vocab = vocab_shard(), .dloss = loss_gradient(loss_scale)});
    const Tensor d_norm = column_parallel_bwd({.dx = rows(d_norm_), .dw = grad(head_w_), .dbias = Tensor(), .dout = rows(a.logits), .x = Tensor(),
                                               .w = value(head_w_)},
                                              local_rows(a.norm_f.out));
    final_norm_.backward(*this, a.norm_f, {.dx = local_rows(a.d_resid), .accumulate_dx = false, .dout = d_norm, .x = local_rows(a.residual.back())});
    // A head tied to this stage's embedding is parameter 0: it is reported with the embedding.
    ready(head_begin_, params_.count());
}

// Under sequence parallelism d_resid holds this rank's tokens: the row-parallel matmuls'
// backward needs the whole rows (gathered), and the gradients of the column-parallel
// matmuls' inputs are reduce-scattered back to this rank's tokens. Each residual branch's
// input gradient is added to d_resid by its norm's backward.
void Transformer::layer_bwd(const ActivationSet& a, int64_t l, const Tensor& d_resid) {
    const LayerParts& p = layers_[param_layer(a, l)];
    const LayerSlots& s = a.layers[static_cast<size_t>(l)];
    const Tensor d_in = rows(d_norm_);
    recompute_layer(a, l);
    // out = resid_mid + mlp(norm2(resid_mid))
    const Tensor d_norm2 = p.mlp->backward(*this, s.mlp, mlp_grad_, d_resid, local_rows(s.norm2.out), d_in);
    p.norm2.backward(*this, s.norm2, {.dx = d_resid, .accumulate_dx = true, .dout = d_norm2, .x = local_rows(s.resid_mid)});
    // resid_mid = x + out_proj(attend(rotate(qkv(norm1(x)))))
    p.attention.project_out_bwd(*this, s.attention, attention_grad_, d_resid);
    attend_bwd(a, s.attention);
    p.attention.rotate_bwd(*this, attention_grad_, rope_positions_bwd(a));
    const Tensor d_norm1 = p.attention.project_qkv_bwd(*this, attention_grad_, local_rows(s.norm1.out), d_in);
    p.norm1.backward(*this, s.norm1, {.dx = d_resid, .accumulate_dx = true, .dout = d_norm1, .x = local_rows(a.residual[static_cast<size_t>(l)])});
}

void Transformer::attend_bwd(const ActivationSet& a, const AttentionSlots& s) {
    if (context_parallel()) return ring_attention_bwd(a, s);
    backend_.attention_bwd({.dqkv = rows(attention_grad_.d_qkv), .dout = rows(attention_grad_.d_out), .qkv = rows(s.qkv), .out = rows(s.out),
                            .saved = att_saved(s.saved), .shape = attention_shape(), .doc_starts = attention_doc_starts(a)});
}

// selective: the two norms and the MLP activation, from the kept inputs; full: the whole
// layer forward (its output, the next layer's kept input, is rewritten with equal values).
void Transformer::recompute_layer(const ActivationSet& a, int64_t l) {
    if (part_.recompute == Recompute::none) return;
    if (part_.recompute == Recompute::full) {
        recomputing_ = true;
        layer_fwd(a, l);
        recomputing_ = false;
        return;
    }
    const LayerParts& p = layers_[param_layer(a, l)];
    const LayerSlots& s = a.layers[static_cast<size_t>(l)];
    p.norm1.forward(*this, s.norm1, local_rows(a.residual[static_cast<size_t>(l)]));
    p.norm2.forward(*this, s.norm2, local_rows(s.resid_mid));
    p.mlp->recompute(*this, s.mlp);
}

}  // namespace llmtrain
