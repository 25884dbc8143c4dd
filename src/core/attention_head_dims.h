// The head dimensions the native flash-attention kernels (kernels/attention.cu) are
// instantiated for: one list read by the config check, the CUDA backend's op check, the
// kernels' dispatch and the CUDA stand-in of the tests, so a new instantiation is one edit.
// cuDNN's fused attention (model.attention = "cudnn") takes more: multiples of 8 up to
// cudnn_max_head_dim.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace llmtrain {

inline constexpr std::array<int64_t, 3> native_attention_head_dims{32, 64, 128};
inline constexpr int64_t cudnn_max_head_dim = 256;

constexpr bool native_attention_takes(int64_t head_dim) {
    for (const int64_t d : native_attention_head_dims)
        if (d == head_dim) return true;
    return false;
}

constexpr bool cudnn_attention_takes(int64_t head_dim) { return head_dim > 0 && head_dim % 8 == 0 && head_dim <= cudnn_max_head_dim; }

// "32, 64 or 128"
inline std::string native_attention_head_dims_text() {
    std::string text;
    for (size_t i = 0; i < native_attention_head_dims.size(); ++i) {
        if (i > 0) text += i + 1 == native_attention_head_dims.size() ? " or " : ", ";
        text += std::to_string(native_attention_head_dims[i]);
    }
    return text;
}

}  // namespace llmtrain
