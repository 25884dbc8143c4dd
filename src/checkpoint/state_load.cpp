#include "checkpoint/state_load.h"

#include <vector>

#include "parallel/replica_exchange.h"

namespace llmtrain {

namespace {

std::vector<TensorRole> roles_of(const RankState& rank) {
    if (!rank.optimizer) return {TensorRole::weights};
    return {std::begin(kTensorRoles), std::end(kTensorRoles)};
}

FlatRange flat_of(const TensorPlace& t, FlatRange local) { return {t.flat.begin + local.begin, t.flat.begin + local.end}; }

// Step 2a: each range of a tensor tp does not split, as the tp ranks hold it, cut into the
// tp ranks' parts; part t was read by tp rank t.
void exchange_over_tp(const RankState& rank, const std::vector<TensorRole>& roles) {
    if (!rank.tp || rank.tp->size() == 1) return;
    const int tp = rank.tp->size();
    for (TensorRole role : roles) {
        std::vector<ReplicaPart> parts;
        for (const TensorRange& r : rank.placement.checkpoint_share(false, false)) {
            const TensorPlace& t = rank.placement.tensors()[r.tensor];
            if (!t.replicated_over_tp()) continue;
            for (int holder = 0; holder < tp; ++holder) {
                const FlatRange part = r.local.intersect(Placement::part_of({0, t.numel()}, tp, holder));
                if (part.size() > 0) parts.push_back({state_region(rank, role, flat_of(t, part)), holder});
            }
        }
        exchange_parts(*rank.tp, parts, rank.ops, rank.allocate);
    }
}

// Step 2b: hybrid sharding's blocks hold the same pieces; block j read part j of each.
void exchange_over_replicas(const RankState& rank, const std::vector<TensorRole>& roles) {
    if (!rank.replicas || rank.replicas->size() == 1) return;
    const int replicas = rank.replicas->size();
    for (TensorRole role : roles) {
        std::vector<ReplicaPart> parts;
        for (const FlatRange& piece : rank.placement.pieces())
            for (int holder = 0; holder < replicas; ++holder)
                if (const FlatRange part = Placement::part_of(piece, replicas, holder); part.size() > 0)
                    parts.push_back({state_region(rank, role, part), holder});
        exchange_parts(*rank.replicas, parts, rank.ops, rank.allocate);
    }
}

// Step 3: what the dp group holds whole. The master weights (the store knows how); under
// stage 0 the moments too, laid out as the flat buffer, cut by the same buckets.
void complete_over_dp(const RankState& rank) {
    rank.store.after_load();
    if (!rank.optimizer || rank.placement.shards_optimizer() || !rank.dp || rank.dp->size() == 1) return;
    for (const Tensor& moments : {rank.optimizer->exp_avg(), rank.optimizer->exp_avg_sq()})
        gather_over_cuts(*rank.dp, moments, rank.placement.cuts(), {}, rank.ops);
}

}  // namespace

Tensor state_region(const RankState& rank, TensorRole role, FlatRange range) {
    if (role == TensorRole::weights) return rank.store.master(range);
    if (!rank.optimizer) fail(ErrorKind::runtime, "the ", tensor_role_name(role), " is asked of a rank without an optimizer");
    return rank.optimizer->moment(role == TensorRole::exp_avg_sq, range);
}

void read_to(const Tensor& out, Backend& backend, const std::function<void(void* host, DType as)>& read) {
    if (out.device() == Device::cpu) return read(out.raw(), out.dtype());
    std::vector<char> host(out.bytes());
    read(host.data(), out.dtype());
    backend.copy_from_host(out, host.data());
}

void load_state(const RankState& rank, const ReadTensor& read) {
    const std::vector<TensorRole> roles = roles_of(rank);
    const std::vector<TensorRange> share = rank.placement.checkpoint_share(false);
    for (TensorRole role : roles)
        for (const TensorRange& r : share) {
            const TensorPlace& t = rank.placement.tensors()[r.tensor];
            read(role, t, r.local, state_region(rank, role, flat_of(t, r.local)));
        }
    exchange_over_tp(rank, roles);
    exchange_over_replicas(rank, roles);
    complete_over_dp(rank);
}

}  // namespace llmtrain
