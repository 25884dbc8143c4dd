#include "optim/onebit_compression.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace llmtrain {

namespace {
float scale_of(const float* x, int64_t n) {
    double squares = 0;
    for (int64_t i = 0; i < n; ++i) squares += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    return static_cast<float>(std::sqrt(squares / static_cast<double>(n)));
}

float scale_bits_to_float(int32_t word) {
    float scale;
    std::memcpy(&scale, &word, sizeof scale);
    return scale;
}

Tensor words(std::vector<int32_t>& v) { return Tensor(v.data(), DType::i32, {static_cast<int64_t>(v.size())}); }
}  // namespace

void compress_signs(const float* x, int64_t n, int32_t* out, float* error) {
    if (n % 32 != 0) fail(ErrorKind::runtime, "1-bit compression of ", n, " values: expected a multiple of 32");
    const float scale = scale_of(x, n);
    std::memcpy(&out[0], &scale, sizeof scale);
    for (int64_t w = 0; w < n / 32; ++w) {
        uint32_t bits = 0;
        for (int b = 0; b < 32; ++b) {
            const int64_t i = 32 * w + b;
            const bool negative = x[i] < 0;
            bits |= static_cast<uint32_t>(negative) << b;
            error[i] = x[i] - (negative ? -scale : scale);
        }
        out[1 + w] = static_cast<int32_t>(bits);
    }
}

void decompress_signs(const int32_t* in, int64_t n, float* out) {
    const float scale = scale_bits_to_float(in[0]);
    for (int64_t w = 0; w < n / 32; ++w) {
        const auto bits = static_cast<uint32_t>(in[1 + w]);
        for (int b = 0; b < 32; ++b) out[32 * w + b] = (bits >> b) & 1u ? -scale : scale;
    }
}

CompressedAllReduce::CompressedAllReduce(Comm& group, int64_t numel) : group_(group), numel_(numel) {
    const int64_t p = group.size(), unit = 32 * p;
    chunk_ = (numel + unit - 1) / unit * 32;
    const int64_t padded = chunk_ * p, chunk_words = compressed_words(chunk_);
    padded_.assign(static_cast<size_t>(padded), 0.0f);
    worker_error_.assign(static_cast<size_t>(padded), 0.0f);
    server_error_.assign(static_cast<size_t>(chunk_), 0.0f);
    server_sum_.assign(static_cast<size_t>(chunk_), 0.0f);
    send_.assign(static_cast<size_t>(chunk_words * p), 0);
    received_.assign(static_cast<size_t>(chunk_words * p), 0);
    gathered_.assign(static_cast<size_t>(chunk_words * p), 0);
}

int64_t CompressedAllReduce::bytes_per_call() const {
    // p - 1 chunks out in the all-to-all, and this server's chunk to p - 1 ranks in the all-gather.
    return 2 * (group_.size() - 1) * compressed_words(chunk_) * static_cast<int64_t>(sizeof(int32_t));
}

void CompressedAllReduce::average(std::vector<float>& x) {
    if (static_cast<int64_t>(x.size()) != numel_) fail(ErrorKind::shape, "compressed all-reduce of ", x.size(), " values: expected ", numel_);
    const int64_t p = group_.size(), chunk_words = compressed_words(chunk_);
    const size_t chunk = static_cast<size_t>(chunk_);
    // 1. Worker: x plus its error, compressed chunk by chunk.
    for (size_t i = 0; i < padded_.size(); ++i) padded_[i] = (i < x.size() ? x[i] : 0.0f) + worker_error_[i];
    for (int64_t j = 0; j < p; ++j)
        compress_signs(&padded_[static_cast<size_t>(j) * chunk], chunk_, &send_[static_cast<size_t>(j * chunk_words)], &worker_error_[static_cast<size_t>(j) * chunk]);
    group_.all_to_all(words(received_), words(send_));
    // 2. Server: the average of the workers' chunks (summed in rank order: the same on every
    // run), plus its error, compressed again.
    std::fill(server_sum_.begin(), server_sum_.end(), 0.0f);
    std::vector<float>& decoded = padded_;  // reused: chunk-sized scratch
    for (int64_t r = 0; r < p; ++r) {
        decompress_signs(&received_[static_cast<size_t>(r * chunk_words)], chunk_, decoded.data());
        for (size_t i = 0; i < chunk; ++i) server_sum_[i] += decoded[i];
    }
    for (size_t i = 0; i < chunk; ++i) server_sum_[i] = server_sum_[i] / static_cast<float>(p) + server_error_[i];
    const size_t mine = static_cast<size_t>(group_.rank() * chunk_words);
    compress_signs(server_sum_.data(), chunk_, &gathered_[mine], server_error_.data());
    // 3. Every server's chunk to every rank.
    group_.all_gather(words(gathered_));
    for (int64_t j = 0; j < p; ++j) decompress_signs(&gathered_[static_cast<size_t>(j * chunk_words)], chunk_, &padded_[static_cast<size_t>(j) * chunk]);
    std::copy(padded_.begin(), padded_.begin() + static_cast<std::ptrdiff_t>(numel_), x.begin());
    bytes_sent_ += bytes_per_call();
}

}  // namespace llmtrain
