// The parameter registry: every trainable tensor with its global Hugging Face-style name
// (e.g. "model.layers.3.self_attn.q_proj.weight"), its shape, how it is initialized and
// whether weight decay applies. All parameters live in one flat buffer, in registration
// order, and their gradients in a second buffer of the same layout, so the optimizer and
// the global gradient norm each see one contiguous tensor.
//
// Initialization draws element i of parameter "name" from the Philox stream
// (seed, fnv1a64(name)) at index i: the initial weights do not depend on registration
// order, on other parameters, or on how a tensor is later split across ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace llmtrain {

enum class ParamInit {
    normal,           // N(0, std)
    normal_residual,  // N(0, std / sqrt(2 * n_layers)): projections into the residual stream (GPT-2)
    ones,
    zeros,
};

struct ParamInfo {
    std::string name;
    Shape shape;
    ParamInit init;
    bool weight_decay;      // matrices decay; norms and biases do not
    int64_t offset = 0;     // elements from the start of the flat buffer
};

class Parameters {
public:
    // Registration (before allocate()). Returns the parameter's index.
    size_t add(std::string name, Shape shape, ParamInit init, bool weight_decay);
    // Allocates the parameter and gradient buffers (zeroed) in dtype.
    void allocate(DType dtype);
    // Fills every parameter from its Philox stream.
    void initialize(uint64_t seed, double std, int64_t n_layers);

    size_t count() const { return infos_.size(); }
    const ParamInfo& info(size_t index) const { return infos_[index]; }
    const std::vector<ParamInfo>& infos() const { return infos_; }
    // Index of the parameter with this name; throws if absent.
    size_t index_of(const std::string& name) const;
    int64_t total_numel() const { return total_numel_; }
    DType dtype() const { return all_values().dtype(); }

    Tensor value(size_t index) const { return view_of(values_, index, index); }
    Tensor grad(size_t index) const { return view_of(grads_, index, index); }
    // Parameters first..last (inclusive) registered back to back with equal row width, as one
    // tensor of stacked rows: q, k and v projections become one fused QKV weight.
    Tensor value_span(size_t first, size_t last) const { return view_of(values_, first, last); }
    Tensor grad_span(size_t first, size_t last) const { return view_of(grads_, first, last); }
    Tensor all_values() const { return values_.view(); }
    Tensor all_grads() const { return grads_.view(); }

private:
    Tensor view_of(const OwnedTensor& buffer, size_t first, size_t last) const;
    std::vector<ParamInfo> infos_;
    int64_t total_numel_ = 0;
    OwnedTensor values_;
    OwnedTensor grads_;
};

}  // namespace llmtrain
