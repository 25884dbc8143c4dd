// make_cuda_backend in a build without the CUDA toolkit: a clear refusal, so the same
// config fails with a reason instead of a missing symbol.
#include "backend/backend.h"

namespace llmtrain {

bool cuda_backend_built() { return false; }

std::unique_ptr<Backend> make_cuda_backend(int /*device_index*/) {
    fail(ErrorKind::unsupported, "train.device = \"cuda\": this llmtrain was built without the CUDA toolkit; rebuild where nvcc is found, "
         "or set train.device = \"cpu\"");
}

}  // namespace llmtrain
