#include "backend/cudnn/cudnn_graph.h"

#include <algorithm>
#include <optional>

#include "core/error.h"

namespace llmtrain::cudnn {

Owned& Owned::operator=(Owned&& other) noexcept {
    if (this != &other) {
        if (d_) api_->destroy_descriptor(d_);
        api_ = other.api_;
        d_ = other.d_;
        other.d_ = nullptr;
    }
    return *this;
}

Owned::~Owned() {
    if (d_) api_->destroy_descriptor(d_);
}

const char* numerical_note_name(Enum note) {
    switch (note) {
        case kNoteTensorCore: return "tensor_core";
        case kNoteDownConvertInputs: return "down_convert_inputs";
        case kNoteReducedPrecisionReduction: return "reduced_precision_reduction";
        case kNoteFft: return "fft";
        case kNoteNondeterministic: return "nondeterministic";
        case kNoteWinograd: case kNoteWinograd4x4: case kNoteWinograd6x6: case kNoteWinograd13x13: return "winograd";
        case kNoteStrictNanPropagation: return "strict_nan_propagation";
        default: return "numerical_note_?";
    }
}

const char* behavior_note_name(Enum note) {
    switch (note) {
        case kBehaviorRuntimeCompilation: return "runtime_compilation";
        case kBehaviorFilterInt8x32Reorder: case kBehaviorBiasInt8x32Reorder: return "int8x32_reorder";
        case kBehaviorCudaGraphNative: return "cuda_graph_native";
        case kBehaviorCublasLtDependency: return "cublaslt_dependency";
        default: return "behavior_note_?";
    }
}

std::string EngineInfo::notes_text() const {
    std::string text;
    for (const Enum n : numerical_notes) text += cat(text.empty() ? "" : ", ", numerical_note_name(n));
    for (const Enum n : behavior_notes) text += cat(text.empty() ? "" : ", ", behavior_note_name(n));
    return text.empty() ? "no notes" : text;
}

// ---- Graph ----

Owned Graph::make(Enum type, const char* what) const {
    Descriptor d = nullptr;
    const Status s = library_->api().create_descriptor(type, &d);
    if (s != kSuccess) fail(ErrorKind::unsupported, name_, ": cuDNN cannot create the ", what, " descriptor: ", library_->describe(s));
    return Owned(&library_->api(), d);
}

void Graph::set(const Owned& d, Enum name, Enum type, int64_t count, const void* values, const char* what) const {
    const Status s = library_->api().set_attribute(d.get(), name, type, count, values);
    if (s != kSuccess) fail(ErrorKind::unsupported, name_, ": cuDNN refuses attribute ", name, " of the ", what, ": ", library_->describe(s));
}

void Graph::done(const Owned& d, const char* what) const {
    const Status s = library_->api().finalize(d.get());
    if (s != kSuccess) fail(ErrorKind::unsupported, name_, ": cuDNN does not finalize the ", what, ": ", library_->describe(s));
}

GraphTensor Graph::add_tensor(int64_t uid, Enum dtype, std::array<int64_t, 4> dims, std::array<int64_t, 4> strides, bool is_virtual, bool by_value) {
    // 16 bytes: what the tensor-core engines need of every operand (the callers check the
    // pointers they bind).
    const int64_t alignment = 16;
    Owned t = make(kTensorDescriptor, "tensor");
    set(t, kTensorDataType, kTypeDataType, 1, &dtype, "tensor");
    set(t, kTensorDimensions, kTypeInt64, 4, dims.data(), "tensor");
    set(t, kTensorStrides, kTypeInt64, 4, strides.data(), "tensor");
    set(t, kTensorUniqueId, kTypeInt64, 1, &uid, "tensor");
    set(t, kTensorAlignment, kTypeInt64, 1, &alignment, "tensor");
    set(t, kTensorIsVirtual, kTypeBoolean, 1, &is_virtual, "tensor");
    if (by_value) set(t, kTensorIsByValue, kTypeBoolean, 1, &by_value, "tensor");
    done(t, "tensor");
    GraphTensor g{t.get(), uid, dtype, dims, strides};
    tensors_.push_back(std::move(t));
    return g;
}

GraphTensor Graph::tensor(int64_t uid, Enum dtype, std::array<int64_t, 4> dims, std::array<int64_t, 4> strides) {
    return add_tensor(uid, dtype, dims, strides, false, false);
}

GraphTensor Graph::scalar(int64_t uid, Enum dtype) { return add_tensor(uid, dtype, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }

GraphTensor Graph::virtual_tensor(Enum dtype, std::array<int64_t, 4> dims, std::array<int64_t, 4> strides) {
    return add_tensor(next_virtual_uid_++, dtype, dims, strides, true, false);
}

void Graph::pointwise(Enum mode, Enum precision, const GraphTensor& x, const GraphTensor* b, const GraphTensor* t, const GraphTensor& y, int64_t axis) {
    Owned pw = make(kPointwiseDescriptor, "pointwise");
    set(pw, kPointwiseMode, kTypePointwiseMode, 1, &mode, "pointwise");
    set(pw, kPointwiseMathPrecision, kTypeDataType, 1, &precision, "pointwise");
    if (axis >= 0) set(pw, kPointwiseAxis, kTypeInt64, 1, &axis, "pointwise");
    done(pw, "pointwise");
    Owned op = make(kPointwiseOperation, "pointwise operation");
    Descriptor pw_d = pw.get();
    set(op, kPointwiseOperationDescriptor, kTypeBackendDescriptor, 1, &pw_d, "pointwise operation");
    set(op, kPointwiseX, kTypeBackendDescriptor, 1, &x.d, "pointwise operation");
    if (b) set(op, kPointwiseB, kTypeBackendDescriptor, 1, &b->d, "pointwise operation");
    if (t) set(op, kPointwiseT, kTypeBackendDescriptor, 1, &t->d, "pointwise operation");
    set(op, kPointwiseY, kTypeBackendDescriptor, 1, &y.d, "pointwise operation");
    done(op, "pointwise operation");
    descriptors_.push_back(std::move(pw));
    add_op(std::move(op));
}

void Graph::matmul(const GraphTensor& a, const GraphTensor& b, const GraphTensor& c) {
    Owned mm = make(kMatmulDescriptor, "matmul");
    const Enum compute = kFloat;
    set(mm, kMatmulComputeType, kTypeDataType, 1, &compute, "matmul");
    done(mm, "matmul");
    Owned op = make(kMatmulOperation, "matmul operation");
    Descriptor mm_d = mm.get();
    set(op, kMatmulA, kTypeBackendDescriptor, 1, &a.d, "matmul operation");
    set(op, kMatmulB, kTypeBackendDescriptor, 1, &b.d, "matmul operation");
    set(op, kMatmulC, kTypeBackendDescriptor, 1, &c.d, "matmul operation");
    set(op, kMatmulOperationDescriptor, kTypeBackendDescriptor, 1, &mm_d, "matmul operation");
    done(op, "matmul operation");
    descriptors_.push_back(std::move(mm));
    add_op(std::move(op));
}

void Graph::reduction(Enum reduce, const GraphTensor& x, const GraphTensor& y) {
    Owned r = make(kReductionDescriptor, "reduction");
    const Enum compute = kFloat;
    set(r, kReductionOperator, kTypeReductionOperator, 1, &reduce, "reduction");
    set(r, kReductionComputeType, kTypeDataType, 1, &compute, "reduction");
    done(r, "reduction");
    Owned op = make(kReductionOperation, "reduction operation");
    Descriptor r_d = r.get();
    set(op, kReductionX, kTypeBackendDescriptor, 1, &x.d, "reduction operation");
    set(op, kReductionY, kTypeBackendDescriptor, 1, &y.d, "reduction operation");
    set(op, kReductionOperationDescriptor, kTypeBackendDescriptor, 1, &r_d, "reduction operation");
    done(op, "reduction operation");
    descriptors_.push_back(std::move(r));
    add_op(std::move(op));
}

void Graph::reshape(const GraphTensor& x, const GraphTensor& y) {
    Owned op = make(kReshapeOperation, "reshape operation");
    set(op, kReshapeX, kTypeBackendDescriptor, 1, &x.d, "reshape operation");
    set(op, kReshapeY, kTypeBackendDescriptor, 1, &y.d, "reshape operation");
    done(op, "reshape operation");
    add_op(std::move(op));
}

void Graph::finalize(Handle handle) {
    graph_ = make(kOperationGraphDescriptor, "operation graph");
    std::vector<Descriptor> ops;
    for (const Owned& op : ops_) ops.push_back(op.get());
    set(graph_, kOperationGraphHandle, kTypeHandle, 1, &handle, "operation graph");
    set(graph_, kOperationGraphOps, kTypeBackendDescriptor, static_cast<int64_t>(ops.size()), ops.data(), "operation graph");
    done(graph_, cat("operation graph of ", ops.size(), " operations").c_str());
}

// ---- Plans ----

namespace {

// What one attempt at a plan ended in, for the error that lists them.
struct Attempts {
    std::vector<std::string> lines;
    void add(std::string line) { lines.push_back(std::move(line)); }
    std::string text() const {
        std::string t;
        const size_t shown = std::min<size_t>(lines.size(), 8);
        for (size_t i = 0; i < shown; ++i) t += cat(i ? "; " : "", lines[i]);
        if (lines.size() > shown) t += cat("; and ", lines.size() - shown, " more");
        return t.empty() ? "no engine configuration was offered" : t;
    }
};

class Planner {
public:
    Planner(const Graph& graph, Handle handle) : graph_(graph), lib_(graph.library()), api_(lib_.api()), handle_(handle) {}

    Plan run() {
        for (const Enum mode : {kHeuristicsA, kHeuristicsFallback})
            if (std::optional<Plan> p = from_heuristics(mode)) return std::move(*p);
        if (std::optional<Plan> p = from_enumeration()) return std::move(*p);
        fail(ErrorKind::unsupported, graph_.name(), ": no deterministic cuDNN engine finalizes a plan: ", attempts_.text());
    }

private:
    Owned make(Enum type) {
        Descriptor d = nullptr;
        if (api_.create_descriptor(type, &d) != kSuccess) return Owned();
        return Owned(&api_, d);
    }

    std::vector<Enum> notes(Descriptor engine, Enum attribute, Enum type, Enum count) {
        std::vector<Enum> out(static_cast<size_t>(count));
        int64_t got = 0;
        if (api_.get_attribute(engine, attribute, type, count, &got, out.data()) != kSuccess) got = 0;
        out.resize(static_cast<size_t>(std::clamp<int64_t>(got, 0, count)));
        return out;
    }

    EngineInfo describe(Descriptor engine, const std::string& found_by) {
        EngineInfo info;
        info.found_by = found_by;
        int64_t got = 0;
        if (api_.get_attribute(engine, kEngineGlobalIndex, kTypeInt64, 1, &got, &info.global_index) != kSuccess) info.global_index = -1;
        info.numerical_notes = notes(engine, kEngineNumericalNote, kTypeNumericalNote, kNoteTypeCount);
        info.behavior_notes = notes(engine, kEngineBehaviorNote, kTypeBehaviorNote, kBehaviorTypeCount);
        return info;
    }

    // A plan from one engine configuration, or nothing (the reason recorded).
    std::optional<Plan> try_config(Descriptor config, EngineInfo info, const std::string& label) {
        if (std::find(info.numerical_notes.begin(), info.numerical_notes.end(), kNoteNondeterministic) != info.numerical_notes.end()) {
            attempts_.add(cat(label, " (engine ", info.global_index, "): passed over, nondeterministic"));
            return std::nullopt;
        }
        Owned plan = make(kExecutionPlanDescriptor);
        Status s = plan.get() ? api_.set_attribute(plan.get(), kExecutionPlanHandle, kTypeHandle, 1, &handle_) : kNotSupported;
        if (s == kSuccess) s = api_.set_attribute(plan.get(), kExecutionPlanEngineConfig, kTypeBackendDescriptor, 1, &config);
        if (s == kSuccess) s = api_.finalize(plan.get());
        if (s != kSuccess) {
            attempts_.add(cat(label, " (engine ", info.global_index, "): ", lib_.describe(s)));
            return std::nullopt;
        }
        int64_t got = 0;
        if (api_.get_attribute(plan.get(), kExecutionPlanWorkspaceSize, kTypeInt64, 1, &got, &info.workspace_bytes) != kSuccess) info.workspace_bytes = 0;
        return Plan{std::move(plan), std::move(info)};
    }

    std::optional<Plan> from_heuristics(Enum mode) {
        const std::string source = mode == kHeuristicsA ? "heuristics mode A" : "heuristics fallback";
        Owned heur = make(kEngineHeuristicsDescriptor);
        Descriptor graph = graph_.get();
        Status s = heur.get() ? api_.set_attribute(heur.get(), kEngineHeuristicsGraph, kTypeBackendDescriptor, 1, &graph) : kNotSupported;
        if (s == kSuccess) s = api_.set_attribute(heur.get(), kEngineHeuristicsMode, kTypeHeurMode, 1, &mode);
        if (s == kSuccess) s = api_.finalize(heur.get());
        int64_t count = 0;
        if (s == kSuccess) s = api_.get_attribute(heur.get(), kEngineHeuristicsResults, kTypeBackendDescriptor, 0, &count, nullptr);
        if (s != kSuccess) {
            attempts_.add(cat(source, ": ", lib_.describe(s)));
            return std::nullopt;
        }
        std::vector<Owned> configs;
        std::vector<Descriptor> raw;
        for (int64_t i = 0; i < count; ++i) {
            configs.push_back(make(kEngineConfigDescriptor));
            raw.push_back(configs.back().get());
        }
        int64_t got = 0;
        if (count > 0 && (s = api_.get_attribute(heur.get(), kEngineHeuristicsResults, kTypeBackendDescriptor, count, &got, raw.data())) != kSuccess) {
            attempts_.add(cat(source, ": ", lib_.describe(s)));
            return std::nullopt;
        }
        if (got == 0) attempts_.add(cat(source, ": no configuration"));
        for (int64_t i = 0; i < std::min(got, count); ++i) {
            Owned engine = make(kEngineDescriptor);
            Descriptor engine_d = engine.get();
            int64_t one = 0;
            if (!engine_d || api_.get_attribute(raw[static_cast<size_t>(i)], kEngineConfigEngine, kTypeBackendDescriptor, 1, &one, &engine_d) != kSuccess) {
                attempts_.add(cat(source, " configuration ", i, ": its engine cannot be read"));
                continue;
            }
            if (std::optional<Plan> p = try_config(raw[static_cast<size_t>(i)], describe(engine_d, source), cat(source, " configuration ", i))) return p;
        }
        return std::nullopt;
    }

    std::optional<Plan> from_enumeration() {
        int64_t count = 0, got = 0;
        if (api_.get_attribute(graph_.get(), kOperationGraphEngineCount, kTypeInt64, 1, &got, &count) != kSuccess) return std::nullopt;
        Descriptor graph = graph_.get();
        for (int64_t index = 0; index < count; ++index) {
            Owned engine = make(kEngineDescriptor);
            Status s = engine.get() ? api_.set_attribute(engine.get(), kEngineOperationGraph, kTypeBackendDescriptor, 1, &graph) : kNotSupported;
            if (s == kSuccess) s = api_.set_attribute(engine.get(), kEngineGlobalIndex, kTypeInt64, 1, &index);
            if (s == kSuccess) s = api_.finalize(engine.get());
            if (s != kSuccess) continue;  // this engine does not take the graph
            Owned config = make(kEngineConfigDescriptor);
            Descriptor engine_d = engine.get();
            s = config.get() ? api_.set_attribute(config.get(), kEngineConfigEngine, kTypeBackendDescriptor, 1, &engine_d) : kNotSupported;
            if (s == kSuccess) s = api_.finalize(config.get());
            if (s != kSuccess) {
                attempts_.add(cat("engine ", index, ": its configuration does not finalize: ", lib_.describe(s)));
                continue;
            }
            if (std::optional<Plan> p = try_config(config.get(), describe(engine_d, "engine enumeration"), cat("engine enumeration ", index))) return p;
        }
        return std::nullopt;
    }

    const Graph& graph_;
    const Library& lib_;
    const Api& api_;
    Handle handle_;
    Attempts attempts_;
};

}  // namespace

Plan make_plan(const Graph& graph, Handle handle) { return Planner(graph, handle).run(); }

Owned variant_pack(const Library& library, const std::vector<int64_t>& uids, const std::vector<void*>& pointers, void* workspace) {
    const Api& api = library.api();
    Descriptor pack = nullptr;
    Status s = api.create_descriptor(kVariantPackDescriptor, &pack);
    Owned owned(&api, s == kSuccess ? pack : nullptr);
    const auto count = static_cast<int64_t>(uids.size());
    if (s == kSuccess) s = api.set_attribute(pack, kVariantPackUniqueIds, kTypeInt64, count, uids.data());
    if (s == kSuccess) s = api.set_attribute(pack, kVariantPackDataPointers, kTypeVoidPtr, count, pointers.data());
    if (s == kSuccess) s = api.set_attribute(pack, kVariantPackWorkspace, kTypeVoidPtr, 1, &workspace);
    if (s == kSuccess) s = api.finalize(pack);
    if (s != kSuccess) fail(ErrorKind::runtime, "cuDNN attention: the variant pack does not finalize: ", library.describe(s));
    return owned;
}

void execute(const Library& library, Handle handle, const Plan& plan, const Owned& pack) {
    const Status s = library.api().execute(handle, plan.plan.get(), pack.get());
    if (s != kSuccess) fail(ErrorKind::runtime, "cuDNN attention: execution failed: ", library.describe(s));
}

}  // namespace llmtrain::cudnn
