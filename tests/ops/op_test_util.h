// Helpers for the op tests: seeded random tensors, f64 <-> f32 copies, sum(out * R) losses,
// the central-difference gradient check and closeness checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace llmtrain::test {

inline double get(const Tensor& t, int64_t i) {
    return t.dtype() == DType::f64 ? t.data<double>()[i] : static_cast<double>(t.data<float>()[i]);
}

inline void set(const Tensor& t, int64_t i, double value) {
    if (t.dtype() == DType::f64) t.data<double>()[i] = value;
    else t.data<float>()[i] = static_cast<float>(value);
}

// Uniform values in [lo, hi), the same for a given seed on every platform's mt19937_64.
inline OwnedTensor random_tensor(DType dtype, Shape shape, uint64_t seed, double lo = -1, double hi = 1) {
    OwnedTensor t(dtype, shape);
    std::mt19937_64 rng(seed);
    for (int64_t i = 0; i < t.numel(); ++i) {
        const double unit = static_cast<double>(rng() >> 11) * 0x1.0p-53;
        set(t, i, lo + (hi - lo) * unit);
    }
    return t;
}

inline OwnedTensor filled(DType dtype, Shape shape, double value) {
    OwnedTensor t(dtype, shape);
    for (int64_t i = 0; i < t.numel(); ++i) set(t, i, value);
    return t;
}

// Token ids in [0, vocab); every id of a small vocabulary repeats in a long enough list.
inline OwnedTensor random_tokens(int64_t count, int64_t vocab, uint64_t seed) {
    OwnedTensor t(DType::i32, {count});
    std::mt19937_64 rng(seed);
    for (int64_t i = 0; i < count; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    return t;
}

// A copy in another float type (or the same one); i32 tensors are copied as they are.
inline OwnedTensor converted(const Tensor& src, DType dtype) {
    if (src.dtype() == DType::i32) dtype = DType::i32;
    OwnedTensor t(dtype, src.shape());
    if (dtype == src.dtype()) std::memcpy(t.view().raw(), src.raw(), src.bytes());
    else for (int64_t i = 0; i < src.numel(); ++i) set(t, i, get(src, i));
    return t;
}

inline OwnedTensor copy_of(const Tensor& src) { return converted(src, src.dtype()); }

inline void copy_into(const Tensor& dst, const Tensor& src) { std::memcpy(dst.raw(), src.raw(), src.bytes()); }

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
    return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// L = sum(out * R): the scalar whose gradient with respect to out is R.
inline double weighted_sum(const Tensor& out, const Tensor& weights) {
    double total = 0;
    for (int64_t i = 0; i < out.numel(); ++i) total += get(out, i) * get(weights, i);
    return total;
}

// For every element i of the f64 `input`, compares analytic[i] - offset (offset: what the
// gradient buffer held before an accumulating backward) with the central difference
// (L(x + eps) - L(x - eps)) / (2 eps) of `loss`, relative to max(|a|, |b|, 1e-3).
inline void expect_gradient_matches(const char* name, const Tensor& input, const Tensor& analytic, const std::function<double()>& loss,
                                    double offset = 0, double rtol = 1e-6, double eps = 1e-5) {
    ASSERT_EQ(input.shape(), analytic.shape()) << name;
    double* x = input.data<double>();
    const double* grad = analytic.data<double>();
    int failures = 0;
    for (int64_t i = 0; i < input.numel(); ++i) {
        const double saved = x[i];
        x[i] = saved + eps;
        const double plus = loss();
        x[i] = saved - eps;
        const double minus = loss();
        x[i] = saved;
        const double numeric = (plus - minus) / (2 * eps), a = grad[i] - offset;
        const double scale = std::max({std::abs(a), std::abs(numeric), 1e-3});
        if (std::abs(a - numeric) > rtol * scale && ++failures <= 5)
            ADD_FAILURE() << name << "[" << i << "]: analytic " << a << ", finite difference " << numeric;
    }
}

// |actual - expected| <= rtol * max(|expected|, 1) for every element.
inline void expect_close(const char* name, const Tensor& actual, const Tensor& expected, double rtol) {
    ASSERT_EQ(actual.shape(), expected.shape()) << name;
    int failures = 0;
    for (int64_t i = 0; i < actual.numel(); ++i) {
        const double a = get(actual, i), e = get(expected, i);
        if (!(std::abs(a - e) <= rtol * std::max(std::abs(e), 1.0)) && ++failures <= 5)
            ADD_FAILURE() << name << "[" << i << "]: " << a << " vs expected " << e;
    }
}

// `call` must throw an llmtrain::Error of `kind` whose message contains each of `words`.
inline void expect_error(ErrorKind kind, const std::vector<std::string>& words, const std::function<void()>& call) {
    try {
        call();
        ADD_FAILURE() << "no error thrown; expected one mentioning " << words.front();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), kind) << e.what();
        for (const std::string& word : words) EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
}

}  // namespace llmtrain::test
