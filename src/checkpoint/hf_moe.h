// A mixture-of-experts model (model.moe) in Hugging Face's terms: exported as Mixtral
// (transformers' MixtralForCausalLM), and Hugging Face weights checked against model.moe
// before train.init_from allocates anything.
//
// Mixtral's MoE block routes as our softmax router with normalize_top_k does: softmax over
// all experts of the fp32 router logits, the top num_experts_per_tok, renormalized to sum to
// one, with no bias added to the scores; every layer is a MoE layer, no expert is shared,
// attention has no biases. Our names
// are Qwen2-MoE's (model/moe_mlp.h); Mixtral's differ only inside the MLP:
//   model.layers.{l}.mlp.gate.weight                    -> model.layers.{l}.block_sparse_moe.gate.weight
//   model.layers.{l}.mlp.experts.{e}.gate_proj.weight   -> ...block_sparse_moe.experts.{e}.w1.weight
//   model.layers.{l}.mlp.experts.{e}.up_proj.weight     -> ...block_sparse_moe.experts.{e}.w3.weight
//   model.layers.{l}.mlp.experts.{e}.down_proj.weight   -> ...block_sparse_moe.experts.{e}.w2.weight
// with the same [out, in] layouts. Qwen2MoeForCausalLM is not a target: its MoE block always
// has a shared expert with a sigmoid gate, which model.moe has not.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config.h"

namespace llmtrain {

class SafetensorsFile;

// Why MixtralForCausalLM cannot compute what this MoE model computes ("model.moe.router =
// \"sigmoid\": ..."), naming the first key in the way; nothing when it can.
std::optional<std::string> mixtral_export_problem(const ModelConfig& model);

// Mixtral's name of one of our tensors (the MoE tensors renamed as above, the rest unchanged).
std::string mixtral_name(const std::string& name);

// config.json of MixtralForCausalLM for a model mixtral_export_problem passes: Llama's
// (the attention, norms, RoPE and embeddings are the same) with the MLP's keys Mixtral's.
nlohmann::ordered_json mixtral_config(nlohmann::ordered_json llama, const ModelConfig& model);

// The experts of Hugging Face weights (our names or Mixtral's) against model.moe: which
// layers hold experts (model.moe.first_dense_layers, every), how many per layer
// (model.moe.n_experts) and their width (model.moe.d_ff_expert). Throws Error(config) naming
// the key and the value the weights need.
void check_hf_experts(const SafetensorsFile& file, const ModelConfig& model);

}  // namespace llmtrain
