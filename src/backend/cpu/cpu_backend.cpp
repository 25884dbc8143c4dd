// The CPU backend's construction, identity and support table; the ops live in the
// cpu_<family>.cpp files.
#include "backend/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <cstring>

namespace llmtrain {

std::string blas_library_version() { return openblas_get_config(); }

CpuBackend::CpuBackend(int threads) : threads_(threads > 0 ? threads : omp_get_max_threads()) {
    // BLAS runs inside the OpenMP threads, one call per block (cpu_matmul.cpp's gemm).
    openblas_set_num_threads(1);
}

std::string CpuBackend::name() const { return "cpu"; }

// Every op of the table is implemented for both float types and nothing else.

Memory CpuBackend::allocate(size_t bytes) {
    check_memory_limit(*held_, bytes);
    Memory memory = allocate_host_memory(bytes);
    *held_ += bytes;
    void* raw = memory.get();
    return Memory(raw, [memory = std::move(memory), held = held_, bytes](void*) mutable {
        memory.reset();
        *held -= bytes;
    });
}

void CpuBackend::copy_from_host(const Tensor& dst, const void* src) {
    if (dst.device() != Device::cpu) fail(ErrorKind::unsupported, "copy_from_host: destination is in ", device_name(dst.device()), " memory");
    if (dst.numel() > 0) std::memcpy(dst.raw(), src, dst.bytes());
}

void CpuBackend::copy_to_host(void* dst, const Tensor& src) {
    if (src.device() != Device::cpu) fail(ErrorKind::unsupported, "copy_to_host: source is in ", device_name(src.device()), " memory");
    if (src.numel() > 0) std::memcpy(dst, src.raw(), src.bytes());
}

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace llmtrain
