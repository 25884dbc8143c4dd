#include "data/batch_windows.h"

#include <cstring>

#include "core/philox.h"

namespace llmtrain {

namespace {
void copy_window(BatchBuffers& out, const std::vector<int32_t>& tokens, int64_t row, int64_t start, int64_t seq_len) {
    const size_t bytes = static_cast<size_t>(seq_len) * sizeof(int32_t);
    std::memcpy(out.inputs.data<int32_t>() + row * seq_len, tokens.data() + start, bytes);
    std::memcpy(out.targets.data<int32_t>() + row * seq_len, tokens.data() + start + 1, bytes);
}
}  // namespace

void fill_train_batch(BatchBuffers& out, const std::vector<int32_t>& tokens, uint64_t seed, int64_t step, int64_t micro_batch,
                      int64_t micro_batches_per_step, int64_t batch, int64_t seq_len) {
    static const uint64_t stream_id = fnv1a64("train-windows");
    const PhiloxStream stream(seed, stream_id);
    const auto start_count = static_cast<uint64_t>(static_cast<int64_t>(tokens.size()) - seq_len);  // valid starts
    for (int64_t row = 0; row < batch; ++row) {
        const auto window = static_cast<uint64_t>((step * micro_batches_per_step + micro_batch) * batch + row);
        copy_window(out, tokens, row, static_cast<int64_t>(stream.below(window, start_count)), seq_len);
    }
}

void fill_eval_batch(BatchBuffers& out, const std::vector<int32_t>& tokens, int64_t first_sequence, int64_t sequences, int64_t seq_len) {
    const int64_t start_count = static_cast<int64_t>(tokens.size()) - seq_len;
    for (int64_t row = 0; row < sequences; ++row) {
        const int64_t window = first_sequence + row;
        copy_window(out, tokens, row, (window * seq_len) % start_count, seq_len);
    }
}

}  // namespace llmtrain
