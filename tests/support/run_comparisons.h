// Comparisons of whole training runs, shared by the e2e, parallel and GPU tests: the same
// tiny CUDA-shaped run, "bitwise the same", "a layout matches the single process" and
// "tracks the fp32 CPU run within bf16's drift".
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "config/config.h"
#include "train/trainer.h"

namespace llmtrain::test {

// configs/tiny.toml shrunk to 2 layers of d_model 128 in 2 heads (head dimension 64, as the
// flash kernels take); llama adds GQA (1 kv head) and QKV bias.
inline Config tiny_cuda_shaped_run(const std::string& family, const std::string& device, int64_t batch, int64_t seq_len,
                                   const std::vector<std::string>& more = {}) {
    std::vector<std::string> overrides = {"model.family=\"" + family + "\"", "model.n_layers=2", "model.d_model=128", "model.n_heads=2",
                                          "train.steps=10", "optimizer.warmup_steps=2", "train.batch_size=" + std::to_string(batch),
                                          "train.seq_len=" + std::to_string(seq_len), "train.grad_accum=2", "train.eval_sequences=" + std::to_string(batch),
                                          "train.sample_tokens=8", "train.threads=1", "train.device=\"" + device + "\""};
    if (family == "llama") {
        overrides.push_back("model.n_kv_heads=1");
        overrides.push_back("model.qkv_bias=true");
    }
    overrides.insert(overrides.end(), more.begin(), more.end());
    return load_config("configs/tiny.toml", overrides);
}

// Same losses, gradient norms and final validation loss, bit for bit.
inline void expect_bitwise_identical(const TrainResult& a, const TrainResult& b, const std::string& what = "") {
    ASSERT_EQ(a.steps.size(), b.steps.size());
    for (size_t i = 0; i < a.steps.size(); ++i) {
        EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << what << " step " << i + 1;
        EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm) << what << " step " << i + 1;
    }
    EXPECT_EQ(a.evals.back().val_loss, b.evals.back().val_loss) << what;
}

// A parallel layout against the single process that computes the same run (fp32 or f64):
// losses, gradient norms and validation losses within `relative` of the single process's
// (the layouts sum in other orders), and a reference that learns at all.
inline void expect_matches_single_process(const TrainResult& parallel, const TrainResult& single, double relative, const std::string& what = "parallel") {
    const auto expect_close = [&](double actual, double expected, const std::string& of) {
        EXPECT_LE(std::abs(actual - expected), relative * std::abs(expected)) << of << ": " << what << " " << actual << ", single process " << expected;
    };
    ASSERT_EQ(parallel.steps.size(), single.steps.size());
    for (size_t i = 0; i < single.steps.size(); ++i) {
        expect_close(parallel.steps[i].loss, single.steps[i].loss, "loss at step " + std::to_string(i + 1));
        expect_close(parallel.steps[i].grad_norm, single.steps[i].grad_norm, "grad norm at step " + std::to_string(i + 1));
    }
    ASSERT_EQ(parallel.evals.size(), single.evals.size());
    for (size_t i = 0; i < single.evals.size(); ++i) expect_close(parallel.evals[i].val_loss, single.evals[i].val_loss, "val loss");
    EXPECT_LT(single.steps.back().loss, single.steps.front().loss) << "the reference run must learn for the comparison to mean much";
}

// A 16-bit run against the fp32 CPU run of the same config: bf16 rounds activations at 2^-8
// relative, and over 10 steps the runs drift apart a little; 2% of the loss (5% of the
// gradient norm) bounds that drift, while a real error (a wrong gradient, a missed
// accumulation, a stale compute copy) moves them by far more. Steps an fp16 overflow
// skipped are not compared.
inline void expect_tracks_cpu(const TrainResult& half, const TrainResult& cpu) {
    ASSERT_EQ(half.steps.size(), cpu.steps.size());
    for (size_t i = 0; i < cpu.steps.size(); ++i) {
        if (half.steps[i].skipped) continue;
        EXPECT_TRUE(std::isfinite(half.steps[i].loss)) << "step " << i + 1;
        EXPECT_NEAR(half.steps[i].loss, cpu.steps[i].loss, 0.02 * cpu.steps[i].loss) << "step " << i + 1;
        EXPECT_NEAR(half.steps[i].grad_norm, cpu.steps[i].grad_norm, 0.05 * cpu.steps[i].grad_norm + 0.01) << "step " << i + 1;
    }
    EXPECT_LT(half.steps.back().loss, half.steps.front().loss);
    EXPECT_NEAR(half.evals.back().val_loss, cpu.evals.back().val_loss, 0.02 * cpu.evals.back().val_loss);
}

}  // namespace llmtrain::test
