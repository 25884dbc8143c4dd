// `llmtrain bench comm`: collective bus bandwidth over MPI (host memory) or NCCL (GPU
// memory), as nccl-tests reports it. Run it under mpirun with one rank per GPU or core.
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/commands.h"
#include "core/log.h"
#include "plan/cluster.h"
#include "parallel/comm_bench.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "parallel/nccl_comm.h"

namespace llmtrain {

namespace {

struct BenchCommArgs {
    std::string backend = "mpi";
    std::string op = "all";
    std::string dtype = "f32";
    size_t min_bytes = 1024;
    size_t max_bytes = 64u << 20;
    int warmup = 5;
    int iterations = 20;
    double timeout_seconds = 300;
    std::string calibration_path;  // write the largest size's bus bandwidth per op for `plan`
};

// The plan's figures: bus bandwidth at the largest size and at every size measured, and the
// latency of one ring step from the smallest all-reduce (2(n-1) steps).
CollectiveCalibration collective_calibration(const std::vector<CommBenchRow>& rows, int ranks, bool inter_node) {
    CollectiveCalibration c;
    c.inter_node = inter_node;
    c.ranks = ranks;
    for (const CommBenchRow& r : rows) {
        const Collective op = r.op == CollectiveOp::all_reduce ? Collective::all_reduce : r.op == CollectiveOp::reduce_scatter ? Collective::reduce_scatter : Collective::all_gather;
        c.busbw_gbps[op] = r.busbw_gbps;  // rows come smallest first: the last is the largest
        if (r.busbw_gbps > 0) c.busbw_by_size[op].emplace_back(static_cast<double>(r.bytes), r.busbw_gbps);
        if (r.op == CollectiveOp::all_reduce && c.latency_us == 0) c.latency_us = r.seconds * 1e6 / (2.0 * (ranks - 1));
    }
    return c;
}

std::vector<CollectiveOp> parse_ops(const std::string& op) {
    if (op == "all") return {CollectiveOp::all_reduce, CollectiveOp::reduce_scatter, CollectiveOp::all_gather};
    for (CollectiveOp c : {CollectiveOp::all_reduce, CollectiveOp::reduce_scatter, CollectiveOp::all_gather})
        if (op == collective_name(c)) return {c};
    fail(ErrorKind::config, "--op \"", op, "\" (allowed: all, all_reduce, reduce_scatter, all_gather)");
}

std::string fixed_decimals(double value, int decimals) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
    return buffer;
}

std::string size_text(size_t bytes) {
    if (bytes >= (1u << 30) && bytes % (1u << 30) == 0) return cat(bytes >> 30, " GB");
    if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return cat(bytes >> 20, " MB");
    if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return cat(bytes >> 10, " KB");
    return cat(bytes, " B");
}

// The library's algorithm choice is its own (tuned by message size and topology); what can
// be said is which override, if any, is in force.
std::string algorithm_note(const std::string& backend) {
    const char* name = backend == "nccl" ? "NCCL_ALGO" : "OMPI_MCA_coll_tuned_allreduce_algorithm";
    const char* value = std::getenv(name);
    return value ? cat(name, "=", value) : cat("library's choice per size (", name, " unset)");
}

// ranks = 1: bus bandwidth has no meaning (no peer) and is printed as n/a.
void print_row(const CommBenchRow& r, int ranks) {
    const std::string busbw = ranks > 1 ? fixed_decimals(r.busbw_gbps, 3) : "n/a";
    std::printf("%-15s %10s %12lld %12.1f %12.3f %12s\n", collective_name(r.op), size_text(r.bytes).c_str(), static_cast<long long>(r.count),
                r.seconds * 1e6, r.algbw_gbps, busbw.c_str());
    std::fflush(stdout);
}

int run_bench_comm(const BenchCommArgs& args) {
    CommBenchOptions options;
    options.ops = parse_ops(args.op);
    options.dtype = parse_dtype(args.dtype);
    if (options.dtype != DType::f32 && options.dtype != DType::f64) fail(ErrorKind::config, "--dtype \"", args.dtype, "\" (allowed: f32, f64)");
    if (args.min_bytes == 0 || args.min_bytes > args.max_bytes) fail(ErrorKind::config, "--min-bytes must be positive and at most --max-bytes");
    if (args.backend != "mpi" && args.backend != "nccl") fail(ErrorKind::config, "--backend \"", args.backend, "\" (allowed: mpi, nccl)");
    options.min_bytes = args.min_bytes;
    options.max_bytes = args.max_bytes;
    options.warmup = args.warmup;
    options.iterations = args.iterations;

    MpiSession mpi;
    ParallelConfig world_only;
    world_only.timeout_seconds = args.timeout_seconds;
    ParallelContext ctx = make_mpi_context(world_only);
    std::unique_ptr<Comm> nccl;
    Comm* comm = ctx.world.get();
    BenchAllocator allocate = [](size_t bytes) { return std::shared_ptr<void>(std::malloc(bytes), std::free); };
    std::string library = mpi_library_version();
    if (args.backend == "nccl") {
        nccl = make_nccl_comm(*ctx.world, ctx.local_rank, args.timeout_seconds);
        comm = nccl.get();
        options.device = Device::cuda;
        allocate = cuda_bench_allocator();
        library = nccl_library_version();
    }
    if (comm->size() == 1)
        log_warn("bench comm: one rank, so no peer: the times are local copies and bus bandwidth is meaningless (n/a); "
                 "measure the interconnect under mpirun -np N with N >= 2 (one rank per GPU or node)");
    if (ctx.world_rank == 0) {
        std::printf("bench comm: %s (%s), %d ranks, %s, %d iterations after %d warm-up\n", args.backend.c_str(), library.c_str(), comm->size(),
                    args.dtype.c_str(), options.iterations, options.warmup);
        std::printf("algorithm: %s\n", algorithm_note(args.backend).c_str());
        std::printf("busbw (nccl-tests): all_reduce algbw x 2(n-1)/n; reduce_scatter and all_gather algbw x (n-1)/n; size = the whole buffer\n");
        std::printf("%-15s %10s %12s %12s %12s %12s\n", "op", "size", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
    }
    std::vector<CommBenchRow> rows;
    run_comm_bench(*comm, *ctx.world, options, allocate, [&](const CommBenchRow& row) {
        if (ctx.world_rank == 0) print_row(row, comm->size());
        rows.push_back(row);
    });
    ctx.world->barrier();
    if (!args.calibration_path.empty() && ctx.world_rank == 0) {
        if (comm->size() < 2) fail(ErrorKind::config, "--calibration-out: one rank measures no link; run under mpirun -np N with N >= 2");
        const bool inter_node = ctx.local_size < comm->size();
        write_calibration(args.calibration_path, collective_calibration(rows, comm->size(), inter_node));
        std::printf("calibration: %s bus bandwidth and latency -> %s\n", inter_node ? "inter-node" : "intra-node", args.calibration_path.c_str());
    }
    return 0;
}

}  // namespace

void register_bench_command(CLI::App& app, CommandAction& action) {
    CLI::App* bench = app.add_subcommand("bench", "Training throughput of a config (tokens/s, MFU, memory, time per op), or `bench comm` / `bench tokenizer` / `bench attention` / `bench gemm` / `bench moe`");
    bench->require_subcommand(0, 1);
    register_bench_train(*bench, action);
    register_bench_tokenizer(*bench, action);
    register_bench_attention(*bench, action);
    register_bench_gemm(*bench, action);
    register_bench_moe(*bench, action);
    auto args = std::make_shared<BenchCommArgs>();
    CLI::App* comm = bench->add_subcommand("comm", "Collective bandwidth (all_reduce, reduce_scatter, all_gather) over message sizes; run under mpirun");
    comm->add_option("--backend", args->backend, "mpi (host memory) or nccl (GPU memory)")->capture_default_str();
    comm->add_option("--op", args->op, "all, all_reduce, reduce_scatter or all_gather")->capture_default_str();
    comm->add_option("--dtype", args->dtype, "f32 or f64")->capture_default_str();
    comm->add_option("--min-bytes", args->min_bytes, "smallest message")->capture_default_str();
    comm->add_option("--max-bytes", args->max_bytes, "largest message")->capture_default_str();
    comm->add_option("--warmup", args->warmup, "untimed operations per size")->capture_default_str()->check(CLI::Range(0, 100000));
    comm->add_option("--iters", args->iterations, "timed operations per size")->capture_default_str()->check(CLI::Range(1, 1000000));
    comm->add_option("--timeout", args->timeout_seconds, "seconds before a stuck collective ends the job")->capture_default_str();
    comm->add_option("--calibration-out", args->calibration_path, "write the bus bandwidths and latency into this calibration file (for `plan`)");
    comm->callback([args, &action] { action = [args] { return run_bench_comm(*args); }; });
}

}  // namespace llmtrain
