// make_cuda_backend and the CUDA memory queries in a build without the CUDA toolkit: a clear refusal, so the same
// config fails with a reason instead of a missing symbol.
#include "backend/backend.h"

namespace llmtrain {

namespace {
[[noreturn]] void refuse() {
    fail(ErrorKind::unsupported, "train.device = \"cuda\": this llmtrain was built without the CUDA toolkit; rebuild where nvcc is found, "
         "or set train.device = \"cpu\"");
}
}  // namespace

bool cuda_backend_built() { return false; }

std::unique_ptr<Backend> make_cuda_backend(int /*device_index*/, AttentionImpl /*attention*/) { refuse(); }
int cuda_device_count() { refuse(); }
size_t cuda_free_memory_bytes(int /*device_index*/) { refuse(); }
std::string cuda_runtime_version() { return "not built"; }
CudaVersions cuda_versions() { return {}; }

}  // namespace llmtrain
