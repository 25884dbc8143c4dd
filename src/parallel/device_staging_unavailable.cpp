#include "core/error.h"
#include "parallel/device_staging.h"

namespace llmtrain {

namespace {
[[noreturn]] void no_cuda() { fail(ErrorKind::unsupported, "GPU tensor handed to MPI in a build without CUDA"); }
}  // namespace

void copy_device_to_host(void*, const void*, size_t) { no_cuda(); }
void copy_host_to_device(void*, const void*, size_t) { no_cuda(); }

}  // namespace llmtrain
