#include "train/trainer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <thread>
#include <unistd.h>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/initial_weights.h"
#include "checkpoint/io_report.h"
#include "checkpoint/restore.h"
#include "checkpoint/safetensors.h"
#include "train/fp8_state.h"
#include "parallel/fully_sharded.h"
#include "parallel/grad_buckets.h"
#include "parallel/sharded_gradients.h"
#include "core/log.h"
#include "core/timer.h"
#include "model/generate.h"
#include "plan/step_model.h"
#include "optim/lr_schedule.h"

namespace llmtrain {

namespace {

// FP8 tensor cores start at compute capability 8.9 (Ada; Hopper 9.0, Blackwell 10.x): on an
// older GPU cuBLASLt has no FP8 GEMM, so an FP8 run is refused before anything of it is set
// up. A CPU runs FP8 emulated.
void refuse_fp8_without_tensor_cores(const TrainConfig& train, const Backend& backend) {
    const std::optional<GpuDevice> gpu = backend.gpu_device();
    if (train.precision != Precision::fp8 || !gpu || gpu->sm_major * 10 + gpu->sm_minor >= 89) return;
    fail(ErrorKind::config, "train.precision = \"fp8\" needs FP8 tensor cores (sm_89 or later: Ada, Hopper, Blackwell), which ", gpu->name, " (sm_",
         gpu->sm_major, gpu->sm_minor, ") has not: train on it with train.precision = \"bf16\", or on a GPU with FP8");
}

// total += after - before, op by op: the op time of the training steps alone, not evaluation.
void add_profile_difference(OpProfile& total, const OpProfile& before, const OpProfile& after) {
    for (size_t i = 0; i < static_cast<size_t>(op_count); ++i) {
        total.seconds[i] += after.seconds[i] - before.seconds[i];
        total.calls[i] += after.calls[i] - before.calls[i];
    }
}

// Threads per rank: as configured, or the node's cores shared among its ranks.
int threads_per_rank(const TrainConfig& train, const ParallelContext& ctx) {
    if (train.threads > 0) return static_cast<int>(train.threads);
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return std::max(1, cores / std::max(1, ctx.local_size));
}
// What each (group, op) of the table held: the time a step spent is the difference.
std::vector<CommTimes::Row> comm_rows(const CommTimes* times) {
    std::vector<CommTimes::Row> rows;
    if (times)
        for (const CommTimes::Group& g : times->groups()) rows.push_back(g.seconds);
    return rows;
}

void add_comm_since(RankStepTimes& out, const CommTimes* times, const std::vector<CommTimes::Row>& before) {
    if (!times) return;
    for (size_t g = 0; g < before.size(); ++g)
        for (size_t op = 0; op < static_cast<size_t>(comm_op_count); ++op) {
            const double seconds = times->groups()[g].seconds[op] - before[g][op];
            if (seconds <= 0) continue;
            out.comm.push_back({times->groups()[g].name, comm_op_name(static_cast<CommOp>(op)), seconds});
            out.comm_seconds += seconds;
        }
}

// "257", or "257 (padded to 258 rows: a multiple of tp 2 x model.pad_vocab_to 1)".
std::string vocab_description(const ModelConfig& m, int64_t tp) {
    const int64_t padded = m.padded_vocab_size(tp);
    if (padded == m.vocab_size) return std::to_string(m.vocab_size);
    return cat(m.vocab_size, " (padded to ", padded, " rows: a multiple of tp ", tp, " x model.pad_vocab_to ", m.pad_vocab_to, ")");
}

// "[0, 4)", or the chunks of an interleaved stage: "[0, 2) [4, 6)".
// " | sequence parallel" (and how its collectives run), or nothing without it.
std::string sequence_parallelism(const ParallelConfig& parallel, int64_t tp) {
    if (!parallel.sequence_parallel || tp == 1) return "";
    return parallel.tp_overlap ? " | sequence parallel, its collectives in pieces behind the matmuls" : " | sequence parallel";
}

std::string held_layers(const ModelPartition& part) {
    std::string text;
    for (int64_t c = 0; c < part.chunks; ++c)
        text += cat(c ? " " : "", "[", part.first_layer + c * part.chunk_stride, ", ", part.last_layer + c * part.chunk_stride, ")");
    return text;
}

}  // namespace

Trainer::Trainer(const Config& config, TrainerOptions options) : Trainer(config, std::move(options), nullptr) {}

Trainer::Trainer(const Config& config, TrainerOptions options, ParallelContext& ctx) : Trainer(config, std::move(options), &ctx) {}

Trainer::Trainer(const Config& config, TrainerOptions options, ParallelContext* shared_ctx)
    : options_(std::move(options)),
      own_ctx_(shared_ctx ? nullptr : std::make_unique<ParallelContext>(make_single_process_context())),
      ctx_(shared_ctx ? shared_ctx : own_ctx_.get()), given_config_(config), config_(resolve_on_mesh(config, ctx_->mesh.dp())),
      batch_(config.train.batch_size, config.train.seq_len),
      dtype_(options_.dtype ? *options_.dtype : llmtrain::compute_dtype(config.train)),
      compute_times_(static_cast<size_t>(std::max<int64_t>(1, config.metrics.straggler_interval_steps))) {
    const ParallelContext& ctx = *ctx_;
    if (ctx.mesh.tp() != config_.parallel.tp || ctx.mesh.pp() != config_.parallel.pp || ctx.mesh.cp() != config_.parallel.cp)
        fail(ErrorKind::config, "parallel: the config asks for tp ", config_.parallel.tp, " x pp ", config_.parallel.pp,
             config_.parallel.cp > 1 ? cat(" x cp ", config_.parallel.cp) : "", " but the run's mesh is tp ", ctx.mesh.tp(), " x pp ", ctx.mesh.pp(),
             ctx.mesh.cp() > 1 ? cat(" x cp ", ctx.mesh.cp()) : "");
    require_trainable_in_this_build(config_);
    check_optimizer_layout(config_.optimizer, config_.parallel, ctx.mesh.dp());
    ModelPartition partition = stage_partition(config_, ctx.mesh, ctx.world_rank);
    if (partition.splits_documents()) partition.document_end_token = document_end_token(config_);
    if (!is_logger()) options_.quiet = true;
    if (options_.make_backend) backend_ = options_.make_backend(ctx.local_rank);
    else if (config_.train.device == ComputeDevice::cuda) backend_ = make_cuda_backend(ctx.local_rank, config_.model.attention);
    else backend_ = make_cpu_backend(threads_per_rank(config_.train, ctx));
    refuse_fp8_without_tensor_cores(config_.train, *backend_);
    backend_->set_memory_limit(memory_limit_bytes(config_.train));
    comms_ = std::make_unique<TrainingComms>(config_, *ctx_, *backend_, options_.device_comms);
    data_ = options_.synthetic_data ? make_synthetic_batch_source(config_) : make_batch_source(config_);
    model_ = std::make_unique<Transformer>(config_.model, *backend_, dtype_, config_.train.batch_size, config_.train.seq_len, partition, &comms_->tp(),
                                           comms_->cp());
    placement_ = std::make_unique<Placement>(state_placement(config_, ctx.mesh, ctx.world_rank, *model_, model_->parameters().dtype()));
    sync_ = make_gradient_sync();
    store_ = make_parameter_store();
    store_->initialize([this](FlatRange range, const Tensor& out) { model_->initialize_range(config_.train.seed, range, out); });
    std::vector<OwnedPiece> pieces = sync_->owned();
    store_->place(pieces);
    optimizer_ = make_optimizer(config_.optimizer, model_->parameters(), pieces, comms_->dp());
    if (dtype_ == DType::f16) loss_scale_ = DynamicLossScale(config_.train.loss_scale, config_.train.loss_scale_window);
    pipeline_ = std::make_unique<PipelineRunner>(*model_, *ctx_, comms_->pp(), config_.train.grad_accum);
    Backend& backend = *backend_;
    step_scalars_ = OwnedTensor(DType::f64, {5}, backend.device(), [&backend](size_t bytes) { return backend.allocate(bytes); });
    // The fp16 overflow rule first: an overflow is not a fault for the non-finite policy.
    own_guards_.push_back(std::make_unique<LossScaleGuard>(loss_scale_, options_.quiet));
    auto health = std::make_unique<HealthMonitor>(config_.monitor, config_.checkpoint.every_steps > 0);
    health_ = health.get();
    if (config_.monitor.rerun_on_anomaly) health_->set_rerun([this](const StepRecord& first) { return rerun_step(first); });
    own_guards_.push_back(std::move(health));
    for (const auto& guard : own_guards_) guards_.push_back(guard.get());
}

Trainer::~Trainer() = default;

std::unique_ptr<GradientSync> Trainer::make_gradient_sync() {
    Parameters& params = model_->parameters();
    std::unique_ptr<GradientSync> sync;
    const DType reduce = grad_reduce_dtype(config_.parallel, params.dtype());
    if (placement_->shards_gradients())
        sync = std::make_unique<ShardedGradients>(flat_parameters(params), placement_->cuts(), comms_->shard(), comms_->replicas(), backend_ops(*backend_), reduce);
    else
        sync = std::make_unique<GradBuckets>(flat_parameters(params), placement_->cuts(), placement_->shards_optimizer(), comms_->dp(), reduce,
                                             backend_ops(*backend_));
    for (const GradStorageBinding& b : sync->run_storage()) params.bind_grads(b.first, b.end, b.values, b.flat_offset);
    return sync;
}

std::unique_ptr<ParameterStore> Trainer::make_parameter_store() {
    Parameters& params = model_->parameters();
    if (!placement_->shards_parameters()) {
        GradientSync& sync = *sync_;
        auto store = std::make_unique<ReplicatedParameters>(flat_parameters(params), *placement_, comms_->shard(),
                                                            [&sync](size_t cut, int slot) { return sync.idle_buffer(cut, slot); }, backend_ops(*backend_),
                                                            config_.parallel.overlap_param_gather);
        ParameterStore& weights = *store;
        if (config_.parallel.overlap_param_gather)
            model_->set_group_weights([&weights](const std::vector<size_t>& pass, size_t position) { return weights.weights(pass, position); });
        return store;
    }
    auto store = std::make_unique<FullyShardedParameters>(
        flat_parameters(params), *placement_, comms_->shard(), backend_ops(*backend_), params.compute_dtype(), static_cast<int>(config_.parallel.prefetch_layers),
        [&params](size_t first, size_t end, const Tensor& storage, int64_t offset) { params.bind_values(first, end, storage, offset); }, fp8_param_gather());
    ParameterStore& weights = *store;
    model_->set_group_weights([&weights](const std::vector<size_t>& pass, size_t position) { return weights.weights(pass, position); });
    return store;
}

// fp8.param_gather under ZeRO-3: the FP8 linears' weights gathered in FP8 into their FP8
// copies, each rank's pieces cast by the linears with scales agreed over the shard group and tp.
Fp8ParamGather Trainer::fp8_param_gather() {
    Fp8Linears* fp8 = model_->fp8();
    if (!fp8 || !fp8->weights_gathered()) return {};
    Fp8ParamGather gather;
    gather.weights = model_->fp8_weight_ranges();
    for (int id = 0; id < fp8->count(); ++id) gather.bytes.push_back(fp8->weight_bytes(id));
    Comm* shard = &comms_->shard();
    gather.cast = [fp8, shard](const std::vector<Fp8ShardPiece>& pieces) { fp8->cast_weight_pieces(pieces, shard); };
    return gather;
}

// Every load goes through here: no gather of the last update may still write the values.
RankState Trainer::rank_state(bool with_optimizer) {
    store_->settle();
    Parameters& params = model_->parameters();
    return {*placement_, *store_, with_optimizer ? optimizer_.get() : nullptr, *backend_, backend_ops(*backend_),
            [&params](DType dtype, Shape shape) { return params.new_tensor(dtype, shape); }, &comms_->tp(), comms_->replicas(), &comms_->shard()};
}

RankMemory Trainer::memory() const {
    return {store_->value_bytes(), sync_->gradient_bytes(), optimizer_->state_bytes(), model_->activation_bytes(), backend_->workspace_bytes(),
            model_->fp8() ? model_->fp8()->allocated_bytes() : 0};
}

void Trainer::log_startup() const {
    const ModelConfig& m = config_.model;
    const TrainConfig& t = config_.train;
    const Mesh& mesh = ctx_->mesh;
    const ModelPartition& part = model_->partition();
    // Per-rank figures differ between pipeline stages: the largest over the ranks is what
    // decides whether a layout fits.
    const RankMemory mine = memory();
    const auto max_over_ranks = [&](size_t bytes) { return ctx_->world->all_reduce_scalar(static_cast<double>(bytes), ReduceOp::max); };
    const double params_max = max_over_ranks(mine.parameter_bytes), grads_max = max_over_ranks(mine.gradient_bytes);
    const double optim_max = max_over_ranks(mine.optimizer_bytes), act_max = max_over_ranks(mine.activation_bytes);
    const double fp8_max = max_over_ranks(mine.fp8_bytes);
    const double total_params = ctx_->world->all_reduce_scalar(
        ctx_->coord()[mesh_dim::dp] == 0 && ctx_->coord()[mesh_dim::cp] == 0 ? static_cast<double>(model_->parameters().total_numel()) : 0.0, ReduceOp::sum);
    if (options_.quiet) return;
    log_info("model ", family_name(m.family), ": ", m.n_layers, " layers, d_model ", m.d_model, ", ", m.n_heads, " heads (", m.n_kv_heads,
             " kv), d_ff ", m.d_ff, ", vocab ", vocab_description(m, ctx_->mesh.tp()), " | ", fixed(total_params / 1e6, 3), "M parameters held over all tp x pp ranks",
             parameters_beyond_the_model(m, mesh.tp(), mesh.pp(), total_params));
    log_info("layout: ", mesh.world_size(), " ranks = tp ", mesh.tp(), mesh.cp() > 1 ? cat(" x cp ", mesh.cp()) : "", " x dp ", mesh.dp(), " x pp ", mesh.pp(),
             " (order ", config_.parallel.order,
             ")", sequence_parallelism(config_.parallel, mesh.tp()), " | ", sync_->describe(), store_->describe().empty() ? "" : " | ", store_->describe(), " | comm ",
             comms_->event_ordered() ? "nccl (event-ordered)" : comm_backend_name(CommBackend::mpi), " | rank 0 holds layers ", held_layers(part));
    log_info("memory per rank (rank 0 / largest): parameters ", megabytes(static_cast<double>(mine.parameter_bytes)), " / ", megabytes(params_max),
             ", gradients ", megabytes(static_cast<double>(mine.gradient_bytes)), " / ", megabytes(grads_max), ", optimizer ",
             megabytes(static_cast<double>(mine.optimizer_bytes)), " / ", megabytes(optim_max), ", activations ",
             megabytes(static_cast<double>(mine.activation_bytes)), " / ", megabytes(act_max),
             mine.fp8_bytes > 0 ? cat(", fp8 ", megabytes(static_cast<double>(mine.fp8_bytes)), " / ", megabytes(fp8_max)) : std::string(),
             " (planned) | backend ", backend_->name(), " ",
             dtype_name(dtype_), " compute, ", dtype_name(model_->parameters().dtype()), " master weights, recompute ",
             recompute_name(config_.train.recompute));
    const int64_t sequences_per_step = t.batch_size * t.grad_accum * mesh.dp();
    log_info("data: ", data_->describe(), " | global batch ", sequences_per_step, " sequences = batch_size ", t.batch_size, " x grad_accum ",
             t.grad_accum, " x dp ", mesh.dp(), " | ", sequences_per_step * t.seq_len, " tokens per step | validation ",
             t.eval_sequences, " sequences");
    log_schedule_notes();
}

// Settings that run but not as written: said once, at start-up.
void Trainer::log_schedule_notes() const {
    const int64_t warmup = config_.optimizer.warmup_steps, steps = config_.train.steps;
    if (warmup > steps)
        log_info("optimizer: warmup over ", steps, " steps, the whole run (optimizer.warmup_steps = ", warmup, " > train.steps = ", steps, ")");
    if (const auto repeated = repeated_eval_warning(*data_, config_.train.eval_sequences, config_.train.seq_len, "train.eval_sequences = ")) log_warn(*repeated);
    // 1F1B idles each stage for pp - 1 micro-batch slots of the M + pp - 1 a step takes;
    // interleaving with V chunks for pp - 1 chunk slots of the V * M + pp - 1.
    const int64_t pp = ctx_->mesh.pp(), micro_batches = config_.train.grad_accum, chunks = config_.parallel.virtual_stages;
    if (pp > 1)
        log_info("pipeline: ", chunks > 1 ? cat("interleaved 1F1B, ", chunks, " virtual stages") : std::string("1F1B"), ", ", micro_batches,
                 " micro-batches | bubble ", fixed(100 * pipeline_bubble_fraction(pp, micro_batches, chunks), 1), "% of the step ((pp - 1) / (",
                 chunks > 1 ? "virtual_stages x " : "", "grad_accum + pp - 1))");
    if (micro_batches < pp)
        log_warn("pipeline: train.grad_accum = ", micro_batches, " micro-batches per step for parallel.pp = ", pp, " stages: each stage idles ",
                 std::lround(100.0 * static_cast<double>(pp - 1) / static_cast<double>(micro_batches + pp - 1)),
                 "% of the step (the 1F1B bubble, (pp - 1) / (grad_accum + pp - 1)); grad_accum >= pp, or a larger train.global_batch_size, fills it");
    if (config_.train.precision == Precision::fp8) {
        const Fp8Config& f = config_.fp8;
        log_info("fp8: the blocks' linears of layers [", f.bf16_first_layers, ", ", config_.model.n_layers - f.bf16_last_layers, ") in FP8, recipe ",
                 fp8_recipe_name(f.recipe), ", ", f.format == Fp8Formats::hybrid ? "e4m3 forward, e5m2 gradients" : "e4m3 everywhere",
                 config_.train.device == ComputeDevice::cpu ? "; emulated on the CPU (exact FP8 rounding, f32 GEMMs): no speed-up here" : "");
    }
}

// The delayed recipe's step amaxes agreed over every group that holds the same layers (max),
// so every rank records what one process would; then the histories and the weights' casts
// move to the next step.
void Trainer::close_fp8_step() {
    Fp8Linears* fp8 = model_->fp8();
    if (!fp8) return;
    if (fp8->delayed() && fp8->count() > 0)
        for (Comm* group : {&comms_->tp(), comms_->cp(), &comms_->dp()})
            if (group && group->size() > 1) group->all_reduce(fp8->step_amaxes(), ReduceOp::max);
    fp8->close_step();
}

TrainResult Trainer::run() {
    log_startup();
    // A resumed run was evaluated at its start already, by the run that saved it.
    if (start_step_ == 0) record_eval(0, evaluate());
    result_.last_step = start_step_;
    const int64_t steps = config_.train.steps;
    for (int64_t step = start_step_; step < steps; ++step) {
        options_.faults.strike_if_due(ctx_->world_rank, step + 1);
        const OpProfile before = backend_->profile();
        StepRecord s = train_step(step);
        add_profile_difference(result_.step_profile, before, backend_->profile());
        result_.train_seconds += s.step_seconds;
        if (rollback_to_) {
            // The step rolled back is no step: the anomaly record tells of it; go on from the checkpoint.
            step = *rollback_to_ - 1;
            rollback_to_.reset();
            continue;
        }
        measure_stragglers(s);
        record(s);
        const bool last = step + 1 == steps;
        if (last || (config_.train.eval_every > 0 && (step + 1) % config_.train.eval_every == 0)) record_eval(step + 1, evaluate());
        if (!last && (result_.stop_signal = stop_signal_after_step()) != 0) break;
    }
    result_.gemm_fraction = result_.train_seconds > 0 ? result_.step_profile.gemm_seconds() / result_.train_seconds : 0;
    // The first step warms up (allocations, plans): timed over the others when there are others.
    const int64_t done = result_.steps_taken;
    const int64_t timed_steps = done > 1 ? done - 1 : done;
    const double timed_seconds = done > 1 ? result_.train_seconds - first_step_seconds_ : result_.train_seconds;
    const double tokens_per_step = static_cast<double>(config_.train.batch_size * config_.train.seq_len * config_.train.grad_accum * ctx_->mesh.dp());
    result_.tokens_per_second = tokens_per_step * static_cast<double>(timed_steps) / timed_seconds;
    if (result_.stop_signal == 0) result_.sample = sample_text();
    store_->settle();
    return result_;
}

StepRecord Trainer::train_step(int64_t step) {
    const TrainConfig& t = config_.train;
    Stopwatch clock;
    const std::vector<CommTimes::Row> comm_before = comm_rows(options_.comm_times);
    data_wait_seconds_ = 0;
    StepRecord s;
    s.step = step + 1;
    s.loss_scale = loss_scale_.scale();
    s.dynamic_loss_scale = loss_scale_.dynamic();
    current_step_ = step;
    const int64_t bytes_before = sync_->bytes_sent() + optimizer_->bytes_sent();
    const int64_t syncs_before = backend_->profile().host_syncs;
    compute_step(step, s);
    s.lr = learning_rate_at(config_.optimizer, step, t.steps) * lr_scale(s.step);
    update(s);
    close_fp8_step();
    s.dp_bytes_sent = sync_->bytes_sent() + optimizer_->bytes_sent() - bytes_before;
    backend_->synchronize();  // the step's time is the device's
    comms_->check();
    s.rank.host_syncs = backend_->profile().host_syncs - syncs_before;
    s.step_seconds = clock.seconds();
    s.sequences = t.batch_size * t.grad_accum * ctx_->mesh.dp();
    s.tokens = s.sequences * t.seq_len;
    s.tokens_per_second = static_cast<double>(s.tokens) / s.step_seconds;
    if (!rollback_to_) tokens_seen_ += s.tokens;  // a rollback restored the count of its checkpoint
    s.rank.data_wait_seconds = data_wait_seconds_;
    add_comm_since(s.rank, options_.comm_times, comm_before);
    return s;
}

void Trainer::compute_step(int64_t step, StepRecord& s) {
    forward_backward(step);
    if (options_.faults.nonfinite_gradients(ctx_->world_rank, s.step)) poison_gradients();
    if (options_.faults.bit_flip(ctx_->world_rank, s.step)) flip_gradient_bit();
    const double spike = options_.faults.spike_factor(data_step(step));
    if (spike != 1) scale_gradients(spike);
    close_step(s);
    moe_balance_.close_step(*model_, *ctx_, s);
    if (spike != 1) {
        s.loss *= spike;
        local_loss_ *= spike;
    }
    // The gradients hold loss_scale x d(loss): the norm and the update take it out again.
    s.grad_norm /= loss_scale_.scale();
}

uint64_t Trainer::global_batch() const {
    return static_cast<uint64_t>(config_.train.batch_size * config_.train.grad_accum * ctx_->mesh.dp());
}

int64_t Trainer::data_step(int64_t step) const {
    const std::optional<LoaderState> state = data_->state_at(step, ctx_->mesh.dp());
    return state ? static_cast<int64_t>(state->cursor / global_batch()) + 1 : step + 1;
}

double Trainer::lr_scale(int64_t step) const {
    double scale = options_.faults.lr_factor(step);
    for (const UpdateGuard* guard : guards_) scale *= guard->lr_scale();
    return scale;
}

SnapshotSource Trainer::snapshot_source() {
    store_->settle();
    Parameters& params = model_->parameters();
    const AdamW& optimizer = *optimizer_;
    const ParameterStore& store = *store_;
    return {*placement_,
            [&store, &optimizer](TensorRole role, FlatRange range) {
                return role == TensorRole::weights ? store.master(range) : optimizer.moment(role == TensorRole::exp_avg_sq, range);
            },
            optimizer.rank_local_state(), *backend_, ctx_->world_rank, params.dtype(), fp8_checkpoint_datasets(model_->fp8())};
}

Manifest Trainer::manifest_at(int64_t step) const {
    Manifest m;
    m.run_id = options_.run_id;
    m.step = step;
    m.tokens_seen = tokens_seen_;
    m.resumes = resumes_;
    m.optimizer_steps = optimizer_->steps_taken();
    m.loss_scale = loss_scale_.scale();
    m.loss_scale_good_steps = loss_scale_.good_steps();
    m.data = data_->state_at(step, ctx_->mesh.dp());
    m.monitor_state = health_->state();
    m.moe_state = moe_balance_.state();
    m.fp8_state = fp8_manifest_state(config_, ctx_->mesh);
    m.seed = config_.train.seed;
    m.global_batch = static_cast<int64_t>(global_batch());
    m.world_size = ctx_->mesh.world_size();
    m.tp = ctx_->mesh.tp(), m.dp = ctx_->mesh.dp(), m.pp = ctx_->mesh.pp(), m.cp = ctx_->mesh.cp();
    m.zero_stage = placement_->zero_stage();
    // The config as given: a grad_accum derived from the global batch is the layout's, not the run's.
    m.config_toml = dump_config(given_config_);
    return m;
}

void Trainer::restore(const std::string& path, const Manifest& manifest) {
    if (manifest.step >= config_.train.steps)
        fail(ErrorKind::config, "train.steps = ", config_.train.steps, ": the checkpoint '", path, "' is at step ", manifest.step, " already; raise train.steps to train on");
    load_checkpoint(path, manifest, "resume");
    loss_scale_.restore(manifest.loss_scale, manifest.loss_scale_good_steps);
    if (manifest.data) data_ = make_batch_source(config_, manifest.data);
    health_->restore(manifest.monitor_state);
    start_step_ = manifest.step;
    tokens_seen_ = manifest.tokens_seen;
    resumes_ = manifest.resumes + 1;
}

void Trainer::load_checkpoint(const std::string& path, const Manifest& manifest, const char* why) {
    const StorageCounter counter;
    Stopwatch clock;
    {
        const CheckpointTensors checkpoint(path, manifest, *ctx_->world);
        load_state(rank_state(true), checkpoint_reader(checkpoint, *backend_));
    }
    optimizer_->set_steps_taken(manifest.optimizer_steps);
    moe_balance_.restore(manifest.moe_state, path, *model_);
    const std::string fp8_note = restore_fp8_state(model_->fp8(), *ctx_, path, manifest);
    if (!fp8_note.empty() && !options_.quiet && is_logger()) log_info(fp8_note);
    restore_rank_local_state(path, manifest);
    const IoFigures figures = agree_io_figures(*ctx_->world, counter.bytes_read(), clock.seconds());
    if (!options_.quiet)
        log_info("checkpoint ", why, ": read '", path, "' (", megabytes(static_cast<double>(checkpoint_bytes(manifest))), ") in ", fixed(figures.seconds, 3),
                 " s | ", describe_io(figures, "read"));
}

// 1-bit Adam's error feedback belongs to each rank of the layout that saved it; on another
// layout it starts again from zero, which costs a few steps of compression error, not a wrong result.
void Trainer::restore_rank_local_state(const std::string& path, const Manifest& manifest) {
    const Mesh& mesh = ctx_->mesh;
    const bool same_layout = manifest.world_size == mesh.world_size() && manifest.tp == mesh.tp() && manifest.dp == mesh.dp() && manifest.pp == mesh.pp() &&
                             manifest.cp == mesh.cp();
    if (load_rank_local_state(path, manifest, ctx_->world_rank, same_layout, *optimizer_) || optimizer_->rank_local_state().empty()) return;
    if (!options_.quiet) log_warn("checkpoint '", path, "': 1-bit Adam's error feedback was saved by another layout (or not at all); it starts from zero");
}

void Trainer::load_initial_weights(const std::string& path) {
    if (const std::optional<Manifest> manifest = checkpoint_to_start_from(path, config_, shared_problem_check(*ctx_->world))) {
        const CheckpointTensors checkpoint(path, *manifest, *ctx_->world);
        load_state(rank_state(false), checkpoint_reader(checkpoint, *backend_));
        return;
    }
    const HfWeights weights(path, config_.model.vocab_size, placement_->tensors());
    load_state(rank_state(false), [&](TensorRole, const TensorPlace& t, FlatRange local, const Tensor& out) {
        read_to(out, *backend_, [&](void* host, DType as) { weights.read(t, local, host, as); });
    });
}

// Drills. The faults land in the reduced gradients this rank updates (under ZeRO-1 its
// shard), what it contributes to the norm and the update.

// The non-finite policy's: the first gradient this rank updates becomes NaN.
void Trainer::poison_gradients() {
    const Tensor first = sync_->owned().front().grads.slice_rows(0, 1);
    if (first.dtype() == DType::f64) backend_->copy_from_host(first, std::vector<double>{std::numeric_limits<double>::quiet_NaN()}.data());
    else backend_->copy_from_host(first, std::vector<float>{std::numeric_limits<float>::quiet_NaN()}.data());
}

namespace {
// Flips bit `bit` of the first element of `t` (on the device), whose host type is Value.
template <class Value, class Bits>
void flip_first_element_bit(Backend& backend, const Tensor& t, int bit) {
    Value value = 0;
    backend.copy_to_host(&value, t);
    Bits bits;
    std::memcpy(&bits, &value, sizeof bits);
    bits ^= Bits{1} << bit;
    std::memcpy(&value, &bits, sizeof bits);
    backend.copy_from_host(t, &value);
}
}  // namespace

// Silent data corruption: the top exponent bit of the first gradient this rank updates
// flips (|g| < 2 becomes |g| x 2^128, or 2^(exponent bias) for f64): a wrong number, no crash.
void Trainer::flip_gradient_bit() {
    const Tensor first = sync_->owned().front().grads.slice_rows(0, 1);
    if (first.dtype() == DType::f64)
        flip_first_element_bit<double, uint64_t>(*backend_, first, 62);
    else
        flip_first_element_bit<float, uint32_t>(*backend_, first, 30);
}

// A bad batch: every gradient this rank updates times factor (through the host: a drill).
void Trainer::scale_gradients(double factor) {
    for (const OwnedPiece& piece : sync_->owned()) {
        const auto n = static_cast<size_t>(piece.grads.numel());
        if (piece.grads.dtype() == DType::f64) {
            std::vector<double> values(n);
            backend_->copy_to_host(values.data(), piece.grads);
            for (double& v : values) v *= factor;
            backend_->copy_from_host(piece.grads, values.data());
        } else {
            std::vector<float> values(n);
            backend_->copy_to_host(values.data(), piece.grads);
            for (float& v : values) v = static_cast<float>(v * factor);
            backend_->copy_from_host(piece.grads, values.data());
        }
    }
}

// Loss and norm are reduced over the whole job: every guard reaches the same verdict on
// every rank. The first verdict other than apply decides.
void Trainer::update(StepRecord& s) {
    Verdict verdict;
    for (UpdateGuard* guard : guards_) {
        verdict = guard->judge(s);
        if (verdict.action != Verdict::apply) break;
    }
    std::optional<AnomalyRecord> event = health_->take_event();
    if (verdict.action == Verdict::rollback) roll_back(s.step, *event);
    if (event) report(*event, s.step - 1);
    if (verdict.action == Verdict::abort) fail(ErrorKind::diverged, verdict.reason);
    if (verdict.action == Verdict::exclude_node) fail(ErrorKind::hardware, verdict.reason);
    s.skipped = verdict.action != Verdict::apply;
    if (!s.skipped) {
        optimizer_->step(*backend_, s.lr, clip_scale(s.grad_norm, config_.optimizer.grad_clip) / loss_scale_.scale());
        store_->after_update();
    }
    for (UpdateGuard* guard : guards_) guard->after_verdict(s, verdict.action);
}

namespace {
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
std::string exact(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", value);
    return text;
}
}  // namespace

// The weights are still the step's starting state (the update waits for the verdict), and
// every input of the step is a function of (seed, step): a second computation must repeat
// the first bit for bit. Each rank compares its own partial results; a few scalar reductions
// then name the ranks that changed.
RerunResult Trainer::rerun_step(const StepRecord& first) {
    const double loss_partial = local_loss_, grad_partial = local_grad_square_sum_;
    StepRecord again = first;
    compute_step(current_step_, again);
    const bool mine_changed = !same_bits(loss_partial, local_loss_) || !same_bits(grad_partial, local_grad_square_sum_);
    Comm& world = *ctx_->world;
    const int ranks = ctx_->mesh.world_size();
    const auto changed = static_cast<int>(world.all_reduce_scalar(mine_changed ? 1.0 : 0.0, ReduceOp::sum));
    const auto lowest = static_cast<int>(-world.all_reduce_scalar(mine_changed ? -ctx_->world_rank : -ranks, ReduceOp::max));
    RerunResult r;
    r.reproduced = changed == 0 && same_bits(first.loss, again.loss) && same_bits(first.grad_norm, again.grad_norm);
    r.numbers = cat("loss ", exact(first.loss), " then ", exact(again.loss), ", grad norm ", exact(first.grad_norm), " then ", exact(again.grad_norm));
    if (r.reproduced) return r;
    if (changed == 0) r.culprits = "an unknown rank (every rank's partial results repeated; a reduction between them did not)";
    else r.culprits = cat("rank ", lowest, " (", place_of(lowest), ")", changed > 1 ? cat(" and ", changed - 1, " other rank(s)") : "");
    return r;
}

// Only the rank itself knows its host: its name travels as 6-byte pieces, each an exact
// double in a scalar sum (the rest add 0). Rare (a fault being named) and device-agnostic.
std::string Trainer::place_of(int rank) {
    std::string mine;
    if (rank == ctx_->world_rank) {
        char host[64] = {};
        gethostname(host, sizeof host - 1);
        mine = cat("host ", host, ", ", config_.train.device == ComputeDevice::cuda ? cat("gpu ", ctx_->local_rank) : std::string("cpu"));
    }
    std::string text;
    constexpr size_t kPiece = 6, kPieces = 16;
    for (size_t p = 0; p < kPieces; ++p) {
        double value = 0;
        for (size_t i = 0; i < kPiece && p * kPiece + i < mine.size(); ++i)
            value += static_cast<double>(static_cast<unsigned char>(mine[p * kPiece + i])) * std::ldexp(1.0, static_cast<int>(8 * i));
        auto sum = static_cast<uint64_t>(ctx_->world->all_reduce_scalar(value, ReduceOp::sum));
        for (size_t i = 0; i < kPiece && (sum >> (8 * i)) != 0; ++i) text += static_cast<char>((sum >> (8 * i)) & 0xff);
    }
    return text;
}

// Every rank checks its share of each candidate's files (checkpoint_store.h:
// shared_problem_check) and every rank takes the same one: the newest that loads.
std::string Trainer::agreed_rollback_checkpoint(int64_t offending_step, const std::string& kind) {
    const std::string& root = config_.checkpoint.dir;
    Comm& world = *ctx_->world;
    double step = -1;
    const auto passed_over = [&](const std::string& why) {
        if (is_logger()) log_warn("rollback: ", why);
    };
    if (const std::optional<std::string> path = find_resume_checkpoint(root, "auto", passed_over, shared_problem_check(world), options_.run_id))
        step = static_cast<double>(read_checkpoint_manifest(*path).step);
    step = world.all_reduce_scalar(step, ReduceOp::max);
    if (step < 0)
        fail(ErrorKind::diverged, "step ", offending_step, ": ", kind, " calls for a rollback, but no checkpoint has been committed under '", root,
             "' yet (checkpoint.every_steps = ", config_.checkpoint.every_steps, "); stopping instead");
    return (std::filesystem::path(root) / checkpoint_name(static_cast<int64_t>(step))).string();
}

void Trainer::roll_back(int64_t offending_step, AnomalyRecord& event) {
    if (options_.settle_checkpoints) options_.settle_checkpoints();
    const std::string path = agreed_rollback_checkpoint(offending_step, event.kind);
    const Manifest manifest = read_checkpoint_manifest(path);
    // Every rank has read the manifest before rank 0 replaces it below.
    ctx_->world->all_reduce_scalar(0.0, ReduceOp::sum);
    // The data of the steps after the checkpoint up to the offending one, and skip_batches
    // global batches more, are never trained on: the data restarts at what step
    // offending_step + skip_batches (0-based) would have read.
    std::optional<LoaderState> resume = data_->state_at(offending_step + config_.monitor.skip_batches, ctx_->mesh.dp());
    load_checkpoint(path, manifest, "rollback");
    loss_scale_.restore(manifest.loss_scale, manifest.loss_scale_good_steps);
    tokens_seen_ = manifest.tokens_seen;
    if (resume) {
        if (manifest.data) {
            event.samples_begin = static_cast<int64_t>(manifest.data->cursor);
            event.samples_end = static_cast<int64_t>(resume->cursor);
        }
        resume->step = static_cast<uint64_t>(manifest.step);
        data_ = make_batch_source(config_, resume);
    }
    health_->rolled_back(manifest.monitor_state, offending_step);
    // The skip goes into the checkpoint's own manifest: a restart from it skips the same data
    // and counts this rollback. Its tensors (and the layout that saved them) stay as they are.
    if (is_logger()) {
        Manifest rewritten = manifest;
        rewritten.data = data_->state_at(manifest.step, ctx_->mesh.dp());
        rewritten.monitor_state = health_->state();
        rewrite_checkpoint_manifest(path, rewritten);
    }
    event.rollback_to = manifest.step;
    event.detail += cat("; restored '", path, "' (step ", manifest.step, ")");
    rollback_to_ = manifest.step;
}

void Trainer::report(AnomalyRecord& event, int64_t step) {
    const bool skipped_update = event.action == "skip" || event.action == "lower_lr";
    if (skipped_update) {
        if (const std::optional<LoaderState> state = data_->state_at(step, ctx_->mesh.dp())) {
            event.samples_begin = static_cast<int64_t>(state->cursor);
            event.samples_end = static_cast<int64_t>(state->cursor + global_batch());
        }
    }
    if (is_logger() && event.samples_end > event.samples_begin)
        event.samples_origin = data_->describe_samples(static_cast<uint64_t>(event.samples_begin), static_cast<uint64_t>(event.samples_end));
    if (!options_.quiet) log_warn(describe_event(event));
    for (StepObserver* observer : options_.observers) observer->after_anomaly(event);
}

bool Trainer::weights_finite() {
    double local = 0;
    for (const FlatRange& piece : placement_->pieces()) local += backend_->sum_squares(store_->master(piece));
    return std::isfinite(ctx_->world->all_reduce_scalar(local, ReduceOp::sum));
}

// Global micro-batch g = dp_rank * M + m of the step (M = grad_accum): each dp rank trains
// on its contiguous slice of the global batch, and a single process with M * dp
// micro-batches sees the very same windows.
void Trainer::forward_backward(int64_t step) {
    const TrainConfig& t = config_.train;
    const int64_t M = t.grad_accum, dp = ctx_->mesh.dp(), dp_rank = ctx_->coord()[mesh_dim::dp];
    Parameters& params = model_->parameters();
    const std::optional<size_t> embedding = model_->embedding_param();
    const bool tied_across_stages = config_.model.tied_embeddings && ctx_->mesh.pp() > 1;
    if (!params.all_grads().empty()) backend_->fill_zero(params.all_grads());
    gradients_reduced_ = optimizer_->reduces_gradients();
    sync_->begin_step(gradients_reduced_);

    bool last = false;  // whether the backward running is the step's last micro-batch's
    model_->set_grads_begin_hook([&](size_t begin, size_t end) {
        if (const std::optional<GradStorageBinding> b = sync_->open(begin, end)) params.bind_grads(b->first, b->end, b->values, b->flat_offset);
    });
    model_->set_grads_ready_hook([&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) {
            // Sequence-parallel norms saw only this rank's tokens: sum over the tp group first.
            if (params.info(i).grad_partial_over_tp && sync_->consumes(i, last)) comms_->tp().all_reduce(params.grad(i), ReduceOp::sum);
            if (!(tied_across_stages && embedding && i == *embedding)) sync_->ready(i, i + 1, last);
        }
    });
    const auto batch_of = [&](int64_t m) {
        Stopwatch wait;
        data_->fill_train(batch_, step, m, static_cast<int>(dp_rank), static_cast<int>(dp));
        data_wait_seconds_ += wait.seconds();
        return MicroBatch{batch_.inputs, batch_.targets};
    };
    // Each cp rank's loss is the mean over its chunks: the step's loss is their mean too.
    const int64_t cp = ctx_->mesh.cp();
    pipeline_->train_step(batch_of, t.batch_size, t.seq_len, loss_scale_.scale() / static_cast<double>(M * dp * cp), [&](int64_t m) { last = m == M - 1; });
    model_->set_grads_ready_hook(nullptr);
    model_->set_grads_begin_hook(nullptr);
    if (tied_across_stages && embedding) {
        sync_tied_embedding();
        sync_->ready(*embedding, *embedding + 1, true);
    }
    sync_->finish();
}

// The first stage's embedding and the last stage's head are one tied tensor held twice:
// their gradients are summed so that both copies take the same update.
void Trainer::sync_tied_embedding() {
    if (!comms_->embedding()) return;
    comms_->embedding()->all_reduce(model_->parameters().grad(*model_->embedding_param()), ReduceOp::sum);
}

// A parameter counts once in the norm: a tensor replicated over tp on tp rank 0 only, the
// tied embedding on the first stage only; under plain dp every rank holds every reduced
// gradient, so dp rank 0 alone counts them (under hybrid sharding: the first block's ranks).
bool Trainer::counts_in_norm(size_t param) const {
    const ParamInfo& info = model_->parameters().info(param);
    if (info.replicated() && ctx_->coord()[mesh_dim::tp] != 0) return false;
    const bool tied_copy = config_.model.tied_embeddings && !ctx_->first_stage() && model_->embedding_param() == param;
    return !tied_copy;
}

// One read of the device's step scalars, one reduction over the world of three numbers:
//   [0] the loss: the last stage's (tp rank 0's) sum of micro-batch means; 0 elsewhere.
//   [1] the squared gradient norm: each parameter counted once (counts_in_norm). A NaN or
//       Inf on any rank, also in a gradient this rank does not count, makes it NaN: that NaN
//       is the non-finite flag every guard reads.
//   [2] the stop signals raised: their sum is nonzero when any rank was asked to stop.
void Trainer::close_step(StepRecord& s) {
    const Parameters& params = model_->parameters();
    const std::vector<OwnedPiece>& owned = sync_->owned();
    const Tensor scalars = step_scalars_.view();
    const bool reports_loss = ctx_->last_stage() && ctx_->coord()[mesh_dim::tp] == 0;
    // The last stage's copy of a tied embedding holds the first stage's summed gradient: counted there.
    const bool tied_copy_here = config_.model.tied_embeddings && !ctx_->first_stage();
    backend_->fill_zero(scalars);
    if (reports_loss) backend_->copy(scalars.slice_rows(0, 1), model_->loss_sum());
    backend_->accumulate_sum_squares(scalars.slice_rows(1, 1), gradient_runs(params, owned, [this](size_t i) { return counts_in_norm(i); }));
    backend_->accumulate_sum_squares(scalars.slice_rows(2, 1), gradient_runs(params, owned, [&](size_t i) {
        return !counts_in_norm(i) && !(tied_copy_here && model_->embedding_param() == i);
    }));
    // FP8: the casts' saturated and flushed counts ride the same read and the same reduction.
    const Fp8Linears* fp8 = model_->fp8();
    if (fp8) backend_->copy(scalars.slice_rows(3, 2), fp8->cast_counts());
    double device[5] = {};
    backend_->copy_to_host(device, scalars);

    local_loss_ = device[0];
    local_grad_square_sum_ = device[1] + device[2];
    double squares = std::isfinite(device[2]) ? device[1] : std::numeric_limits<double>::quiet_NaN();
    if (!gradients_reduced_) {
        // Each dp rank holds its share s_r of the summed gradient; its own estimate of the
        // gradient is dp s_r. The norm reported is the root mean square of those estimates
        // over the dp ranks: sqrt(sum_r ||dp s_r||^2 / dp) = sqrt(dp sum_r ||s_r||^2).
        squares *= static_cast<double>(ctx_->mesh.data_size());
    } else if (!sync_->holds_first_copy() && std::isfinite(squares)) {
        squares = 0;
    }
    const int local_signal = options_.stop_signal ? options_.stop_signal() : 0;
    std::vector<ReplacedSample> replaced = data_->take_replaced_samples();
    std::array<double, 6> closing{local_loss_, squares, static_cast<double>(local_signal != 0), static_cast<double>(replaced.size()), device[3], device[4]};
    if (ctx_->mesh.world_size() > 1) ctx_->world->all_reduce(Tensor(closing.data(), DType::f64, {6}), ReduceOp::sum);
    const TrainConfig& t = config_.train;
    s.loss = closing[0] / static_cast<double>(t.grad_accum * ctx_->mesh.dp() * ctx_->mesh.cp());
    s.grad_norm = std::sqrt(closing[1]);
    agreed_stop_signal_ = closing[2] > 0 ? agreed_stop_signal(local_signal) : 0;
    if (closing[3] > 0) report_replaced_samples(s, replaced);
    if (config_.train.precision == Precision::fp8) s.fp8 = true, s.fp8_saturated = closing[4], s.fp8_flushed = closing[5];
}

// Rare (a corrupt block met): one reduction for the longest list, one all-gather of every
// rank's (global sample, source, shard, block) rows. Ranks that read the same samples (tp, cp,
// the first and last pipeline stages) list them alike: keyed by global sample, each counts once.
std::map<uint64_t, ReplacedSample> Trainer::gather_replaced_samples(const std::vector<ReplacedSample>& mine) {
    constexpr size_t kFields = 4;
    const int world = ctx_->mesh.world_size();
    const auto most = static_cast<size_t>(world > 1 ? ctx_->world->all_reduce_scalar(static_cast<double>(mine.size()), ReduceOp::max) : static_cast<double>(mine.size()));
    std::vector<double> rows(static_cast<size_t>(world) * most * kFields, -1.0);
    for (size_t i = 0; i < mine.size(); ++i) {
        double* row = rows.data() + (static_cast<size_t>(ctx_->world_rank) * most + i) * kFields;
        row[0] = static_cast<double>(mine[i].global_sample);
        row[1] = mine[i].source;
        row[2] = static_cast<double>(mine[i].shard);
        row[3] = mine[i].block;
    }
    if (world > 1) ctx_->world->all_gather(Tensor(rows.data(), DType::f64, {static_cast<int64_t>(rows.size())}));
    std::map<uint64_t, ReplacedSample> by_sample;
    for (size_t r = 0; r < rows.size(); r += kFields)
        if (rows[r] >= 0)
            by_sample.emplace(static_cast<uint64_t>(rows[r]), ReplacedSample{static_cast<uint64_t>(rows[r]), static_cast<uint32_t>(rows[r + 1]),
                                                                             static_cast<uint64_t>(rows[r + 2]), static_cast<uint32_t>(rows[r + 3])});
    return by_sample;
}

// A block is reported the first time this process meets it: the same step on every layout,
// since the global samples of a step do not depend on the layout.
void Trainer::report_replaced_samples(StepRecord& s, const std::vector<ReplacedSample>& mine) {
    const std::map<uint64_t, ReplacedSample> by_sample = gather_replaced_samples(mine);
    s.samples_replaced = static_cast<int64_t>(by_sample.size());
    std::map<CorruptBlockKey, CorruptBlockRecord> met;  // blocks not reported before, in (source, shard, block) order
    for (const auto& [global, r] : by_sample) {
        const CorruptBlockKey key{r.source, r.shard, r.block};
        if (reported_blocks_.count(key) > 0) continue;
        const auto [entry, fresh] = met.try_emplace(key);
        if (!fresh) {
            ++entry->second.samples_replaced;
            continue;
        }
        const BlockOrigin origin = data_->corrupt_block_origin(r);
        entry->second = {s.step, origin.shard, origin.block, static_cast<int64_t>(origin.first_token), static_cast<int64_t>(origin.tokens), 1};
    }
    for (const auto& [key, record] : met) {
        reported_blocks_.insert(key);
        if (is_logger() && !options_.quiet)
            log_warn("data: step ", record.step, ": block ", record.block, " of '", record.shard, "' (tokens [", record.first_token, ", ", record.first_token + record.tokens,
                     ")) is corrupt: its ", record.tokens, " tokens are skipped, and each sample that meets it is replaced by the next clean sample of its source ",
                     "(data.on_corrupt_block = \"skip\"; ", record.samples_replaced, " this step); `llmtrain data verify` lists every corrupt block");
        for (StepObserver* observer : options_.observers) observer->after_corrupt_block(record);
    }
}

// The validation set is sequences [0, eval_sequences) whatever the micro-batch size and the
// layout: they run in micro-batches of up to batch_size (the last holds the remainder),
// micro-batch i on dp rank i % dp. Each adds its mean loss times its sequences, so the
// result is the mean over every validation token: sum_i rows_i * mean_i / eval_sequences.
double Trainer::evaluate() {
    // dp ranks run different numbers of forwards here: every gather completes first, on all.
    store_->settle();
    const Fp8NotRecording fp8_reads_only(model_->fp8());
    const TrainConfig& t = config_.train;
    const int64_t dp = ctx_->mesh.dp(), dp_rank = ctx_->coord()[mesh_dim::dp];
    const int64_t micro_batches = (t.eval_sequences + t.batch_size - 1) / t.batch_size;
    // ZeRO-3 gathers parameters in every forward, a collective over the dp group: every dp
    // rank runs as many forwards, those past the last micro-batch on the first one, unweighted.
    const int64_t rounds = store_->gathers_in_forward() ? (micro_batches + dp - 1) / dp * dp : micro_batches;
    double total = 0;
    for (int64_t i = dp_rank; i < rounds; i += dp) {
        const bool counted = i < micro_batches;
        const int64_t first = counted ? i * t.batch_size : 0, rows = std::min(t.batch_size, t.eval_sequences - first);
        data_->fill_eval(batch_, first, rows);
        const MicroBatch micro_batch{batch_.inputs.view().slice_rows(0, rows * t.seq_len), batch_.targets.view().slice_rows(0, rows * t.seq_len)};
        const double loss = pipeline_->forward_only(micro_batch, rows, t.seq_len);
        if (counted) total += static_cast<double>(rows) * loss;
    }
    const bool reports_loss = ctx_->last_stage() && ctx_->coord()[mesh_dim::tp] == 0;
    // Every cp rank reports the mean over its chunks of the same sequences.
    return ctx_->world->all_reduce_scalar(reports_loss ? total : 0.0, ReduceOp::sum) / static_cast<double>(t.eval_sequences * ctx_->mesh.cp());
}

std::string Trainer::sample_text() {
    store_->settle();  // every rank's; the sample's forwards run on one
    const TrainConfig& t = config_.train;
    if (t.sample_tokens == 0 || !is_logger()) return "";
    if (store_->gathers_in_forward()) {
        if (!options_.quiet) log_info("sample: not generated; under parallel.zero_stage = 3 every forward gathers the parameters over the dp group");
        return "";
    }
    // Under cp a rank holds its chunks of each sequence: a forward is a ring over the cp group.
    if (ctx_->mesh.tp() > 1 || ctx_->mesh.pp() > 1 || ctx_->mesh.cp() > 1) {
        if (!options_.quiet) log_info("sample: not generated; sampling runs on a model held whole by one rank over whole sequences (tp = pp = cp = 1)");
        return "";
    }
    const std::vector<int32_t> context = data_->prompt_tokens(t.sample_prompt);
    const Fp8NotRecording fp8_reads_only(model_->fp8());
    const std::vector<int32_t> generated = generate_tokens(*model_, context, t.sample_tokens, t.sample_temperature, t.seed);
    const std::string text = data_->printable(generated);
    if (!options_.quiet) log_info("sample (", t.sample_tokens, " tokens, temperature ", t.sample_temperature, "):\n", t.sample_prompt, text);
    return t.sample_prompt + text;
}

void Trainer::record(const StepRecord& s) {
    if (result_.steps_taken++ == 0) first_step_seconds_ = s.step_seconds;
    result_.last_step = s.step;
    result_.steps.push_back(s);
    if (result_.steps.size() > TrainResult::kStepRecordsKept) result_.steps.pop_front();
    for (StepObserver* observer : options_.observers) observer->after_step(s);
}

void Trainer::record_eval(int64_t step, double val_loss) {
    const EvalRecord e{step, val_loss};
    result_.evals.push_back(e);
    for (StepObserver* observer : options_.observers) observer->after_eval(e);
}

// One all-reduce of world_size numbers (each rank fills its own slot) every
// straggler_interval_steps; the median keeps one slow step from marking a rank.
void Trainer::measure_stragglers(StepRecord& s) {
    const int64_t interval = config_.metrics.straggler_interval_steps;
    const int world = ctx_->mesh.world_size();
    if (interval == 0 || world == 1) return;
    compute_times_.add(s.rank.compute_seconds(s.step_seconds));
    if (s.step % interval != 0) return;
    std::vector<double> medians(static_cast<size_t>(world), 0.0);
    medians[static_cast<size_t>(ctx_->world_rank)] = compute_times_.median();
    ctx_->world->all_reduce(Tensor(medians.data(), DType::f64, {world}), ReduceOp::sum);
    s.straggler_scores = straggler_scores(medians);
    if (!is_logger()) return;
    for (int r = 0; r < world; ++r) {
        const double score = s.straggler_scores[static_cast<size_t>(r)];
        if (score < config_.metrics.straggler_threshold)
            log_warn("straggler: rank ", r, " (", ctx_->mesh.describe(r), ") computes at ", fixed(score, 2), " of the fastest rank's speed (median ",
                     fixed(medians[static_cast<size_t>(r)] * 1e3, 1), " ms against ", fixed(medians[static_cast<size_t>(r)] * score * 1e3, 1),
                     " ms over the last ", interval, " steps; metrics.straggler_threshold = ", config_.metrics.straggler_threshold, ")");
    }
}

// One process asks at the step boundary itself; ranks go by what the step's closing
// reduction agreed (no collective of its own: a signal raised after that waits a step).
int Trainer::stop_signal_after_step() {
    if (ctx_->mesh.world_size() == 1) return options_.stop_signal ? options_.stop_signal() : 0;
    return agreed_stop_signal_;
}

// A signal may reach one rank alone (Slurm signals the batch step, a user kills one pid),
// and every rank must leave the loop after the same step with the same code: rare (a stop),
// so one more collective to agree which signal.
int Trainer::agreed_stop_signal(int local_signal) {
    if (ctx_->mesh.world_size() == 1) return local_signal;
    return static_cast<int>(ctx_->world->all_reduce_scalar(static_cast<double>(local_signal), ReduceOp::max));
}

}  // namespace llmtrain
