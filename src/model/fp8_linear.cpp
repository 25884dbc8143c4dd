// FP8 linear layers: the scaling state and the GEMMs of each (fp8_linear.h states the math).
#include "model/fp8_linear.h"

#include <algorithm>
#include <cmath>

namespace llmtrain {

namespace {
constexpr size_t kInput = 0, kInputT = 1, kGrad = 2, kGradT = 3;  // scratch buffers

AmaxCompute amax_compute(Fp8AmaxCompute compute) { return compute == Fp8AmaxCompute::max ? AmaxCompute::max : AmaxCompute::most_recent; }

Tensor transposed_shape(const Tensor& t) { return Tensor(t.raw(), t.dtype(), {t.dim(1), t.dim(0)}, t.device()); }
}  // namespace

Fp8Linears::Fp8Linears(const Fp8Config& config, Backend& backend, DType compute, Groups groups)
    : config_(config), backend_(backend), compute_(compute), groups_(groups) {
    if (compute == DType::f16)
        fail(ErrorKind::config, "train.precision = \"fp8\" computes around its FP8 GEMMs in bf16 (CUDA) or f32 (CPU), not f16: fp16's loss "
                                "scaling and FP8's per-tensor scaling do not go together");
    if (groups_.tp && groups_.tp->size() < 2) groups_.tp = nullptr;
    if (groups_.cp && groups_.cp->size() < 2) groups_.cp = nullptr;
}

int Fp8Linears::add(int64_t out_features, int64_t in_features, LinearSplit split, std::string name) {
    if (state_memory_) fail(ErrorKind::runtime, "Fp8Linears::add after allocate()");
    const int history = delayed() ? static_cast<int>(config_.amax_history_len) : 1;
    const AmaxHistory empty(history, amax_compute(config_.amax_compute));
    const bool column = split == LinearSplit::column_parallel;
    const DType grad_format = config_.format == Fp8Formats::hybrid ? DType::e5m2 : DType::e4m3;
    tensors_.push_back({.format = DType::e4m3, .agree_tp = !column, .agree_cp = true, .history = empty});  // input: columns split when row-parallel
    tensors_.push_back({.format = DType::e4m3, .agree_tp = true, .agree_cp = false, .history = empty});   // weight: split either way
    tensors_.push_back({.format = grad_format, .agree_tp = column, .agree_cp = true, .history = empty});   // output gradient: columns split when column-parallel
    linears_.push_back({.out_features = out_features, .in_features = in_features, .name = std::move(name)});
    max_width_ = std::max({max_width_, out_features, in_features});
    return static_cast<int>(linears_.size()) - 1;
}

size_t Fp8Buffers::total() const {
    size_t sum = state + 4 * scratch + counts + weight_amaxes;
    for (const size_t w : weights) sum += w;
    return sum;
}

Fp8Buffers fp8_buffers(const std::vector<Fp8LinearShape>& linears, int64_t max_rows, bool weights_gathered) {
    Fp8Buffers b;
    int64_t width = 0;
    b.state = 5 * 3 * linears.size() * sizeof(float);
    for (const Fp8LinearShape& l : linears) {
        b.weights.push_back(static_cast<size_t>(2 * l.out_features * l.in_features));
        width = std::max({width, l.out_features, l.in_features});
    }
    b.scratch = static_cast<size_t>(max_rows * width);
    b.counts = 2 * sizeof(double);
    if (weights_gathered) b.weight_amaxes = std::max<size_t>(linears.size(), 1) * sizeof(float);
    return b;
}

void Fp8Linears::allocate(int64_t max_rows) {
    std::vector<Fp8LinearShape> shapes;
    for (const Linear& l : linears_) shapes.push_back({l.out_features, l.in_features});
    const Fp8Buffers sizes = fp8_buffers(shapes, max_rows, weights_gathered_);
    const auto take = [&](size_t bytes) {
        allocated_bytes_ += bytes;
        return backend_.allocate(bytes);
    };
    max_rows_ = max_rows;
    state_memory_ = take(sizes.state);
    const std::vector<float> ones(2 * tensors_.size(), 1.0f);
    backend_.copy_from_host(scales(), ones.data());
    for (size_t i = 0; i < linears_.size(); ++i) linears_[i].weight_memory = take(sizes.weights[i]);
    for (int i = 0; i < 4; ++i) scratch_.push_back(take(sizes.scratch));
    counts_memory_ = take(sizes.counts);
    backend_.fill_zero(cast_counts());
    if (weights_gathered_) weight_amax_memory_ = take(sizes.weight_amaxes);
}

Tensor Fp8Linears::amaxes(int t) const { return Tensor(static_cast<float*>(state_memory_.get()) + 3 * t, DType::f32, {3}, backend_.device()); }
Tensor Fp8Linears::scale(int t) const {
    return Tensor(static_cast<float*>(state_memory_.get()) + 3 * tensors_.size() + t, DType::f32, {1}, backend_.device());
}
Tensor Fp8Linears::scale_inv(int t) const {
    return Tensor(static_cast<float*>(state_memory_.get()) + 4 * tensors_.size() + t, DType::f32, {1}, backend_.device());
}
Tensor Fp8Linears::scales() const {
    return Tensor(static_cast<float*>(state_memory_.get()) + 3 * tensors_.size(), DType::f32, {static_cast<int64_t>(2 * tensors_.size())}, backend_.device());
}
Tensor Fp8Linears::step_amaxes() const {
    return Tensor(state_memory_.get(), DType::f32, {static_cast<int64_t>(3 * tensors_.size())}, backend_.device());
}

Tensor Fp8Linears::scratch(size_t which, DType dtype, Shape shape) const {
    if (shape.numel() > max_rows_ * max_width_)
        fail(ErrorKind::runtime, "FP8 cast of ", shape.numel(), " elements into scratch planned for ", max_rows_, " rows of ", max_width_);
    return Tensor(scratch_[which].get(), dtype, shape, backend_.device());
}

// One all-reduce (max) per group that splits the tensor, before the cast that needs it.
void Fp8Linears::agree(int t) {
    const Scaled& s = tensors_[static_cast<size_t>(t)];
    if (s.agree_tp && groups_.tp) groups_.tp->all_reduce(amax_now(t), ReduceOp::max);
    if (s.agree_cp && groups_.cp) groups_.cp->all_reduce(amax_now(t), ReduceOp::max);
}

void Fp8Linears::cast(int t, const Tensor& x, const Tensor& xq, const Tensor& xt) {
    const Scaled& s = tensors_[static_cast<size_t>(t)];
    const bool from_history = delayed() && s.has_history && t % 3 != weight;
    if (!from_history) {
        backend_.fp8_amax({.amax = amax_now(t), .x = x});
        agree(t);
        backend_.fp8_update_scale({.scale = scale(t), .scale_inv = scale_inv(t), .amax = amax_now(t), .format = s.format, .margin = static_cast<int>(config_.margin)});
    }
    backend_.fp8_cast({.out = xq, .out_t = xt, .x = x, .scale = scale(t), .amax = from_history ? amax_now(t) : Tensor(),
                      .counts = recording_ ? cast_counts() : Tensor()});
    if (!delayed() || !recording_) return;
    // The step's running max: max(|running|, |now|) into the third entry, then back.
    const Tensor a = amaxes(t);
    backend_.fp8_amax({.amax = a.slice_rows(2, 1), .x = a.slice_rows(0, 2)});
    backend_.copy(a.slice_rows(0, 1), a.slice_rows(2, 1));
}

Tensor Fp8Linears::weight_q(int id) const {
    const Linear& l = linears_[static_cast<size_t>(id)];
    return Tensor(l.weight_memory.get(), DType::e4m3, {l.out_features, l.in_features}, backend_.device());
}
Tensor Fp8Linears::weight_t(int id) const {
    const Linear& l = linears_[static_cast<size_t>(id)];
    return Tensor(static_cast<uint8_t*>(l.weight_memory.get()) + l.out_features * l.in_features, DType::e4m3, {l.in_features, l.out_features},
                  backend_.device());
}

void Fp8Linears::cast_weight(int id, const Tensor& w) {
    Linear& l = linears_[static_cast<size_t>(id)];
    if (l.weight_cast) return;
    expect_shape("fp8 linear", "w", w, {l.out_features, l.in_features});
    // Gathered in FP8: w's compute-dtype values were never gathered; the bytes are in wq.
    if (weights_gathered_) backend_.fp8_cast({.out = weight_q(id), .out_t = weight_t(id), .x = weight_q(id)});
    else cast(tensor(id, weight), w, weight_q(id), weight_t(id));
    l.weight_cast = true;
}

void Fp8Linears::cast_weight_pieces(const std::vector<Fp8ShardPiece>& pieces, Comm* shard) {
    if (!weights_gathered_) fail(ErrorKind::runtime, "Fp8Linears::cast_weight_pieces without gather_weights_in_fp8()");
    if (linears_.empty()) return;
    const Tensor amaxes(weight_amax_memory_.get(), DType::f32, {count()}, backend_.device());
    const auto amax_of = [&](size_t id) { return amaxes.slice_rows(static_cast<int64_t>(id), 1); };
    backend_.fill_zero(amaxes);
    std::vector<bool> seen(linears_.size(), false);
    for (const Fp8ShardPiece& p : pieces) {
        if (p.weight >= linears_.size() || seen[p.weight])
            fail(ErrorKind::runtime, "FP8 weight pieces: weight ", p.weight, " of ", linears_.size(), " given twice or unknown");
        seen[p.weight] = true;
        backend_.fp8_amax({.amax = amax_of(p.weight), .x = p.source});  // overwrites: one piece per weight
    }
    for (Comm* group : {shard, groups_.tp})
        if (group && group->size() > 1) group->all_reduce(amaxes, ReduceOp::max);
    for (int id = 0; id < count(); ++id) {
        const int t = tensor(id, weight);
        backend_.fp8_update_scale({.scale = scale(t), .scale_inv = scale_inv(t), .amax = amax_of(static_cast<size_t>(id)), .format = DType::e4m3,
                                   .margin = static_cast<int>(config_.margin)});
    }
    for (const Fp8ShardPiece& p : pieces)
        backend_.fp8_cast({.out = p.out.reshape({1, p.out.numel()}), .x = p.source.reshape({1, p.source.numel()}), .scale = scale(tensor(static_cast<int>(p.weight), weight)), .counts = recording_ ? cast_counts() : Tensor()});
}

void Fp8Linears::forward(int id, const MatmulFwd& a) {
    cast_weight(id, a.w);
    const Tensor xq = scratch(kInput, DType::e4m3, a.x.shape());
    cast(tensor(id, input), a.x, xq, Tensor());
    backend_.matmul_fp8({.out = a.out, .a = xq, .a_scale_inv = scale_inv(tensor(id, input)), .b = weight_q(id),
                         .b_scale_inv = scale_inv(tensor(id, weight)), .bias = a.bias, .fast_accumulate = true});
}

void Fp8Linears::backward(int id, const MatmulBwd& a) {
    cast_weight(id, a.w);
    const int g = tensor(id, grad), x = tensor(id, input), w = tensor(id, weight);
    const Shape d_shape = a.dout.shape();
    const Scaled& gs = tensors_[static_cast<size_t>(g)];
    const Tensor gq = scratch(kGrad, gs.format, d_shape);
    const Tensor gt = a.dw.empty() ? Tensor() : transposed_shape(scratch(kGradT, gs.format, d_shape));
    cast(g, a.dout, gq, gt);
    if (!a.dx.empty())
        backend_.matmul_fp8({.out = a.dx, .a = gq, .a_scale_inv = scale_inv(g), .b = weight_t(id), .b_scale_inv = scale_inv(w)});
    if (!a.dw.empty()) {
        const Tensor xq = scratch(kInput, DType::e4m3, a.x.shape());
        const Tensor xt = transposed_shape(scratch(kInputT, DType::e4m3, a.x.shape()));
        cast(x, a.x, xq, xt);
        backend_.matmul_fp8({.out = a.dw, .a = gt, .a_scale_inv = scale_inv(g), .b = xt, .b_scale_inv = scale_inv(x), .accumulate = true});
    }
    if (!a.dbias.empty()) add_column_sums(backend_, a.dbias, a.dout);
}

void Fp8Linears::close_step() {
    for (Linear& l : linears_) l.weight_cast = false;
    if (counts_memory_) backend_.fill_zero(cast_counts());
    if (!delayed() || tensors_.empty()) return;
    const size_t T = tensors_.size();
    std::vector<float> host(3 * T);
    backend_.copy_to_host(host.data(), step_amaxes());
    std::vector<float> scales(2 * T);
    backend_.copy_to_host(scales.data(), this->scales());
    for (size_t t = 0; t < T; ++t) {
        Scaled& s = tensors_[t];
        if (t % 3 == weight) continue;
        const float amax = host[3 * t];
        s.history.record(amax, fp8_format_of(s.format), static_cast<int>(config_.margin));
        if (std::isfinite(amax) && amax > 0) s.has_history = true;
        if (!s.has_history) continue;
        scales[t] = s.history.scale();
        scales[T + t] = 1.0f / s.history.scale();
    }
    backend_.copy_from_host(this->scales(), scales.data());
    backend_.fill_zero(step_amaxes());
}

Fp8Linears::TensorState Fp8Linears::state(int id, int role) const {
    const int t = 3 * id + role;
    TensorState out;
    backend_.copy_to_host(&out.scale, scale(t));
    backend_.copy_to_host(&out.scale_inv, scale_inv(t));
    if (delayed() && role != weight) out.history = tensors_[static_cast<size_t>(t)].history.entries();
    return out;
}

std::string Fp8Linears::state_name(int t) const { return linears_[static_cast<size_t>(t / 3)].name + (t % 3 == input ? "/input" : "/grad"); }

std::vector<Fp8Linears::NamedState> Fp8Linears::scaling_state() const {
    std::vector<NamedState> out;
    if (!delayed() || tensors_.empty()) return out;
    std::vector<float> scales(2 * tensors_.size());
    backend_.copy_to_host(scales.data(), this->scales());
    for (size_t t = 0; t < tensors_.size(); ++t) {
        const Scaled& s = tensors_[t];
        if (t % 3 == weight || !s.has_history) continue;
        const std::string name = state_name(static_cast<int>(t));
        out.push_back({name + "_amax_history", s.history.entries()});
        out.push_back({name + "_scale", {scales[t]}});
    }
    return out;
}

int Fp8Linears::restore_scaling_state(const std::map<std::string, std::vector<float>>& saved) {
    if (!delayed() || tensors_.empty()) return 0;
    const size_t T = tensors_.size();
    std::vector<float> scales(2 * T, 1.0f);
    int restored = 0;
    for (size_t t = 0; t < T; ++t) {
        Scaled& s = tensors_[t];
        if (t % 3 == weight) continue;
        const std::string name = state_name(static_cast<int>(t));
        const auto history = saved.find(name + "_amax_history");
        const auto scale = saved.find(name + "_scale");
        const bool found = history != saved.end() && scale != saved.end();
        s.has_history = found;
        if (!found) {
            s.history.restore(std::vector<float>(static_cast<size_t>(s.history.length()), 0.0f), 1.0f);
            continue;
        }
        if (scale->second.size() != 1 || !(scale->second[0] > 0) || !std::isfinite(scale->second[0]))
            fail(ErrorKind::data, "FP8 scaling state '", scale->first, "': expected one finite positive scale, found ", scale->second.size(), " values");
        // The newest entries, as many as this run's history holds (zeros before them when it holds more).
        const auto length = static_cast<size_t>(s.history.length());
        std::vector<float> entries(length, 0.0f);
        const std::vector<float>& from = history->second;
        const size_t kept = std::min(length, from.size());
        std::copy(from.end() - static_cast<std::ptrdiff_t>(kept), from.end(), entries.end() - static_cast<std::ptrdiff_t>(kept));
        s.history.restore(entries, scale->second[0]);
        scales[t] = scale->second[0];
        scales[T + t] = 1.0f / scale->second[0];
        ++restored;
    }
    backend_.copy_from_host(this->scales(), scales.data());
    backend_.fill_zero(step_amaxes());
    return restored;
}

}  // namespace llmtrain
