#include "model/generate.h"

#include <algorithm>
#include <cmath>

#include "core/philox.h"

namespace llmtrain {

namespace {
// Draws from the first `vocab` logits of the row: the classes after them are vocabulary
// padding, with probability zero.
int32_t sample_row(const std::vector<double>& row, int64_t vocab, double temperature, float uniform) {
    if (vocab < 1 || vocab > static_cast<int64_t>(row.size()))
        fail(ErrorKind::runtime, "sampling: ", vocab, " real classes in a row of ", row.size(), " logits");
    const double* logits = row.data();
    const double max_logit = *std::max_element(logits, logits + vocab);
    std::vector<double> weights(static_cast<size_t>(vocab));
    double total = 0;
    for (int64_t i = 0; i < vocab; ++i) total += weights[static_cast<size_t>(i)] = std::exp((logits[i] - max_logit) / temperature);
    double threshold = uniform * total;
    for (int64_t i = 0; i < vocab; ++i) {
        threshold -= weights[static_cast<size_t>(i)];
        if (threshold <= 0) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(vocab - 1);
}
}  // namespace

std::vector<int32_t> generate_tokens(Transformer& model, std::vector<int32_t> context, int64_t new_tokens, double temperature, uint64_t seed) {
    if (context.empty()) fail(ErrorKind::runtime, "generation needs at least one context token");
    const PhiloxStream stream(seed, fnv1a64("sample"));
    std::vector<int32_t> generated;
    OwnedTensor window(DType::i32, {model.max_seq_len()});
    for (int64_t i = 0; i < new_tokens; ++i) {
        const int64_t length = std::min<int64_t>(static_cast<int64_t>(context.size()), model.max_seq_len());
        std::copy(context.end() - length, context.end(), window.data<int32_t>());
        model.forward(window.view().slice_rows(0, length), Tensor(), 1, length);
        const int32_t token = sample_row(model.logits_row(length - 1), model.config().vocab_size, temperature, stream.uniform(static_cast<uint64_t>(i)));
        context.push_back(token);
        generated.push_back(token);
    }
    return generated;
}

}  // namespace llmtrain
