// `llmtrain train`: load and validate the config (with --set overrides) before anything is
// allocated, create the run directory with the effective config, train, report.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "config/config.h"
#include "core/log.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "train/trainer.h"

namespace llmtrain {

namespace {

struct TrainArgs {
    std::string config_path;
    std::vector<std::string> overrides;
    std::string run_dir;
};

std::string default_run_dir(const std::string& config_path) {
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    return cat("runs/", std::filesystem::path(config_path).stem().string(), "-", stamp);
}

// Creates the run directory; an existing run there is never overwritten.
void prepare_run_dir(const std::string& dir, const Config& config) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) fail(ErrorKind::io, "cannot create run directory '", dir, "': ", ec.message());
    if (fs::exists(fs::path(dir) / "log.jsonl"))
        fail(ErrorKind::io, "run directory '", dir, "' already holds a run (log.jsonl); choose another --run-dir");
    const std::string path = (fs::path(dir) / "config.toml").string();
    std::ofstream out(path);
    out << "# Effective configuration of this run (defaults and --set overrides applied).\n" << dump_config(config);
    if (!out) fail(ErrorKind::io, "cannot write '", path, "'");
}

void report(const TrainResult& result, const Config& config) {
    const OpProfile& p = result.step_profile;
    std::vector<int> order(op_count);
    for (int i = 0; i < op_count; ++i) order[static_cast<size_t>(i)] = i;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p.seconds[static_cast<size_t>(a)] > p.seconds[static_cast<size_t>(b)]; });
    std::string top;
    for (size_t i = 0; i < 5 && i < order.size(); ++i) {
        const auto op = static_cast<size_t>(order[i]);
        top += cat(i ? ", " : "", op_name(static_cast<Op>(op)), " ", std::lround(100 * p.seconds[op] / result.train_seconds), "%");
    }
    log_info("done: ", config.train.steps, " steps in ", std::round(result.train_seconds * 10) / 10, " s | ", std::lround(result.tokens_per_second),
             " tokens/s (steps after the first) | time in GEMMs: ", std::lround(100 * result.gemm_fraction), "% of step time");
    log_info("op time: ", top);
    if (!result.evals.empty())
        log_info("val loss: ", result.evals.front().val_loss, " at step 0 -> ", result.evals.back().val_loss, " at step ", result.evals.back().step);
}

int train_single_process(const TrainArgs& args, const Config& config) {
    const int64_t ranks = config.parallel.tp * config.parallel.pp * std::max<int64_t>(1, config.parallel.dp);
    if (ranks > 1)
        fail(ErrorKind::config, config.source_path, ": parallel: the layout asks for ", ranks, " ranks (tp ", config.parallel.tp, ", pp ", config.parallel.pp,
             ", dp ", config.parallel.dp, ") but this process was not started by an MPI launcher: run `mpirun -np ", ranks, " llmtrain train ...`");
    micro_batches_per_step(config, 1);  // a global batch that does not split stops the run before its directory exists
    const std::string run_dir = args.run_dir.empty() ? default_run_dir(args.config_path) : args.run_dir;
    prepare_run_dir(run_dir, config);
    log_info("llmtrain ", LLMTRAIN_VERSION, " | config ", args.config_path, " | run directory ", run_dir);
    Trainer trainer(config, TrainerOptions{run_dir, std::nullopt, false});
    report(trainer.run(), config);
    return 0;
}

// Under MPI every rank runs this. Rank 0 owns the run directory and the output; an error on
// any rank is printed with the rank's place in the mesh and ends the whole job, so that no
// rank is left waiting for a peer that is gone.
int train_under_mpi(const TrainArgs& args, const Config& config) {
    MpiSession mpi;
    const int world_rank = mpi.world_rank();
    std::string where = cat("rank ", world_rank);
    try {
        ParallelContext ctx = make_mpi_context(config.parallel);
        where = cat("rank ", world_rank, " (", ctx.mesh.describe(world_rank), ")");
        micro_batches_per_step(config, ctx.mesh.dp());  // every rank stops on a global batch that this dp does not split
        const std::string run_dir = args.run_dir.empty() ? default_run_dir(args.config_path) : args.run_dir;
        if (world_rank == 0) {
            prepare_run_dir(run_dir, config);
            log_info("llmtrain ", LLMTRAIN_VERSION, " | config ", args.config_path, " | run directory ", run_dir, " | ", mpi.world_size(), " ranks");
        }
        Trainer trainer(config, TrainerOptions{world_rank == 0 ? run_dir : "", std::nullopt, world_rank != 0}, ctx);
        const TrainResult result = trainer.run();
        // No barrier here: rank 0 may still be sampling text, which has no time limit.
        if (world_rank == 0) report(result, config);
        return 0;
    } catch (const Error& e) {
        if (mpi.world_size() == 1) throw;
        std::fprintf(stderr, "llmtrain: %s: %s: %s\n", where.c_str(), error_kind_name(e.kind()), e.what());
        std::fflush(stderr);
        const bool bad_input = e.kind() == ErrorKind::config || e.kind() == ErrorKind::data;
        MpiSession::abort_job(bad_input ? 2 : 1);
    }
}

int run_train(const TrainArgs& args) {
    const Config config = load_config(args.config_path, args.overrides);
    return launched_by_mpi() ? train_under_mpi(args, config) : train_single_process(args, config);
}

}  // namespace

void register_train_command(CLI::App& app, CommandAction& action) {
    auto args = std::make_shared<TrainArgs>();
    CLI::App* cmd = app.add_subcommand("train", "Train a model as described by a TOML config");
    cmd->add_option("config", args->config_path, "The run's TOML config file")->required();
    cmd->add_option("--set", args->overrides, "Override a config key, e.g. --set train.steps=100 (repeatable)")->type_name("KEY=VALUE");
    cmd->add_option("--run-dir", args->run_dir, "Where logs and the effective config go (default: runs/<config>-<time>)");
    cmd->callback([args, &action] { action = [args] { return run_train(*args); }; });
}

}  // namespace llmtrain
