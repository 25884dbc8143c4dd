// The launch check every launcher ends with: a bad configuration or an earlier fault
// becomes an llmtrain error naming the kernel, not a silent wrong result later.
#pragma once

namespace llmtrain::kernels {

// Throws a runtime error "<kernel>: <CUDA error string>" when cudaGetLastError() reports one.
void check_launch(const char* kernel);

}  // namespace llmtrain::kernels
