#include "train/training_comms.h"

#include "core/log.h"

namespace llmtrain {

namespace {

bool any_group_communicates(const ParallelContext& ctx) {
    return ctx.tp->size() > 1 || ctx.dp->size() > 1 || ctx.pp->size() > 1 || (ctx.cp && ctx.cp->size() > 1) || (ctx.embedding && ctx.embedding->size() > 1);
}

DeviceCommFactory with_defaults(DeviceCommFactory factory, const ParallelContext& ctx, double timeout_seconds) {
    if (!factory.make_order) factory.make_order = [](Backend& backend) { return make_cuda_stream_order(backend.device_stream()); };
    if (!factory.make_collectives) {
        const int local_rank = ctx.local_rank;
        factory.make_collectives = [local_rank, timeout_seconds](Comm& group, StreamOrder& order) {
            return make_nccl_collectives(group, local_rank, timeout_seconds, order);
        };
    }
    return factory;
}

}  // namespace

TrainingComms::TrainingComms(const Config& config, ParallelContext& ctx, Backend& backend, const DeviceCommFactory& overrides)
    : tp_(ctx.tp.get()), dp_(ctx.dp.get()), pp_(ctx.pp.get()), cp_(ctx.cp.get()), embedding_(ctx.embedding.get()), shard_(ctx.shard.get()), replica_(ctx.replica.get()) {
    if (comm_backend(config) != CommBackend::nccl || !any_group_communicates(ctx)) return;
    const DeviceCommFactory factory = with_defaults(overrides, ctx, config.parallel.timeout_seconds);
    order_ = factory.make_order(backend);
    watchdog_ = std::make_unique<CommWatchdog>(*order_, config.parallel.timeout_seconds, ctx.world_rank, ctx.progress.get());
    // Every rank builds the communicators of its groups in the same order (tp, dp, pp, cp,
    // embedding, shard, replica): each bootstrap is a broadcast over that group's MPI Comm.
    const auto ordered = [&](Comm*& slot, bool point_to_point) {
        if (!slot || slot->size() == 1) return;
        std::unique_ptr<StreamCollectives> main = factory.make_collectives(*slot, *order_);
        std::unique_ptr<StreamCollectives> reverse = point_to_point ? factory.make_collectives(*slot, *order_) : nullptr;
        owned_.push_back(std::make_unique<EventOrderedComm>(*slot, std::move(main), std::move(reverse), *order_, *watchdog_));
        slot = owned_.back().get();
    };
    ordered(tp_, false);
    ordered(dp_, false);
    ordered(pp_, true);
    // The cp ring sends to the next rank while it receives from the previous one: both lanes.
    ordered(cp_, true);
    ordered(embedding_, false);
    ordered(shard_, false);
    ordered(replica_, false);
    // A collective is looked at ten times per second: a hang is found within the timeout
    // plus 0.1 s, and the polling costs nothing measurable.
    watchdog_->start(std::chrono::milliseconds(100));
}

TrainingComms::~TrainingComms() {
    // The watchdog stops before the communicators it watches are destroyed.
    watchdog_.reset();
}

void TrainingComms::check() {
    if (!watchdog_) return;
    watchdog_->poll();
    watchdog_->check();
}

}  // namespace llmtrain
