#include <cuda_runtime.h>

#include <memory>

#include "core/error.h"
#include "parallel/peer_copy.h"

namespace llmtrain {

namespace {

void check(cudaError_t code, const char* what, int a, int b) {
    if (code != cudaSuccess) fail(ErrorKind::runtime, what, " (GPUs ", a, " and ", b, "): ", cudaGetErrorString(code));
}

// A buffer and a stream on one GPU, released with it.
struct DeviceSide {
    int device = 0;
    void* buffer = nullptr;
    cudaStream_t stream = nullptr;
    DeviceSide(int d, size_t bytes, int peer) : device(d) {
        check(cudaSetDevice(d), "cudaSetDevice", d, peer);
        check(cudaMalloc(&buffer, bytes), "cudaMalloc", d, peer);
        check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate", d, peer);
    }
    ~DeviceSide() {
        cudaSetDevice(device);
        if (stream) cudaStreamDestroy(stream);
        if (buffer) cudaFree(buffer);
    }
    DeviceSide(const DeviceSide&) = delete;
    DeviceSide& operator=(const DeviceSide&) = delete;
};

// Peer access both ways; "already enabled" is not an error (an earlier pair enabled it).
bool enable_peer_access(int a, int b) {
    int ab = 0, ba = 0;
    check(cudaDeviceCanAccessPeer(&ab, a, b), "cudaDeviceCanAccessPeer", a, b);
    check(cudaDeviceCanAccessPeer(&ba, b, a), "cudaDeviceCanAccessPeer", b, a);
    if (!ab || !ba) return false;
    for (const auto [self, peer] : {std::pair{a, b}, std::pair{b, a}}) {
        check(cudaSetDevice(self), "cudaSetDevice", self, peer);
        const cudaError_t r = cudaDeviceEnablePeerAccess(peer, 0);
        if (r == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
        else check(r, "cudaDeviceEnablePeerAccess", self, peer);
    }
    return true;
}

// Both directions at once: a's stream copies a -> b, b's stream b -> a; timed by events on
// a's stream, which waits for b's last copy.
double bidirectional_gbps(DeviceSide& a, DeviceSide& b, size_t bytes, int iterations) {
    cudaEvent_t start = nullptr, stop = nullptr, b_done = nullptr;
    check(cudaSetDevice(a.device), "cudaSetDevice", a.device, b.device);
    check(cudaEventCreate(&start), "cudaEventCreate", a.device, b.device);
    check(cudaEventCreate(&stop), "cudaEventCreate", a.device, b.device);
    check(cudaEventCreateWithFlags(&b_done, cudaEventDisableTiming), "cudaEventCreate", a.device, b.device);
    const auto round = [&] {
        check(cudaMemcpyPeerAsync(b.buffer, b.device, a.buffer, a.device, bytes, a.stream), "cudaMemcpyPeerAsync", a.device, b.device);
        check(cudaMemcpyPeerAsync(a.buffer, a.device, b.buffer, b.device, bytes, b.stream), "cudaMemcpyPeerAsync", b.device, a.device);
    };
    round();  // warm-up: first-touch mappings and the copy engines' start
    check(cudaStreamSynchronize(b.stream), "cudaStreamSynchronize", b.device, a.device);
    check(cudaStreamSynchronize(a.stream), "cudaStreamSynchronize", a.device, b.device);
    check(cudaEventRecord(start, a.stream), "cudaEventRecord", a.device, b.device);
    check(cudaStreamWaitEvent(b.stream, start, 0), "cudaStreamWaitEvent", b.device, a.device);
    for (int i = 0; i < iterations; ++i) round();
    check(cudaEventRecord(b_done, b.stream), "cudaEventRecord", b.device, a.device);
    check(cudaStreamWaitEvent(a.stream, b_done, 0), "cudaStreamWaitEvent", a.device, b.device);
    check(cudaEventRecord(stop, a.stream), "cudaEventRecord", a.device, b.device);
    check(cudaEventSynchronize(stop), "cudaEventSynchronize", a.device, b.device);
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime", a.device, b.device);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaEventDestroy(b_done);
    return 2.0 * static_cast<double>(bytes) * iterations / (ms / 1e3) / 1e9;
}

}  // namespace

std::vector<PeerCopyResult> measure_peer_copies(size_t bytes, int iterations) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    std::vector<PeerCopyResult> results;
    for (int a = 0; a < count; ++a) {
        for (int b = a + 1; b < count; ++b) {
            PeerCopyResult r{a, b, enable_peer_access(a, b), 0};
            DeviceSide side_a(a, bytes, b), side_b(b, bytes, a);
            r.bidirectional_gbps = bidirectional_gbps(side_a, side_b, bytes, iterations);
            results.push_back(r);
        }
    }
    return results;
}

}  // namespace llmtrain
