// `llmtrain train`: every check first (config, layout, the run directory and checkpoint.dir
// against the run's identity, the resume target, and under MPI the agreement of every rank),
// then the trainer (device, data, allocation), and only then the run directory: a run refused
// at the door leaves nothing behind. The run directory tells what became of the run
// (metrics/run_log.h): start, steps, and one closing record, or none if it was killed; the
// same command run again with --resume continues the run there.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/config_changes.h"
#include "checkpoint/initial_weights.h"
#include "checkpoint/local_snapshots.h"
#include "checkpoint/resume_point.h"
#include "cli/commands.h"
#include "cli/restart_report.h"
#include "cli/run_directory.h"
#include "cli/run_guards.h"
#include "cli/run_metrics.h"
#include "config/config.h"
#include "core/durable_file.h"
#include "core/exit_code.h"
#include "core/log.h"
#include "core/signals.h"
#include "data/batch_source.h"
#include "metrics/console_observer.h"
#include "metrics/run_log.h"
#include "health/anomaly_log.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "plan/memory_plan.h"
#include "parallel/timed_comm.h"
#include "train/trainer.h"

namespace llmtrain {

namespace {

// checkpoint.dir is made by the first save's writer, so that a run refused before then (its
// data, init_from) leaves nothing behind; a directory still to be made must be makeable now.
// One that exists but cannot be written is the save-error policy's (checkpoint.on_save_error
// = "warn": the run goes on and each failed save says why).
void require_checkpoint_dir_creatable(const Config& config) {
    std::error_code ec;
    if (config.checkpoint.every_steps > 0 && !std::filesystem::exists(config.checkpoint.dir, ec))
        require_creatable(config.checkpoint.dir, OutputKind::directory, "checkpoint.dir");
}

struct TrainArgs {
    std::string config_path;
    std::vector<std::string> overrides;
    std::string run_dir;
    bool dry_run = false;
    bool strict = false;  // refuse to start where a warning would do (too little room for checkpoints)
    std::string resume;  // "", auto, latest or a checkpoint directory
};

// The run's evaluations, first and last; one evaluation is said once. A resumed run was
// evaluated at its start by the run that saved it, so its first here is a later step.
std::string val_loss_summary(const std::vector<EvalRecord>& evals, int64_t start_step) {
    const EvalRecord &first = evals.front(), &last = evals.back();
    std::string text = cat("val loss: ", first.val_loss, " at step ", first.step);
    if (evals.size() > 1) text += cat(" -> ", last.val_loss, " at step ", last.step);
    if (start_step > 0) text += cat(" (", evals.size() > 1 ? "this run's first and last evaluations" : "this run's one evaluation", "; it resumed at step ", start_step, ")");
    return text;
}

void report(const TrainResult& result, int64_t start_step) {
    const OpProfile& p = result.step_profile;
    std::vector<int> order(op_count);
    for (int i = 0; i < op_count; ++i) order[static_cast<size_t>(i)] = i;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p.seconds[static_cast<size_t>(a)] > p.seconds[static_cast<size_t>(b)]; });
    std::string top;
    for (size_t i = 0; i < 5 && i < order.size(); ++i) {
        const auto op = static_cast<size_t>(order[i]);
        top += cat(i ? ", " : "", op_name(static_cast<Op>(op)), " ", std::lround(100 * p.seconds[op] / result.train_seconds), "%");
    }
    log_info("done: ", result.steps_taken, " steps in ", std::round(result.train_seconds * 10) / 10, " s | ", std::lround(result.tokens_per_second),
             " tokens/s (steps after the first)",
             p.total_seconds() > 0 ? cat(" | time in GEMMs: ", std::lround(100 * result.gemm_fraction), "% of step time") : std::string());
    // The CUDA backend times ops only when profiling (bench): no timing events in a training step.
    if (p.total_seconds() > 0) log_info("op time: ", top);
    if (!result.evals.empty()) log_info(val_loss_summary(result.evals, start_step));
}

// SIGINT is the user at the terminal; SIGTERM and SIGUSR1 are a scheduler's notice: run again.
ExitCode exit_code_of_stop(int signal) { return signal == SIGINT ? exit_interrupted : exit_resume; }

// --dry-run, after the checks the run itself makes: what the run would be, and nothing created.
void print_dry_run(const Config& config, const Mesh& mesh) {
    const std::vector<int64_t> layers = parse_stage_layers(config.parallel.stage_layers, mesh.pp(), config.model.n_layers);
    std::string stages;
    for (size_t s = 0; s < layers.size(); ++s) stages += cat(s ? ", " : "", layers[s]);
    const int shard_size = shard_size_of(config.parallel, mesh.dp());
    const std::string hybrid = shard_size < mesh.dp() ? cat(" (sharded within blocks of ", shard_size, " dp ranks)") : "";
    // ZeRO shards over the data group: the dp x cp ranks holding the same weights.
    const std::string zero = mesh.data_size() > 1 ? cat("ZeRO stage ", config.parallel.zero_stage, mesh.cp() > 1 ? cat(", data group dp x cp = ", mesh.data_size(), " ranks") : "")
                                                  : "ZeRO off (dp 1: nothing to shard)";
    std::printf("layout: %d ranks = %s (order %s) | layers per stage: %s | %s%s\n", mesh.world_size(), mesh.describe_sizes().c_str(), config.parallel.order.c_str(),
                stages.c_str(), zero.c_str(), hybrid.c_str());
    const int64_t micro_batches = micro_batches_per_step(config, mesh.dp());
    std::printf("batch: %lld x %lld tokens x %lld micro-batches x dp %d = %lld tokens per step%s\n", static_cast<long long>(config.train.batch_size),
                static_cast<long long>(config.train.seq_len), static_cast<long long>(micro_batches), mesh.dp(),
                static_cast<long long>(config.train.batch_size * config.train.seq_len * micro_batches * mesh.dp()),
                mesh.cp() > 1 ? cat(" (each sequence split over cp ", mesh.cp(), ": ", config.train.seq_len / mesh.cp(), " tokens per rank)").c_str() : "");
    const MemoryPlan plan = largest_rank_plan(config, mesh);
    std::printf("memory plan of the largest rank: %s\n", describe(plan).c_str());
    check_memory_fits(plan, available_memory_per_rank(config, 0, 1));  // as if each rank had a node of this machine's size
    std::printf("dry run: every check passed; nothing was allocated or written\n");
}

// --dry-run's first output: the effective config (the key reference: every key with its
// default and description), then the data as the run opens it (files, headers, every id
// against model.vocab_size, the tokenizer's hash against the dataset's).
void print_effective_config_and_data(const Config& config) {
    std::printf("# Effective configuration (defaults and --set overrides applied)\n%s\n", dump_config(config).c_str());
    std::fflush(stdout);
    std::printf("data: %s\n", make_batch_source(config)->describe().c_str());
}

// Where a run stands before anything is written: the checkpoint it starts from, and who it is.
struct RunStart {
    std::optional<ResumePoint> resume;
    RunIdentity identity;
};

// The run's identity from its run directory's record and the checkpoint --resume found: a
// resumed run is the checkpoint's run, a run continued in its run directory is the one
// recorded there (and may resume only its own checkpoints), any other run is new.
RunIdentity identify_run(const std::string& run_dir, const RunRecord& record, const std::optional<ResumePoint>& resume) {
    RunIdentity identity;
    identity.continues_record = record.holds_run;
    if (resume) {
        identity.run_id = resume->manifest.run_id;
        identity.resumed_from = resume->path;
        identity.start_step = resume->manifest.step;
    } else {
        identity.run_id = record.run_id ? *record.run_id : new_run_id();
    }
    if (record.holds_run && record.run_id && resume && *record.run_id != resume->manifest.run_id)
        fail(ErrorKind::config, "run directory '", run_dir, "' holds ", describe_run(*record.run_id), "; the checkpoint '", resume->path, "' is of ",
             describe_run(resume->manifest.run_id), ": continue each run in its own run directory (choose another --run-dir)");
    return identity;
}

// The keys of the effective config that differ from what the run directory recorded first.
std::string changes_from_record(const std::string& run_dir, const Config& config) {
    std::ifstream in(std::filesystem::path(run_dir) / "config.toml");
    const std::string recorded((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const ConfigChanges changes = config_changes(recorded, dump_config(config));
    std::string text;
    for (const auto* list : {&changes.model_shape, &changes.layout, &changes.other})
        for (const ConfigChange& c : *list) text += (text.empty() ? "" : ", ") + c.describe();
    return text;
}

// The checks of a run's start that read the run directory, checkpoint.dir and the resume
// target, in the order the run makes them; they write nothing. find: the resume target
// (under MPI every rank agrees on it). On return `config` is the run's effective config (a
// resume keeps its global batch on this dp).
// record: what the run directory holds, the same on every rank; run_dir: "" on ranks other than 0.
template <class FindResume>
RunStart check_run_start(const TrainArgs& args, const std::string& run_dir, const RunRecord& record, Config& config, int64_t dp, bool report, FindResume&& find) {
    if (record.holds_run && args.resume.empty()) check_run_dir_is_free(run_dir);
    RunStart start;
    if (!args.resume.empty()) start.resume = find(record.run_id);
    start.identity = identify_run(run_dir, record, start.resume);
    if (start.resume) {
        check_resume_config(*start.resume, config, report);
        keep_saved_global_batch(*start.resume, config, dp, report);
    } else {
        check_initial_weights_fit(config);
    }
    micro_batches_per_step(config, dp);  // a global batch that does not split stops the run before its directory exists
    if (record.holds_run && !run_dir.empty()) start.identity.config_changes = changes_from_record(run_dir, config);
    if (config.checkpoint.every_steps > 0 && !run_dir.empty()) check_checkpoint_dir_is_free_for(config.checkpoint.dir, start.identity.run_id);
    return start;
}

// The lines that use a run's checkpoints, printed when a run leaves one: on its run directory
// (its own newest checkpoint), else on the checkpoint; the export beside them, not inside a
// checkpoint directory.
void print_next_commands(const std::string& run_dir, const std::string& checkpoint) {
    const std::string target = run_dir.empty() ? checkpoint : run_dir;
    const std::string out = run_dir.empty() ? (std::filesystem::path("exports") / std::filesystem::path(checkpoint).filename()).string()
                                            : (std::filesystem::path(run_dir) / "hf").string();
    log_info("next: llmtrain generate ", target, "  |  llmtrain eval ", target, "  |  llmtrain checkpoint export ", target, " ", out);
}

// The world a layout asks for: tp * cp * pp * dp (dp = 0: 1).
int layout_ranks(const ParallelConfig& parallel) {
    return static_cast<int>(parallel.tp * parallel.cp * parallel.pp * std::max<int64_t>(1, parallel.dp));
}

// The starting point: the checkpoint --resume found, else train.init_from's weights, else the
// random initialization the trainer made.
void restore(Trainer& trainer, const std::optional<ResumePoint>& resume, const Config& config) {
    if (!resume) {
        if (config.train.init_from.empty()) return;
        trainer.load_initial_weights(config.train.init_from);
        if (trainer.context().world_rank == 0) log_info("weights from '", initial_weights_source(config.train.init_from), "' (train.init_from); starting at step 0");
        return;
    }
    trainer.restore(resume->path, resume->manifest);
    if (trainer.context().world_rank != 0) return;
    log_info("resumed from '", resume->path, "' at step ", resume->manifest.step, " (saved on ", resume->manifest.world_size, " rank(s): tp ",
             resume->manifest.tp, " x dp ", resume->manifest.dp, " x pp ", resume->manifest.pp, ")");
    const std::string health = trainer.health().lasting_effects();
    if (!health.empty()) log_info("health: in force from before the checkpoint: ", health);
}

// Where this run's local snapshots live ([checkpoint.local]): every rank's node and this
// node's directory, checked to be node-local. Known before the restore, which may use them.
struct LocalSnapshotPlace {
    NodeMap nodes;
    std::string root;
};

std::optional<LocalSnapshotPlace> place_local_snapshots(Trainer& trainer, const Config& config, const std::string& run_id) {
    if (config.checkpoint.local.every_steps == 0) return std::nullopt;
    Comm& world = *trainer.context().world;
    LocalSnapshotPlace place{gather_node_map(world), ""};
    place.root = local_snapshot_root(config.checkpoint.local, place.nodes.names[static_cast<size_t>(place.nodes.node_of_rank[static_cast<size_t>(world.rank())])], run_id);
    check_node_local(world, place.nodes, place.root);
    return place;
}

// --resume auto with local snapshots: the newest local snapshot whose every piece survives,
// when it is newer than the persistent checkpoint found (the same step: the local one, read
// from memory rather than shared storage). Every rank takes the same decision.
// Returns whether the local snapshot was chosen.
bool prefer_local_snapshot(Trainer& trainer, std::optional<ResumePoint>& resume, const std::optional<LocalSnapshotPlace>& place, const std::string& mode,
                           const std::string& run_id) {
    if (!place || mode != "auto") return false;
    const bool root = trainer.context().world_rank == 0;
    const Manifest here = trainer.manifest_at(0);
    const LayoutCheck same_layout = [&here](const Manifest& m) -> std::optional<std::string> {
        if (m.world_size == here.world_size && m.tp == here.tp && m.cp == here.cp && m.dp == here.dp && m.pp == here.pp && m.zero_stage == here.zero_stage)
            return std::nullopt;
        return cat("it was written on another layout (", m.world_size, " ranks: tp ", m.tp, " cp ", m.cp, " dp ", m.dp, " pp ", m.pp, ", ZeRO ", m.zero_stage,
                   "); local snapshots restore on the layout that wrote them only, so the persistent checkpoints are used");
    };
    const int64_t persistent = resume ? resume->manifest.step - 1 : -1;  // a local snapshot of the same step is preferred
    const std::optional<LocalResume> local = agree_on_local_snapshot(*trainer.context().world, *trainer.context().snapshot_copies, place->nodes, place->root, run_id, persistent, same_layout,
                                                                     [root](const std::string& why) {
                                                                         if (root) log_warn("--resume auto: ", why);
                                                                     });
    if (!local) {
        if (root && resume) log_info("--resume auto: no complete local snapshot newer than the persistent checkpoint '", resume->path, "'");
        return false;
    }
    if (root)
        log_info("--resume auto: the local snapshot of step ", local->manifest.step, " (", local->path, " on each node) is the newest restorable state",
                 resume ? cat("; the persistent checkpoint is at step ", resume->manifest.step) : "; no persistent checkpoint yet", " | ", local->fetched,
                 " rank(s) fetched their piece from a peer (", megabytes(static_cast<double>(local->fetched_bytes)), ")");
    resume = ResumePoint{local->path, local->manifest};
    return true;
}

// A resumed run's restart facts (nullopt for a fresh start).
std::optional<RestartFacts> restart_facts(const std::optional<ResumePoint>& resume, bool local, int64_t interrupted_step, RestartMarks marks) {
    if (!resume) return std::nullopt;
    marks.loaded = unix_now();
    return RestartFacts{resume->manifest.step, local ? "local snapshot" : "checkpoint", resume->path, interrupted_step, marks};
}

// What a save of this rank's state (a checkpoint or a local snapshot) takes from the run: its
// file's attributes, the copy of its state, and the manifest's fields.
FileAttributes rank_file_attributes(const ParallelContext& ctx) {
    return {0, ctx.world_rank, ctx.mesh.world_size(), ctx.mesh.tp(), ctx.mesh.dp(), ctx.mesh.pp(), ctx.mesh.cp()};
}
std::function<void(int64_t, RankSnapshot&)> state_capture(Trainer& trainer) {
    return [&trainer](int64_t step, RankSnapshot& out) { capture_snapshot(trainer.snapshot_source(), step, out); };
}
// The config as the user gave it: a resume compares its batch keys with the next one's (a kept
// global batch is in the manifest's global_batch, not in the keys).
std::function<Manifest(int64_t)> manifest_fields(Trainer& trainer, const Config& as_given, const std::string& run_dir) {
    return [&trainer, given = dump_config(as_given), run_dir](int64_t step) {
        Manifest m = trainer.manifest_at(step);
        m.config_toml = given;
        m.run_directory = run_dir;
        return m;
    };
}

void start_local_snapshots(std::optional<LocalSnapshotter>& snapshots, Trainer& trainer, const Config& config, const Config& as_given,
                           const std::optional<LocalSnapshotPlace>& place, const std::string& run_dir, const FaultPlan& faults) {
    if (!place) return;
    const ParallelContext& ctx = trainer.context();
    const FileAttributes file = rank_file_attributes(ctx);
    LocalSnapshotHooks hooks{state_capture(trainer), manifest_fields(trainer, as_given, run_dir), {}};
    if (!faults.empty()) hooks.before_write = [faults, rank = ctx.world_rank](int64_t step) { faults.strike_local_snapshot(rank, step); };
    snapshots.emplace(config.checkpoint.local, *ctx.world, *ctx.snapshot_copies, file, place->nodes, place->root, trainer.start_step(), std::move(hooks));
    trainer.observe(*snapshots);
}

// A local snapshot in log.jsonl: complete or failed, what it cost the step loop and the node.
void record_local_snapshots(LocalSnapshotter& snapshots, RunLog& log) {
    snapshots.on_outcome([&log](const LocalSnapshotOutcome& o) {
        log.write("local_snapshot", {{"step", o.step}, {"complete", o.complete}, {"reason", o.reason}, {"copy_seconds", o.copy_seconds},
                                     {"write_seconds", o.write_seconds}, {"blocked_seconds", o.blocked_seconds}, {"own_bytes", o.own_bytes},
                                     {"replica_bytes", o.replica_bytes}, {"seconds_to_complete", o.seconds_to_complete}});
    });
}

void start_checkpointer(std::optional<Checkpointer>& checkpointer, Trainer& trainer, const Config& config, const Config& as_given, const std::string& run_dir,
                        const FaultPlan& faults) {
    if (config.checkpoint.every_steps == 0) return;
    const ParallelContext& ctx = trainer.context();
    const FileAttributes file = rank_file_attributes(ctx);
    CheckpointerHooks hooks;
    hooks.capture = state_capture(trainer);
    hooks.manifest = manifest_fields(trainer, as_given, run_dir);
    if (!faults.empty()) hooks.commit_probe = [faults](int64_t step, std::string_view point) { faults.strike_commit(step, point); };
    checkpointer.emplace(config.checkpoint, *ctx.world, file, std::move(hooks));
    trainer.observe(*checkpointer);
    trainer.settle_checkpoints_with([&saver = *checkpointer] { saver.finish(); });
}

// Training health stopped the run (every rank agrees: the verdict is judged on reduced
// figures): the state before the offending step is saved, if it is finite, for a person to
// start again from with other settings.
void save_before_abort(Trainer& trainer, std::optional<Checkpointer>& checkpointer, const std::string& checkpoint_dir) {
    if (!checkpointer) return;
    const int64_t step = trainer.current_step();
    const bool root = trainer.context().world_rank == 0;
    if (step <= trainer.start_step() || !trainer.weights_finite()) {
        if (root) log_warn("no checkpoint saved at the abort: ", step <= trainer.start_step() ? "no step was applied in this run" : "the weights are not finite");
        checkpointer->finish();
        return;
    }
    checkpointer->save_and_wait(step);
    if (root) log_warn("saved the state after step ", step, " (before the offending step) in '", checkpoint_dir, "'");
}

// The run's name: its directory's (the `job` label of its metrics).
std::string run_name(const std::string& run_dir) { return std::filesystem::path(run_dir).lexically_normal().filename().string(); }

// What a run is given to train: its effective config, the config as the user gave it (for its
// manifests), where it is recorded and who it is.
struct RunPlan {
    const Config& config;
    const Config& as_given;
    std::string run_dir;      // rank 0; "" elsewhere
    std::string job_run_dir;  // the run directory, known to every rank
    int ranks = 1;
    RunIdentity identity;
    const FaultPlan& faults;  // the commit's faults (the trainer holds its own copy for the steps)
    const std::optional<LocalSnapshotPlace>& local;
    const std::optional<RestartFacts>& restart;  // a resumed run's
};

// A failed save in log.jsonl: the step, who failed and why, how many in a row, and what there
// is to resume from.
void record_failed_saves(Checkpointer& checkpointer, RunLog& log) {
    checkpointer.on_outcome([&log](const SaveOutcome& o) {
        if (o.committed) return;
        log.write("checkpoint_failed", {{"step", o.step}, {"rank", o.failed_rank}, {"reason", o.reason}, {"failures_in_a_row", o.failures_in_a_row},
                                        {"newest_checkpoint", o.newest_checkpoint}});
    });
}

// The state after the last step must be on disk before the process says it is done: a run
// whose final save failed ends with Error(storage) (exit 74), never 0, naming what is left.
void require_final_save(const Checkpointer& checkpointer, int64_t last_step) {
    if (checkpointer.saved(last_step)) return;
    const std::optional<SaveOutcome>& failure = checkpointer.last_failure();
    const std::string newest = failure && !failure->newest_checkpoint.empty() ? cat("the newest checkpoint is '", failure->newest_checkpoint, "'")
                                                                              : "no newer checkpoint of this run was found";
    fail(ErrorKind::storage, "the checkpoint of the last step ", last_step, " was not saved", failure ? cat(" (", failure->reason, ")") : "",
         ": the steps since are lost; ", newest, ". Fix the storage of checkpoint.dir, then run the same command with --resume auto");
}

// Trains with everything checked; rank 0 (run_dir set) records the run. Returns the exit code.
int train(Trainer& trainer, const RunPlan& run) {
    const Config& config = run.config;
    std::optional<RunDirectory> dir;
    std::optional<ConsoleObserver> console;
    std::optional<AnomalyLog> anomalies;
    std::optional<Checkpointer> checkpointer;
    std::optional<LocalSnapshotter> snapshots;
    std::optional<UnsavedRunWarning> unsaved;
    start_checkpointer(checkpointer, trainer, config, run.as_given, run.job_run_dir, run.faults);
    start_local_snapshots(snapshots, trainer, config, run.as_given, run.local, run.job_run_dir, run.faults);
    // Before the run directory: a metrics port that cannot be bound leaves nothing behind.
    RunMetrics metrics(trainer, config, run_name(run.job_run_dir), checkpointer ? &*checkpointer : nullptr, snapshots ? &*snapshots : nullptr);
    std::optional<RestartReport> restart;
    if (!run.run_dir.empty()) {
        dir.emplace(run.run_dir, config, config.source_path, run.ranks, run.identity);
        anomalies.emplace((std::filesystem::path(run.run_dir) / "anomalies.jsonl").string(), run.identity.continues_record);
        trainer.observe(*anomalies);
        log_info("llmtrain ", LLMTRAIN_VERSION, " | config ", config.source_path, " | run directory ", run.run_dir,
                 run.identity.continues_record ? " (continued)" : "", run.ranks > 1 ? cat(" | ", run.ranks, " ranks") : "", " | ", describe_run(run.identity.run_id));
        console.emplace(config.train.log_every, config.train.steps);
        trainer.observe(*console);
        if (config.metrics.jsonl) trainer.observe(dir->log());
        if (checkpointer) record_failed_saves(*checkpointer, dir->log());
        if (snapshots) record_local_snapshots(*snapshots, dir->log());
        if (!checkpointer) {
            unsaved.emplace(config, trainer.start_step());
            trainer.observe(*unsaved);
        }
    }
    if (run.restart) {
        restart.emplace(*run.restart, dir ? &dir->log() : nullptr, metrics);
        trainer.observe(*restart);
    }
    metrics.publish_endpoints(run.run_dir);
    try {
        const TrainResult result = trainer.run();
        const int64_t last_step = result.last_step;
        // Stopped or finished: the state after the last step is saved before the process ends.
        if (snapshots) snapshots->finish();
        if (checkpointer) checkpointer->save_and_wait(last_step);
        metrics.finish();  // the last scrape sees the final save, failed or not
        if (checkpointer) require_final_save(*checkpointer, last_step);
        if (result.stop_signal != 0) {
            const ExitCode code = exit_code_of_stop(result.stop_signal);
            if (dir) {
                log_warn("stopped by ", signal_name(result.stop_signal), " after step ", last_step, " of ", config.train.steps,
                         checkpointer ? "; the checkpoint is saved: run the same command with --resume auto to continue" : "");
                dir->log().write("interrupted", {{"signal", signal_name(result.stop_signal)}, {"step", last_step}, {"exit_code", code}});
            }
            return code;
        }
        if (dir) {
            report(result, trainer.start_step());
            dir->log().write("end", {{"steps", last_step}, {"seconds", result.train_seconds},
                                     {"tokens_per_second", result.tokens_per_second}, {"exit_code", exit_ok}});
            if (checkpointer && checkpointer->last_save())
                print_next_commands(run.run_dir, (std::filesystem::path(config.checkpoint.dir) / checkpoint_name(last_step)).string());
        }
        return exit_ok;
    } catch (const Error& e) {
        if (e.kind() == ErrorKind::diverged) save_before_abort(trainer, checkpointer, config.checkpoint.dir);
        if (dir) dir->log().write("error", {{"kind", error_kind_name(e.kind())}, {"message", e.what()}, {"exit_code", exit_code_for(e.kind())}});
        throw;
    }
}

// A run whose checkpoint holds every step already has nothing to do; it says so, and how to
// use what it left.
bool finished_already(const RunStart& start, const Config& config, const std::string& run_dir, bool report) {
    if (!trained_already(start.resume, config, report)) return false;
    if (report) print_next_commands(start.identity.continues_record ? run_dir : "", start.resume->path);
    return true;
}

int train_single_process(const TrainArgs& args, const Config& as_given, FaultPlan faults, RestartMarks marks) {
    Config config = as_given;
    const int ranks = layout_ranks(config.parallel);
    const Mesh mesh = make_mesh(config.parallel, ranks);
    require_trainable_in_this_build(config);  // a layout plan sizes but this build does not train: also under --dry-run
    if (args.dry_run) print_effective_config_and_data(config);
    if (ranks > 1 && !args.dry_run)
        fail(ErrorKind::config, config.source_path, ": parallel: the layout asks for ", ranks, " ranks (tp ", config.parallel.tp,
             config.parallel.cp > 1 ? cat(", cp ", config.parallel.cp) : "", ", pp ", config.parallel.pp, ", dp ", config.parallel.dp, ") but this process was not started by an MPI launcher: run `mpirun -np ", ranks, " llmtrain train ...`");
    micro_batches_per_step(config, mesh.dp());  // a global batch that does not split stops the run before its directory exists
    const std::string run_dir = args.run_dir.empty() ? default_run_dir(args.config_path) : args.run_dir;
    const RunStart start = check_run_start(args, run_dir, read_run_record(run_dir), config, mesh.dp(), true,
                                           [&](const std::optional<std::string>& run_id) { return find_resume_point(args.resume, config, true, {}, run_id); });
    if (args.dry_run) {
        print_dry_run(config, mesh);
        return exit_ok;
    }
    require_checkpoint_dir_creatable(config);
    check_rank_memory(config, mesh, 0, 1);
    if (finished_already(start, config, run_dir, true)) return exit_ok;
    const RunLocks locks(run_dir, config);
    check_checkpoint_room(config, args.strict);
    install_stop_signal_handlers();
    TrainerOptions options;
    options.stop_signal = pending_stop_signal;
    options.run_id = start.identity.run_id;
    options.faults = faults;
    marks.communicators = unix_now();
    Trainer trainer(config, std::move(options));
    const std::optional<LocalSnapshotPlace> local = place_local_snapshots(trainer, config, start.identity.run_id);
    std::optional<ResumePoint> resume = start.resume;
    const bool from_local = prefer_local_snapshot(trainer, resume, local, args.resume, start.identity.run_id);
    restore(trainer, resume, config);
    const std::optional<RestartFacts> restart = restart_facts(resume, from_local, read_run_record(run_dir).last_step, marks);
    return train(trainer, {config, as_given, run_dir, run_dir, 1, start.identity, faults, local, restart});
}

// Runs checks on every rank. If any rank fails, the first failing rank alone prints its
// error (a config error is the same on every rank: printed once, not once per rank) and
// every rank ends with that error's exit code.
template <class Checks>
void check_on_every_rank(const MpiSession& mpi, Checks&& checks) {
    std::optional<Error> error;
    try {
        checks();
    } catch (const Error& e) {
        error = e;
    }
    const int first = mpi.first_failing_rank(error.has_value());
    if (first < 0) return;
    if (first == mpi.world_rank()) {
        const std::string where = mpi.world_size() > 1 && first != 0 ? cat("rank ", first, ": ") : "";
        print_error_line(cat("llmtrain: ", where, error_kind_name(error->kind()), ": ", error->what()));
    }
    throw ExitNow{mpi.broadcast_from(first, error ? exit_code_for(error->kind()) : exit_failure)};
}

// Every rank looks for the checkpoint the same way and checks its share of the files (size,
// XXH64), so no rank reads the whole checkpoint; one agreement per candidate keeps every rank
// on the same choice. The rank that finds a problem says which file.
std::optional<ResumePoint> agree_on_resume(const MpiSession& mpi, const TrainArgs& args, const Config& config, const std::optional<std::string>& run_id) {
    const bool root = mpi.world_rank() == 0;
    const ProblemOf shared_check = shared_problem_check({mpi.world_rank(), mpi.world_size()}, [&mpi](bool found) { return mpi.first_failing_rank(found); },
                                                        [&](const std::string& mine) {
                                                            if (!root) log_warn("--resume ", args.resume, ": ", mine);
                                                        });
    return find_resume_point(args.resume, config, root, shared_check, run_id);
}

// What rank 0's run directory holds, told to every rank (they choose the checkpoint together).
RunRecord agree_on_run_record(const MpiSession& mpi, const std::string& run_dir) {
    const RunRecord mine = mpi.world_rank() == 0 ? read_run_record(run_dir) : RunRecord{};
    const std::string text = mpi.broadcast_text(0, !mine.holds_run ? "" : mine.run_id ? "id " + *mine.run_id : "no id");
    RunRecord record = mine;
    record.holds_run = !text.empty();
    if (text.starts_with("id ")) record.run_id = text.substr(3);
    return record;
}

// Under MPI every rank runs this. Rank 0 owns the run directory and the output; an error on
// any rank after the checks is printed with the rank's place in the mesh and ends the whole
// job, so that no rank is left waiting for a peer that is gone.
int train_under_mpi(const TrainArgs& args) {
    RestartMarks marks{process_start_unix()};
    MpiSession mpi;
    const int world_rank = mpi.world_rank();
    std::optional<Config> as_given;
    FaultPlan faults;
    check_on_every_rank(mpi, [&] {
        as_given.emplace(load_config(args.config_path, args.overrides));
        faults = fault_plan_from_environment();
    });
    Config config = *as_given;
    if (args.dry_run) check_on_every_rank(mpi, [&] { if (world_rank == 0) print_effective_config_and_data(config); });
    const std::string run_dir = world_rank != 0 ? "" : args.run_dir.empty() ? default_run_dir(args.config_path) : args.run_dir;
    // Every rank knows where the run is recorded: one that fails adds its error there.
    const std::string job_run_dir = mpi.broadcast_text(0, run_dir);
    // A layout this world cannot hold, or a global batch its dp does not split, stops every
    // rank before the run directory exists.
    std::optional<Mesh> mesh;
    check_on_every_rank(mpi, [&] {
        mesh.emplace(make_mesh(config.parallel, mpi.world_size()));
        require_trainable_in_this_build(config);
        micro_batches_per_step(config, mesh->dp());
    });
    const RunRecord record = agree_on_run_record(mpi, run_dir);
    marks.launched = unix_now();
    RunStart start;
    check_on_every_rank(mpi, [&] {
        start = check_run_start(args, run_dir, record, config, mesh->dp(), world_rank == 0,
                                [&](const std::optional<std::string>& run_id) { return agree_on_resume(mpi, args, config, run_id); });
        if (args.dry_run && world_rank == 0) print_dry_run(config, *mesh);
        if (!args.dry_run && !run_dir.empty()) require_checkpoint_dir_creatable(config);
    });
    if (args.dry_run) return exit_ok;
    start.identity.run_id = mpi.broadcast_text(0, start.identity.run_id);  // a new run's id is rank 0's
    if (finished_already(start, config, run_dir, world_rank == 0)) return exit_ok;
    std::optional<RunLocks> locks;  // rank 0's
    check_on_every_rank(mpi, [&] {
        if (world_rank != 0) return;
        locks.emplace(run_dir, config);
        check_checkpoint_room(config, args.strict);
    });
    CommTimes comm_times;  // outlives the context's groups, which add to it
    std::optional<ParallelContext> ctx;
    std::string where = cat("rank ", world_rank);
    try {
        ctx.emplace(make_mpi_context(config.parallel));
        time_communication(*ctx, comm_times);
        marks.communicators = unix_now();
        where = cat("rank ", world_rank, " (", ctx->mesh.describe(world_rank), ")");
        check_on_every_rank(mpi, [&] { check_rank_memory(config, ctx->mesh, ctx->local_rank, ctx->local_size); });
        install_stop_signal_handlers();
        TrainerOptions options;
        options.quiet = world_rank != 0;
        options.stop_signal = pending_stop_signal;
        options.comm_times = &comm_times;
        options.run_id = start.identity.run_id;
        options.faults = faults;
        Trainer trainer(config, std::move(options), *ctx);
        std::optional<LocalSnapshotPlace> local;
        check_on_every_rank(mpi, [&] { local = place_local_snapshots(trainer, config, start.identity.run_id); });
        std::optional<ResumePoint> resume = start.resume;
        const bool from_local = prefer_local_snapshot(trainer, resume, local, args.resume, start.identity.run_id);
        restore(trainer, resume, config);
        const std::optional<RestartFacts> restart = restart_facts(resume, from_local, record.last_step, marks);
        // No barrier at the end: rank 0 may still be sampling text, which has no time limit.
        return train(trainer, {config, *as_given, run_dir, job_run_dir, mpi.world_size(), start.identity, faults, local, restart});
    } catch (const Error& e) {
        if (mpi.world_size() == 1) throw;
        // A storage error is a verdict every rank reached at the same point (the outcome of a
        // save is agreed): rank 0 alone reports it (train() recorded it), and every rank ends
        // normally with its code, so that rank 0's record is not cut short by an abort.
        if (e.kind() == ErrorKind::storage) {
            if (world_rank == 0) print_error_line(cat("llmtrain: ", error_kind_name(e.kind()), ": ", e.what()));
            throw ExitNow{exit_code_for(e.kind())};
        }
        print_error_line(cat("llmtrain: ", where, ": ", error_kind_name(e.kind()), ": ", e.what()));
        // Rank 0 records its own errors; another rank's would die with it, unrecorded, at the abort.
        if (world_rank != 0)
            RunLog::append_to((std::filesystem::path(job_run_dir) / "log.jsonl").string(), "error",
                              {{"rank", world_rank}, {"kind", error_kind_name(e.kind())}, {"message", e.what()}, {"exit_code", exit_code_for(e.kind())}});
        MpiSession::abort_job(exit_code_for(e.kind()));
    }
}

int run_train(const TrainArgs& args) {
    if (launched_by_mpi()) return train_under_mpi(args);
    RestartMarks marks{process_start_unix()};
    const Config as_given = load_config(args.config_path, args.overrides);
    marks.launched = unix_now();
    return train_single_process(args, as_given, fault_plan_from_environment(), marks);
}

}  // namespace

void register_train_command(CLI::App& app, CommandAction& action) {
    auto args = std::make_shared<TrainArgs>();
    CLI::App* cmd = app.add_subcommand("train", "Train a model as described by a TOML config");
    cmd->add_option("config", args->config_path, "The run's TOML config file")->required();
    cmd->add_option("--set", args->overrides, "Override a config key, e.g. --set train.steps=100 (repeatable)")->type_name("KEY=VALUE");
    cmd->add_option("--run-dir", args->run_dir,
                    "Where logs and the effective config go (default: runs/<config>-<time>); with --resume, the directory of the run to continue in");
    cmd->add_option("--resume", args->resume,
                    "Continue from a checkpoint: auto (the newest valid one of this run's chain under checkpoint.dir, or a fresh start if none), "
                    "latest, or a checkpoint directory")
        ->type_name("auto|latest|PATH");
    cmd->add_flag("--strict", args->strict,
                  "Refuse to start (exit 74) where a warning would do: checkpoint.dir without room for checkpoint.keep_last + 1 checkpoints");
    cmd->add_flag("--dry-run", args->dry_run,
                  "Print the effective config, run every check the run would (data, tokenizer, resume target, checkpoint.dir, memory), and exit");
    cmd->callback([args, &action] { action = [args] { return run_train(*args); }; });
}

}  // namespace llmtrain
