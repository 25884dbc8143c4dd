// The CUDA backend's set-up, memory, copies and profile; the ops are in cuda_ops.cpp.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "backend/cuda/gemm_cublaslt.h"
#include "backend/cuda_host_rules.h"
#include "backend/cudnn/cudnn_attention.h"
#include "core/log.h"
#include "kernels/launch_check.h"

namespace llmtrain {

namespace {
const size_t kCublasWorkspaceBytes = reserved_workspace_bytes(Device::cuda);
// Pinned staging: enough buffers that the one a copy takes has long completed (a step's
// micro-batches take two each: tokens, targets), each up to this size.
constexpr size_t kStagingSlots = 16;
constexpr size_t kStagingMaxBytes = 16u << 20;
}  // namespace

void check_cuda(cudaError_t status, const char* what) {
    if (status != cudaSuccess) fail(kernels::cuda_error_kind(status), what, ": ", cudaGetErrorString(status));
}

bool cuda_backend_built() { return true; }

std::unique_ptr<Backend> make_cuda_backend(int device_index, AttentionImpl attention) { return std::make_unique<CudaBackend>(device_index, attention); }

namespace {
// A driver older than the runtime this binary was built with fails at the first kernel
// launch with an obscure error; say so up front, naming both versions.
void expect_driver_supports_runtime() {
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    const std::string problem = cuda_driver_problem(driver, CUDART_VERSION);
    if (!problem.empty()) fail(ErrorKind::unsupported, problem);
}
}  // namespace

int cuda_device_count() {
    expect_driver_supports_runtime();
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0)
        fail(ErrorKind::unsupported, "train.device = \"cuda\": no usable GPU (", status != cudaSuccess ? cudaGetErrorString(status) : "no devices",
             "); set train.device = \"cpu\" or run on a machine with a GPU and its driver");
    return count;
}

// Versions are encoded as 1000 * major + 10 * minor.
std::string cuda_runtime_version() {
    const auto text = [](int v) { return cat(v / 1000, ".", v % 1000 / 10); };
    int runtime = 0, driver = 0;
    check_cuda(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
    const bool has_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
    return cat("CUDA runtime ", text(runtime), has_driver ? cat(" (driver ", text(driver), ")") : std::string(" (no driver)"));
}

CudaVersions cuda_versions() {
    CudaVersions v;
    v.runtime = CUDART_VERSION;
    if (cudaDriverGetVersion(&v.driver) != cudaSuccess) v.driver = 0;
    return v;
}

size_t cuda_free_memory_bytes(int device_index) {
    check_cuda(cudaSetDevice(device_index % cuda_device_count()), "cudaSetDevice");
    size_t free_bytes = 0, total_bytes = 0;
    check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    return free_bytes;
}


// Device selection: the node-local rank modulo the GPUs seen (CUDA_VISIBLE_DEVICES may
// give each rank one GPU, which is then device 0).
CudaBackend::CudaBackend(int device_index, AttentionImpl attention) : attention_impl_(attention) {
    sync_check_ = cuda_sync_check_requested(std::getenv("LLMTRAIN_CUDA_CHECK"));
    device_index_ = device_index % cuda_device_count();
    check_cuda(cudaSetDevice(device_index_), "cudaSetDevice");
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, device_index_), "cudaGetDeviceProperties");
    device_name_ = prop.name;
    sm_major_ = prop.major;
    sm_minor_ = prop.minor;
    sm_count_ = prop.multiProcessorCount;
    if (sm_major_ < 8)
        fail(ErrorKind::unsupported, "train.device = \"cuda\": ", device_name_, " is compute capability ", sm_major_, ".", sm_minor_,
             "; the bf16 tensor-core kernels need 8.0 or newer (A100, H100)");
    // A blocking stream: the legacy default stream, which MPI staging copies use,
    // synchronizes with it, so transfers see every op enqueued before them.
    check_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate");
    cublas_workspace_ = allocate(kCublasWorkspaceBytes);
    GemmTuningHooks hooks{[this](size_t bytes) { return std::shared_ptr<void>(allocate(bytes)); }, [this] { ++profile_.host_syncs; }};
    gemm_ = std::make_unique<CublasLtMatmul>(stream_, cublas_workspace_.get(), kCublasWorkspaceBytes, std::move(hooks));
    sum_result_ = allocate(sizeof(double));
    open_cudnn();
}

// model.attention = "auto" says once per process which kernels it got; "cudnn" without a
// loadable libcudnn is a configuration the run cannot honour.
void CudaBackend::open_cudnn() {
    if (attention_impl_ == AttentionImpl::native) return;
    std::string why_not;
    cudnn_ = CudnnAttention::open(stream_, why_not);
    static bool said = false;
    if (cudnn_) {
        if (!std::exchange(said, true)) log_info("attention: ", cudnn_->describe(), " fused flash attention, deterministic engines (model.attention = \"",
                                                 attention_impl_name(attention_impl_), "\")");
        return;
    }
    if (attention_impl_ == AttentionImpl::cudnn) fail(ErrorKind::unsupported, "model.attention = \"cudnn\": ", why_not);
    if (!std::exchange(said, true)) log_info("attention: native flash kernels (model.attention = \"auto\": ", why_not, ")");
}

CudaBackend::~CudaBackend() {
    cudaStreamSynchronize(stream_);
    cudnn_.reset();
    for (const PendingOp& p : pending_) {
        cudaEventDestroy(p.start);
        cudaEventDestroy(p.stop);
    }
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    for (StagingSlot& slot : staging_) {
        if (slot.host) cudaFreeHost(slot.host);
        if (slot.copied) cudaEventDestroy(slot.copied);
    }
    gemm_.reset();
    if (stream_) cudaStreamDestroy(stream_);
}

std::string CudaBackend::name() const { return cat("cuda:", device_index_, " (", device_name_, ", sm_", sm_major_, sm_minor_, ")"); }

// The dense bf16 tensor-core peak of the chips we know, from their data sheets.
double CudaBackend::peak_bf16_tflops() const {
    const std::string& n = device_name_;
    const auto has = [&n](const char* part) { return n.find(part) != std::string::npos; };
    if (has("H100") || has("H200") || has("GH200")) return has("PCIe") ? 756 : 989;
    if (has("A100")) return 312;
    if (has("L40S")) return 362;
    if (has("A10G") || has("A10")) return 125;
    return 0;
}

Memory CudaBackend::allocate(size_t bytes) {
    void* p = nullptr;
    const size_t rounded = bytes == 0 ? 256 : (bytes + 255) / 256 * 256;
    check_memory_limit(allocated_bytes_, rounded);
    const cudaError_t status = cudaMalloc(&p, rounded);
    if (status != cudaSuccess) {
        size_t free_bytes = 0, total_bytes = 0;
        cudaMemGetInfo(&free_bytes, &total_bytes);
        fail(ErrorKind::runtime, "cuda: cannot allocate ", rounded / 1e6, " MB on ", device_name_, " (", free_bytes / 1e6, " MB free of ", total_bytes / 1e6,
             " MB; already held by this run: ", allocated_bytes_ / 1e6, " MB). Lower train.batch_size, or set train.recompute");
    }
    check_cuda(cudaMemset(p, 0, rounded), "cudaMemset");
    allocated_bytes_ += rounded;
    peak_allocated_bytes_ = std::max(peak_allocated_bytes_, allocated_bytes_);
    return Memory(p, [this, rounded](void* q) {
        cudaFree(q);
        allocated_bytes_ -= rounded;
    });
}

void CudaBackend::copy_from_host(const Tensor& dst, const void* src) {
    if (dst.device() != Device::cuda) fail(ErrorKind::unsupported, "copy_from_host: destination is in ", llmtrain::device_name(dst.device()), " memory");
    if (dst.numel() == 0) return;
    if (dst.bytes() > kStagingMaxBytes) {
        // Pageable host memory: the call returns once the source is staged, so it may be reused.
        check_cuda(cudaMemcpyAsync(dst.raw(), src, dst.bytes(), cudaMemcpyHostToDevice, stream_), "copy_from_host");
        return;
    }
    StagingSlot& slot = staging_slot(dst.bytes());
    std::memcpy(slot.host, src, dst.bytes());
    check_cuda(cudaMemcpyAsync(dst.raw(), slot.host, dst.bytes(), cudaMemcpyHostToDevice, stream_), "copy_from_host");
    check_cuda(cudaEventRecord(slot.copied, stream_), "copy_from_host");
}

CudaBackend::StagingSlot& CudaBackend::staging_slot(size_t bytes) {
    if (staging_.empty()) staging_.resize(kStagingSlots);
    StagingSlot& slot = staging_[next_staging_];
    next_staging_ = (next_staging_ + 1) % staging_.size();
    if (!slot.copied) check_cuda(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming), "staging event");
    else if (const cudaError_t done = cudaEventQuery(slot.copied); done == cudaErrorNotReady) {
        // Sixteen copies later and still queued: the stream is far behind; wait for this one.
        (void)cudaGetLastError();  // "not ready" is no error for the launch checks to find
        ++profile_.host_syncs;
        check_cuda(cudaEventSynchronize(slot.copied), "staging buffer");
    } else {
        check_cuda(done, "staging buffer");
    }
    if (slot.capacity < bytes) {
        if (slot.host) check_cuda(cudaFreeHost(slot.host), "staging buffer");
        slot.host = nullptr;
        slot.capacity = std::max<size_t>(bytes, 64u << 10);
        check_cuda(cudaMallocHost(&slot.host, slot.capacity), "staging buffer");
    }
    return slot;
}

void CudaBackend::copy_to_host(void* dst, const Tensor& src) {
    if (src.device() != Device::cuda) fail(ErrorKind::unsupported, "copy_to_host: source is in ", llmtrain::device_name(src.device()), " memory");
    if (src.numel() > 0) check_cuda(cudaMemcpyAsync(dst, src.raw(), src.bytes(), cudaMemcpyDeviceToHost, stream_), "copy_to_host");
    wait_for_stream("copy_to_host");
}

// cudaHostRegister can fail where page-locked memory is limited (ulimit -l, a container's
// memlock): the save still works through pageable memory, at a fraction of the rate, and the
// run is told once.
std::shared_ptr<void> CudaBackend::pin_host_memory(void* p, size_t bytes) {
    if (!p || bytes == 0) return nullptr;
    const cudaError_t code = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (code != cudaSuccess) {
        cudaGetLastError();  // not sticky: clear it for the next check
        if (!pin_failure_said_)
            log_warn("cudaHostRegister of ", bytes, " bytes of host memory failed (", cudaGetErrorString(code),
                     "): checkpoint copies go through pageable memory, slower (raise the locked-memory limit: ulimit -l)");
        pin_failure_said_ = true;
        return nullptr;
    }
    return std::shared_ptr<void>(p, [](void* q) { cudaHostUnregister(q); });
}

void CudaBackend::synchronize() {
    wait_for_stream("synchronize");
    resolve_profile();
}

void CudaBackend::wait_for_stream(const char* what) {
    ++profile_.host_syncs;
    check_cuda(cudaStreamSynchronize(stream_), what);
}

size_t CudaBackend::workspace_bytes() const { return workspace_size_ + kCublasWorkspaceBytes; }

void* CudaBackend::workspace(size_t bytes) {
    if (bytes <= workspace_size_) return workspace_.get();
    // Only the first step's ops grow it: wait for the ops still using the old one.
    wait_for_stream("workspace");
    workspace_.reset();
    workspace_ = allocate(bytes);
    workspace_size_ = (bytes + 255) / 256 * 256;
    return workspace_.get();
}

cudaEvent_t CudaBackend::take_event() {
    if (!free_events_.empty()) {
        cudaEvent_t e = free_events_.back();
        free_events_.pop_back();
        return e;
    }
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreate(&e), "cudaEventCreate");
    return e;
}

void CudaBackend::resolve_profile() {
    // Every pending pair goes back to the free list even when a timing query fails, so no
    // event is both pending and free; the first failure is reported after the loop.
    cudaError_t first_error = cudaSuccess;
    for (const PendingOp& p : pending_) {
        float ms = 0;
        const cudaError_t status = cudaEventElapsedTime(&ms, p.start, p.stop);
        if (status == cudaSuccess) {
            const auto index = static_cast<size_t>(p.op);
            profile_.seconds[index] += ms * 1e-3;
            profile_.calls[index] += 1;
        } else if (first_error == cudaSuccess) {
            first_error = status;
        }
        free_events_.push_back(p.start);
        free_events_.push_back(p.stop);
    }
    pending_.clear();
    check_cuda(first_error, "cudaEventElapsedTime");
}

}  // namespace llmtrain
