// The CUDA runtime API of the emulation: one device; device memory is host memory, poisoned
// on allocation and placed between guard zones that are checked after every launch and at
// cudaFree; copies and memsets check that their device range lies in one allocation; every
// stream operation is complete when the call returns (so streams and events only order what
// is already ordered), and events time the host. There is no cuDNN: a real one would need a
// real device, so the loader is pointed at nothing (unless a test points it itself) and the
// backend runs the native kernels, as on a GPU without libcudnn.
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "emu_internal.h"

struct CUstream_st {
    unsigned flags;
};
struct CUevent_st {
    std::chrono::steady_clock::time_point time;
    bool recorded = false;
};

namespace emu {

namespace {

const bool kNoCudnn = [] { return setenv("LLMTRAIN_CUDNN_LIBRARY", "/nonexistent/libcudnn-in-the-cuda-emulation.so", 0) == 0; }();

constexpr size_t kGuardBytes = 16384;
constexpr size_t kAlignment = 256;  // what cudaMalloc guarantees
constexpr unsigned char kGuardPattern[2] = {0xff, 0x7f};  // 0x7fff: NaN in bf16 and f16, and as f32 and f64
constexpr size_t kTotalBytes = size_t{80} << 30;

struct Memory {
    std::map<uintptr_t, Allocation> allocations;  // by base
    std::set<void*> pinned;
    std::map<void*, size_t> registered;  // cudaHostRegister: start -> bytes
    size_t allocated = 0;
    uint64_t next_id = 1;
    cudaError_t last_error = cudaSuccess;
    int device = 0;
};

Memory& memory() {
    static Memory m;
    return m;
}

void fill_guard(unsigned char* p) {
    for (size_t i = 0; i < kGuardBytes; ++i) p[i] = kGuardPattern[i % 2];
}

// The offset of the first changed byte of a guard, or kGuardBytes.
size_t first_damage(const unsigned char* p) {
    for (size_t i = 0; i < kGuardBytes; ++i)
        if (p[i] != kGuardPattern[i % 2]) return i;
    return kGuardBytes;
}

std::string guard_damage(const Allocation& a) {
    const size_t before = first_damage(a.base - kGuardBytes);
    if (before != kGuardBytes)
        return describe(a) + ": the guard before it was written " + std::to_string(kGuardBytes - before) + " bytes before its start";
    const size_t after = first_damage(a.base + a.bytes);
    if (after != kGuardBytes) return describe(a) + ": the guard after it was written " + std::to_string(after) + " bytes past its end";
    return "";
}

// A device range of a copy or memset must lie in one allocation.
bool device_range_ok(const void* p, size_t bytes, const char* call) {
    if (bytes == 0 || find_allocation(p, bytes)) return true;
    std::fprintf(stderr, "emu: %s: [%p, +%zu bytes) is not inside one device allocation\n", call, p, bytes);
    return false;
}

bool is_device(const void* p) { return find_allocation(p) != nullptr; }

cudaError_t fail(cudaError_t error) {
    memory().last_error = error;
    return error;
}

}  // namespace

const Allocation* find_allocation(const void* p, size_t bytes) {
    auto& allocations = memory().allocations;
    const auto address = reinterpret_cast<uintptr_t>(p);
    auto it = allocations.upper_bound(address);
    if (it == allocations.begin()) return nullptr;
    --it;
    const Allocation& a = it->second;
    const uintptr_t end = reinterpret_cast<uintptr_t>(a.base) + a.bytes;
    if (address + bytes > end || (bytes == 0 && address >= end))
        return nullptr;
    return &a;
}

std::vector<const Allocation*> live_allocations() {
    std::vector<const Allocation*> out;
    for (const auto& [base, a] : memory().allocations) out.push_back(&a);
    return out;
}

std::string describe(const Allocation& a) { return "device allocation #" + std::to_string(a.id) + " (" + std::to_string(a.bytes) + " bytes)"; }

void check_guards(const std::string& context) {
    for (const auto& [base, a] : memory().allocations) {
        const std::string damage = guard_damage(a);
        if (!damage.empty()) {
            // Repair, so that one fault is reported once.
            fill_guard(a.base - kGuardBytes);
            fill_guard(a.base + a.bytes);
            throw Fault(context + ": " + damage);
        }
    }
}

void set_last_error(cudaError_t error) { memory().last_error = error; }

uint64_t seed() {
    static const uint64_t value = [] {
        const char* text = std::getenv("LLMTRAIN_EMU_SEED");
        const uint64_t s = text && *text ? std::strtoull(text, nullptr, 10) : std::random_device{}();
        std::fprintf(stderr, "emu: seed %llu (LLMTRAIN_EMU_SEED=%llu repeats this run's WMMA lane mappings and thread orders)\n",
                     static_cast<unsigned long long>(s), static_cast<unsigned long long>(s));
        return s;
    }();
    return value;
}

int schedules() {
    static const int value = [] {
        const char* text = std::getenv("LLMTRAIN_EMU_SCHEDULES");
        const int n = text && *text ? std::atoi(text) : 2;
        return n < 1 ? 1 : n;
    }();
    return value;
}

}  // namespace emu

using emu::memory;

const char* cudaGetErrorName(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInitializationError: return "cudaErrorInitializationError";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
        case cudaErrorNoDevice: return "cudaErrorNoDevice";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorECCUncorrectable: return "cudaErrorECCUncorrectable";
        case cudaErrorNvlinkUncorrectable: return "cudaErrorNvlinkUncorrectable";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorNotReady: return "cudaErrorNotReady";
        case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
        case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
        case cudaErrorHardwareStackError: return "cudaErrorHardwareStackError";
        case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
        case cudaErrorNotSupported: return "cudaErrorNotSupported";
        default: return "cudaErrorUnknown";
    }
}

const char* cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
        case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorNoDevice: return "no CUDA-capable device is detected";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
        default: return cudaGetErrorName(error);
    }
}

cudaError_t cudaGetLastError() {
    const cudaError_t e = memory().last_error;
    memory().last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError() { return memory().last_error; }

cudaError_t cudaGetDeviceCount(int* count) {
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device != 0) return emu::fail(cudaErrorInvalidDevice);
    memory().device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
    *device = memory().device;
    return cudaSuccess;
}

// An H100 SXM's figures, under a name that says what it is.
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (device != 0) return emu::fail(cudaErrorInvalidDevice);
    *prop = cudaDeviceProp{};
    std::snprintf(prop->name, sizeof prop->name, "%s", "CUDA emulation on the CPU");
    prop->totalGlobalMem = emu::kTotalBytes;
    prop->sharedMemPerBlock = 49152;
    prop->sharedMemPerBlockOptin = 232448;
    prop->sharedMemPerMultiprocessor = 233472;
    prop->regsPerBlock = 65536;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132;
    prop->l2CacheSize = 50 << 20;
    prop->memoryBusWidth = 5120;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    cudaDeviceProp prop;
    if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) return e;
    switch (attr) {
        case cudaDevAttrMaxThreadsPerBlock: *value = prop.maxThreadsPerBlock; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(prop.sharedMemPerBlock); break;
        case cudaDevAttrWarpSize: *value = prop.warpSize; break;
        case cudaDevAttrMultiProcessorCount: *value = prop.multiProcessorCount; break;
        case cudaDevAttrComputeCapabilityMajor: *value = prop.major; break;
        case cudaDevAttrComputeCapabilityMinor: *value = prop.minor; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = static_cast<int>(prop.sharedMemPerBlockOptin); break;
        default: return emu::fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
    *version = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
    *version = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    *total_bytes = emu::kTotalBytes;
    *free_bytes = emu::kTotalBytes - memory().allocated;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
    using namespace emu;
    *p = nullptr;
    if (bytes > kTotalBytes - memory().allocated) return fail(cudaErrorMemoryAllocation);
    const size_t body = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    auto* raw = static_cast<unsigned char*>(std::aligned_alloc(kAlignment, kGuardBytes + body + kGuardBytes));
    if (!raw) return fail(cudaErrorMemoryAllocation);
    unsigned char* base = raw + kGuardBytes;
    fill_guard(raw);
    std::memset(base, kPoisonByte, bytes);
    fill_guard(base + bytes);  // right after the requested bytes, not after the rounding
    memory().allocations[reinterpret_cast<uintptr_t>(base)] = Allocation{base, bytes, memory().next_id++};
    memory().allocated += bytes;
    *p = base;
    return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
    using namespace emu;
    if (!p) return cudaSuccess;
    auto& allocations = memory().allocations;
    auto it = allocations.find(reinterpret_cast<uintptr_t>(p));
    if (it == allocations.end()) {
        std::fprintf(stderr, "emu: cudaFree(%p): not the start of a device allocation\n", p);
        return fail(cudaErrorInvalidValue);
    }
    const Allocation a = it->second;
    const std::string damage = guard_damage(a);
    allocations.erase(it);
    memory().allocated -= a.bytes;
    std::free(a.base - kGuardBytes);
    if (!damage.empty()) throw Fault("cudaFree: " + damage);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
    *p = std::malloc(bytes == 0 ? 1 : bytes);
    if (!*p) return emu::fail(cudaErrorMemoryAllocation);
    memory().pinned.insert(*p);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) { return cudaMallocHost(p, bytes); }

cudaError_t cudaFreeHost(void* p) {
    if (memory().pinned.erase(p) == 0) return emu::fail(cudaErrorInvalidValue);
    std::free(p);
    return cudaSuccess;
}

// As the driver: a range registers once, and unregisters by its start.
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned) {
    if (!p || bytes == 0) return emu::fail(cudaErrorInvalidValue);
    if (!memory().registered.emplace(p, bytes).second) return emu::fail(cudaErrorHostMemoryAlreadyRegistered);
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
    if (memory().registered.erase(p) == 0) return emu::fail(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}

namespace emu {
size_t registered_host_bytes() {
    size_t bytes = 0;
    for (const auto& [p, n] : memory().registered) bytes += n;
    return bytes;
}
}  // namespace emu

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    using namespace emu;
    const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice || (kind == cudaMemcpyDefault && is_device(dst));
    const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice || (kind == cudaMemcpyDefault && is_device(src));
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return fail(cudaErrorInvalidMemcpyDirection);
    if ((dst_device && !device_range_ok(dst, bytes, "cudaMemcpy destination")) || (src_device && !device_range_ok(src, bytes, "cudaMemcpy source")))
        return fail(cudaErrorInvalidValue);
    if (bytes > 0) std::memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) { return cudaMemcpy(dst, src, bytes, kind); }

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
    if (!emu::device_range_ok(p, bytes, "cudaMemset")) return emu::fail(cudaErrorInvalidValue);
    if (bytes > 0) std::memset(p, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) { return cudaMemset(p, value, bytes); }

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
    *stream = new CUstream_st{flags};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }

cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned) { return event ? cudaSuccess : emu::fail(cudaErrorInvalidResourceHandle); }

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
    *event = new CUevent_st{};
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
    if (!event) return emu::fail(cudaErrorInvalidResourceHandle);
    event->time = std::chrono::steady_clock::now();
    event->recorded = true;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) { return event ? cudaSuccess : emu::fail(cudaErrorInvalidResourceHandle); }
cudaError_t cudaEventQuery(cudaEvent_t event) { return event ? cudaSuccess : emu::fail(cudaErrorInvalidResourceHandle); }

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
    if (!start || !stop || !start->recorded || !stop->recorded) return emu::fail(cudaErrorInvalidResourceHandle);
    *ms = std::chrono::duration<float, std::milli>(stop->time - start->time).count();
    return cudaSuccess;
}
