#include "parallel/context.h"

namespace llmtrain {

ParallelContext make_single_process_context() {
    ParallelContext ctx;
    ctx.world = make_self_comm("world");
    ctx.tp = make_self_comm("tp");
    ctx.dp = make_self_comm("dp");
    ctx.pp = make_self_comm("pp");
    ctx.cp = make_self_comm("cp");
    ctx.snapshot_copies = make_self_comm("snapshot copies");
    return ctx;
}

Mesh make_mesh(const ParallelConfig& parallel, int world_size) {
    const int64_t tp = parallel.tp, pp = parallel.pp, cp = parallel.cp;
    // cp is named only where a config sets it.
    const bool named_cp = cp > 1;
    if (world_size % (tp * cp * pp) != 0)
        fail(ErrorKind::config, "parallel.tp * ", named_cp ? "parallel.cp * " : "", "parallel.pp = ", tp * cp * pp, " does not divide the world size ", world_size,
             " (ranks launched)");
    const int64_t dp = parallel.dp ? parallel.dp : world_size / (tp * cp * pp);
    if (tp * cp * pp * dp != world_size)
        fail(ErrorKind::config, "parallel: tp * ", named_cp ? "cp * " : "", "pp * dp = ", tp, " * ", named_cp ? cat(cp, " * ") : "", pp, " * ", dp, " = ",
             tp * cp * pp * dp, " but ", world_size, " ranks were launched (set parallel.dp = 0 to derive it)");
    if (parallel.shard_size > 0 && dp % parallel.shard_size != 0)
        fail(ErrorKind::config, "parallel.shard_size = ", parallel.shard_size, " does not divide dp = ", dp,
             " (allowed: a divisor of dp, e.g. the dp ranks of a node; 0: dp)");
    const int64_t ep = parallel.ep, stage = tp * cp * dp;
    if (ep < 1 || stage % ep != 0)
        fail(ErrorKind::config, "parallel.ep = ", ep, " does not divide the ranks of a pipeline stage, tp * ", named_cp ? "cp * " : "", "dp = ", stage,
             " (allowed: a divisor of ", stage, ")");
    // Hybrid sharding keeps its dp / shard_size replica blocks for the experts' state too.
    const int64_t blocks = parallel.shard_size > 0 ? dp / parallel.shard_size : 1;
    if (ep > 1 && (stage / ep) % blocks != 0)
        fail(ErrorKind::config, "parallel.shard_size = ", parallel.shard_size, " cuts dp = ", dp, " into ", blocks, " replica blocks, which do not divide the ",
             stage / ep, " ranks holding the same experts (edp = tp * ", named_cp ? "cp * " : "", "dp / parallel.ep = ", stage, " / ", ep,
             "; allowed: a shard_size with dp / shard_size dividing edp, or 0)");
    return Mesh(world_size, static_cast<int>(tp), static_cast<int>(dp), static_cast<int>(pp), parallel.order, static_cast<int>(cp), static_cast<int>(ep));
}

int shard_size_of(const ParallelConfig& parallel, int dp) { return parallel.shard_size > 0 ? static_cast<int>(parallel.shard_size) : dp; }

std::vector<int> context_group_ranks(const Mesh& mesh, int shard_size, const std::string& group, int world_rank) {
    if (group == "world" || group == "snapshot copies") {
        std::vector<int> all(static_cast<size_t>(mesh.world_size()));
        for (int r = 0; r < mesh.world_size(); ++r) all[static_cast<size_t>(r)] = r;
        return all;
    }
    if (group == "tp") return mesh.group(mesh_dim::tp, world_rank);
    if (group == "dp") return mesh.data_group(world_rank);  // with its cp ranks
    if (group == "pp") return mesh.group(mesh_dim::pp, world_rank);
    if (group == "cp") return mesh.group(mesh_dim::cp, world_rank);
    if (group == "embedding") {
        const std::vector<int> column = mesh.group(mesh_dim::pp, world_rank);
        const int stage = mesh.coord(world_rank)[mesh_dim::pp];
        if (mesh.pp() > 1 && (stage == 0 || stage == mesh.pp() - 1)) return {column.front(), column.back()};
        return {};
    }
    if (mesh.ep() > 1 && group == "ep") return mesh.expert_group(world_rank);
    if (mesh.ep() > 1 && group == "edp") return mesh.expert_data_group(world_rank);
    if (shard_size < mesh.dp() && group == "shard") return mesh.shard_group(world_rank, shard_size);
    if (shard_size < mesh.dp() && group == "replica") return mesh.replica_group(world_rank, shard_size);
    return {};
}

}  // namespace llmtrain
