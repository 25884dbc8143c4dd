// The parameter registry: every trainable tensor with its global Hugging Face-style name
// (e.g. "model.layers.3.self_attn.q_proj.weight"), its shape, how it is initialized and
// whether weight decay applies. All parameters live in one flat buffer, in registration
// order, and their gradients in a second buffer of the same layout, so the optimizer and
// the global gradient norm each see one contiguous tensor.
//
// Initialization draws element i of parameter "name" from the Philox stream
// (seed, fnv1a64(name)) at index i of the *global* (unsplit) tensor: the initial weights
// do not depend on registration order, on other parameters, or on how a tensor is split
// across tensor-parallel ranks. A table with padding rows (the padded vocabulary) keeps its
// row width, so element (row, col) of a real row is index row * cols + col whatever the
// padding: the real rows start the same for any padding, and the padding rows at zero.
//
// Mixed precision: the flat buffer holds the master weights (f32) that AdamW updates, and
// the gradients are kept in the same dtype; a second flat buffer of the same layout holds
// the 16-bit copy that forward and backward compute with (value()), refreshed after every
// update. On the CPU the compute dtype is the master's and there is no copy.
//
// Gradient storage: the flat gradient buffer by default. Under ZeRO-2 (GradStorage::bound)
// no such buffer exists: while backward writes a group of parameters' gradients, they live
// in a buffer of that group's length bound with bind_grads() (the data-parallel reduction
// owns those buffers), in the flat layout's order, so grad_span() still joins neighbours.
//
// Value storage: the flat buffers by default. Under ZeRO-3 (ValueStorage::bound) there are
// no flat value buffers at all (the parameter store keeps this rank's shards): forward and
// backward read each group of parameters from a buffer of that group's length bound with
// bind_values() (an all-gathered group of the data-parallel shards), and the shards are
// initialized piece by piece (initialize_range).
//
// Tensor parallelism (Megatron): a parameter may be split across the tp ranks by rows or
// by columns, or held whole by each (TensorSplit, parallel/placement.h).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "parallel/placement.h"

namespace llmtrain {

class Backend;

enum class ParamInit {
    normal,           // N(0, std)
    normal_residual,  // N(0, std / sqrt(2 * n_layers)): projections into the residual stream (GPT-2)
    ones,
    zeros,
};

// Where the gradients live: the flat buffer, or buffers bound per group of parameters (ZeRO-2).
enum class GradStorage { flat, bound };
// Where the values forward and backward read live: the flat buffers, or buffers bound per group (ZeRO-3).
enum class ValueStorage { flat, bound };

struct ParamInfo {
    std::string name;
    Shape shape;            // this rank's part
    Shape global_shape;     // the whole tensor
    TensorSplit split;
    ParamInit init;
    bool weight_decay;      // matrices decay; norms and biases do not
    int64_t offset = 0;     // elements from the start of the flat buffer
    bool grad_partial_over_tp = false;  // each tp rank's gradient is a partial sum (sequence parallel norms)
    int64_t real_rows = 0;  // global rows from this one on are padding, initialized to zero; 0: no padding
    bool replicated() const { return split.kind == TpSplit::none; }
};

class Parameters {
public:
    // tp_rank of tp_size: which part of split parameters this registry holds.
    explicit Parameters(int tp_rank = 0, int tp_size = 1) : tp_rank_(tp_rank), tp_size_(tp_size) {}

    // Registration (before allocate()). global_shape is the unsplit tensor's; a split
    // dimension must divide evenly. Returns the parameter's index.
    size_t add(std::string name, Shape global_shape, ParamInit init, bool weight_decay, TensorSplit split = {});
    void mark_grad_partial_over_tp(size_t index) { infos_.at(index).grad_partial_over_tp = true; }
    // The global rows [real_rows, rows) of a matrix are padding (a padded vocabulary).
    void set_real_rows(size_t index, int64_t real_rows);
    // Allocates the parameter and gradient buffers (zeroed) in host memory, in dtype; their
    // length is total_numel() rounded up to a multiple of pad_multiple (data-parallel
    // sharding splits the flat buffers into equal pieces), the padding zero and unused.
    void allocate(DType dtype, int64_t pad_multiple = 1);
    // The same in the backend's memory: master weights and gradients in `master`, and a
    // compute copy in `compute` when it differs.
    void allocate(Backend& backend, DType master, DType compute, int64_t pad_multiple = 1, GradStorage grads = GradStorage::flat,
                  ValueStorage values = ValueStorage::flat);
    // Parameters [first, end) keep their gradients in `storage` from now on, whose element 0
    // is element storage_offset of the flat layout (the offset of parameter first).
    void bind_grads(size_t first, size_t end, const Tensor& storage, int64_t storage_offset);
    // ValueStorage::bound: forward and backward read the values of parameters [first, end)
    // from `storage` (compute dtype) from now on, whose element 0 is flat element storage_offset.
    void bind_values(size_t first, size_t end, const Tensor& storage, int64_t storage_offset);
    bool has_master_values() const { return !values_.view().empty(); }
    // Fills every parameter from its Philox stream (on the host, then copied to the device),
    // and the compute copy from the result. ValueStorage::bound has no buffers to fill.
    void initialize(uint64_t seed, double std, int64_t n_layers);
    // The same values for flat elements `range` alone, into `out` (range.size() elements of
    // the master dtype, host or device memory): how a shard initializes itself.
    void initialize_range(uint64_t seed, double std, int64_t n_layers, FlatRange range, const Tensor& out) const;
    // compute copy = master weights (rounded), after an update that did not write it.
    void refresh_compute_copy();
    // A zeroed tensor in the parameters' memory (optimizer state, sharded gradients).
    OwnedTensor new_tensor(DType dtype, Shape shape) const;

    size_t count() const { return infos_.size(); }
    const ParamInfo& info(size_t index) const { return infos_[index]; }
    const std::vector<ParamInfo>& infos() const { return infos_; }
    // Index of the parameter with this name; throws if absent.
    size_t index_of(const std::string& name) const;
    int64_t total_numel() const { return total_numel_; }
    int64_t padded_numel() const { return padded_numel_; }
    // The flat buffers' length for total_numel elements: rounded up to a multiple of pad_multiple.
    static int64_t padded_length(int64_t total_numel, int64_t pad_multiple);
    int tp_rank() const { return tp_rank_; }
    int tp_size() const { return tp_size_; }
    // Flat index in the global tensor of element `local` of parameter `index`.
    int64_t global_index(size_t index, int64_t local) const;
    DType dtype() const { return master_dtype_; }  // the master weights' and the gradients'
    DType compute_dtype() const { return compute_dtype_; }
    // Whether a flat compute copy exists (16-bit compute with ValueStorage::flat).
    bool has_compute_copy() const { return !compute_.view().empty(); }
    Device device() const { return device_; }
    ValueStorage value_storage() const { return value_storage_; }

    // What forward and backward read: the compute copy (the master weights on the CPU).
    Tensor value(size_t index) const { return value_span(index, index); }
    Tensor master_value(size_t index) const { return view_of(values_, index, index); }
    Tensor grad(size_t index) const { return grad_span(index, index); }
    // Parameters first..last (inclusive) registered back to back with equal row width, as one
    // tensor of stacked rows: q, k and v projections become one fused QKV weight.
    Tensor value_span(size_t first, size_t last) const;
    Tensor grad_span(size_t first, size_t last) const;
    Tensor all_values() const { return values_.view(); }  // the master weights
    Tensor all_compute_values() const { return compute_buffer().view(); }
    Tensor all_grads() const { return grads_.view(); }  // empty under GradStorage::bound

private:
    const OwnedTensor& compute_buffer() const { return compute_.view().empty() ? values_ : compute_; }
    Tensor view_of(const OwnedTensor& buffer, size_t first, size_t last) const { return view_of(buffer.view(), 0, first, last); }
    // Parameters first..last of a buffer whose element 0 is flat element base_offset.
    Tensor view_of(const Tensor& buffer, int64_t base_offset, size_t first, size_t last) const;
    int64_t allocation_length(int64_t pad_multiple) const;
    Shape local_shape(const std::string& name, const Shape& global_shape, TensorSplit split) const;
    int tp_rank_, tp_size_;
    std::vector<ParamInfo> infos_;
    // Name -> index: a MoE model registers n_experts x 3 tensors per layer (18,000 for a
    // Qwen3-30B-A3B shape), which `plan --search` registers again for every layout it weighs.
    std::unordered_map<std::string, size_t> index_by_name_;
    int64_t total_numel_ = 0;
    int64_t padded_numel_ = 0;  // the flat buffers' length
    bool allocated_ = false;
    Backend* backend_ = nullptr;  // null: host memory, no backend
    DType master_dtype_ = DType::f32, compute_dtype_ = DType::f32;
    Device device_ = Device::cpu;
    ValueStorage value_storage_ = ValueStorage::flat;
    OwnedTensor values_;
    OwnedTensor compute_;         // empty without a compute copy
    OwnedTensor grads_;           // empty under GradStorage::bound
    struct GradHome {
        Tensor storage;           // empty: not bound
        int64_t base_offset = 0;  // flat element of storage's element 0
    };
    std::vector<GradHome> grad_homes_;  // per parameter
    std::vector<GradHome> value_homes_;  // per parameter, under ValueStorage::bound
};

// The registry as the parallel layer sees it: flat buffers and each parameter's range.
struct FlatParameters;
FlatParameters flat_parameters(Parameters& params);
// Every parameter as a placement sees it: global name and shape, tp split, flat range.
std::vector<TensorPlace> tensor_places(const Parameters& params);

}  // namespace llmtrain
