#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "core/philox.h"

namespace llmtrain {

namespace {
// The logits of the last window position, recomputing the whole window.
std::vector<double> recomputed_logits(Transformer& model, const std::vector<int32_t>& context, OwnedTensor& window) {
    const int64_t length = std::min<int64_t>(static_cast<int64_t>(context.size()), model.max_seq_len());
    std::copy(context.end() - length, context.end(), window.data<int32_t>());
    model.forward(window.view().slice_rows(0, length), Tensor(), 1, length);
    return model.logits_row(length - 1);
}

// The logits after `token`, from the cache; a full cache is refilled with the last
// max_seq_len tokens of the context (the window slides, every position moves).
std::vector<double> cached_logits(Transformer& model, const std::vector<int32_t>& context, KvCache& cache, bool fresh) {
    if (fresh || cache.length == cache.capacity) {
        cache.length = 0;
        const int64_t length = std::min<int64_t>(static_cast<int64_t>(context.size()), cache.capacity);
        for (auto it = context.end() - length; it != context.end(); ++it) model.decode(*it, cache);
    } else {
        model.decode(context.back(), cache);
    }
    return model.logits_row(0);
}
}  // namespace

int32_t sample_from_logits(const std::vector<double>& row, int64_t vocab, const SamplingOptions& options, double uniform) {
    if (vocab < 1 || vocab > static_cast<int64_t>(row.size()))
        fail(ErrorKind::runtime, "sampling: ", vocab, " real classes in a row of ", row.size(), " logits");
    const double* logits = row.data();
    const auto most_likely = static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
    if (options.temperature <= 0) return most_likely;
    std::vector<double> weights(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) weights[static_cast<size_t>(i)] = std::exp((logits[i] - logits[most_likely]) / options.temperature);
    // Candidates in index order, or (top-k / top-p) by falling probability, ties by index.
    std::vector<int32_t> candidates(static_cast<size_t>(vocab));
    std::iota(candidates.begin(), candidates.end(), 0);
    const bool filtered = (options.top_k > 0 && options.top_k < vocab) || options.top_p < 1;
    if (filtered) {
        std::stable_sort(candidates.begin(), candidates.end(), [&](int32_t a, int32_t b) { return weights[static_cast<size_t>(a)] > weights[static_cast<size_t>(b)]; });
        if (options.top_k > 0 && options.top_k < vocab) candidates.resize(static_cast<size_t>(options.top_k));
        double total = 0, kept = 0;
        for (int32_t c : candidates) total += weights[static_cast<size_t>(c)];
        size_t keep = 0;
        while (keep < candidates.size() && (keep == 0 || kept < options.top_p * total)) kept += weights[static_cast<size_t>(candidates[keep++])];
        candidates.resize(keep);
    }
    double total = 0;
    for (int32_t c : candidates) total += weights[static_cast<size_t>(c)];
    double threshold = uniform * total;
    for (int32_t c : candidates) {
        threshold -= weights[static_cast<size_t>(c)];
        if (threshold <= 0) return c;
    }
    return candidates.back();
}

std::vector<int32_t> generate_tokens(Transformer& model, std::vector<int32_t> context, int64_t new_tokens, const SamplingOptions& options,
                                     const TokenSink& sink) {
    if (context.empty()) fail(ErrorKind::runtime, "generation needs at least one context token");
    const PhiloxStream stream(options.seed, fnv1a64("sample"));
    std::vector<int32_t> generated;
    OwnedTensor window(DType::i32, {options.kv_cache ? 1 : model.max_seq_len()});
    std::optional<KvCache> cache;
    if (options.kv_cache) cache.emplace(model.make_kv_cache());
    for (int64_t i = 0; i < new_tokens; ++i) {
        const std::vector<double> logits = cache ? cached_logits(model, context, *cache, i == 0) : recomputed_logits(model, context, window);
        const int32_t token = sample_from_logits(logits, model.config().vocab_size, options, stream.uniform(static_cast<uint64_t>(i)));
        context.push_back(token);
        generated.push_back(token);
        if (sink) sink(token);
    }
    return generated;
}

std::vector<int32_t> generate_tokens(Transformer& model, std::vector<int32_t> context, int64_t new_tokens, double temperature, uint64_t seed) {
    SamplingOptions options;
    options.temperature = temperature;
    options.seed = seed;
    return generate_tokens(model, std::move(context), new_tokens, options);
}

}  // namespace llmtrain
