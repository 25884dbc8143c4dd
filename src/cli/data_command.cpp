// `llmtrain data verify DATASET...`: reads every block of every shard of llmtrain datasets and
// checks it (data/dataset_verify.h), on --threads threads and, under mpirun / srun, on every
// rank; rank 0 prints one line per corrupt block (the shard file, the block, its tokens, what
// is wrong) and a summary. Exit 0: clean; 2: something is corrupt.
#include <cstdio>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/data_verification.h"
#include "core/error.h"
#include "core/exit_code.h"
#include "parallel/mpi_comm.h"

namespace llmtrain {

namespace {

struct VerifyArgs {
    std::vector<std::string> datasets;
    int threads = 0;
    bool json = false;
};

int run_verify(const VerifyArgs& args) {
    std::optional<MpiSession> mpi;
    if (launched_by_mpi()) mpi.emplace();
    const int rank = mpi ? mpi->world_rank() : 0, ranks = mpi ? mpi->world_size() : 1;
    const int threads = args.threads > 0 ? args.threads : default_verify_threads();
    VerifyReport report;
    try {
        report = verify_datasets(args.datasets, threads, mpi ? &*mpi : nullptr);
    } catch (const Error& e) {
        if (ranks == 1) throw;
        // Another rank may wait in the gather: report here and end every rank.
        std::fprintf(stderr, "llmtrain: rank %d: %s: %s\n", rank, error_kind_name(e.kind()), e.what());
        std::fflush(stderr);
        MpiSession::abort_job(exit_code_for(e.kind()));
    }
    if (rank != 0) return report.clean() ? exit_ok : exit_bad_input;  // the job's verdict, as rank 0's
    if (args.json) {
        std::printf("%s\n", report.to_json().c_str());
    } else {
        std::printf("%s", list_corrupt(report).c_str());
        std::printf("data verify: %s on %d rank(s) x %d thread(s): %s\n", describe_verified(report).c_str(), ranks, threads,
                    report.clean() ? "every block checks" : cat(report.corrupt.size(), " corrupt block(s) or shard(s)").c_str());
    }
    std::fflush(stdout);
    return report.clean() ? exit_ok : exit_bad_input;
}

}  // namespace

void register_data_command(CLI::App& app, CommandAction& action) {
    CLI::App* cmd = app.add_subcommand("data", "Check prepared datasets");
    cmd->require_subcommand(1);
    auto args = std::make_shared<VerifyArgs>();
    CLI::App* verify = cmd->add_subcommand("verify", "Read and check every block of every shard (checksums, sizes, ids); list each corrupt block; exit 2 if any");
    verify->add_option("dataset", args->datasets, "A dataset.json, or the directory prepare wrote (several: each)")->required();
    verify->add_option("--threads", args->threads, "Threads per process (0: the cores, shared among the ranks of a node)")->capture_default_str()
        ->check(CLI::Range(0, 4096));
    verify->add_flag("--json", args->json, "One JSON object: counts, seconds and every corrupt part");
    verify->callback([args, &action] { action = [args] { return run_verify(*args); }; });
}

}  // namespace llmtrain
