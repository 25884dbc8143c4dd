// Incremental decoding's key/value cache (as in every autoregressive inference engine; Pope
// et al. 2022): the keys and values of every position decoded so far, per layer, so that a new
// token's forward runs its own position only. Its attention reads the cached keys and values
// instead of recomputing every earlier position's; per token the cost is one position's
// matmuls plus an attention that is linear in the context, not the whole context's forward.
// The cache lives on the host in double precision: a new position's q, k and v (one row) come
// to the host and its attention output (one row) goes back, a few kB per layer and token, so
// it serves every backend alike.
#pragma once

#include <cstdint>
#include <vector>

namespace llmtrain {

struct KvCache {
    KvCache(int64_t layers, int64_t capacity, int64_t kv_width);
    int64_t capacity;   // positions it can hold: the model's max_seq_len
    int64_t kv_width;   // n_kv_heads * head_dim
    int64_t length = 0; // positions held
    std::vector<std::vector<double>> keys, values;  // per layer, [capacity, kv_width]
};

// Causal attention of one new query row q [n_heads * head_dim] at position `positions - 1`
// over the cached keys and values of positions [0, positions) of one layer (grouped-query:
// query head h reads kv head h / (n_heads / n_kv_heads)):
//   out_h = sum_s softmax_s(q_h . k_s / sqrt(D)) v_s
void cached_attention(double* out, const double* q, const std::vector<double>& keys, const std::vector<double>& values, int64_t positions,
                      int64_t n_heads, int64_t n_kv_heads, int64_t head_dim);

}  // namespace llmtrain
