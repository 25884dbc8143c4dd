// The launch scheduler of the CUDA emulation: blocks one after another, the threads of a
// block as fibers on their own stacks, switched only at barriers and warp collectives.
//
// Race check: a phase is the stretch between two block barriers. Each phase runs the
// threads in an order of its own (forward, reverse or a seeded shuffle, rotating with the
// phase), and a warp whose collective completes runs on at once, ahead of the others, as far
// as its next collective. A launch runs under two such schedules (the second with other
// orders and the blocks in reverse), each from the same memory: the allocations the kernel's
// parameters point into are saved before the first run, its results kept, the memory
// restored and the launch run again. Results that differ depend on the order of threads
// between barriers: a missing barrier, or a block reading another's output.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>

#include "emu_internal.h"
#include "mma.h"

uint3 threadIdx{};
uint3 blockIdx{};
dim3 blockDim{};
dim3 gridDim{};

// ---- context switch --------------------------------------------------------------------------
// emu_switch(save, target): saves the callee-saved registers on the current stack, stores the
// stack pointer in *save and resumes the context whose stack pointer is `target`.
extern "C" void emu_switch(void** save, void* target);
extern "C" void emu_fiber_entry();
extern "C" [[noreturn]] void emu_fiber_main();
#if defined(__x86_64__)
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
    .globl emu_fiber_entry
    .type emu_fiber_entry, @function
emu_fiber_entry:
    call emu_fiber_main
    ud2
    .size emu_fiber_entry, .-emu_fiber_entry
)");
constexpr int kSavedRegisters = 6;
#elif defined(__aarch64__)
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, %function
emu_switch:
    sub sp, sp, #176
    stp x19, x20, [sp, #0]
    stp x21, x22, [sp, #16]
    stp x23, x24, [sp, #32]
    stp x25, x26, [sp, #48]
    stp x27, x28, [sp, #64]
    stp x29, x30, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mov x9, sp
    str x9, [x0]
    mov sp, x1
    ldp x19, x20, [sp, #0]
    ldp x21, x22, [sp, #16]
    ldp x23, x24, [sp, #32]
    ldp x25, x26, [sp, #48]
    ldp x27, x28, [sp, #64]
    ldp x29, x30, [sp, #80]
    ldp d8, d9, [sp, #96]
    ldp d10, d11, [sp, #112]
    ldp d12, d13, [sp, #128]
    ldp d14, d15, [sp, #144]
    add sp, sp, #176
    ret
    .size emu_switch, .-emu_switch
    .globl emu_fiber_entry
    .type emu_fiber_entry, %function
emu_fiber_entry:
    bl emu_fiber_main
    brk #0
    .size emu_fiber_entry, .-emu_fiber_entry
)");
#else
#error "the CUDA emulation's context switch is written for x86-64 and AArch64"
#endif

namespace emu {

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kMaxThreads = 1024;
constexpr size_t kDefaultSharedLimit = 48 * 1024;
constexpr size_t kSharedGuardBytes = 4096;

// A fiber's stack, with a PROT_NONE page below it: an overflow faults instead of corrupting.
struct Stack {
    unsigned char* mapping = nullptr;
    unsigned char* top() const { return mapping + getpagesize() + kStackBytes; }
};

Stack make_stack() {
    const size_t page = static_cast<size_t>(getpagesize());
    void* m = mmap(nullptr, page + kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) throw Fault("emu: cannot map a fiber stack");
    mprotect(m, page, PROT_NONE);
    return {static_cast<unsigned char*>(m)};
}

enum class State { runnable, at_barrier, at_warp, exited };
enum class OpKind { sync, shuffle, vote, wmma_load, wmma_store, wmma_mma };

// The arguments and result of one lane's part in a warp collective.
struct WarpCall {
    OpKind kind;
    Site site;
    unsigned mask;
    uint64_t value;
    int arg, width, sub;  // sub: Shuffle or Vote kind
    // WMMA
    FragmentKind fragment;
    ElementType type;
    void* elements;
    const void* a;
    const void* b;
    const float* c;
    const void* memory;
    unsigned ldm;
    bool col_major, a_col, b_col;
    uint64_t result;
};

struct Fiber {
    void* sp = nullptr;
    uint3 tid{};
    int linear = 0, warp = 0, lane = 0;
    State state = State::exited;
    Site site{};        // where it waits
    int predicate = 0;  // __syncthreads_count/and/or
    int reduce = 0;
    int barrier_result = 0;
    WarpCall call{};
    bool completed_collective = false;  // its arrival completed a warp collective
};

// A collective some lanes of a warp have reached.
struct Gathering {
    unsigned mask, arrived;
    OpKind kind;
    Site site;
};

struct Launch {
    const LaunchConfig* config = nullptr;
    void (*invoke)(void*) = nullptr;
    void* context = nullptr;
    std::string name;
    dim3 block_index{};
    std::vector<Fiber> fibers;
    std::vector<std::vector<Gathering>> gatherings;  // per warp
    std::vector<unsigned> warp_lanes;                 // lanes that exist, per warp
    std::string fault;
};

struct Scheduler {
    std::vector<Stack> stacks;
    void* host_sp = nullptr;
    Fiber* current = nullptr;
    Launch* launch = nullptr;
    unsigned char* dynamic_shared = nullptr;
    size_t dynamic_shared_bytes = 0, dynamic_shared_capacity = 0;
    std::vector<std::pair<unsigned char*, size_t>> static_shared;
    std::map<const void*, int> max_dynamic_shared;
    // WMMA lane mappings: for each fragment kind, element i of lane l is tile entry map[l * 8 + i].
    std::array<std::array<uint8_t, 256>, 5> fragment_map{};
    bool maps_ready = false;
};

Scheduler& sched() {
    static Scheduler s;
    return s;
}

std::string site_text(Site s) {
    const char* base = std::strrchr(s.file, '/');
    return std::string(base ? base + 1 : s.file) + ":" + std::to_string(s.line);
}

std::string dim_text(dim3 d) {
    std::ostringstream text;
    text << "(" << d.x << ", " << d.y << ", " << d.z << ")";
    return text.str();
}

std::string where(const Launch& l, const Fiber* f) {
    std::string s = "kernel " + l.name + ", block " + dim_text(l.block_index);
    if (f) s += ", thread " + dim_text(dim3(f->tid.x, f->tid.y, f->tid.z));
    return s;
}

void ensure_fragment_maps() {
    Scheduler& s = sched();
    if (s.maps_ready) return;
    std::mt19937_64 rng(seed() ^ 0x9e3779b97f4a7c15ull);
    for (auto& map : s.fragment_map) {
        std::iota(map.begin(), map.end(), uint8_t{0});
        std::shuffle(map.begin(), map.end(), rng);
    }
    s.maps_ready = true;
}

// ---- fiber side ----

// Back to the scheduler; returns when the scheduler resumes this fiber.
void yield_to_scheduler() {
    Scheduler& s = sched();
    Fiber* f = s.current;
    emu_switch(&f->sp, s.host_sp);
}

Fiber& current_fiber() {
    Fiber* f = sched().current;
    if (!f) throw Fault("emu: a device builtin was called outside a kernel");
    return *f;
}

}  // namespace

[[noreturn]] void device_fault(const std::string& message) {
    Scheduler& s = sched();
    if (!s.current) throw Fault(message);
    Fiber& f = *s.current;
    if (s.launch->fault.empty()) s.launch->fault = where(*s.launch, &f) + ": " + message;
    f.state = State::exited;
    yield_to_scheduler();
    std::abort();  // never resumed
}

bool in_device_code() { return sched().current != nullptr; }

}  // namespace emu

extern "C" [[noreturn]] void emu_fiber_main() {
    using namespace emu;
    Scheduler& s = sched();
    s.launch->invoke(s.launch->context);
    s.current->state = State::exited;
    yield_to_scheduler();
    std::abort();
}

namespace emu {

namespace {

// ---- warp collectives ----

unsigned lane_bit(int lane) { return 1u << lane; }

// The lane joins the gathering of its warp for `call`; returns once every lane of the mask
// arrived and the collective is done (call.result set).
void join_collective(const WarpCall& call) {
    Scheduler& s = sched();
    Launch& l = *s.launch;
    Fiber& f = current_fiber();
    if ((call.mask & lane_bit(f.lane)) == 0)
        device_fault("warp collective at " + site_text(call.site) + " called by lane " + std::to_string(f.lane) + ", which is not in its mask");
    const unsigned mask = call.mask & l.warp_lanes[static_cast<size_t>(f.warp)];
    auto& gatherings = l.gatherings[static_cast<size_t>(f.warp)];
    Gathering* g = nullptr;
    for (Gathering& candidate : gatherings) {
        if (candidate.mask == mask) {
            g = &candidate;
        } else if (candidate.mask & mask) {
            device_fault("warp collective at " + site_text(call.site) + " with mask " + std::to_string(mask) + " overlaps one at " +
                         site_text(candidate.site) + " with mask " + std::to_string(candidate.mask));
        }
    }
    if (!g) {
        gatherings.push_back({mask, 0, call.kind, call.site});
        g = &gatherings.back();
    } else if (g->kind != call.kind || g->site.line != call.site.line || std::strcmp(g->site.file, call.site.file) != 0) {
        device_fault("divergent warp collectives: lane " + std::to_string(f.lane) + " at " + site_text(call.site) + " while other lanes wait at " +
                     site_text(g->site));
    }
    f.call = call;
    f.call.mask = mask;
    g->arrived |= lane_bit(f.lane);
    f.state = State::at_warp;
    f.completed_collective = g->arrived == mask;
    yield_to_scheduler();
}

Fiber& lane_fiber(Launch& l, int warp, int lane) { return l.fibers[static_cast<size_t>(warp * 32 + lane)]; }

void require_uniform(Launch& l, int warp, unsigned mask, bool (*same)(const WarpCall&, const WarpCall&), const char* what) {
    const WarpCall* first = nullptr;
    for (int lane = 0; lane < 32; ++lane) {
        if (!(mask & lane_bit(lane))) continue;
        const WarpCall& c = lane_fiber(l, warp, lane).call;
        if (!first) first = &c;
        else if (!same(*first, c))
            throw Fault(where(l, &lane_fiber(l, warp, lane)) + ": " + what + " at " + site_text(c.site) + " with arguments that differ between lanes");
    }
}

template <class T>
T element_to_float(ElementType type, const void* p, size_t i) {
    switch (type) {
        case ElementType::f16: return __half2float(static_cast<const __half*>(p)[i]);
        case ElementType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
        default: return static_cast<const float*>(p)[i];
    }
}

size_t element_bytes(ElementType type) { return type == ElementType::f32 ? 4 : 2; }

// Tile entry e (row-major index in the 16 x 16 tile) at its place in memory.
size_t memory_index(int entry, unsigned ldm, bool col_major) {
    const int r = entry / 16, c = entry % 16;
    return col_major ? static_cast<size_t>(c) * ldm + r : static_cast<size_t>(r) * ldm + c;
}

void check_wmma_memory(Launch& l, const Fiber& f, const WarpCall& c, const void* p, ElementType type) {
    const size_t bytes = element_bytes(type);
    const auto address = reinterpret_cast<uintptr_t>(p);
    const std::string at = where(l, &f) + ": WMMA " + (c.kind == OpKind::wmma_store ? "store" : "load") + " at " + site_text(c.site);
    if (address % 32 != 0) throw Fault(at + ": the tile pointer " + std::to_string(address) + " is not 32-byte aligned");
    if ((c.ldm * bytes) % 16 != 0 || c.ldm < 16)
        throw Fault(at + ": leading dimension " + std::to_string(c.ldm) + " is not a multiple of 16 bytes of at least 16 elements");
    try {
        check_access(p, (15 * static_cast<size_t>(c.ldm) + 16) * bytes, "WMMA tile");
    } catch (const Fault& e) {
        throw Fault(at + ": " + e.what());
    }
}

void complete_wmma_load(Launch& l, int warp, unsigned mask) {
    Scheduler& s = sched();
    require_uniform(
        l, warp, mask,
        [](const WarpCall& a, const WarpCall& b) { return a.memory == b.memory && a.ldm == b.ldm && a.col_major == b.col_major && a.fragment == b.fragment; },
        "wmma::load_matrix_sync");
    const WarpCall& first = lane_fiber(l, warp, __builtin_ctz(mask)).call;
    check_wmma_memory(l, lane_fiber(l, warp, __builtin_ctz(mask)), first, first.memory, first.type);
    const auto& map = s.fragment_map[static_cast<size_t>(first.fragment)];
    const size_t bytes = element_bytes(first.type);
    for (int lane = 0; lane < 32; ++lane) {
        if (!(mask & lane_bit(lane))) continue;
        WarpCall& c = lane_fiber(l, warp, lane).call;
        for (int i = 0; i < 8; ++i) {
            const size_t index = memory_index(map[static_cast<size_t>(lane * 8 + i)], c.ldm, c.col_major);
            std::memcpy(static_cast<unsigned char*>(c.elements) + i * bytes, static_cast<const unsigned char*>(c.memory) + index * bytes, bytes);
        }
    }
}

void complete_wmma_store(Launch& l, int warp, unsigned mask) {
    Scheduler& s = sched();
    require_uniform(
        l, warp, mask, [](const WarpCall& a, const WarpCall& b) { return a.memory == b.memory && a.ldm == b.ldm && a.col_major == b.col_major; },
        "wmma::store_matrix_sync");
    const WarpCall& first = lane_fiber(l, warp, __builtin_ctz(mask)).call;
    check_wmma_memory(l, lane_fiber(l, warp, __builtin_ctz(mask)), first, first.memory, ElementType::f32);
    const auto& map = s.fragment_map[static_cast<size_t>(FragmentKind::accumulator)];
    for (int lane = 0; lane < 32; ++lane) {
        if (!(mask & lane_bit(lane))) continue;
        const WarpCall& c = lane_fiber(l, warp, lane).call;
        float* dst = static_cast<float*>(const_cast<void*>(c.memory));
        for (int i = 0; i < 8; ++i) dst[memory_index(map[static_cast<size_t>(lane * 8 + i)], c.ldm, c.col_major)] = static_cast<const float*>(c.elements)[i];
    }
}

// D = A B + C over the whole warp's fragments, in fp32 (the 16-bit products are exact).
void complete_wmma_mma(Launch& l, int warp, unsigned mask) {
    Scheduler& s = sched();
    if (mask != l.warp_lanes[static_cast<size_t>(warp)] || mask != 0xffffffffu)
        throw Fault(where(l, nullptr) + ": wmma::mma_sync needs the whole warp");
    const WarpCall& first = lane_fiber(l, warp, 0).call;
    const auto& map_a = s.fragment_map[static_cast<size_t>(first.a_col ? FragmentKind::a_col : FragmentKind::a_row)];
    const auto& map_b = s.fragment_map[static_cast<size_t>(first.b_col ? FragmentKind::b_col : FragmentKind::b_row)];
    const auto& map_c = s.fragment_map[static_cast<size_t>(FragmentKind::accumulator)];
    float a[256], b[256], c[256];
    for (int lane = 0; lane < 32; ++lane) {
        const WarpCall& k = lane_fiber(l, warp, lane).call;
        if (k.type != first.type || k.a_col != first.a_col || k.b_col != first.b_col)
            throw Fault(where(l, nullptr) + ": wmma::mma_sync at " + site_text(k.site) + " with fragment types that differ between lanes");
        for (int i = 0; i < 8; ++i) {
            const size_t slot = static_cast<size_t>(lane * 8 + i);
            a[map_a[slot]] = element_to_float<float>(k.type, k.a, static_cast<size_t>(i));
            b[map_b[slot]] = element_to_float<float>(k.type, k.b, static_cast<size_t>(i));
            c[map_c[slot]] = k.c[i];
        }
    }
    float d[256];
    for (int r = 0; r < 16; ++r)
        for (int col = 0; col < 16; ++col) {
            float acc = c[r * 16 + col];
            for (int k = 0; k < 16; ++k) acc += a[r * 16 + k] * b[k * 16 + col];
            d[r * 16 + col] = acc;
        }
    for (int lane = 0; lane < 32; ++lane) {
        const WarpCall& k = lane_fiber(l, warp, lane).call;
        for (int i = 0; i < 8; ++i) static_cast<float*>(k.elements)[i] = d[map_c[static_cast<size_t>(lane * 8 + i)]];
    }
}

void complete_shuffle(Launch& l, int warp, unsigned mask) {
    for (int lane = 0; lane < 32; ++lane) {
        if (!(mask & lane_bit(lane))) continue;
        WarpCall& c = lane_fiber(l, warp, lane).call;
        const int width = c.width;
        if (width < 1 || width > 32 || (width & (width - 1)) != 0)
            throw Fault(where(l, &lane_fiber(l, warp, lane)) + ": shuffle at " + site_text(c.site) + " with width " + std::to_string(width));
        const int segment = lane & ~(width - 1);
        int source = lane;
        switch (static_cast<Shuffle>(c.sub)) {
            case Shuffle::index: source = segment + (c.arg & (width - 1)); break;
            case Shuffle::up: source = lane - c.arg >= segment ? lane - c.arg : lane; break;
            case Shuffle::down: source = lane + c.arg < segment + width ? lane + c.arg : lane; break;
            case Shuffle::xor_: source = lane ^ c.arg; source = source >= segment + width ? lane : source; break;
        }
        if (source < 0 || source > 31 || !(mask & lane_bit(source)))
            throw Fault(where(l, &lane_fiber(l, warp, lane)) + ": shuffle at " + site_text(c.site) + " reads lane " + std::to_string(source) +
                        ", which is not in the mask");
        c.result = lane_fiber(l, warp, source).call.value;
    }
}

void complete_vote(Launch& l, int warp, unsigned mask) {
    unsigned ballot = 0;
    for (int lane = 0; lane < 32; ++lane)
        if ((mask & lane_bit(lane)) && lane_fiber(l, warp, lane).call.value) ballot |= lane_bit(lane);
    for (int lane = 0; lane < 32; ++lane) {
        if (!(mask & lane_bit(lane))) continue;
        WarpCall& c = lane_fiber(l, warp, lane).call;
        switch (static_cast<Vote>(c.sub)) {
            case Vote::all: c.result = ballot == mask; break;
            case Vote::any: c.result = ballot != 0; break;
            case Vote::ballot: c.result = ballot; break;
        }
    }
}

// Runs the collective the lanes of `mask` in `warp` gathered for (host side, all lanes arrived).
void complete_collective(Launch& l, int warp, const Gathering& g) {
    switch (g.kind) {
        case OpKind::sync: break;
        case OpKind::shuffle: complete_shuffle(l, warp, g.mask); break;
        case OpKind::vote: complete_vote(l, warp, g.mask); break;
        case OpKind::wmma_load: complete_wmma_load(l, warp, g.mask); break;
        case OpKind::wmma_store: complete_wmma_store(l, warp, g.mask); break;
        case OpKind::wmma_mma: complete_wmma_mma(l, warp, g.mask); break;
    }
}

}  // namespace

// ---- device builtins ----

int block_barrier(Site site, int predicate, int reduce) {
    Fiber& f = current_fiber();
    f.site = site;
    f.predicate = predicate;
    f.reduce = reduce;
    f.state = State::at_barrier;
    yield_to_scheduler();
    return f.barrier_result;
}

void warp_sync(Site site, unsigned mask) {
    WarpCall c{};
    c.kind = OpKind::sync;
    c.site = site;
    c.mask = mask;
    join_collective(c);
}

uint64_t warp_shuffle(Site site, Shuffle kind, unsigned mask, uint64_t value, int arg, int width) {
    WarpCall c{};
    c.kind = OpKind::shuffle;
    c.site = site;
    c.mask = mask;
    c.value = value;
    c.arg = arg;
    c.width = width;
    c.sub = static_cast<int>(kind);
    join_collective(c);
    return current_fiber().call.result;
}

unsigned warp_vote(Site site, Vote kind, unsigned mask, int predicate) {
    WarpCall c{};
    c.kind = OpKind::vote;
    c.site = site;
    c.mask = mask;
    c.value = predicate != 0;
    c.sub = static_cast<int>(kind);
    join_collective(c);
    return static_cast<unsigned>(current_fiber().call.result);
}

unsigned active_mask() {
    Launch& l = *sched().launch;
    const Fiber& f = current_fiber();
    unsigned mask = 0;
    for (int lane = 0; lane < 32; ++lane)
        if ((l.warp_lanes[static_cast<size_t>(f.warp)] & lane_bit(lane)) && lane_fiber(l, f.warp, lane).state != State::exited) mask |= lane_bit(lane);
    return mask;
}

void wmma_load(Site site, FragmentKind kind, ElementType type, void* elements, const void* src, unsigned ldm, bool col_major) {
    ensure_fragment_maps();
    WarpCall c{};
    c.kind = OpKind::wmma_load;
    c.site = site;
    c.mask = 0xffffffffu;
    c.fragment = kind;
    c.type = type;
    c.elements = elements;
    c.memory = src;
    c.ldm = ldm;
    c.col_major = col_major;
    join_collective(c);
}

void wmma_store(Site site, void* dst, const float* elements, unsigned ldm, bool col_major) {
    ensure_fragment_maps();
    WarpCall c{};
    c.kind = OpKind::wmma_store;
    c.site = site;
    c.mask = 0xffffffffu;
    c.type = ElementType::f32;
    c.elements = const_cast<float*>(elements);
    c.memory = dst;
    c.ldm = ldm;
    c.col_major = col_major;
    join_collective(c);
}

void wmma_mma(Site site, ElementType type, float* d, const void* a, bool a_col, const void* b, bool b_col, const float* c_in) {
    ensure_fragment_maps();
    WarpCall c{};
    c.kind = OpKind::wmma_mma;
    c.site = site;
    c.mask = 0xffffffffu;
    c.type = type;
    c.elements = d;
    c.a = a;
    c.b = b;
    c.c = c_in;
    c.a_col = a_col;
    c.b_col = b_col;
    join_collective(c);
}

void* dynamic_shared() {
    current_fiber();
    return sched().dynamic_shared;
}

void* register_static_shared(size_t bytes, size_t alignment) {
    void* p = std::aligned_alloc(std::max<size_t>(alignment, 16), (bytes + 15) / 16 * 16);
    if (!p) throw Fault("emu: cannot allocate static shared memory");
    std::memset(p, kPoisonByte, bytes);
    sched().static_shared.emplace_back(static_cast<unsigned char*>(p), bytes);
    return p;
}

void check_access(const void* p, size_t bytes, const char* what) {
    const Scheduler& s = sched();
    const auto address = reinterpret_cast<uintptr_t>(p);
    const auto inside = [&](const unsigned char* base, size_t size) {
        const auto b = reinterpret_cast<uintptr_t>(base);
        return address >= b && address + bytes <= b + size;
    };
    if (find_allocation(p, bytes)) return;
    if (s.launch && s.dynamic_shared && inside(s.dynamic_shared, s.dynamic_shared_bytes)) return;
    for (const auto& [base, size] : s.static_shared)
        if (inside(base, size)) return;
    const std::string message = std::string(what) + ": [" + std::to_string(address) + ", +" + std::to_string(bytes) +
                                " bytes) is outside device memory and the block's shared memory";
    if (in_device_code()) device_fault(message);
    throw Fault("emu: " + message);
}

void set_max_dynamic_shared(const void* kernel, int bytes) { sched().max_dynamic_shared[kernel] = bytes; }

namespace {

// ---- the scheduler proper ----

// The order of the threads in one phase: forward, reverse or shuffled, rotating with the
// phase and shifted by the schedule.
std::vector<int> phase_order(int threads, int schedule, uint64_t block, int phase) {
    std::vector<int> order(static_cast<size_t>(threads));
    std::iota(order.begin(), order.end(), 0);
    switch ((phase + schedule) % 3) {
        case 0: break;
        case 1: std::reverse(order.begin(), order.end()); break;
        default: {
            std::mt19937_64 rng(seed() * 0x2545f4914f6cdd1dull + (block << 20) + static_cast<uint64_t>(phase) * 7919 + static_cast<uint64_t>(schedule));
            std::shuffle(order.begin(), order.end(), rng);
        }
    }
    return order;
}

void resume(Fiber& f) {
    Scheduler& s = sched();
    s.current = &f;
    threadIdx = f.tid;
    emu_switch(&s.host_sp, f.sp);
    s.current = nullptr;
}

void start_fiber(Fiber& f, const Stack& stack) {
    auto* top = reinterpret_cast<void**>(reinterpret_cast<uintptr_t>(stack.top()) & ~uintptr_t{15});
#if defined(__x86_64__)
    // emu_switch pops kSavedRegisters registers and returns into emu_fiber_entry, which calls
    // emu_fiber_main with the stack 16-byte aligned.
    top -= 8;  // spare room above the first frame
    top -= 1;  // after the return into it, the stack is 16-byte aligned for the call
    top[0] = reinterpret_cast<void*>(&emu_fiber_entry);
    top -= kSavedRegisters;
    for (int i = 0; i < kSavedRegisters; ++i) top[i] = nullptr;
    f.sp = top;
#else
    // 176 bytes of saved registers; x30 (the return address) at offset 88.
    auto* frame = reinterpret_cast<unsigned char*>(top) - 176;
    std::memset(frame, 0, 176);
    void* entry = reinterpret_cast<void*>(&emu_fiber_entry);
    std::memcpy(frame + 88, &entry, sizeof entry);
    f.sp = frame;
#endif
    f.state = State::runnable;
}

[[noreturn]] void block_fault(Launch& l, const std::string& message) { throw Fault(where(l, nullptr) + ": " + message); }

// After every runnable thread is blocked or done: releases a block barrier or reports a deadlock.
// Returns false when every thread has exited.
bool release_barrier(Launch& l) {
    int exited = 0, at_barrier = 0;
    const Fiber* first = nullptr;
    for (Fiber& f : l.fibers) {
        if (f.state == State::at_warp) {
            const Gathering& g = l.gatherings[static_cast<size_t>(f.warp)].front();
            unsigned missing = g.mask & ~g.arrived;
            std::ostringstream lanes;
            for (int lane = 0; lane < 32; ++lane)
                if (missing & lane_bit(lane))
                    lanes << " " << lane << (lane_fiber(l, f.warp, lane).state == State::exited ? " (exited)" : " (at __syncthreads)");
            block_fault(l, "warp " + std::to_string(f.warp) + " waits at the collective at " + site_text(g.site) + " for lanes that never reach it:" +
                               lanes.str());
        }
        if (f.state == State::exited) ++exited;
        if (f.state == State::at_barrier) {
            ++at_barrier;
            if (!first) first = &f;
            else if (f.site.line != first->site.line || std::strcmp(f.site.file, first->site.file) != 0)
                block_fault(l, "divergent __syncthreads: thread " + dim_text(dim3(f.tid.x, f.tid.y, f.tid.z)) + " waits at " + site_text(f.site) +
                                   ", thread " + dim_text(dim3(first->tid.x, first->tid.y, first->tid.z)) + " at " + site_text(first->site));
        }
    }
    if (at_barrier == 0) return false;
    if (exited > 0)
        block_fault(l, "__syncthreads at " + site_text(first->site) + " reached by " + std::to_string(at_barrier) + " threads while " +
                           std::to_string(exited) + " threads of the block have exited");
    int count = 0;
    for (const Fiber& f : l.fibers) count += f.predicate;
    for (Fiber& f : l.fibers) {
        f.state = State::runnable;
        // __syncthreads_count, _and, _or (every thread is at the same site, so of the same kind).
        f.barrier_result = f.reduce == 1 ? count : f.reduce == 2 ? count == at_barrier : f.reduce == 3 ? count > 0 : 0;
    }
    return true;
}

// Resumes lane fibers of a completed collective ahead of everyone else, in the phase's order.
void push_lanes_front(std::deque<int>& queue, int warp, unsigned mask, const std::vector<int>& rank) {
    std::vector<int> lanes;
    for (int lane = 0; lane < 32; ++lane)
        if (mask & lane_bit(lane)) lanes.push_back(warp * 32 + lane);
    std::sort(lanes.begin(), lanes.end(), [&](int a, int b) { return rank[static_cast<size_t>(a)] < rank[static_cast<size_t>(b)]; });
    for (auto it = lanes.rbegin(); it != lanes.rend(); ++it) queue.push_front(*it);
}

void run_block(Launch& l, int schedule, uint64_t block_number) {
    Scheduler& s = sched();
    const dim3 b = l.config->block;
    const int threads = static_cast<int>(b.x * b.y * b.z);
    if (s.stacks.size() < static_cast<size_t>(threads))
        while (s.stacks.size() < static_cast<size_t>(threads)) s.stacks.push_back(make_stack());
    if (s.dynamic_shared) std::memset(s.dynamic_shared, kPoisonByte, s.dynamic_shared_capacity);
    for (auto& [base, size] : s.static_shared) std::memset(base, kPoisonByte, size);

    l.fibers.assign(static_cast<size_t>(threads), Fiber{});
    const int warps = (threads + 31) / 32;
    l.gatherings.assign(static_cast<size_t>(warps), {});
    l.warp_lanes.assign(static_cast<size_t>(warps), 0);
    for (int t = 0; t < threads; ++t) {
        Fiber& f = l.fibers[static_cast<size_t>(t)];
        f.tid = {static_cast<unsigned>(t) % b.x, static_cast<unsigned>(t) / b.x % b.y, static_cast<unsigned>(t) / (b.x * b.y)};
        f.linear = t;
        f.warp = t / 32;
        f.lane = t % 32;
        l.warp_lanes[static_cast<size_t>(f.warp)] |= lane_bit(f.lane);
        start_fiber(f, s.stacks[static_cast<size_t>(t)]);
    }

    for (int phase = 0;; ++phase) {
        const std::vector<int> order = phase_order(threads, schedule, block_number, phase);
        std::vector<int> rank(static_cast<size_t>(threads));
        for (int i = 0; i < threads; ++i) rank[static_cast<size_t>(order[static_cast<size_t>(i)])] = i;
        std::deque<int> queue(order.begin(), order.end());
        while (!queue.empty()) {
            Fiber& f = l.fibers[static_cast<size_t>(queue.front())];
            queue.pop_front();
            if (f.state != State::runnable) continue;
            resume(f);
            if (!l.fault.empty()) throw Fault(l.fault);
            if (f.state == State::at_warp && f.completed_collective) {
                f.completed_collective = false;
                auto& gatherings = l.gatherings[static_cast<size_t>(f.warp)];
                auto it = std::find_if(gatherings.begin(), gatherings.end(), [&](const Gathering& g) { return g.mask & lane_bit(f.lane); });
                const Gathering g = *it;
                gatherings.erase(it);
                complete_collective(l, f.warp, g);
                for (int lane = 0; lane < 32; ++lane)
                    if (g.mask & lane_bit(lane)) lane_fiber(l, f.warp, lane).state = State::runnable;
                push_lanes_front(queue, f.warp, g.mask, rank);
            }
        }
        if (!release_barrier(l)) break;
    }
    if (s.dynamic_shared) {
        for (size_t i = s.dynamic_shared_bytes; i < s.dynamic_shared_capacity; ++i)
            if (s.dynamic_shared[i] != kPoisonByte)
                block_fault(l, "wrote " + std::to_string(i - s.dynamic_shared_bytes) + " bytes past the " + std::to_string(s.dynamic_shared_bytes) +
                                   " bytes of dynamic shared memory");
    }
}

void run_grid(Launch& l, int schedule) {
    const dim3 g = l.config->grid;
    const uint64_t blocks = uint64_t{g.x} * g.y * g.z;
    gridDim = g;
    blockDim = l.config->block;
    for (uint64_t i = 0; i < blocks; ++i) {
        const uint64_t n = schedule % 2 == 0 ? i : blocks - 1 - i;
        l.block_index = dim3(static_cast<unsigned>(n % g.x), static_cast<unsigned>(n / g.x % g.y), static_cast<unsigned>(n / (uint64_t{g.x} * g.y)));
        blockIdx = {l.block_index.x, l.block_index.y, l.block_index.z};
        run_block(l, schedule, n);
    }
}

// The allocations a launch may write: those its parameters (pointers, or structs holding
// them) point into.
std::vector<const Allocation*> reachable_allocations(const std::vector<ParamBytes>& params) {
    std::vector<const Allocation*> out;
    for (const ParamBytes& p : params)
        for (size_t offset = 0; offset + sizeof(void*) <= p.size; offset += sizeof(void*)) {
            void* value;
            std::memcpy(&value, static_cast<const unsigned char*>(p.data) + offset, sizeof value);
            if (const Allocation* a = find_allocation(value)) {
                if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
            }
        }
    return out;
}

using Snapshot = std::vector<std::vector<unsigned char>>;

Snapshot take(const std::vector<const Allocation*>& allocations) {
    Snapshot s;
    for (const Allocation* a : allocations) s.emplace_back(a->base, a->base + a->bytes);
    return s;
}

void restore(const std::vector<const Allocation*>& allocations, const Snapshot& s) {
    for (size_t i = 0; i < allocations.size(); ++i) std::memcpy(allocations[i]->base, s[i].data(), s[i].size());
}

bool valid_config(const LaunchConfig& c, size_t shared_limit) {
    const auto bad = [&](const char* why) {
        std::fprintf(stderr, "emu: kernel %s: invalid launch: %s (grid (%u, %u, %u), block (%u, %u, %u), %zu bytes of dynamic shared memory)\n", c.name,
                     why, c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z, c.shared_bytes);
        return false;
    };
    const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
    if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || c.grid.y > 65535 || c.grid.z > 65535) return bad("grid dimensions");
    if (threads == 0 || threads > kMaxThreads || c.block.z > 64) return bad("block dimensions");
    if (c.shared_bytes > shared_limit) return bad("more dynamic shared memory than the kernel's limit (cudaFuncSetAttribute)");
    return true;
}

void prepare_dynamic_shared(size_t bytes) {
    Scheduler& s = sched();
    const size_t capacity = bytes + kSharedGuardBytes;
    if (capacity > s.dynamic_shared_capacity) {
        std::free(s.dynamic_shared);
        s.dynamic_shared = static_cast<unsigned char*>(std::aligned_alloc(1024, (capacity + 1023) / 1024 * 1024));
        if (!s.dynamic_shared) throw Fault("emu: cannot allocate dynamic shared memory");
        s.dynamic_shared_capacity = capacity;
    }
    s.dynamic_shared_bytes = bytes;
}

// A fault (SIGSEGV, SIGBUS) inside a kernel names it before the process ends.
void report_crash(int signal_number) {
    const Scheduler& s = sched();
    if (s.launch && s.current) {
        const std::string text = "emu: signal " + std::to_string(signal_number) + " in " + where(*s.launch, s.current) +
                                 " (an access outside any allocation, or a fiber stack overflow)\n";
        (void)!write(2, text.data(), text.size());
    }
    ::signal(signal_number, SIG_DFL);
    ::raise(signal_number);
}

void install_crash_report() {
    static bool installed = false;
    if (installed) return;
    installed = true;
    static std::vector<unsigned char> alternate(1 << 16);
    stack_t ss{};
    ss.ss_sp = alternate.data();
    ss.ss_size = alternate.size();
    sigaltstack(&ss, nullptr);
    struct sigaction sa {};
    sa.sa_handler = report_crash;
    sa.sa_flags = SA_ONSTACK | SA_RESETHAND;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
}

}  // namespace

void run_launch(const LaunchConfig& config, const void* kernel, void (*invoke)(void*), void* context, const std::vector<ParamBytes>& params) {
    Scheduler& s = sched();
    if (s.launch) throw Fault("emu: kernel " + std::string(config.name) + " launched from device code");
    const auto limit_it = s.max_dynamic_shared.find(kernel);
    const size_t limit = limit_it == s.max_dynamic_shared.end() ? kDefaultSharedLimit : static_cast<size_t>(limit_it->second);
    if (!valid_config(config, limit)) {
        set_last_error(config.shared_bytes > limit ? cudaErrorInvalidValue : cudaErrorInvalidConfiguration);
        return;
    }
    install_crash_report();
    seed();
    Launch l;
    l.config = &config;
    l.invoke = invoke;
    l.context = context;
    l.name = config.name;
    prepare_dynamic_shared(config.shared_bytes);
    const std::vector<const Allocation*> reachable = reachable_allocations(params);
    const int runs = schedules();
    Snapshot before, first_result;
    if (runs > 1) before = take(reachable);
    s.launch = &l;
    try {
        for (int schedule = 0; schedule < runs; ++schedule) {
            if (schedule > 0) restore(reachable, before);
            run_grid(l, schedule);
            check_guards("kernel " + l.name);
            if (schedule == 0 && runs > 1) {
                first_result = take(reachable);
                continue;
            }
            if (schedule == 0) continue;
            for (size_t i = 0; i < reachable.size(); ++i) {
                const Allocation& a = *reachable[i];
                const auto mismatch = std::mismatch(first_result[i].begin(), first_result[i].end(), a.base);
                if (mismatch.first != first_result[i].end())
                    throw Fault("kernel " + l.name + ": the result depends on the order of the threads (a missing __syncthreads or __syncwarp?): " +
                                describe(a) + " differs at byte " + std::to_string(mismatch.first - first_result[i].begin()) +
                                " between two schedules of the same launch");
            }
        }
    } catch (...) {
        s.launch = nullptr;
        s.current = nullptr;
        throw;
    }
    s.launch = nullptr;
}

}  // namespace emu
