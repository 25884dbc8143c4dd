// One FP8 linear (model/fp8_linear.h) on the CPU against the product of the FP8 values computed
// here, in double, from core/fp8.h's rounding: the forward, the input and weight gradients, the
// bias gradient; the delayed recipe's scale from the history; the weight cast kept for a step.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/fp8.h"
#include "model/fp8_linear.h"

using namespace llmtrain;

namespace {

constexpr int64_t N = 12, IC = 16, OC = 8;  // token rows, input and output features

std::vector<float> random_values(size_t n, float spread, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, spread);
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
}

Tensor view(std::vector<float>& v, Shape shape) { return Tensor(v.data(), DType::f32, shape); }

float amax_of(const std::vector<float>& v) {
    float a = 0;
    for (float x : v) a = std::max(a, std::fabs(x));
    return a;
}

// The values an FP8 cast with `scale` stands for: fp8(x scale) / scale.
std::vector<double> fp8_values(const std::vector<float>& v, float scale, Fp8Format format) {
    std::vector<double> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(round_to_fp8(v[i] * scale, format)) / scale;
    return out;
}
std::vector<double> fp8_values(const std::vector<float>& v, Fp8Format format) { return fp8_values(v, fp8_scale_for_amax(amax_of(v), format, 0), format); }

// c[i, j] = sum_k a[i, k] b[j, k] (+ bias[j]).
std::vector<double> product_nt(const std::vector<double>& a, const std::vector<double>& b, int64_t rows, int64_t cols, int64_t k,
                               const std::vector<float>& bias = {}) {
    std::vector<double> c(static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
            double sum = bias.empty() ? 0.0 : bias[static_cast<size_t>(j)];
            for (int64_t p = 0; p < k; ++p) sum += a[static_cast<size_t>(i * k + p)] * b[static_cast<size_t>(j * k + p)];
            c[static_cast<size_t>(i * cols + j)] = sum;
        }
    return c;
}
std::vector<double> transposed(const std::vector<double>& a, int64_t rows, int64_t cols) {
    std::vector<double> t(a.size());
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) t[static_cast<size_t>(j * rows + i)] = a[static_cast<size_t>(i * cols + j)];
    return t;
}

void expect_near_all(const std::vector<float>& got, const std::vector<double>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double largest = 0;
    for (double w : want) largest = std::max(largest, std::fabs(w));
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5 * largest) << what << " element " << i;
}

double max_difference(const std::vector<float>& a, const std::vector<double>& b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    return d;
}

struct OneLinear {
    std::unique_ptr<Backend> backend = make_cpu_backend(1);
    Fp8Linears linears;
    int id;
    explicit OneLinear(Fp8Config config) : linears(config, *backend, DType::f32, {}), id(linears.add(OC, IC, LinearSplit::column_parallel)) {
        linears.allocate(N);
    }
};

Fp8Config recipe(Fp8Recipe r) {
    Fp8Config c;
    c.recipe = r;
    c.amax_history_len = 4;
    return c;
}

}  // namespace

TEST(Fp8Linear, ForwardAndBackward_AreTheProductsOfTheFp8CastValues) {
    OneLinear l(recipe(Fp8Recipe::current));
    std::vector<float> x = random_values(N * IC, 1.0f, 1), w = random_values(OC * IC, 0.05f, 2), bias = random_values(OC, 0.1f, 3);
    std::vector<float> out(N * OC);
    l.linears.forward(l.id, {.out = view(out, {N, OC}), .x = view(x, {N, IC}), .w = view(w, {OC, IC}), .bias = view(bias, {OC})});
    const std::vector<double> xq = fp8_values(x, Fp8Format::e4m3), wq = fp8_values(w, Fp8Format::e4m3);
    expect_near_all(out, product_nt(xq, wq, N, OC, IC, bias), "out");
    // Not the f32 product: the operands were rounded to e4m3.
    std::vector<double> exact_x(x.begin(), x.end()), exact_w(w.begin(), w.end());
    EXPECT_GT(max_difference(out, product_nt(exact_x, exact_w, N, OC, IC, bias)), 1e-4);

    // Backward: the gradient in e5m2 (hybrid), dw and dbias added to what they hold.
    std::vector<float> dout = random_values(N * OC, 1e-3f, 4), dx(N * IC), dw(OC * IC, 0.5f), dbias(OC, 0.25f);
    l.linears.backward(l.id, {.dx = view(dx, {N, IC}), .dw = view(dw, {OC, IC}), .dbias = view(dbias, {OC}), .dout = view(dout, {N, OC}),
                              .x = view(x, {N, IC}), .w = view(w, {OC, IC})});
    const std::vector<double> gq = fp8_values(dout, Fp8Format::e5m2);
    expect_near_all(dx, product_nt(gq, transposed(wq, OC, IC), N, IC, OC), "dx");
    std::vector<double> want_dw = product_nt(transposed(gq, N, OC), transposed(xq, N, IC), OC, IC, N);
    for (double& v : want_dw) v += 0.5;
    expect_near_all(dw, want_dw, "dw");
    std::vector<double> want_dbias(OC, 0.25);
    for (int64_t n = 0; n < N; ++n)
        for (int64_t o = 0; o < OC; ++o) want_dbias[static_cast<size_t>(o)] += dout[static_cast<size_t>(n * OC + o)];
    expect_near_all(dbias, want_dbias, "dbias");
}

TEST(Fp8Linear, E4m3Format_CastsTheGradientToE4m3) {
    Fp8Config config = recipe(Fp8Recipe::current);
    config.format = Fp8Formats::e4m3;
    OneLinear l(config);
    std::vector<float> x = random_values(N * IC, 1.0f, 5), w = random_values(OC * IC, 0.05f, 6), dout = random_values(N * OC, 1e-3f, 7);
    std::vector<float> out(N * OC), dx(N * IC);
    l.linears.forward(l.id, {.out = view(out, {N, OC}), .x = view(x, {N, IC}), .w = view(w, {OC, IC})});
    l.linears.backward(l.id, {.dx = view(dx, {N, IC}), .dout = view(dout, {N, OC}), .x = view(x, {N, IC}), .w = view(w, {OC, IC})});
    const std::vector<double> wq = fp8_values(w, Fp8Format::e4m3);
    expect_near_all(dx, product_nt(fp8_values(dout, Fp8Format::e4m3), transposed(wq, OC, IC), N, IC, OC), "dx");
}

TEST(Fp8Linear, WeightCast_IsKeptUntilTheStepCloses) {
    OneLinear l(recipe(Fp8Recipe::current));
    std::vector<float> x = random_values(N * IC, 1.0f, 8), w = random_values(OC * IC, 0.05f, 9), first(N * OC), again(N * OC);
    const std::vector<double> wq = fp8_values(w, Fp8Format::e4m3);
    l.linears.forward(l.id, {.out = view(first, {N, OC}), .x = view(x, {N, IC}), .w = view(w, {OC, IC})});
    for (float& v : w) v *= 2;  // an optimizer step the linear has not been told of yet
    l.linears.forward(l.id, {.out = view(again, {N, OC}), .x = view(x, {N, IC}), .w = view(w, {OC, IC})});
    EXPECT_EQ(first, again);
    l.linears.close_step();
    l.linears.forward(l.id, {.out = view(again, {N, OC}), .x = view(x, {N, IC}), .w = view(w, {OC, IC})});
    expect_near_all(again, product_nt(fp8_values(x, Fp8Format::e4m3), fp8_values(w, Fp8Format::e4m3), N, OC, IC), "out after the step");
    EXPECT_GT(max_difference(again, product_nt(fp8_values(x, Fp8Format::e4m3), wq, N, OC, IC)), 1e-3);
}

// The first step has no history: the input is scaled from its own amax. From then on the scale
// comes from the history's max, and an input beyond it saturates at 448 / scale.
TEST(Fp8Linear, DelayedRecipe_ScalesFromTheHistoryOfTheStepsBefore) {
    OneLinear l(recipe(Fp8Recipe::delayed));
    std::vector<float> x1 = random_values(N * IC, 1.0f, 10), w = random_values(OC * IC, 0.05f, 11), out(N * OC);
    const std::vector<double> wq = fp8_values(w, Fp8Format::e4m3);
    l.linears.forward(l.id, {.out = view(out, {N, OC}), .x = view(x1, {N, IC}), .w = view(w, {OC, IC})});
    expect_near_all(out, product_nt(fp8_values(x1, Fp8Format::e4m3), wq, N, OC, IC), "first step");
    l.linears.close_step();
    const float a1 = amax_of(x1);
    Fp8Linears::TensorState input = l.linears.state(l.id, 0);
    EXPECT_EQ(input.scale, fp8_scale_for_amax(a1, Fp8Format::e4m3, 0));
    EXPECT_EQ(input.history, (std::vector<float>{0, 0, 0, a1}));

    std::vector<float> x2 = x1;
    for (float& v : x2) v *= 3;  // beyond the history: saturates at the history's scale
    l.linears.forward(l.id, {.out = view(out, {N, OC}), .x = view(x2, {N, IC}), .w = view(w, {OC, IC})});
    expect_near_all(out, product_nt(fp8_values(x2, input.scale, Fp8Format::e4m3), wq, N, OC, IC), "second step");
    EXPECT_GT(max_difference(out, product_nt(fp8_values(x2, Fp8Format::e4m3), wq, N, OC, IC)), 1e-2);
    l.linears.close_step();
    input = l.linears.state(l.id, 0);
    EXPECT_EQ(input.history, (std::vector<float>{0, 0, a1, amax_of(x2)}));
    EXPECT_EQ(input.scale, fp8_scale_for_amax(amax_of(x2), Fp8Format::e4m3, 0));
}

TEST(Fp8Linear, Fp16Compute_IsRefusedNamingThePrecision) {
    auto backend = make_cpu_backend(1);
    try {
        Fp8Linears linears(Fp8Config{}, *backend, DType::f16, {});
        FAIL() << "fp8 with f16 compute was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("train.precision = \"fp8\""), std::string::npos) << e.what();
    }
}
