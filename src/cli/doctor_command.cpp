// `llmtrain doctor [CONFIG]`: checks a node before a run (ops/doctor.h), alone or under
// mpirun / srun (every rank checks its node; rank 0 prints the world and its table, other
// ranks print only their warnings and failures, naming the rank and the host).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <unistd.h>

#include "cli/commands.h"
#include "config/config.h"
#include "core/error.h"
#include "data/batch_source.h"
#include "model/transformer.h"
#include "ops/doctor.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "ops/memory_plan.h"

namespace llmtrain {

namespace {

struct DoctorArgs {
    std::string config_path, checkpoint_dir;
    std::vector<std::string> overrides;
    int64_t io_mb = 256;
    bool json = false;
};

struct World {
    int rank = 0, size = 1, local_rank = 0, local_size = 1, nodes = 1;
    bool mpi = false;
};

std::string host_name() {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    return name;
}

// Ranks per node from the hosts' names, gathered through one broadcast per rank.
World mpi_world(const MpiSession& mpi) {
    World w;
    w.mpi = true;
    w.rank = mpi.world_rank();
    w.size = mpi.world_size();
    std::vector<std::string> hosts;
    for (int r = 0; r < w.size; ++r) hosts.push_back(mpi.broadcast_text(r, host_name()));
    std::vector<std::string> distinct;
    w.local_rank = w.local_size = 0;
    for (int r = 0; r < w.size; ++r) {
        const std::string& host = hosts[static_cast<size_t>(r)];
        if (std::find(distinct.begin(), distinct.end(), host) == distinct.end()) distinct.push_back(host);
        if (host != hosts[static_cast<size_t>(w.rank)]) continue;
        ++w.local_size;
        if (r < w.rank) ++w.local_rank;
    }
    w.nodes = static_cast<int>(distinct.size());
    return w;
}

CheckResult world_check(const World& w) {
    if (!w.mpi) return {"mpi.world", CheckStatus::pass, "one process (no MPI launcher): run under mpirun or srun to check the job's world", ""};
    return {"mpi.world", CheckStatus::pass, cat(w.size, " rank(s) on ", w.nodes, " node(s); this node holds ", w.local_size, " (local rank ", w.local_rank, ")"), ""};
}

// The config valid for this world size and its data readable; the bytes a rank needs.
std::vector<CheckResult> config_checks(const DoctorArgs& args, const World& w, std::optional<Config>& config, uint64_t& rank_bytes) {
    std::vector<CheckResult> checks;
    try {
        config.emplace(load_config(args.config_path, args.overrides, DataFiles::unchecked));
        const Mesh mesh = make_mesh(config->parallel, w.size);
        micro_batches_per_step(*config, mesh.dp());
        const MemoryPlan plan = largest_rank_plan(*config, mesh);
        rank_bytes = plan.memory.total();
        checks.push_back({"config", CheckStatus::pass, cat(args.config_path, ": valid on ", w.size, " rank(s): tp ", mesh.tp(), " x dp ", mesh.dp(), " x pp ", mesh.pp()), ""});
    } catch (const Error& e) {
        checks.push_back({"config", CheckStatus::fail, e.what(), "fix the config or the number of ranks"});
        return checks;
    }
    try {
        load_config(args.config_path, args.overrides, DataFiles::checked);
        const std::unique_ptr<BatchSource> data = make_batch_source(*config);
        checks.push_back({"data", CheckStatus::pass, cat("readable: ", data->describe()), ""});
    } catch (const Error& e) {
        checks.push_back({"data", CheckStatus::fail, e.what(), "the run would stop at its first step: fix data.* or the files"});
    }
    return checks;
}

int run_doctor(const DoctorArgs& args) {
    std::optional<MpiSession> mpi;
    if (launched_by_mpi()) mpi.emplace();
    const World w = mpi ? mpi_world(*mpi) : World{};
    std::vector<CheckResult> checks{world_check(w)};
    std::optional<Config> config;
    uint64_t rank_bytes = 0;
    if (!args.config_path.empty()) for (CheckResult& c : config_checks(args, w, config, rank_bytes)) checks.push_back(std::move(c));
    checks.push_back(check_host_memory(rank_bytes, w.local_size));
    checks.push_back(check_host_cores(w.local_size));
    // The storage of this node, checked by its first rank; a checkpoint holds weights and two
    // AdamW moments in f32: 12 bytes per parameter.
    const std::string dir = !args.checkpoint_dir.empty() ? args.checkpoint_dir : config ? config->checkpoint.dir : "checkpoints";
    uint64_t checkpoint_bytes = 0;
    if (config) checkpoint_bytes = 12 * static_cast<uint64_t>(TransformerLayout(config->model, Device::cpu, DType::f32, 1, 1, {}, 0, 1).parameters().total_numel());
    if (w.local_rank == 0) {
        const int64_t keep = config ? config->checkpoint.keep_last + 1 : 1;
        for (CheckResult& c : check_checkpoint_storage(dir, checkpoint_bytes, keep, static_cast<uint64_t>(args.io_mb) << 20)) checks.push_back(std::move(c));
    }
    checks.push_back(check_gpu_devices());
    if (w.size < 2 || w.nodes < 2) checks.push_back({"mpi.internode_bandwidth", CheckStatus::skip, "one node: nothing crosses the network", "run across nodes"});
    const int code = doctor_exit_code(checks);
    if (w.rank == 0) {
        std::printf("%s\n", args.json ? checks_to_json(checks).c_str() : format_checks(checks).c_str());
    } else {
        for (const CheckResult& c : checks)
            if (c.status == CheckStatus::warn || c.status == CheckStatus::fail)
                std::fprintf(stderr, "llmtrain doctor: rank %d (%s): %s %s: %s\n", w.rank, host_name().c_str(), check_status_name(c.status), c.name.c_str(), c.detail.c_str());
    }
    return code;
}

}  // namespace

void register_doctor_command(CLI::App& app, CommandAction& action) {
    auto args = std::make_shared<DoctorArgs>();
    CLI::App* cmd = app.add_subcommand("doctor", "Check this node (or, under mpirun / srun, every node) before a run; exit 0 ok, 1 warn, 2 fail");
    cmd->add_option("config", args->config_path, "The run's TOML config: checks it, its data and its checkpoint.dir");
    cmd->add_option("--set", args->overrides, "Override a config key (repeatable)")->type_name("KEY=VALUE");
    cmd->add_option("--checkpoint-dir", args->checkpoint_dir, "Storage to check (default: the config's checkpoint.dir)");
    cmd->add_option("--io-mb", args->io_mb, "Size of the storage test file in MB")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    cmd->add_flag("--json", args->json, "One JSON object instead of the table");
    cmd->callback([args, &action] { action = [args] { return run_doctor(*args); }; });
}

}  // namespace llmtrain
