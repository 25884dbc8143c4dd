// measure_peer_copies in a build without CUDA: a clear refusal.
#include "core/error.h"
#include "parallel/peer_copy.h"

namespace llmtrain {

std::vector<PeerCopyResult> measure_peer_copies(size_t, int) {
    fail(ErrorKind::unsupported, "GPU-to-GPU copies: this llmtrain was built without CUDA (no CUDA compiler was found at build time)");
}

}  // namespace llmtrain
