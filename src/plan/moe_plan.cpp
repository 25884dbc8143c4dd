// Mixture-of-experts figures of the plan (moe_plan.h).
#include "plan/moe_plan.h"

#include "model/moe_mlp.h"

namespace llmtrain {

int64_t moe_layers_in(const ModelConfig& model, const ModelPartition& part) {
    const int64_t last = part.last_layer < 0 ? model.n_layers : part.last_layer;
    int64_t count = 0;
    for (int64_t c = 0; c < part.chunks; ++c)
        for (int64_t layer = part.first_layer; layer < last; ++layer) count += model.moe.is_moe_layer(layer + c * part.chunk_stride) ? 1 : 0;
    return count;
}

double expert_parameters_per_layer(const ModelConfig& model) {
    const MoeConfig& moe = model.moe;
    return static_cast<double>(moe.n_experts) * 3.0 * static_cast<double>(moe.d_ff_expert) * static_cast<double>(model.d_model);
}

double active_parameter_count(const ModelConfig& model, const double parameters) {
    if (!model.moe.enabled()) return parameters;
    const double idle_share = static_cast<double>(model.moe.n_experts - model.moe.top_k) / static_cast<double>(model.moe.n_experts);
    return parameters - static_cast<double>(moe_layers_in(model, ModelPartition{})) * expert_parameters_per_layer(model) * idle_share;
}

int64_t planned_routed_rows(const MoeConfig& moe, int64_t tokens) { return moe_permuted_rows(moe, tokens); }

int64_t stage_parameter_count(const Config& config, const ModelPartition& part, int tp) {
    ModelConfig model = config.model;
    const int64_t others = model.moe.enabled() ? model.moe.n_experts - 1 : 0;
    if (others > 0) model.moe.n_experts = 1;
    const TransformerLayout layout(model, Device::cpu, compute_dtype(config.train), config.train.batch_size, config.train.seq_len, part, 0, tp);
    const int64_t per_expert = model.d_model * (1 + 3 * model.moe.d_ff_expert);
    return layout.parameters().total_numel() + others * per_expert * moe_layers_in(model, part);
}

std::string untrainable_layout_note(const Config& config) {
    if (untrainable_in_this_build(config).empty()) return "";
    return cat("planned, not trainable in this build: parallel.ep = ", config.parallel.ep,
               " needs the experts' own parameter group, which this build does not have (it trains ep = 1, every expert on every rank)");
}

}  // namespace llmtrain
