// Autoregressive sampling from a Transformer: each new token is drawn from the last
// position's logits over a window of at most model.max_seq_len() tokens. Only the real
// vocabulary (model.vocab_size) is drawn from: padded classes have probability zero. Draws
// come from the Philox stream (seed, "sample"), draw i from counter i, so a sample is
// reproducible, and the same with or without the KV cache.
//
// With the KV cache (model/kv_cache.h) each new token runs one position's forward; without
// it, the whole window's (the reference the cache is tested against). Once the window is
// full it slides: the cache is rebuilt from the last max_seq_len tokens, as recomputing
// would see them.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/transformer.h"

namespace llmtrain {

struct SamplingOptions {
    double temperature = 1.0;  // logits / temperature; 0: always the most likely token (greedy)
    int64_t top_k = 0;         // draw among the k most likely tokens only; 0: all
    double top_p = 1.0;        // nucleus: among the most likely tokens whose probabilities sum to top_p
    uint64_t seed = 0;
    bool kv_cache = true;
};

// Called with each token as soon as it is drawn (streaming output).
using TokenSink = std::function<void(int32_t token)>;

std::vector<int32_t> generate_tokens(Transformer& model, std::vector<int32_t> context, int64_t new_tokens, const SamplingOptions& options,
                                     const TokenSink& sink = {});
// The trainer's sample: the whole vocabulary at this temperature.
std::vector<int32_t> generate_tokens(Transformer& model, std::vector<int32_t> context, int64_t new_tokens, double temperature, uint64_t seed);

// The token a uniform draw in [0, 1) picks from a row of logits (first `vocab` classes real).
int32_t sample_from_logits(const std::vector<double>& row, int64_t vocab, const SamplingOptions& options, double uniform);

}  // namespace llmtrain
