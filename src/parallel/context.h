// ParallelContext: this rank's place in the Mesh and the Comm of each of its groups.
// Made once at start-up (single process: groups of one; under MPI: split from the world)
// and passed explicitly to everything that communicates.
#pragma once

#include <memory>
#include <string>

#include "config/config.h"
#include "parallel/comm.h"
#include "parallel/device_staging.h"
#include "parallel/mesh.h"
#include "parallel/progress_board.h"

namespace llmtrain {

struct ParallelContext {
    Mesh mesh{1, 1, 1, 1};
    int world_rank = 0;
    int local_rank = 0;               // rank among the processes of this node
    int local_size = 1;               // processes on this node
    // dp: the data group (Mesh::data_group, dp x cp ranks holding the same weights), which
    // reduces gradients and shards the training state; cp: the context-parallel ring.
    std::unique_ptr<Comm> world, tp, dp, pp, cp;
    // The first and the last pipeline stage of this (tp, dp) column, which both hold the
    // tied token embedding; null on other stages and when pp = 1.
    std::unique_ptr<Comm> embedding;
    // Hybrid sharding (parallel.shard_size < dp): this rank's block of the dp group, which
    // shards, and its replica group across the blocks. Null otherwise: the dp group shards.
    std::unique_ptr<Comm> shard, replica;
    // Expert parallelism (parallel.ep > 1, mesh.h): ep, the expert group, whose ranks exchange
    // tokens and hold a share of the experts each; edp, the expert-data group, the ranks
    // holding the same experts, which reduces their gradients and shards their state. Null
    // when ep = 1: a dense run makes no communicator more.
    std::unique_ptr<Comm> ep, edp;
    // The world's ranks again, on a communicator of their own: the copies of local snapshots
    // (checkpoint/local_snapshots.h) travel on it in the background, across steps, and so
    // never match another exchange's point-to-point messages.
    std::unique_ptr<Comm> snapshot_copies;
    // How far each rank got in its communication (progress_board.h); null in a single process.
    std::shared_ptr<ProgressBoard> progress;

    MeshCoord coord() const { return mesh.coord(world_rank); }
    bool first_stage() const { return coord()[mesh_dim::pp] == 0; }
    bool last_stage() const { return coord()[mesh_dim::pp] == mesh.pp() - 1; }
    int ep_rank() const { return mesh.ep_rank(world_rank); }
    int edp_rank() const { return mesh.edp_rank(world_rank); }
};

// The mesh of a world of world_size ranks; dp = 0 is derived (world / (tp * cp * pp)). Config errors name the keys
// (also a parallel.shard_size that does not divide dp, a parallel.ep that does not divide tp * cp * dp).
Mesh make_mesh(const ParallelConfig& parallel, int world_size);
// The dp ranks that shard together: parallel.shard_size, or dp when it is 0.
int shard_size_of(const ParallelConfig& parallel, int dp);

// The world ranks of the group named `group` ("world", "snapshot copies", "tp", "dp", "pp",
// "cp", "embedding", "shard", "replica", "ep", "edp") that holds world_rank: the one formula the
// groups of make_mpi_context are split by, which also tells a hang's diagnosis the groups of
// other ranks. Empty: world_rank is in no such group (embedding off the end stages, shard and
// replica without hybrid sharding, ep and edp with parallel.ep = 1).
std::vector<int> context_group_ranks(const Mesh& mesh, int shard_size, const std::string& group, int world_rank);

// A run of one process: every group is that process alone.
ParallelContext make_single_process_context();

// The groups of a run under MPI (MPI must be initialized). dp = 0 in the config is derived
// as world / (tp * pp). A layout that does not fit the world is a config error naming the
// keys; every operation gives up after timeout_seconds. staging: how the groups reach GPU
// tensors (null: CUDA's copies into pinned buffers).
ParallelContext make_mpi_context(const ParallelConfig& parallel, std::shared_ptr<DeviceStaging> staging = nullptr);

}  // namespace llmtrain
