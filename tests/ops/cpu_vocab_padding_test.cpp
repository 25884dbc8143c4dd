// Cross-entropy over a padded vocabulary (model.pad_vocab_to): logits rows wider than the
// real vocabulary, whose extra columns hold large values, must give the loss and the real
// gradient of the unpadded rows and a zero gradient to every padded column, whole-row and
// vocabulary-parallel alike, including a shard that holds padding only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "op_test_util.h"

using namespace llmtrain;
using namespace llmtrain::test;

namespace {

constexpr DType f64 = DType::f64;
constexpr double kGarbage = 123.0;

// The real vocabulary of 11 classes, padded to 16: 4 tp shards of 4 hold 4, 4, 3 + 1 padding
// and 0 + 4 padding real classes.
constexpr int64_t kReal = 11, kPadded = 16, kRows = 7;

// [rows, kPadded]: the real logits in the first kReal columns, then padding columns of +40,
// far above every real logit: any padding that leaks into a max or a sum shows.
OwnedTensor padded_copy(const Tensor& real) {
    OwnedTensor out(f64, {real.dim(0), kPadded});
    for (int64_t r = 0; r < real.dim(0); ++r)
        for (int64_t c = 0; c < kPadded; ++c) set(out, r * kPadded + c, c < kReal ? get(real, r * kReal + c) : 40.0);
    return out;
}

OwnedTensor columns_of(const Tensor& t, int64_t begin, int64_t count) {
    OwnedTensor out(t.dtype(), {t.dim(0), count});
    for (int64_t r = 0; r < t.dim(0); ++r)
        for (int64_t c = 0; c < count; ++c) set(out, r * count + c, get(t, r * t.dim(1) + begin + c));
    return out;
}

void expect_padding_gradient_zero(const Tensor& dlogits, int64_t first_padded_column) {
    for (int64_t r = 0; r < dlogits.dim(0); ++r)
        for (int64_t c = first_padded_column; c < dlogits.dim(1); ++c)
            EXPECT_EQ(get(dlogits, r * dlogits.dim(1) + c), 0.0) << "row " << r << ", padded column " << c;
}

struct Reference {
    OwnedTensor logits, targets, losses, dlogits;
};

// The unpadded loss and gradient (dloss 0.5), with targets that include the last real class.
Reference unpadded_reference(uint64_t seed) {
    auto be = make_cpu_backend(1);
    Reference ref{random_tensor(f64, {kRows, kReal}, seed, -6, 6), random_tokens(kRows, kReal, seed + 1), OwnedTensor(f64, {kRows}),
                  OwnedTensor(f64, {kRows, kReal})};
    ref.targets.data<int32_t>()[0] = kReal - 1;
    be->xent_fwd({.losses = ref.losses, .lse = Tensor(), .logits = ref.logits, .targets = ref.targets, .vocab = {}});
    be->xent_bwd({.dlogits = ref.dlogits, .logits = ref.logits, .targets = ref.targets, .lse = Tensor(), .vocab = {}, .dloss = 0.5});
    return ref;
}

}  // namespace

TEST(VocabPaddingCrossEntropy, WholeRows_GiveTheUnpaddedLossAndZeroGradientToPadding) {
    auto be = make_cpu_backend(1);
    const Reference ref = unpadded_reference(10);
    const OwnedTensor logits = padded_copy(ref.logits), losses(f64, {kRows});
    const VocabShard padded{0, kPadded, kReal};
    be->xent_fwd({.losses = losses, .lse = Tensor(), .logits = logits, .targets = ref.targets, .vocab = padded});
    expect_close("losses", losses, ref.losses, 1e-14);

    const OwnedTensor dlogits = filled(f64, {kRows, kPadded}, kGarbage);
    be->xent_bwd({.dlogits = dlogits, .logits = logits, .targets = ref.targets, .lse = Tensor(), .vocab = padded, .dloss = 0.5});
    expect_close("real dlogits", columns_of(dlogits, 0, kReal), ref.dlogits, 1e-14);
    expect_padding_gradient_zero(dlogits, kReal);

    // In place, as the model runs it: the gradient overwrites the logits.
    be->xent_bwd({.dlogits = logits, .logits = logits, .targets = ref.targets, .lse = Tensor(), .vocab = padded, .dloss = 0.5});
    expect_close("in-place dlogits", logits, dlogits, 0);
}

TEST(VocabPaddingCrossEntropy, VocabShards_GiveTheUnpaddedLossAndZeroGradientToPadding) {
    auto be = make_cpu_backend(1);
    const Reference ref = unpadded_reference(20);
    const OwnedTensor logits = padded_copy(ref.logits);
    constexpr int64_t shard_rows = kPadded / 4;

    const OwnedTensor row_max = filled(f64, {kRows}, -INFINITY), local_max(f64, {kRows});
    for (int64_t begin = 0; begin < kPadded; begin += shard_rows) {
        be->logits_row_max(local_max, columns_of(logits, begin, shard_rows), {begin, kPadded, kReal});
        for (int64_t n = 0; n < kRows; ++n) {
            if (begin >= kReal) {
                EXPECT_EQ(get(local_max, n), -INFINITY) << "a shard of padding only has no max";
            }
            set(row_max, n, std::max(get(row_max, n), get(local_max, n)));
        }
    }
    const OwnedTensor partial = filled(f64, {kRows, 2}, 0), local_partial(f64, {kRows, 2});
    for (int64_t begin = 0; begin < kPadded; begin += shard_rows) {
        be->xent_partial({.partial = local_partial, .logits = columns_of(logits, begin, shard_rows), .targets = ref.targets, .row_max = row_max,
                          .vocab = {begin, kPadded, kReal}});
        be->add(partial, partial, local_partial);
    }
    const OwnedTensor losses(f64, {kRows}), lse(f64, {kRows});
    be->xent_combine({.losses = losses, .lse = lse, .partial = partial, .row_max = row_max});
    expect_close("losses", losses, ref.losses, 1e-14);

    for (int64_t begin = 0; begin < kPadded; begin += shard_rows) {
        SCOPED_TRACE(testing::Message() << "shard [" << begin << ", " << begin + shard_rows << ")");
        const OwnedTensor dlocal = filled(f64, {kRows, shard_rows}, kGarbage);
        be->xent_bwd({.dlogits = dlocal, .logits = columns_of(logits, begin, shard_rows), .targets = ref.targets, .lse = lse,
                      .vocab = {begin, kPadded, kReal}, .dloss = 0.5});
        const int64_t real_here = std::clamp(kReal - begin, int64_t{0}, shard_rows);
        expect_close("real dlogits", columns_of(dlocal, 0, real_here), columns_of(ref.dlogits, begin, real_here), 1e-14);
        expect_padding_gradient_zero(dlocal, real_here);
    }
}

TEST(VocabPaddingCrossEntropy, TargetInThePadding_IsADataError) {
    auto be = make_cpu_backend(1);
    const OwnedTensor logits = random_tensor(f64, {2, kPadded}, 30), losses(f64, {2}), targets(DType::i32, {2});
    targets.data<int32_t>()[1] = kReal;
    try {
        be->xent_fwd({.losses = losses, .lse = Tensor(), .logits = logits, .targets = targets, .vocab = {0, kPadded, kReal}});
        FAIL() << "expected a data error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::data);
        EXPECT_NE(std::string(e.what()).find("target 11 at row 1 is outside the vocabulary [0, 11)"), std::string::npos) << e.what();
    }
}

TEST(VocabPaddingCrossEntropy, RealVocabularyBeyondTheRows_IsAShapeError) {
    auto be = make_cpu_backend(1);
    const OwnedTensor logits = random_tensor(f64, {2, 8}, 31), row_max(f64, {2});
    try {
        be->logits_row_max(row_max, logits, {0, 8, 9});
        FAIL() << "expected a shape error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::shape);
        EXPECT_NE(std::string(e.what()).find("real vocabulary 9 must lie in [1, 8]"), std::string::npos) << e.what();
    }
}
