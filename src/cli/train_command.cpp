// `llmtrain train`: every check first (config, layout, and under MPI the agreement of every
// rank), then the trainer (device, data, allocation), and only then the run directory: a run
// refused at the door leaves nothing behind. The run directory tells what became of the run
// (metrics/run_log.h): start, steps, and one closing record, or none if it was killed.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/resume_point.h"
#include "checkpoint/safetensors.h"
#include "cli/commands.h"
#include "cli/run_directory.h"
#include "cli/run_metrics.h"
#include "config/config.h"
#include "core/exit_code.h"
#include "core/log.h"
#include "core/signals.h"
#include "metrics/console_observer.h"
#include "metrics/run_log.h"
#include "monitor/anomaly_log.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "ops/memory_plan.h"
#include "parallel/timed_comm.h"
#include "train/trainer.h"

namespace llmtrain {

namespace {

struct TrainArgs {
    std::string config_path;
    std::vector<std::string> overrides;
    std::string run_dir;
    bool dry_run = false;
    std::string resume;  // "", auto, latest or a checkpoint directory
};

void report(const TrainResult& result) {
    const OpProfile& p = result.step_profile;
    std::vector<int> order(op_count);
    for (int i = 0; i < op_count; ++i) order[static_cast<size_t>(i)] = i;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p.seconds[static_cast<size_t>(a)] > p.seconds[static_cast<size_t>(b)]; });
    std::string top;
    for (size_t i = 0; i < 5 && i < order.size(); ++i) {
        const auto op = static_cast<size_t>(order[i]);
        top += cat(i ? ", " : "", op_name(static_cast<Op>(op)), " ", std::lround(100 * p.seconds[op] / result.train_seconds), "%");
    }
    log_info("done: ", result.steps.size(), " steps in ", std::round(result.train_seconds * 10) / 10, " s | ", std::lround(result.tokens_per_second),
             " tokens/s (steps after the first)",
             p.total_seconds() > 0 ? cat(" | time in GEMMs: ", std::lround(100 * result.gemm_fraction), "% of step time") : std::string());
    // The CUDA backend times ops only when profiling (bench): no timing events in a training step.
    if (p.total_seconds() > 0) log_info("op time: ", top);
    if (!result.evals.empty())
        log_info("val loss: ", result.evals.front().val_loss, " at step ", result.evals.front().step, " -> ", result.evals.back().val_loss, " at step ", result.evals.back().step);
}

// SIGINT is the user at the terminal; SIGTERM and SIGUSR1 are a scheduler's notice: run again.
ExitCode exit_code_of_stop(int signal) { return signal == SIGINT ? exit_interrupted : exit_resume; }

// --dry-run: what the run would be, and nothing created.
void print_dry_run(const Config& config, const Mesh& mesh) {
    std::printf("# Effective configuration (defaults and --set overrides applied)\n%s\n", dump_config(config).c_str());
    const std::vector<int64_t> layers = parse_stage_layers(config.parallel.stage_layers, mesh.pp(), config.model.n_layers);
    std::string stages;
    for (size_t s = 0; s < layers.size(); ++s) stages += cat(s ? ", " : "", layers[s]);
    const int shard_size = shard_size_of(config.parallel, mesh.dp());
    const std::string hybrid = shard_size < mesh.dp() ? cat(" (sharded within blocks of ", shard_size, " dp ranks)") : "";
    std::printf("layout: %d ranks = tp %d x dp %d x pp %d (order %s) | layers per stage: %s | ZeRO stage %lld%s\n", mesh.world_size(), mesh.tp(),
                mesh.dp(), mesh.pp(), config.parallel.order.c_str(), stages.c_str(), static_cast<long long>(mesh.dp() > 1 ? config.parallel.zero_stage : 0),
                hybrid.c_str());
    const int64_t micro_batches = micro_batches_per_step(config, mesh.dp());
    std::printf("batch: %lld x %lld tokens x %lld micro-batches x dp %d = %lld tokens per step\n", static_cast<long long>(config.train.batch_size),
                static_cast<long long>(config.train.seq_len), static_cast<long long>(micro_batches), mesh.dp(),
                static_cast<long long>(config.train.batch_size * config.train.seq_len * micro_batches * mesh.dp()));
    const MemoryPlan plan = largest_rank_plan(config, mesh);
    std::printf("memory plan of the largest rank: %s\n", describe(plan).c_str());
    check_memory_fits(plan, available_memory_per_rank(config, 0, 1));  // as if each rank had a node of this machine's size
    std::printf("dry run: every check passed; nothing was allocated or written\n");
}

// The world a layout asks for: tp * pp * dp (dp = 0: 1).
int layout_ranks(const ParallelConfig& parallel) {
    return static_cast<int>(parallel.tp * parallel.pp * std::max<int64_t>(1, parallel.dp));
}

// The starting point: the checkpoint --resume found, else train.init_from's weights, else the
// random initialization the trainer made.
void restore(Trainer& trainer, const std::optional<ResumePoint>& resume, const Config& config) {
    if (!resume) {
        if (config.train.init_from.empty()) return;
        trainer.load_initial_weights(config.train.init_from);
        if (trainer.context().world_rank == 0) log_info("weights from '", safetensors_file_of(config.train.init_from), "' (train.init_from); starting at step 0");
        return;
    }
    trainer.restore(resume->path, resume->manifest);
    if (trainer.context().world_rank != 0) return;
    log_info("resumed from '", resume->path, "' at step ", resume->manifest.step, " (saved on ", resume->manifest.world_size, " rank(s): tp ",
             resume->manifest.tp, " x dp ", resume->manifest.dp, " x pp ", resume->manifest.pp, ")");
    const std::string health = trainer.health().lasting_effects();
    if (!health.empty()) log_info("health: in force from before the checkpoint: ", health);
}

void start_checkpointer(std::optional<Checkpointer>& checkpointer, Trainer& trainer, const Config& config) {
    if (config.checkpoint.every_steps == 0) return;
    const ParallelContext& ctx = trainer.context();
    const FileAttributes file{0, ctx.world_rank, ctx.mesh.world_size(), ctx.mesh.tp(), ctx.mesh.dp(), ctx.mesh.pp()};
    CheckpointerHooks hooks;
    hooks.capture = [&trainer](int64_t step, RankSnapshot& out) { capture_snapshot(trainer.snapshot_source(), step, out); };
    hooks.manifest = [&trainer](int64_t step) { return trainer.manifest_at(step); };
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

// Trains with everything checked; rank 0 (run_dir set) records the run. job_run_dir: the
// run directory, known to every rank. Returns the exit code.
int train(Trainer& trainer, const Config& config, const std::string& run_dir, const std::string& job_run_dir, int ranks) {
    std::optional<RunDirectory> dir;
    std::optional<ConsoleObserver> console;
    std::optional<AnomalyLog> anomalies;
    std::optional<Checkpointer> checkpointer;
    start_checkpointer(checkpointer, trainer, config);
    // Before the run directory: a metrics port that cannot be bound leaves nothing behind.
    RunMetrics metrics(trainer, config, run_name(job_run_dir), checkpointer ? &*checkpointer : nullptr);
    if (!run_dir.empty()) {
        dir.emplace(run_dir, config, config.source_path, ranks);
        anomalies.emplace((std::filesystem::path(run_dir) / "anomalies.jsonl").string());
        trainer.observe(*anomalies);
        log_info("llmtrain ", LLMTRAIN_VERSION, " | config ", config.source_path, " | run directory ", run_dir, ranks > 1 ? cat(" | ", ranks, " ranks") : "");
        console.emplace(config.train.log_every, config.train.steps);
        trainer.observe(*console);
        if (config.metrics.jsonl) trainer.observe(dir->log());
    }
    metrics.publish_endpoints(run_dir);
    try {
        const TrainResult result = trainer.run();
        const int64_t last_step = trainer.start_step() + static_cast<int64_t>(result.steps.size());
        // Stopped or finished: the state after the last step is saved before the process ends.
        if (checkpointer) checkpointer->save_and_wait(last_step);
        metrics.finish();
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
            report(result);
            dir->log().write("end", {{"steps", last_step}, {"seconds", result.train_seconds},
                                     {"tokens_per_second", result.tokens_per_second}, {"exit_code", exit_ok}});
        }
        return exit_ok;
    } catch (const Error& e) {
        if (e.kind() == ErrorKind::diverged) save_before_abort(trainer, checkpointer, config.checkpoint.dir);
        if (dir) dir->log().write("error", {{"kind", error_kind_name(e.kind())}, {"message", e.what()}, {"exit_code", exit_code_for(e.kind())}});
        throw;
    }
}

int train_single_process(const TrainArgs& args, const Config& config) {
    const int ranks = layout_ranks(config.parallel);
    if (args.dry_run) {
        print_dry_run(config, make_mesh(config.parallel, ranks));
        return exit_ok;
    }
    if (ranks > 1)
        fail(ErrorKind::config, config.source_path, ": parallel: the layout asks for ", ranks, " ranks (tp ", config.parallel.tp, ", pp ", config.parallel.pp,
             ", dp ", config.parallel.dp, ") but this process was not started by an MPI launcher: run `mpirun -np ", ranks, " llmtrain train ...`");
    micro_batches_per_step(config, 1);  // a global batch that does not split stops the run before its directory exists
    const std::string run_dir = args.run_dir.empty() ? default_run_dir(args.config_path) : args.run_dir;
    check_run_dir_is_free(run_dir);
    if (config.checkpoint.every_steps > 0) create_checkpoint_root(config.checkpoint.dir);
    check_rank_memory(config, make_mesh(config.parallel, 1), 0, 1);
    const std::optional<ResumePoint> resume = args.resume.empty() ? std::nullopt : find_resume_point(args.resume, config);
    if (resume) check_resume_config(*resume, config, true);
    if (trained_already(resume, config, true)) return exit_ok;
    install_stop_signal_handlers();
    TrainerOptions options;
    options.stop_signal = pending_stop_signal;
    Trainer trainer(config, std::move(options));
    restore(trainer, resume, config);
    return train(trainer, config, run_dir, run_dir, 1);
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
std::optional<ResumePoint> agree_on_resume(const MpiSession& mpi, const TrainArgs& args, const Config& config) {
    if (args.resume.empty()) return std::nullopt;
    const bool root = mpi.world_rank() == 0;
    const ProblemOf shared_check = shared_problem_check({mpi.world_rank(), mpi.world_size()}, [&mpi](bool found) { return mpi.first_failing_rank(found); },
                                                        [&](const std::string& mine) {
                                                            if (!root) log_warn("--resume ", args.resume, ": ", mine);
                                                        });
    std::optional<ResumePoint> resume;
    check_on_every_rank(mpi, [&] {
        resume = find_resume_point(args.resume, config, root, shared_check);
        if (resume) check_resume_config(*resume, config, root);
    });
    return resume;
}

// Under MPI every rank runs this. Rank 0 owns the run directory and the output; an error on
// any rank after the checks is printed with the rank's place in the mesh and ends the whole
// job, so that no rank is left waiting for a peer that is gone.
int train_under_mpi(const TrainArgs& args) {
    MpiSession mpi;
    const int world_rank = mpi.world_rank();
    std::optional<Config> config;
    check_on_every_rank(mpi, [&] { config.emplace(load_config(args.config_path, args.overrides)); });
    const std::string run_dir = world_rank != 0 ? "" : args.run_dir.empty() ? default_run_dir(args.config_path) : args.run_dir;
    // Every rank knows where the run is recorded: one that fails adds its error there.
    const std::string job_run_dir = mpi.broadcast_text(0, run_dir);
    check_on_every_rank(mpi, [&] {
        // A global batch that this dp does not split stops every rank before the run directory exists.
        micro_batches_per_step(*config, make_mesh(config->parallel, mpi.world_size()).dp());
        if (!run_dir.empty() && !args.dry_run) check_run_dir_is_free(run_dir);
        if (!run_dir.empty() && !args.dry_run && config->checkpoint.every_steps > 0) create_checkpoint_root(config->checkpoint.dir);
    });
    if (args.dry_run) {
        if (world_rank == 0) print_dry_run(*config, make_mesh(config->parallel, mpi.world_size()));
        return exit_ok;
    }
    const std::optional<ResumePoint> resume = agree_on_resume(mpi, args, *config);
    if (trained_already(resume, *config, world_rank == 0)) return exit_ok;
    CommTimes comm_times;  // outlives the context's groups, which add to it
    std::optional<ParallelContext> ctx;
    std::string where = cat("rank ", world_rank);
    try {
        ctx.emplace(make_mpi_context(config->parallel));
        time_communication(*ctx, comm_times);
        where = cat("rank ", world_rank, " (", ctx->mesh.describe(world_rank), ")");
        check_on_every_rank(mpi, [&] { check_rank_memory(*config, ctx->mesh, ctx->local_rank, ctx->local_size); });
        install_stop_signal_handlers();
        TrainerOptions options;
        options.quiet = world_rank != 0;
        options.stop_signal = pending_stop_signal;
        options.comm_times = &comm_times;
        Trainer trainer(*config, std::move(options), *ctx);
        restore(trainer, resume, *config);
        // No barrier at the end: rank 0 may still be sampling text, which has no time limit.
        return train(trainer, *config, run_dir, job_run_dir, mpi.world_size());
    } catch (const Error& e) {
        if (mpi.world_size() == 1) throw;
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
    return train_single_process(args, load_config(args.config_path, args.overrides));
}

}  // namespace

void register_train_command(CLI::App& app, CommandAction& action) {
    auto args = std::make_shared<TrainArgs>();
    CLI::App* cmd = app.add_subcommand("train", "Train a model as described by a TOML config");
    cmd->add_option("config", args->config_path, "The run's TOML config file")->required();
    cmd->add_option("--set", args->overrides, "Override a config key, e.g. --set train.steps=100 (repeatable)")->type_name("KEY=VALUE");
    cmd->add_option("--run-dir", args->run_dir, "Where logs and the effective config go (default: runs/<config>-<time>)");
    cmd->add_option("--resume", args->resume,
                    "Continue from a checkpoint: auto (the newest valid one under checkpoint.dir, or a fresh start if none), latest, or a checkpoint directory")
        ->type_name("auto|latest|PATH");
    cmd->add_flag("--dry-run", args->dry_run, "Check everything, print the effective config, the layout and the memory plan, and exit");
    cmd->callback([args, &action] { action = [args] { return run_train(*args); }; });
}

}  // namespace llmtrain
