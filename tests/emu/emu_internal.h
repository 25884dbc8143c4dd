// Between the parts of the CUDA emulation: device memory (runtime.cpp), the launch scheduler
// (scheduler.cpp) and the cuBLASLt stand-in (cublaslt.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_runtime_api.h"

namespace emu {

// One cudaMalloc: [base, base + bytes) between two guard zones.
struct Allocation {
    unsigned char* base;
    size_t bytes;
    uint64_t id;  // in allocation order, from 1
};

// Poison of fresh device and shared memory: NaN in f32, f64, bf16 and f16 (and -1 as integers).
inline constexpr unsigned char kPoisonByte = 0xff;

// The allocation holding [p, p + bytes), or null.
const Allocation* find_allocation(const void* p, size_t bytes = 1);
std::vector<const Allocation*> live_allocations();
std::string describe(const Allocation& a);
// Throws Fault ("<context>: ...") when a guard zone of a live allocation changed.
void check_guards(const std::string& context);
// Records a launch configuration error for cudaGetLastError.
void set_last_error(cudaError_t error);
// The run's seed (LLMTRAIN_EMU_SEED, else random; printed once).
uint64_t seed();
// How many schedules each launch runs under (LLMTRAIN_EMU_SCHEDULES, default 2).
int schedules();
// Host memory registered with cudaHostRegister and not yet unregistered.
size_t registered_host_bytes();
// True while a kernel's thread runs (a fault is then a device fault, not a host throw).
bool in_device_code();

}  // namespace emu
