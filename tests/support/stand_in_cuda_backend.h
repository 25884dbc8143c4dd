// A stand-in for the CUDA backend that runs on the CPU: it keeps the CUDA backend's
// contract (memory labelled Device::cuda and reached only through copy_from_host /
// copy_to_host; 16-bit activations and compute weights; f32 parameter gradients, norm
// statistics, attention log-sum-exps [B, H, T], losses and AdamW state) and computes each op
// with the CPU reference in f32, rounding 16-bit outputs to nearest even.
//
// What it tests: everything around the kernels that a GPU run depends on (mixed-precision
// parameters and their compute copy, device labels on every tensor the model, optimizer
// and trainer hand over, loss scaling, recomputation), on machines without a GPU. Every op
// refuses a tensor not labelled as device memory or of the wrong dtype, as the CUDA
// backend does.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace llmtrain::test {

// cpu_threads: the CPU reference's threads (<= 0: every core); its results do not depend on them.
// gpu: the GPU it reports (gpu_device()), a Hopper unless a test asks for another compute
// capability; the ops compute the same on any.
std::unique_ptr<Backend> make_stand_in_cuda_backend(int cpu_threads = 1, GpuDevice gpu = {"stand-in H100 (CPU)", 9, 0});

}  // namespace llmtrain::test
