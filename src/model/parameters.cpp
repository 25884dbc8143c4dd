#include "model/parameters.h"

#include <cmath>
#include <limits>

#include "backend/backend.h"
#include "core/philox.h"
#include "parallel/gradient_sync.h"

namespace llmtrain {

Shape Parameters::local_shape(const std::string& name, const Shape& global, TensorSplit split) const {
    Shape local = global;
    if (split.kind == TpSplit::none || tp_size_ == 1) return local;
    const int axis = split.kind == TpSplit::rows ? 0 : 1;
    if (axis >= global.rank) fail(ErrorKind::shape, "parameter '", name, "' of shape ", global.str(), " has no axis ", axis, " to split");
    const int64_t parts = (split.kind == TpSplit::rows ? split.blocks : 1) * tp_size_;
    if (global[axis] % parts != 0)
        fail(ErrorKind::config, "parameter '", name, "' of shape ", global.str(), ": axis ", axis, " does not split into ", parts, " equal parts for tp = ", tp_size_);
    local.dims[static_cast<size_t>(axis)] = global[axis] / tp_size_;
    return local;
}

size_t Parameters::add(std::string name, Shape global_shape, ParamInit init, bool weight_decay, TensorSplit split) {
    if (allocated_) fail(ErrorKind::runtime, "parameter '", name, "' registered after allocation");
    if (!index_by_name_.emplace(name, infos_.size()).second) fail(ErrorKind::runtime, "parameter '", name, "' registered twice");
    const Shape shape = local_shape(name, global_shape, split);
    infos_.push_back({std::move(name), shape, global_shape, split, init, weight_decay, total_numel_, false, 0});
    total_numel_ += shape.numel();
    return infos_.size() - 1;
}

void Parameters::set_real_rows(size_t index, int64_t real_rows) {
    ParamInfo& p = infos_.at(index);
    if (p.global_shape.rank != 2 || real_rows < 1 || real_rows > p.global_shape[0])
        fail(ErrorKind::runtime, "parameter '", p.name, "' of shape ", p.global_shape.str(), ": ", real_rows, " real rows");
    p.real_rows = real_rows;
}

int64_t Parameters::padded_length(int64_t total_numel, int64_t pad_multiple) {
    return (total_numel + pad_multiple - 1) / pad_multiple * pad_multiple;
}

int64_t Parameters::allocation_length(int64_t pad_multiple) const {
    if (allocated_) fail(ErrorKind::runtime, "parameters allocated twice");
    return padded_length(total_numel_, pad_multiple);
}

void Parameters::allocate(DType dtype, int64_t pad_multiple) {
    const int64_t padded = allocation_length(pad_multiple);
    padded_numel_ = padded;
    allocated_ = true;
    values_ = OwnedTensor(dtype, Shape{padded});
    grads_ = OwnedTensor(dtype, Shape{padded});
    master_dtype_ = compute_dtype_ = dtype;
    grad_homes_.assign(infos_.size(), GradHome{grads_.view(), 0});
}

void Parameters::allocate(Backend& backend, DType master, DType compute, int64_t pad_multiple, GradStorage grads, ValueStorage values) {
    const int64_t padded = allocation_length(pad_multiple);
    const auto allocate = [&backend](size_t bytes) { return backend.allocate(bytes); };
    backend_ = &backend;
    padded_numel_ = padded;
    allocated_ = true;
    master_dtype_ = master;
    compute_dtype_ = compute;
    device_ = backend.device();
    value_storage_ = values;
    if (values == ValueStorage::flat) values_ = OwnedTensor(master, Shape{padded}, backend.device(), allocate);
    if (grads == GradStorage::flat) grads_ = OwnedTensor(master, Shape{padded}, backend.device(), allocate);
    if (compute != master && values == ValueStorage::flat) compute_ = OwnedTensor(compute, Shape{padded}, backend.device(), allocate);
    grad_homes_.assign(infos_.size(), GradHome{grads_.view(), 0});
    value_homes_.assign(infos_.size(), GradHome{});
}

void Parameters::bind_values(size_t first, size_t end, const Tensor& storage, int64_t storage_offset) {
    if (first >= end) return;
    const ParamInfo& last = infos_.at(end - 1);
    if (value_storage_ != ValueStorage::bound || storage.dtype() != compute_dtype_ || storage_offset > infos_[first].offset ||
        last.offset + last.shape.numel() - storage_offset > storage.numel())
        fail(ErrorKind::runtime, "value storage of ", storage.numel(), " ", dtype_name(storage.dtype()), " elements from flat element ", storage_offset,
             " does not hold parameters '", infos_[first].name, "'..'", last.name, "' (or their values are not bound per group)");
    for (size_t i = first; i < end; ++i) value_homes_[i] = {storage, storage_offset};
}

Tensor Parameters::value_span(size_t first, size_t last) const {
    if (value_storage_ == ValueStorage::flat) return view_of(compute_buffer(), first, last);
    const GradHome& home = value_homes_.at(first);
    if (home.storage.empty()) fail(ErrorKind::runtime, "the value of '", infos_[first].name, "' is read before its group was gathered");
    if (value_homes_.at(last).storage.raw() != home.storage.raw())
        fail(ErrorKind::runtime, "the values of '", infos_[first].name, "'..'", infos_[last].name, "' are bound to different buffers");
    return view_of(home.storage, home.base_offset, first, last);
}

void Parameters::bind_grads(size_t first, size_t end, const Tensor& storage, int64_t storage_offset) {
    if (first >= end) return;
    const ParamInfo& last = infos_.at(end - 1);
    if (storage.dtype() != dtype() || storage_offset > infos_[first].offset || last.offset + last.shape.numel() - storage_offset > storage.numel())
        fail(ErrorKind::runtime, "gradient storage of ", storage.numel(), " elements from flat element ", storage_offset, " does not hold parameters '",
             infos_[first].name, "'..'", last.name, "'");
    for (size_t i = first; i < end; ++i) grad_homes_[i] = {storage, storage_offset};
}

Tensor Parameters::grad_span(size_t first, size_t last) const {
    const GradHome& home = grad_homes_.at(first);
    if (home.storage.empty()) fail(ErrorKind::runtime, "the gradient of '", infos_[first].name, "' is used outside the backward that binds its storage");
    if (grad_homes_.at(last).storage.raw() != home.storage.raw())
        fail(ErrorKind::runtime, "the gradients of '", infos_[first].name, "'..'", infos_[last].name, "' are bound to different buffers");
    return view_of(home.storage, home.base_offset, first, last);
}

OwnedTensor Parameters::new_tensor(DType dtype, Shape shape) const {
    if (!backend_) return OwnedTensor(dtype, shape);
    Backend& backend = *backend_;
    return OwnedTensor(dtype, shape, backend.device(), [&backend](size_t bytes) { return backend.allocate(bytes); });
}

void Parameters::refresh_compute_copy() {
    if (has_compute_copy()) backend_->copy(compute_.view(), values_.view());
}

int64_t Parameters::global_index(size_t index, int64_t local) const {
    const ParamInfo& p = infos_[index];
    return tp_global_index(p.shape, p.global_shape, p.split, tp_rank_, tp_size_, local);
}

namespace {
// Local elements [from, to) of parameter `index` into out[0, to - from).
template <class T>
void fill_param(T* out, const Parameters& params, size_t index, int64_t from, int64_t to, uint64_t seed, double std) {
    const ParamInfo& info = params.info(index);
    if (info.init == ParamInit::ones || info.init == ParamInit::zeros) {
        const T value = info.init == ParamInit::ones ? T(1) : T(0);
        for (int64_t i = from; i < to; ++i) out[i - from] = value;
        return;
    }
    const PhiloxStream stream(seed, fnv1a64(info.name));
    const int64_t padding_from = info.real_rows ? info.real_rows * info.global_shape.cols() : std::numeric_limits<int64_t>::max();
    for (int64_t i = from; i < to; ++i) {
        const int64_t global = params.global_index(index, i);
        out[i - from] = global < padding_from ? static_cast<T>(std * stream.normal(static_cast<uint64_t>(global))) : T(0);
    }
}
}  // namespace

void Parameters::initialize(uint64_t seed, double std, int64_t n_layers) {
    if (!allocated_) fail(ErrorKind::runtime, "parameters initialized before allocation");
    if (value_storage_ == ValueStorage::bound) return;
    initialize_range(seed, std, n_layers, {0, total_numel_}, values_.view().slice_rows(0, total_numel_));
    refresh_compute_copy();
}

void Parameters::initialize_range(uint64_t seed, double std, int64_t n_layers, FlatRange range, const Tensor& out) const {
    if (out.numel() != range.size() || out.dtype() != dtype())
        fail(ErrorKind::runtime, "initial values of flat elements [", range.begin, ", ", range.end, ") into ", out.numel(), " ", dtype_name(out.dtype()), " elements");
    if (dtype() != DType::f32 && dtype() != DType::f64) fail(ErrorKind::unsupported, "parameters: master weights in ", dtype_name(dtype()), " (expected f32 or f64)");
    const double residual_std = std / std::sqrt(2.0 * static_cast<double>(n_layers));
    // Filled on the host; device memory is written from there in one copy.
    const bool on_host = out.device() == Device::cpu;
    const OwnedTensor staging = on_host ? OwnedTensor() : OwnedTensor(dtype(), out.shape());
    const Tensor host = on_host ? out : staging.view();
    const size_t elem = dtype_size(dtype());
    for (size_t i = 0; i < infos_.size(); ++i) {
        const ParamInfo& p = infos_[i];
        const int64_t begin = std::max(range.begin, p.offset), end = std::min(range.end, p.offset + p.shape.numel());
        if (begin >= end) continue;
        const double s = p.init == ParamInit::normal_residual ? residual_std : std;
        void* at = static_cast<char*>(host.raw()) + static_cast<size_t>(begin - range.begin) * elem;
        if (dtype() == DType::f32) fill_param(static_cast<float*>(at), *this, i, begin - p.offset, end - p.offset, seed, s);
        else fill_param(static_cast<double*>(at), *this, i, begin - p.offset, end - p.offset, seed, s);
    }
    if (!on_host) backend_->copy_from_host(out, host.raw());
}

size_t Parameters::index_of(const std::string& name) const {
    if (const auto it = index_by_name_.find(name); it != index_by_name_.end()) return it->second;
    fail(ErrorKind::runtime, "no parameter named '", name, "'");
}

Tensor Parameters::view_of(const Tensor& buffer, int64_t base_offset, size_t first, size_t last) const {
    if (buffer.empty()) fail(ErrorKind::runtime, "parameters used before allocation");
    const ParamInfo& head = infos_[first];
    const int64_t width = head.shape.rank >= 2 ? head.shape.cols() : 0;
    int64_t numel = 0, rows = 0;
    for (size_t i = first; i <= last; ++i) {
        const ParamInfo& p = infos_[i];
        if (p.offset != head.offset + numel) fail(ErrorKind::runtime, "parameters '", head.name, "'..'", p.name, "' are not contiguous");
        if (p.shape.rank != head.shape.rank || (width && p.shape.cols() != width))
            fail(ErrorKind::runtime, "parameters '", head.name, "' and '", p.name, "' have different row widths");
        numel += p.shape.numel();
        rows += p.shape.rank >= 2 ? p.shape.rows() : p.shape[0];
    }
    const Shape shape = first == last ? head.shape : (width ? Shape{rows, width} : Shape{rows});
    const size_t elem = dtype_size(buffer.dtype());
    return Tensor(static_cast<char*>(buffer.raw()) + static_cast<size_t>(head.offset - base_offset) * elem, buffer.dtype(), shape, buffer.device());
}

FlatParameters flat_parameters(Parameters& params) {
    FlatParameters flat{params.dtype(), params.all_values(), params.all_grads(), params.has_compute_copy() ? params.all_compute_values() : Tensor(), {},
                        [&params](DType dtype, Shape shape) { return params.new_tensor(dtype, shape); }};
    for (const ParamInfo& p : params.infos()) flat.ranges.push_back({p.offset, p.offset + p.shape.numel()});
    return flat;
}

std::vector<TensorPlace> tensor_places(const Parameters& params) {
    std::vector<TensorPlace> places;
    for (const ParamInfo& p : params.infos())
        places.push_back({p.name, p.global_shape, p.shape, p.split, params.tp_rank(), params.tp_size(), {p.offset, p.offset + p.shape.numel()}});
    return places;
}

}  // namespace llmtrain
