// Which windows of the token stream form each batch. A window is seq_len + 1 consecutive
// tokens: inputs are its first seq_len, targets the last seq_len (shifted by one).
//  - Training: the window of (step, micro-batch, row) starts at an offset drawn from the
//    Philox stream (seed, "train-windows"), a pure function of its coordinates: no loader
//    state, so a run is reproducible and any step can be regenerated.
//  - Evaluation: fixed, non-overlapping windows from the start of the validation stream
//    (wrapping around if the stream is short), identical at every evaluation.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace llmtrain {

struct BatchBuffers {
    OwnedTensor inputs;   // i32 [batch * seq_len]
    OwnedTensor targets;  // i32 [batch * seq_len]
    BatchBuffers(int64_t batch, int64_t seq_len) : inputs(DType::i32, {batch * seq_len}), targets(DType::i32, {batch * seq_len}) {}
};

void fill_train_batch(BatchBuffers& out, const std::vector<int32_t>& tokens, uint64_t seed, int64_t step, int64_t micro_batch,
                      int64_t micro_batches_per_step, int64_t batch, int64_t seq_len);
// Rows [0, sequences) of out from validation windows first_sequence, first_sequence + 1, ...:
// window w starts at token w * seq_len, so a window's tokens do not depend on the batch size.
void fill_eval_batch(BatchBuffers& out, const std::vector<int32_t>& tokens, int64_t first_sequence, int64_t sequences, int64_t seq_len);

}  // namespace llmtrain
