// Copies between GPU and host memory for communication over MPI, which carries host
// memory: a GPU tensor is staged through a host buffer (copied out before the operation,
// back after it). In a build without CUDA there are no GPU tensors and staging refuses.
#pragma once

#include <cstddef>

namespace llmtrain {

void copy_device_to_host(void* host, const void* device, size_t bytes);
void copy_host_to_device(void* device, const void* host, size_t bytes);

}  // namespace llmtrain
