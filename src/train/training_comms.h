// The Comms the trainer hands device tensors to, one per group: the context's own MPI Comms
// (parallel.comm = "mpi", and every CPU run), or EventOrderedComms whose collectives run on
// their own streams, ordered against the backend's compute stream by events (parallel.comm
// = "nccl": NCCL communicators bootstrapped over the context's MPI Comms of the same
// ranks). Groups of one rank keep the context's Comm: they never communicate.
#pragma once

#include <functional>
#include <memory>

#include "backend/backend.h"
#include "config/config.h"
#include "parallel/context.h"
#include "parallel/event_ordered_comm.h"

namespace llmtrain {

// Where the event-ordered path gets its streams and collectives; empty members: CUDA's
// streams and NCCL. Tests plug in stand-ins (the CPU stand-in of the CUDA backend has no
// CUDA stream and there is no NCCL without a GPU).
struct DeviceCommFactory {
    std::function<std::unique_ptr<StreamOrder>(Backend& backend)> make_order{};
    std::function<std::unique_ptr<StreamCollectives>(Comm& group, StreamOrder& order)> make_collectives{};
};

class TrainingComms {
public:
    TrainingComms(const Config& config, ParallelContext& ctx, Backend& backend, const DeviceCommFactory& factory);
    ~TrainingComms();

    Comm& tp() const { return *tp_; }
    Comm& dp() const { return *dp_; }
    Comm& pp() const { return *pp_; }
    Comm* cp() const { return cp_; }  // null where the context has none (a context made before cp existed)
    Comm* embedding() const { return embedding_; }  // null where the context has none
    // The dp ranks ZeRO-2 shards over: a block of the dp group under hybrid sharding, else the dp group.
    Comm& shard() const { return shard_ ? *shard_ : *dp_; }
    Comm* replicas() const { return replica_; }     // across the blocks; null without hybrid sharding
    bool event_ordered() const { return watchdog_ != nullptr; }
    // At a step's end: one more look at the collectives in flight, and their failure thrown
    // (naming the rank, the operation and the group) if there is one.
    void check();

private:
    std::unique_ptr<StreamOrder> order_;
    std::vector<std::unique_ptr<Comm>> owned_;
    Comm *tp_ = nullptr, *dp_ = nullptr, *pp_ = nullptr, *cp_ = nullptr, *embedding_ = nullptr, *shard_ = nullptr, *replica_ = nullptr;
    std::unique_ptr<CommWatchdog> watchdog_;  // last: stopped before the comms it watches go
};

}  // namespace llmtrain
