#include "train/model_flops.h"

namespace llmtrain {

double model_flops_per_token(const Config& config, double parameters) {
    const ModelConfig& m = config.model;
    return 6.0 * parameters + 12.0 * static_cast<double>(m.n_layers * m.n_heads * m.head_dim() * config.train.seq_len);
}

double total_parameters(Trainer& trainer) {
    const ParallelContext& ctx = trainer.context();
    return ctx.world->all_reduce_scalar(ctx.coord().dp == 0 ? static_cast<double>(trainer.model().parameters().total_numel()) : 0.0, ReduceOp::sum);
}

}  // namespace llmtrain
