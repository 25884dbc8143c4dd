#include "model/parameters.h"

#include <cmath>

#include "core/philox.h"

namespace llmtrain {

size_t Parameters::add(std::string name, Shape shape, ParamInit init, bool weight_decay) {
    if (!values_.view().empty()) fail(ErrorKind::runtime, "parameter '", name, "' registered after allocation");
    for (const ParamInfo& existing : infos_)
        if (existing.name == name) fail(ErrorKind::runtime, "parameter '", name, "' registered twice");
    infos_.push_back({std::move(name), shape, init, weight_decay, total_numel_});
    total_numel_ += shape.numel();
    return infos_.size() - 1;
}

void Parameters::allocate(DType dtype) {
    values_ = OwnedTensor(dtype, Shape{total_numel_});
    grads_ = OwnedTensor(dtype, Shape{total_numel_});
}

namespace {
template <class T>
void fill_param(T* out, const ParamInfo& info, uint64_t seed, double std) {
    const int64_t n = info.shape.numel();
    if (info.init == ParamInit::ones || info.init == ParamInit::zeros) {
        const T value = info.init == ParamInit::ones ? T(1) : T(0);
        for (int64_t i = 0; i < n; ++i) out[i] = value;
        return;
    }
    const PhiloxStream stream(seed, fnv1a64(info.name));
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(std * stream.normal(static_cast<uint64_t>(i)));
}
}  // namespace

void Parameters::initialize(uint64_t seed, double std, int64_t n_layers) {
    const double residual_std = std / std::sqrt(2.0 * static_cast<double>(n_layers));
    for (size_t i = 0; i < infos_.size(); ++i) {
        const ParamInfo& p = infos_[i];
        const double s = p.init == ParamInit::normal_residual ? residual_std : std;
        const Tensor v = value(i);
        if (v.dtype() == DType::f32) fill_param(v.data<float>(), p, seed, s);
        else fill_param(v.data<double>(), p, seed, s);
    }
}

size_t Parameters::index_of(const std::string& name) const {
    for (size_t i = 0; i < infos_.size(); ++i)
        if (infos_[i].name == name) return i;
    fail(ErrorKind::runtime, "no parameter named '", name, "'");
}

Tensor Parameters::view_of(const OwnedTensor& buffer, size_t first, size_t last) const {
    if (buffer.view().empty()) fail(ErrorKind::runtime, "parameters used before allocation");
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
    const size_t elem = dtype_size(buffer.view().dtype());
    return Tensor(static_cast<char*>(buffer.view().raw()) + static_cast<size_t>(head.offset) * elem, buffer.view().dtype(), shape);
}

}  // namespace llmtrain
