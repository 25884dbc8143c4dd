// The verification of datasets (data/dataset_verify.h) over this process's threads and, under
// mpirun / srun, over every rank of the job: `llmtrain data verify` and `doctor --data`.
#pragma once

#include <string>
#include <vector>

#include "data/dataset_verify.h"

namespace llmtrain {

class MpiSession;

// Threads per rank by default: the node's cores shared among its ranks.
int default_verify_threads();

// Every block of every dataset (a dataset.json or its directory), shared by this process's
// threads and, with mpi, by every rank (a collective over the world); every rank returns the
// job's report.
VerifyReport verify_datasets(const std::vector<std::string>& datasets, int threads, const MpiSession* mpi);

// One line per corrupt block or shard, and the summary; "" on a clean report.
std::string list_corrupt(const VerifyReport& report);

}  // namespace llmtrain
