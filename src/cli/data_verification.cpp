#include "cli/data_verification.h"

#include <algorithm>
#include <thread>

#include "core/error.h"
#include "parallel/launch_env.h"
#include "parallel/mpi_comm.h"

namespace llmtrain {

int default_verify_threads() {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return std::max(1, cores / (launched_by_mpi() ? std::max(1, launch_environment().local_size) : 1));
}

// Each rank's report reaches rank 0 through one broadcast per rank (a handful of numbers and
// the corrupt parts it found), and the job's goes back to every rank in one more.
VerifyReport verify_datasets(const std::vector<std::string>& datasets, int threads, const MpiSession* mpi) {
    const VerifyShare share{mpi ? mpi->world_rank() : 0, mpi ? mpi->world_size() : 1, threads};
    VerifyReport mine;
    for (const std::string& dataset : datasets) mine.merge(verify_dataset(dataset, share));
    if (!mpi || share.ranks == 1) return mine;
    VerifyReport job;
    for (int r = 0; r < share.ranks; ++r) {
        const std::string text = mpi->broadcast_text(r, r == share.rank ? mine.to_json() : "");
        if (share.rank == 0) job.merge(VerifyReport::from_json(text));
    }
    return VerifyReport::from_json(mpi->broadcast_text(0, share.rank == 0 ? job.to_json() : ""));
}

std::string list_corrupt(const VerifyReport& report) {
    std::string text;
    for (const CorruptPart& part : report.corrupt) text += cat("corrupt: ", part.message, "\n");
    return text;
}

}  // namespace llmtrain
