#include "checkpoint/hf_moe.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <regex>

#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace llmtrain {

MoeHfClass moe_hf_class(const ModelConfig& model) { return model.moe.n_shared_experts > 0 ? MoeHfClass::qwen2_moe : MoeHfClass::mixtral; }

namespace {
// What both classes need: a softmax router with nothing added to its scores.
std::optional<std::string> routing_problem(const MoeConfig& moe, const char* hf_class) {
    if (moe.router != MoeRouter::softmax)
        return cat("model.moe.router = \"", moe_router_name(moe.router), "\": ", hf_class, " routes by a softmax over all experts");
    // The balancing losses shape training alone; a bias that moves the choice of experts
    // (expert_bias) is part of the model, and neither class has one.
    if (moe.load_balancing != MoeBalancing::aux_loss && moe.load_balancing != MoeBalancing::seq_aux_loss && moe.load_balancing != MoeBalancing::none)
        return cat("model.moe.load_balancing = \"", moe_balancing_name(moe.load_balancing), "\": ", hf_class,
                   " chooses experts by the router's scores alone, with no bias added to them");
    return std::nullopt;
}

std::optional<std::string> mixtral_problem(const ModelConfig& model) {
    const MoeConfig& moe = model.moe;
    if (const std::optional<std::string> problem = routing_problem(moe, "MixtralForCausalLM")) return problem;
    if (!moe.normalize_top_k)
        return cat("model.moe.normalize_top_k = false: MixtralForCausalLM renormalizes the chosen experts' scores to sum to one "
                   "(Qwen2MoeForCausalLM, which need not, always adds a shared expert with a sigmoid gate: model.moe.n_shared_experts >= 1 "
                   "with model.moe.shared_expert_gate = true)");
    if (moe.first_dense_layers != 0)
        return cat("model.moe.first_dense_layers = ", moe.first_dense_layers, ": every layer of MixtralForCausalLM is a mixture-of-experts layer");
    if (moe.every != 1) return cat("model.moe.every = ", moe.every, ": every layer of MixtralForCausalLM is a mixture-of-experts layer");
    if (model.qkv_bias) return "model.qkv_bias = true: MixtralForCausalLM's attention has no biases";
    return std::nullopt;
}

std::optional<std::string> qwen2_moe_problem(const ModelConfig& model) {
    const MoeConfig& moe = model.moe;
    if (const std::optional<std::string> problem = routing_problem(moe, "Qwen2MoeForCausalLM")) return problem;
    if (!moe.shared_expert_gate)
        return cat("model.moe.shared_expert_gate = false: Qwen2MoeForCausalLM weighs its shared expert by a sigmoid gate, and MixtralForCausalLM "
                   "has no shared expert (model.moe.n_shared_experts = ", moe.n_shared_experts, ")");
    if (!model.qkv_bias) return "model.qkv_bias = false: Qwen2MoeForCausalLM's attention has q, k and v biases";
    return std::nullopt;
}
}  // namespace

std::optional<std::string> moe_export_problem(const ModelConfig& model) {
    if (!model.moe.enabled()) return std::nullopt;
    return moe_hf_class(model) == MoeHfClass::qwen2_moe ? qwen2_moe_problem(model) : mixtral_problem(model);
}

std::string mixtral_name(const std::string& name) {
    const size_t at = name.find(".mlp.");
    if (!name.starts_with("model.layers.") || at == std::string::npos) return name;
    const std::string layer = name.substr(0, at), part = name.substr(at + std::strlen(".mlp."));
    if (part == "gate.weight") return layer + ".block_sparse_moe.gate.weight";
    if (!part.starts_with("experts.")) return name;
    for (const auto& [ours, theirs] : {std::pair{".gate_proj.weight", ".w1.weight"}, {".up_proj.weight", ".w3.weight"}, {".down_proj.weight", ".w2.weight"}})
        if (part.ends_with(ours)) return layer + ".block_sparse_moe." + part.substr(0, part.size() - std::strlen(ours)) + theirs;
    return name;
}

std::string moe_hf_name(const ModelConfig& model, const std::string& name) {
    return moe_hf_class(model) == MoeHfClass::mixtral ? mixtral_name(name) : name;
}

namespace {
nlohmann::ordered_json mixtral_config(nlohmann::ordered_json llama, const ModelConfig& model) {
    const MoeConfig& moe = model.moe;
    llama["architectures"] = nlohmann::ordered_json::array({"MixtralForCausalLM"});
    llama["model_type"] = "mixtral";
    llama["intermediate_size"] = moe.d_ff_expert;
    llama.erase("attention_bias");
    llama.erase("mlp_bias");
    llama["sliding_window"] = nullptr;
    llama["num_local_experts"] = moe.n_experts;
    llama["num_experts_per_tok"] = moe.top_k;
    // Used by transformers only with output_router_logits (training there): Switch's aux loss,
    // which is ours when model.moe.load_balancing = "aux_loss".
    llama["router_aux_loss_coef"] = moe.load_balancing == MoeBalancing::aux_loss ? moe.aux_loss_coeff : 0.0;
    llama["output_router_logits"] = false;
    llama["router_jitter_noise"] = 0.0;
    return llama;
}

// Qwen2's keys (use_sliding_window, max_window_layers) stay; intermediate_size is the dense layers' MLP.
nlohmann::ordered_json qwen2_moe_config(nlohmann::ordered_json qwen2, const ModelConfig& model) {
    const MoeConfig& moe = model.moe;
    qwen2["architectures"] = nlohmann::ordered_json::array({"Qwen2MoeForCausalLM"});
    qwen2["model_type"] = "qwen2_moe";
    qwen2["qkv_bias"] = true;
    qwen2["num_experts"] = moe.n_experts;
    qwen2["num_experts_per_tok"] = moe.top_k;
    qwen2["moe_intermediate_size"] = moe.d_ff_expert;
    qwen2["shared_expert_intermediate_size"] = moe.shared_d_ff();
    qwen2["norm_topk_prob"] = moe.normalize_top_k;
    qwen2["decoder_sparse_step"] = 1;
    nlohmann::ordered_json dense = nlohmann::ordered_json::array();
    for (int64_t l = 0; l < model.n_layers; ++l)
        if (!moe.is_moe_layer(l)) dense.push_back(l);
    qwen2["mlp_only_layers"] = dense;
    qwen2["router_aux_loss_coef"] = moe.load_balancing == MoeBalancing::aux_loss ? moe.aux_loss_coeff : 0.0;
    qwen2["output_router_logits"] = false;
    return qwen2;
}
}  // namespace

nlohmann::ordered_json moe_hf_config(nlohmann::ordered_json llama, const ModelConfig& model) {
    return moe_hf_class(model) == MoeHfClass::qwen2_moe ? qwen2_moe_config(std::move(llama), model) : mixtral_config(std::move(llama), model);
}

namespace {
// What a Hugging Face file holds of one layer's experts.
struct LayerExperts {
    int64_t count = 0;          // the highest expert index + 1
    int64_t width = 0;          // rows of an expert's gate projection (w1 / gate_proj)
    std::string example;        // one of the layer's expert tensors, for the message
};

// Layer -> its experts, from tensor names in our spelling or Mixtral's.
std::map<int64_t, LayerExperts> experts_by_layer(const SafetensorsFile& file) {
    static const std::regex expert(R"(model\.layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|w1)\.weight)");
    std::map<int64_t, LayerExperts> layers;
    for (const SafetensorsEntry& e : file.entries()) {
        std::smatch m;
        if (!std::regex_match(e.name, m, expert)) continue;
        LayerExperts& layer = layers[std::stoll(m[1].str())];
        const int64_t index = std::stoll(m[3].str());
        layer.count = std::max(layer.count, index + 1);
        if (layer.example.empty() || index == 0) layer.width = e.shape.rank == 2 ? e.shape[0] : 0, layer.example = e.name;
    }
    return layers;
}

// What a Hugging Face file holds of one layer's shared expert (Qwen2-MoE's names).
struct LayerShared {
    int64_t width = 0;   // rows of its gate projection; 0: none
    bool gated = false;  // mlp.shared_expert_gate.weight present
};
LayerShared shared_expert_of(const SafetensorsFile& file, int64_t layer) {
    const std::string mlp = cat("model.layers.", layer, ".mlp.");
    LayerShared shared;
    if (const SafetensorsEntry* up = file.find(mlp + "shared_expert.gate_proj.weight"); up && up->shape.rank == 2) shared.width = up->shape[0];
    shared.gated = file.find(mlp + "shared_expert_gate.weight") != nullptr;
    return shared;
}

// "model.moe.<key> = <value> here: the weights of train.init_from '<file>' <what>; expected model.moe.<key> = <expected>".
[[noreturn]] void refuse(const SafetensorsFile& file, const std::string& key, const std::string& here, const std::string& what, const std::string& expected) {
    fail(ErrorKind::config, "model.moe.", key, " = ", here, " here: the weights of train.init_from '", file.path(), "' ", what, "; expected model.moe.", key, " = ",
         expected);
}
}  // namespace

namespace {
// Layer l's shared expert: n_shared_experts * d_ff_expert wide (none when 0), gated as
// shared_expert_gate says.
void check_shared_expert(const SafetensorsFile& file, const MoeConfig& moe, int64_t l) {
    const LayerShared shared = shared_expert_of(file, l);
    if (shared.width != moe.shared_d_ff()) {
        const std::string what = shared.width == 0 ? cat("hold no shared expert in layer ", l)
                                                   : cat("hold a shared expert ", shared.width, " wide in layer ", l, " (model.layers.", l,
                                                         ".mlp.shared_expert.gate_proj.weight)");
        const std::string expected = shared.width % moe.d_ff_expert == 0
                                         ? cat(shared.width / moe.d_ff_expert)
                                         : cat("a count with n_shared_experts x d_ff_expert = ", shared.width, " (d_ff_expert is ", moe.d_ff_expert, ")");
        refuse(file, "n_shared_experts", cat(moe.n_shared_experts), what, expected);
    }
    if (shared.width > 0 && shared.gated != moe.shared_expert_gate)
        refuse(file, "shared_expert_gate", moe.shared_expert_gate ? "true" : "false",
               cat(shared.gated ? "gate" : "do not gate", " layer ", l, "'s shared expert (model.layers.", l, ".mlp.shared_expert_gate.weight)"),
               shared.gated ? "true" : "false");
}
}  // namespace

void check_hf_experts(const SafetensorsFile& file, const ModelConfig& model) {
    const MoeConfig& moe = model.moe;
    const std::map<int64_t, LayerExperts> layers = experts_by_layer(file);
    if (layers.empty()) {
        if (moe.enabled()) refuse(file, "n_experts", cat(moe.n_experts), "hold no experts (a dense model's)", "0");
        return;
    }
    const auto& [first, first_layer] = *layers.begin();
    if (!moe.enabled())
        refuse(file, "n_experts", "0 (a dense model)", cat("hold ", first_layer.count, " experts in layer ", first, " (", first_layer.example, ")"),
               cat(first_layer.count));
    // The file's MoE layers as first_dense_layers and every would place them.
    const int64_t every = layers.size() > 1 ? std::next(layers.begin())->first - first : moe.every;
    for (int64_t l = 0; l < model.n_layers; ++l) {
        const bool in_file = layers.count(l) > 0;
        if (in_file == moe.is_moe_layer(l)) continue;
        const std::string what = cat("make layer ", l, in_file ? " a mixture-of-experts layer" : " dense", ", this config makes it ",
                                     in_file ? "dense" : "a mixture-of-experts layer");
        if (first != moe.first_dense_layers) refuse(file, "first_dense_layers", cat(moe.first_dense_layers), what, cat(first));
        refuse(file, "every", cat(moe.every), what, cat(every));
    }
    for (const auto& [l, layer] : layers) {
        if (layer.count != moe.n_experts)
            refuse(file, "n_experts", cat(moe.n_experts), cat("hold ", layer.count, " experts in layer ", l, " (", layer.example, ")"), cat(layer.count));
        if (layer.width != moe.d_ff_expert)
            refuse(file, "d_ff_expert", cat(moe.d_ff_expert), cat("hold experts ", layer.width, " wide (", layer.example, ": ", file.find(layer.example)->shape.str(), ")"),
                   cat(layer.width));
        check_shared_expert(file, moe, l);
    }
}

}  // namespace llmtrain
