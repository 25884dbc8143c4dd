// The step's mixture-of-experts figures and the expert biases (moe_load.h).
#include "train/moe_load.h"

#include <algorithm>
#include <numeric>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace llmtrain {

double load_max_over_mean(const std::vector<double>& load) {
    const double total = std::accumulate(load.begin(), load.end(), 0.0);
    if (load.empty() || total <= 0) return 0;
    return *std::max_element(load.begin(), load.end()) / (total / static_cast<double>(load.size()));
}

MoeBalance::MoeBalance(const Config& config) : config_(config) {
    const MoeConfig& moe = config.model.moe;
    if (moe.load_balancing != MoeBalancing::expert_bias) return;
    for (int64_t l = 0; l < config.model.n_layers; ++l)
        if (moe.is_moe_layer(l)) bias_[l] = std::vector<float>(static_cast<size_t>(moe.n_experts), 0.0f);
}

namespace {
// Row l of the reduction holds layer l's routed assignments per expert, then its dropped
// ones; the last element the balancing losses. A layer lives on one pipeline stage, so the
// other stages add zeros.
std::vector<double> local_sums(const Transformer& model, size_t layers, size_t E) {
    const size_t row = E + 1;
    std::vector<double> sums(layers * row + 1, 0.0);
    for (const auto& [layer, load] : model.expert_loads()) {
        double* r = sums.data() + static_cast<size_t>(layer) * row;
        for (size_t e = 0; e < E && e < load.routed.size(); ++e) r[e] = static_cast<double>(load.routed[e]);
        r[E] = static_cast<double>(load.dropped);
    }
    model.backend().copy_to_host(&sums.back(), model.balance_loss_sum());
    return sums;
}

double sign(double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; }
}  // namespace

// A layer's tp ranks route the same tokens (counted tp times, divided here) unless sequence
// parallelism gave each its own; likewise the balancing losses, which the token shards of a
// micro-batch (tp under sequence parallelism, cp) add in parts.
void MoeBalance::close_step(Transformer& model, const ParallelContext& ctx, StepRecord& s) {
    const MoeConfig& moe = config_.model.moe;
    if (!moe.enabled()) return;
    const size_t E = static_cast<size_t>(moe.n_experts), row = E + 1, layers = static_cast<size_t>(config_.model.n_layers);
    std::vector<double> sums = local_sums(model, layers, E);
    if (ctx.mesh.world_size() > 1) ctx.world->all_reduce(Tensor(sums.data(), DType::f64, {static_cast<int64_t>(sums.size())}), ReduceOp::sum);
    const double copies = config_.parallel.sequence_parallel ? 1.0 : static_cast<double>(ctx.mesh.tp());
    for (size_t l = 0; l < layers; ++l) {
        if (!moe.is_moe_layer(static_cast<int64_t>(l))) continue;
        const double* r = sums.data() + l * row;
        std::vector<double> load(r, r + E);
        for (double& v : load) v /= copies;
        const double routed = std::accumulate(load.begin(), load.end(), 0.0);
        // Each token makes top_k assignments to distinct experts: routed / top_k tokens.
        const double busiest = load.empty() ? 0 : *std::max_element(load.begin(), load.end());
        s.moe.push_back({.layer = static_cast<int64_t>(l), .load_max_over_mean = load_max_over_mean(load),
                         .dropped_fraction = routed > 0 ? r[E] / copies / routed : 0.0,
                         .top_expert_token_share = routed > 0 ? busiest / (routed / static_cast<double>(moe.top_k)) : 0.0});
        const auto bias = bias_.find(static_cast<int64_t>(l));
        if (bias == bias_.end() || routed <= 0) continue;
        const double mean = routed / static_cast<double>(E);
        for (size_t e = 0; e < E; ++e) bias->second[e] = static_cast<float>(bias->second[e] + moe.bias_update_rate * sign(mean - load[e]));
    }
    const double micro_batches = static_cast<double>(config_.train.grad_accum * ctx.mesh.dp());
    s.balance_loss = sums.back() / (micro_batches * copies);
    set_biases(model);
}

void MoeBalance::set_biases(Transformer& model) const {
    for (const auto& [layer, bias] : bias_) model.set_expert_bias(layer, bias);
}

std::string MoeBalance::state() const {
    if (bias_.empty()) return "";
    nlohmann::ordered_json layers = nlohmann::ordered_json::object();
    for (const auto& [layer, bias] : bias_) layers[std::to_string(layer)] = bias;
    return nlohmann::ordered_json{{"expert_bias", layers}}.dump();
}

// A float written as JSON reads back as the same float (nlohmann prints the shortest
// round-tripping text).
void MoeBalance::restore(const std::string& state, const std::string& path, Transformer& model) {
    for (auto& [layer, bias] : bias_) std::fill(bias.begin(), bias.end(), 0.0f);
    if (!state.empty() && !bias_.empty()) {
        const nlohmann::json saved = nlohmann::json::parse(state).value("expert_bias", nlohmann::json::object());
        for (auto& [layer, bias] : bias_) {
            const std::string key = std::to_string(layer);
            if (!saved.contains(key)) continue;
            const std::vector<float> values = saved.at(key).get<std::vector<float>>();
            if (values.size() != bias.size())
                fail(ErrorKind::data, "'", path, "': layer ", layer, " has ", values.size(), " expert biases; model.moe.n_experts = ", bias.size());
            bias = values;
        }
    }
    set_biases(model);
}

}  // namespace llmtrain
