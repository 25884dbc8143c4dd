// GPU-to-GPU copy bandwidth inside one process, as CUDA's p2pBandwidthLatencyTest measures
// it: for a pair (a, b), `bytes` are copied a -> b and b -> a at the same time
// (cudaMemcpyPeerAsync on a stream of each GPU), `iterations` times; the bidirectional
// bandwidth is 2 * bytes * iterations / the time both directions took. With peer access
// enabled (NVLink, or PCIe peer-to-peer) the copies go GPU to GPU; without it CUDA stages
// them through host memory, and the figure says so.
//
// In a build without CUDA measure_peer_copies refuses with an "unsupported" error.
#pragma once

#include <cstddef>
#include <vector>

namespace llmtrain {

struct PeerCopyResult {
    int from = 0, to = 0;         // CUDA device indices as this process sees them
    bool peer_access = false;     // cudaDeviceCanAccessPeer both ways
    double bidirectional_gbps = 0;  // GB/s, 1e9 bytes
};

// Every pair of the GPUs this process sees (none with fewer than two).
std::vector<PeerCopyResult> measure_peer_copies(size_t bytes, int iterations);

}  // namespace llmtrain
