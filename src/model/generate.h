// Autoregressive sampling from a Transformer: each new token is drawn from
// softmax(logits / temperature) of the last position, over a window of at most
// model.max_seq_len() tokens. Only the real vocabulary (model.vocab_size) is drawn from:
// padded classes have probability zero. Draws come from the Philox stream (seed, "sample"),
// so a sample is reproducible.
#pragma once

#include <cstdint>
#include <vector>

#include "model/transformer.h"

namespace llmtrain {

std::vector<int32_t> generate_tokens(Transformer& model, std::vector<int32_t> context, int64_t new_tokens, double temperature, uint64_t seed);

}  // namespace llmtrain
