// `llmtrain doctor [CONFIG]`: checks a node before a run (ops/doctor.h, ops/gpu_checks.h), alone
// or under mpirun / srun (every rank checks its node; rank 0 prints the world, one line per
// node's GPUs and its own table, other ranks print only their warnings and failures, naming
// the rank and the host). The measurements run in turn, never two at once: GPU-to-GPU copies
// (each node's first rank), the NCCL all-reduce sweep (every rank), MPI point-to-point
// within rank 0's node, then between rank 0's node and each other node.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/commands.h"
#include "cli/data_verification.h"
#include "config/config.h"
#include "core/error.h"
#include "core/nvml.h"
#include "data/batch_source.h"
#include "model/transformer.h"
#include "doctor/doctor.h"
#include "doctor/gpu_checks.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "parallel/nccl_comm.h"
#include "plan/memory_plan.h"
#include "plan/step_model.h"

namespace llmtrain {

namespace {

struct DoctorArgs {
    std::string config_path, checkpoint_dir;
    std::vector<std::string> overrides;
    int64_t io_mb = 256;
    int64_t nccl_max_mb = 1024;
    double net_gbps = 0;
    bool json = false;
    bool verify_data = false;  // --data: every block of the config's datasets
};

struct World {
    int rank = 0, size = 1, local_rank = 0, local_size = 1, nodes = 1;
    bool mpi = false;
    std::vector<std::string> hosts;  // of every rank
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
    w.hosts = std::move(hosts);
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
        rank_bytes = plan.total();
        checks.push_back({"config", CheckStatus::pass, cat(args.config_path, ": valid on ", w.size, " rank(s): ", mesh.describe_sizes()), ""});
    } catch (const Error& e) {
        checks.push_back({"config", CheckStatus::fail, e.what(), "fix the config or the number of ranks"});
        return checks;
    }
    try {
        load_config(args.config_path, args.overrides, DataFiles::checked);
        const std::unique_ptr<BatchSource> data = make_batch_source(*config);
        checks.push_back({"data", CheckStatus::pass, cat("readable (headers and indexes; --data reads every block): ", data->describe()), ""});
    } catch (const Error& e) {
        checks.push_back({"data", CheckStatus::fail, e.what(), "the run would stop at its first step: fix data.* or the files"});
    }
    return checks;
}

// --data: every block of the config's token shard datasets, as `llmtrain data verify` checks
// them, shared by every rank's threads (a collective: every rank calls it).
CheckResult data_blocks_check(const std::optional<Config>& config, const MpiSession* mpi) {
    if (!config) return {"data.blocks", CheckStatus::fail, "--data verifies the datasets of a run's config: none was given, or it did not load (see config)", "run llmtrain doctor CONFIG --data"};
    const DataConfig& d = config->data;
    if (d.format != DataFormat::shards)
        return {"data.blocks", CheckStatus::skip, "only token shards (data.format = \"shards\") carry block checksums", "prepare the data with llmtrain prepare to have them checked"};
    std::vector<std::string> datasets;
    for (const WeightedPath& source : training_sources(d)) datasets.push_back(source.path);
    if (!d.val_path.empty()) datasets.push_back(d.val_path);
    const int threads = default_verify_threads();
    try {
        const VerifyReport report = verify_datasets(datasets, threads, mpi);
        const std::string where = cat(describe_verified(report), " on ", mpi ? mpi->world_size() : 1, " rank(s) x ", threads, " thread(s)");
        if (report.clean()) return {"data.blocks", CheckStatus::pass, cat("every block checks: ", where), ""};
        const size_t more = report.corrupt.size() - 1;
        return {"data.blocks", CheckStatus::fail, cat(report.corrupt.front().message, more ? cat(" (and ", more, " more corrupt block(s) or shard(s))") : "", "; ", where),
                "the run would stop at the step that reads it: `llmtrain data verify DATASET` lists every one; prepare the dataset again, or set "
                "data.on_corrupt_block = \"skip\" to train on without them"};
    } catch (const Error& e) {
        return {"data.blocks", CheckStatus::fail, e.what(), "fix data.train_path / data.blend / data.val_path or the dataset"};
    }
}

// Each node's GPUs (from its first rank), gathered to rank 0 through one broadcast per rank.
std::vector<CheckResult> node_gpu_checks(const World& w, const MpiSession* mpi, const Nvml* nvml, const std::string& why_not) {
    NodeGpus mine{host_name(), w.local_size, {}, nvml ? "" : why_not};
    for (unsigned i = 0; nvml && i < nvml->device_count(); ++i)
        if (const auto device = nvml->device(i)) mine.models.push_back(nvml->device_name(*device));
    std::vector<NodeGpus> nodes;
    if (!mpi) return judge_node_gpus({mine});
    for (int r = 0; r < w.size; ++r) {
        const std::string text = mpi->broadcast_text(r, w.local_rank == 0 ? node_gpus_to_text(mine) : "");
        if (!text.empty()) nodes.push_back(node_gpus_from_text(text));
    }
    return w.rank == 0 ? judge_node_gpus(nodes) : std::vector<CheckResult>{};
}

// Where NVML is missing, gpu.ecc says why; the checks after it that need NVML too say only that.
constexpr const char* kNvmlMissing = "needs NVML, which is not loaded here (gpu.ecc says why)";

// ECC, retired memory, NVLink of every GPU of this node (its first rank reads them).
std::vector<CheckResult> node_health_checks(const Nvml* nvml, const std::string& why_not, std::vector<GpuHealth>& gpus) {
    if (!nvml) {
        const std::string hint = "GPU checks need a GPU and its driver";
        return {{"gpu.ecc", CheckStatus::skip, why_not, hint}, {"gpu.retired_memory", CheckStatus::skip, kNvmlMissing, hint},
                {"gpu.nvlink", CheckStatus::skip, kNvmlMissing, hint}};
    }
    gpus = read_gpu_health(*nvml);
    return {judge_ecc(gpus), judge_retired_memory(gpus), judge_nvlink(gpus)};
}

CheckResult peer_copy_check(const std::string& model, const std::vector<GpuHealth>& gpus) {
    if (!cuda_backend_built()) return {"gpu.p2p_copy", CheckStatus::skip, "this llmtrain was built without CUDA", "GPU checks need a CUDA build and GPUs"};
    const bool nvlink = std::any_of(gpus.begin(), gpus.end(), [](const GpuHealth& g) {
        return std::any_of(g.nvlinks.begin(), g.nvlinks.end(), [](const auto& link) { return link.second; });
    });
    try {
        return judge_peer_copies(measure_peer_copies(size_t{256} << 20, 10), model, nvlink);
    } catch (const Error& e) {
        return {"gpu.p2p_copy", CheckStatus::fail, e.what(), "GPU-to-GPU copies fail: check nvidia-smi topo -m and the driver"};
    }
}

// Why this rank cannot take part in an NCCL sweep ("" when it can).
std::string nccl_unready_reason() {
    if (!cuda_backend_built()) return "this llmtrain was built without CUDA and NCCL";
    try {
        cuda_device_count();
        return "";
    } catch (const Error& e) {
        return e.what();
    }
}

// The all-reduce sweep from 1 MB to --nccl-max-mb over every rank's GPU; every rank decides
// to run it together (a rank without a GPU would leave the others waiting).
CheckResult nccl_check(const DoctorArgs& args, const World& w, Comm* world, const std::string& model) {
    if (!world || w.size < 2) return {"gpu.nccl_allreduce", CheckStatus::skip, "one rank: no peer to reduce with", "run under mpirun with one rank per GPU"};
    const std::string why_not = nccl_unready_reason();
    if (world->all_reduce_scalar(why_not.empty() ? 0 : 1, ReduceOp::max) > 0)
        return {"gpu.nccl_allreduce", CheckStatus::skip, why_not.empty() ? "a rank has no usable GPU" : why_not, "GPU checks need a CUDA build and a GPU per rank"};
    try {
        const std::unique_ptr<Comm> nccl = make_nccl_comm(*world, w.local_rank, 300);
        CommBenchOptions options;
        options.ops = {CollectiveOp::all_reduce};
        options.min_bytes = size_t{1} << 20;
        options.max_bytes = static_cast<size_t>(args.nccl_max_mb) << 20;
        options.warmup = 2;
        options.iterations = 5;
        options.device = Device::cuda;
        const std::vector<CommBenchRow> rows = run_comm_bench(*nccl, *world, options, cuda_bench_allocator(), [](const CommBenchRow&) {});
        return judge_allreduce(rows.back().busbw_gbps, rows.back().bytes, w.size, w.nodes, model);
    } catch (const Error& e) {
        return {"gpu.nccl_allreduce", CheckStatus::fail, e.what(), "NCCL cannot reduce across these GPUs: check NCCL_DEBUG=INFO output and the interconnect"};
    }
}

constexpr size_t kP2pBytes = size_t{16} << 20;
constexpr int kP2pIterations = 16;

// MPI point-to-point between rank 0 and the next rank on its node (reported, not judged:
// shared memory, not the network).
CheckResult intranode_check(const World& w, Comm* world) {
    int peer = -1;
    for (int r = 1; r < w.size && peer < 0; ++r)
        if (w.hosts[static_cast<size_t>(r)] == w.hosts[0]) peer = r;
    if (!world || peer < 0) return {"mpi.intranode_bandwidth", CheckStatus::skip, "rank 0 is alone on its node", "run 2 or more ranks per node to measure it"};
    const double gbps = measure_p2p_gbps(*world, 0, peer, kP2pBytes, kP2pIterations);
    return {"mpi.intranode_bandwidth", CheckStatus::pass,
            cat("MPI point-to-point rank 0 -> rank ", peer, " on ", w.hosts[0], ": ", static_cast<int64_t>(gbps * 10) / 10.0, " GB/s (", kP2pBytes >> 20,
                " MB messages, host memory; within a node: not the network)"), ""};
}

// MPI point-to-point from rank 0 to the first rank of each other node, one pair at a time.
CheckResult internode_check(const DoctorArgs& args, const World& w, Comm* world) {
    if (!world || w.nodes < 2) return {"mpi.internode_bandwidth", CheckStatus::skip, "one node: nothing crosses the network", "run across nodes"};
    std::vector<std::pair<std::string, double>> pairs;
    std::vector<std::string> seen{w.hosts[0]};
    for (int r = 1; r < w.size; ++r) {
        const std::string& host = w.hosts[static_cast<size_t>(r)];
        if (std::find(seen.begin(), seen.end(), host) != seen.end()) continue;
        seen.push_back(host);
        pairs.emplace_back(cat(w.hosts[0], " -> ", host), measure_p2p_gbps(*world, 0, r, kP2pBytes, kP2pIterations));
    }
    return judge_internode(pairs, args.net_gbps);
}

std::vector<CheckResult> gpu_and_network_checks(const DoctorArgs& args, const World& w, const MpiSession* mpi, Comm* world) {
    std::string why_not;
    const std::unique_ptr<Nvml> nvml = Nvml::load(why_not);
    std::optional<XidWatch> xids;
    if (nvml && w.local_rank == 0) xids.emplace(*nvml);
    const CudaVersions versions = cuda_versions();
    std::vector<CheckResult> checks{judge_gpu_driver(versions.runtime, versions.driver, nvml ? nvml->driver_version() : ""), check_gpu_devices()};
    for (CheckResult& c : node_gpu_checks(w, mpi, nvml.get(), why_not)) checks.push_back(std::move(c));
    std::string model = "unknown GPU", no_device;
    if (nvml)
        if (const auto device = nvml->device_of_local_rank(w.local_rank, no_device)) model = nvml->device_name(*device);
    std::vector<GpuHealth> gpus;
    if (w.local_rank == 0) {
        for (CheckResult& c : node_health_checks(nvml.get(), why_not, gpus)) checks.push_back(std::move(c));
        checks.push_back(peer_copy_check(model, gpus));
    }
    if (world) world->barrier();  // the copies are done before NCCL uses the GPUs
    checks.push_back(nccl_check(args, w, world, model));
    CheckResult intranode = intranode_check(w, world), internode = internode_check(args, w, world);
    if (w.rank == 0) {
        checks.push_back(std::move(intranode));
        checks.push_back(std::move(internode));
    }
    if (w.local_rank == 0) {
        if (xids && xids->watching()) checks.push_back(judge_gpu_health(gpus, xids->events()));
        else checks.push_back({"gpu.health", CheckStatus::skip, nvml ? "NVML offers no XID events here" : kNvmlMissing, "GPU checks need a GPU and its driver"});
    }
    return checks;
}

int run_doctor(const DoctorArgs& args) {
    std::optional<MpiSession> mpi;
    if (launched_by_mpi()) mpi.emplace();
    World w = mpi ? mpi_world(*mpi) : World{};
    if (w.hosts.empty()) w.hosts = {host_name()};
    std::optional<ParallelContext> ctx;
    if (mpi) {
        ParallelConfig world_only;
        world_only.timeout_seconds = 300;
        ctx.emplace(make_mpi_context(world_only));
    }
    std::vector<CheckResult> checks{world_check(w)};
    std::optional<Config> config;
    uint64_t rank_bytes = 0;
    if (!args.config_path.empty()) for (CheckResult& c : config_checks(args, w, config, rank_bytes)) checks.push_back(std::move(c));
    if (args.verify_data) {
        CheckResult blocks = data_blocks_check(config, mpi ? &*mpi : nullptr);
        if (w.rank == 0) checks.push_back(std::move(blocks));  // the job's verdict: rank 0 says it once
    }
    checks.push_back(check_host_memory(rank_bytes, w.local_size));
    checks.push_back(check_host_cores(w.local_size));
    // The storage of this node, checked by its first rank; a checkpoint holds weights and two
    // AdamW moments in f32: 12 bytes per parameter.
    const std::string dir = !args.checkpoint_dir.empty() ? args.checkpoint_dir : config ? config->checkpoint.dir : "checkpoints";
    uint64_t checkpoint_bytes = 0;
    if (config) checkpoint_bytes = static_cast<uint64_t>(planned_checkpoint_bytes(*config, model_parameter_count(config->model)));
    if (w.local_rank == 0) {
        const int64_t keep = config ? config->checkpoint.keep_last + 1 : 1;
        for (CheckResult& c : check_checkpoint_storage(dir, checkpoint_bytes, keep, static_cast<uint64_t>(args.io_mb) << 20)) checks.push_back(std::move(c));
    }
    for (CheckResult& c : gpu_and_network_checks(args, w, mpi ? &*mpi : nullptr, ctx ? ctx->world.get() : nullptr)) checks.push_back(std::move(c));
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
    cmd->add_option("--nccl-max-mb", args->nccl_max_mb, "Largest message of the NCCL all-reduce sweep in MB (from 1 MB, doubling)")
        ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 14));
    cmd->add_option("--net-gbps", args->net_gbps, "The network's line rate between two nodes in Gbit/s (e.g. 400 for NDR InfiniBand): "
                    "inter-node MPI bandwidth below 80% of it warns")->check(CLI::NonNegativeNumber);
    cmd->add_flag("--data", args->verify_data, "Also read and check every block of the config's datasets (as `llmtrain data verify`): FAIL on a corrupt one");
    cmd->add_flag("--json", args->json, "One JSON object instead of the table");
    cmd->callback([args, &action] { action = [args] { return run_doctor(*args); }; });
}

}  // namespace llmtrain
