// A mixture-of-experts model (model.moe) in Hugging Face's terms: exported as Mixtral
// (transformers' MixtralForCausalLM) when it has no shared experts, as Qwen2-MoE
// (Qwen2MoeForCausalLM) when it has; and Hugging Face weights checked against model.moe
// before train.init_from allocates anything.
//
// Both route as our softmax router does: a softmax over all experts of the fp32 router
// logits, the top num_experts_per_tok, with no bias added to the scores; Mixtral always
// renormalizes the chosen scores to sum to one (normalize_top_k), Qwen2-MoE when
// norm_topk_prob says so.
//
// Mixtral: every layer is a MoE layer, no expert is shared, attention has no biases. Our
// names are Qwen2-MoE's (model/moe_mlp.h); Mixtral's differ only inside the MLP:
//   model.layers.{l}.mlp.gate.weight                    -> model.layers.{l}.block_sparse_moe.gate.weight
//   model.layers.{l}.mlp.experts.{e}.gate_proj.weight   -> ...block_sparse_moe.experts.{e}.w1.weight
//   model.layers.{l}.mlp.experts.{e}.up_proj.weight     -> ...block_sparse_moe.experts.{e}.w3.weight
//   model.layers.{l}.mlp.experts.{e}.down_proj.weight   -> ...block_sparse_moe.experts.{e}.w2.weight
// with the same [out, in] layouts.
//
// Qwen2-MoE: Qwen2's attention (q, k and v with biases), and in each MoE layer one shared
// expert of shared_expert_intermediate_size (our n_shared_experts * d_ff_expert, the shared
// experts fused) whose output is weighed by sigmoid(x . shared_expert_gate): our
// shared_expert_gate = true. Its layer is sparse when it is not in mlp_only_layers and
// (layer + 1) % decoder_sparse_step == 0: exported as decoder_sparse_step = 1 with every
// dense layer listed in mlp_only_layers, which says exactly our first_dense_layers and every.
// The names are ours, unchanged.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config.h"

namespace llmtrain {

class SafetensorsFile;

// The class a MoE model exports as: Qwen2-MoE with shared experts, else Mixtral.
enum class MoeHfClass { mixtral, qwen2_moe };
MoeHfClass moe_hf_class(const ModelConfig& model);

// Why the class moe_hf_class names cannot compute what this MoE model computes
// ("model.moe.router = \"sigmoid\": ..."), naming the first key in the way; nothing when it can.
std::optional<std::string> moe_export_problem(const ModelConfig& model);

// Mixtral's name of one of our tensors (the MoE tensors renamed as above, the rest unchanged).
std::string mixtral_name(const std::string& name);
// The exported name of one of our tensors: Mixtral's, or ours for Qwen2-MoE.
std::string moe_hf_name(const ModelConfig& model, const std::string& name);

// config.json for a model moe_export_problem passes: Llama's (or Qwen2's: the attention,
// norms, RoPE and embeddings are the same) with the MLP's keys the class's.
nlohmann::ordered_json moe_hf_config(nlohmann::ordered_json llama, const ModelConfig& model);

// The experts of Hugging Face weights (our names or Mixtral's) against model.moe: which
// layers hold experts (model.moe.first_dense_layers, every), how many per layer
// (model.moe.n_experts) and their width (model.moe.d_ff_expert), the shared experts' width
// (model.moe.n_shared_experts) and their gate (model.moe.shared_expert_gate). Throws
// Error(config) naming the key and the value the weights need.
void check_hf_experts(const SafetensorsFile& file, const ModelConfig& model);

}  // namespace llmtrain
