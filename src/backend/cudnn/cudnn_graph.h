// Operation graphs of cuDNN's backend API, built descriptor by descriptor: tensors (4-D,
// strided, virtual or not, by value), pointwise / matmul / reduction / reshape operations,
// the graph, an execution plan from an engine that finalizes for it, and its execution on
// a variant pack (unique ids -> pointers). Every call is checked; a failure throws an
// unsupported error naming the step and cuDNN's own description (cudnnGetLastErrorString).
//
// Determinism: make_plan takes only engines without the NONDETERMINISTIC numerical note.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cudnn/cudnn_api.h"

namespace llmtrain::cudnn {

// A descriptor destroyed with its owner.
class Owned {
public:
    Owned() = default;
    Owned(const Api* api, Descriptor d) : api_(api), d_(d) {}
    Owned(Owned&& other) noexcept : api_(other.api_), d_(other.d_) { other.d_ = nullptr; }
    Owned& operator=(Owned&& other) noexcept;
    Owned(const Owned&) = delete;
    Owned& operator=(const Owned&) = delete;
    ~Owned();
    Descriptor get() const { return d_; }

private:
    const Api* api_ = nullptr;
    Descriptor d_ = nullptr;
};

// A tensor of a graph: its descriptor and what the graph's other steps need to know of it.
struct GraphTensor {
    Descriptor d = nullptr;
    int64_t uid = 0;
    Enum dtype = kFloat;
    std::array<int64_t, 4> dims{}, strides{};
};

// The engine a plan runs and its notes, for reports.
struct EngineInfo {
    int64_t global_index = -1;
    std::string found_by;  // "heuristics mode A", "heuristics fallback", "engine enumeration"
    std::vector<Enum> numerical_notes, behavior_notes;
    int64_t workspace_bytes = 0;
    std::string notes_text() const;  // "tensor_core, runtime_compilation"
};

// A finalized operation graph and everything it refers to.
class Graph {
public:
    Graph(const Library& library, std::string name) : library_(&library), name_(std::move(name)) {}
    const std::string& name() const { return name_; }

    // A tensor with this unique id (non-virtual: bound in the variant pack by its uid).
    GraphTensor tensor(int64_t uid, Enum dtype, std::array<int64_t, 4> dims, std::array<int64_t, 4> strides);
    // A scalar [1,1,1,1] passed by value: the variant pack points at a host value.
    GraphTensor scalar(int64_t uid, Enum dtype);
    // An intermediate the engine keeps to itself; its uid is drawn from this graph's counter.
    GraphTensor virtual_tensor(Enum dtype, std::array<int64_t, 4> dims, std::array<int64_t, 4> strides);

    // y = mode(x[, b[, t]]) in `precision`; axis for GEN_INDEX (-1: none).
    void pointwise(Enum mode, Enum precision, const GraphTensor& x, const GraphTensor* b, const GraphTensor* t, const GraphTensor& y,
                   int64_t axis = -1);
    // c = a b over the last two dimensions (batched and broadcast over the first two), fp32 compute.
    void matmul(const GraphTensor& a, const GraphTensor& b, const GraphTensor& c);
    // y = reduce(x) over the dimensions where y has extent 1 (or that y groups), fp32 compute.
    void reduction(Enum op, const GraphTensor& x, const GraphTensor& y);
    // y = x seen with y's dimensions and strides (a transpose, for a matmul operand).
    void reshape(const GraphTensor& x, const GraphTensor& y);

    // Finalizes the operation graph over every operation added, on this handle.
    void finalize(Handle handle);
    Descriptor get() const { return graph_.get(); }
    size_t operation_count() const { return ops_.size(); }
    const Library& library() const { return *library_; }

private:
    Owned make(Enum type, const char* what) const;
    void set(const Owned& d, Enum name, Enum type, int64_t count, const void* values, const char* what) const;
    void done(const Owned& d, const char* what) const;
    GraphTensor add_tensor(int64_t uid, Enum dtype, std::array<int64_t, 4> dims, std::array<int64_t, 4> strides, bool is_virtual, bool by_value);
    void add_op(Owned op) { ops_.push_back(std::move(op)); }

    const Library* library_;
    std::string name_;
    std::vector<Owned> tensors_, descriptors_, ops_;
    Owned graph_;
    int64_t next_virtual_uid_ = 1000;
};

// An execution plan for a finalized graph.
struct Plan {
    Owned plan;
    EngineInfo engine;
};

// The first plan that finalizes, from the heuristics' configurations (mode A, then the
// fallback list), then from every engine by global index; engines whose numerical notes
// include NONDETERMINISTIC are passed over. Throws an unsupported error listing what was
// tried (and cuDNN's last error) when none finalizes.
Plan make_plan(const Graph& graph, Handle handle);

// A finalized variant pack: uids[i] bound to pointers[i] (device memory, or a host value for
// a by-value tensor, read at each execution), and the workspace.
Owned variant_pack(const Library& library, const std::vector<int64_t>& uids, const std::vector<void*>& pointers, void* workspace);
// Runs the plan on the stream of `handle` with that binding.
void execute(const Library& library, Handle handle, const Plan& plan, const Owned& pack);

const char* numerical_note_name(Enum note);
const char* behavior_note_name(Enum note);

}  // namespace llmtrain::cudnn
