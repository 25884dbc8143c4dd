#include "parallel/context.h"

namespace llmtrain {

ParallelContext make_single_process_context() {
    ParallelContext ctx;
    ctx.world = make_self_comm("world");
    ctx.tp = make_self_comm("tp");
    ctx.dp = make_self_comm("dp");
    ctx.pp = make_self_comm("pp");
    return ctx;
}

Mesh make_mesh(const ParallelConfig& parallel, int world_size) {
    const int64_t tp = parallel.tp, pp = parallel.pp;
    if (world_size % (tp * pp) != 0)
        fail(ErrorKind::config, "parallel.tp * parallel.pp = ", tp * pp, " does not divide the world size ", world_size, " (ranks launched)");
    const int64_t dp = parallel.dp ? parallel.dp : world_size / (tp * pp);
    if (tp * pp * dp != world_size)
        fail(ErrorKind::config, "parallel: tp * pp * dp = ", tp, " * ", pp, " * ", dp, " = ", tp * pp * dp, " but ", world_size,
             " ranks were launched (set parallel.dp = 0 to derive it)");
    return Mesh(world_size, static_cast<int>(tp), static_cast<int>(dp), static_cast<int>(pp), parallel.order);
}

}  // namespace llmtrain
