#include "train/model_flops.h"

namespace llmtrain {

double total_parameters(Trainer& trainer) {
    const ParallelContext& ctx = trainer.context();
    return ctx.world->all_reduce_scalar(ctx.coord()[mesh_dim::dp] == 0 ? static_cast<double>(trainer.model().parameters().total_numel()) : 0.0, ReduceOp::sum);
}

}  // namespace llmtrain
