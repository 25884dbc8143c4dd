// The NCCL and CUDA-stream entry points of a build without CUDA: each refuses with a clear error.
#include "parallel/nccl_comm.h"
#include "parallel/stream_collectives.h"
#include "parallel/stream_order.h"

namespace llmtrain {

namespace {
[[noreturn]] void no_cuda(const char* what) {
    fail(ErrorKind::unsupported, what, ": this llmtrain was built without CUDA and NCCL (no CUDA compiler was found at build time); use the MPI backend");
}
}  // namespace

std::unique_ptr<Comm> make_nccl_comm(Comm&, int, double) { no_cuda("NCCL communicator"); }
std::unique_ptr<StreamCollectives> make_nccl_collectives(Comm&, int, double, StreamOrder&) { no_cuda("NCCL communicator"); }
std::unique_ptr<StreamOrder> make_cuda_stream_order(void*) { no_cuda("CUDA streams"); }
std::string nccl_library_version() { return "not built"; }
BenchAllocator cuda_bench_allocator() { no_cuda("GPU buffers"); }

}  // namespace llmtrain
