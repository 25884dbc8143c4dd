// NcclCollectives (stream_collectives.h) and NcclComm (nccl_comm.h). NCCL calls are issued on
// a non-blocking communicator (ncclConfig_t.blocking = 0), so that even initialization and a
// stuck enqueue can be bounded in time: ncclInProgress is polled with ncclCommGetAsyncError
// against the deadline.
#include "parallel/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "parallel/stream_collectives.h"

namespace llmtrain {

namespace {

void check_cuda(cudaError_t code, const std::string& what) {
    if (code != cudaSuccess) fail(ErrorKind::runtime, what, ": ", cudaGetErrorString(code));
}

// bf16 and f16 are reduced by NCCL itself (ncclBfloat16 / ncclFloat16).
ncclDataType_t nccl_type(DType dtype, bool reduction) {
    switch (dtype) {
        case DType::f32: return ncclFloat32;
        case DType::f64: return ncclFloat64;
        case DType::bf16: return ncclBfloat16;
        case DType::f16: return ncclFloat16;
        case DType::i32: return ncclInt32;
        case DType::u16:
            if (reduction) fail(ErrorKind::unsupported, "NCCL reductions of u16 tensors");
            return ncclFloat16;  // moved as 2-byte words, never added
        case DType::e4m3:
        case DType::e5m2:
            if (reduction) fail(ErrorKind::unsupported, "NCCL reductions of FP8 bytes");
            return ncclUint8;  // gathered as bytes (fp8.param_gather)
    }
    return ncclUint8;
}

// NCCL reduces bf16 and f16 in their own dtype (2 bytes per element on the wire), which is
// what both sums ask of it (comm.h).
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::max ? ncclMax : ncclSum; }

// One NCCL communicator over the ranks of a bootstrap Comm; operations are enqueued on the
// stream stream_of(id) gives.
class NcclCollectives final : public StreamCollectives {
public:
    NcclCollectives(Comm& bootstrap, int device, double timeout_seconds, std::function<cudaStream_t(StreamId)> stream_of)
        : description_(bootstrap.describe()), timeout_seconds_(timeout_seconds), rank_(bootstrap.rank()), size_(bootstrap.size()), stream_of_(std::move(stream_of)) {
        check_cuda(cudaSetDevice(device), cat("cudaSetDevice(", device, ")"));
        ncclUniqueId id{};
        if (bootstrap.rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
        bootstrap.broadcast(Tensor(&id, DType::u16, {static_cast<int64_t>(sizeof id / 2)}), 0);
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        settle(ncclCommInitRankConfig(&comm_, size_, id, bootstrap.rank(), &config), "ncclCommInitRank");
    }
    ~NcclCollectives() override {
        if (comm_ && !aborted_) ncclCommDestroy(comm_);
    }

    void all_reduce(const Tensor& data, ReduceOp op, StreamId stream) override {
        expect_device("all_reduce", data);
        settle(ncclAllReduce(data.raw(), data.raw(), count(data), nccl_type(data.dtype(), true), nccl_op(op), comm_,
                             stream_of_(stream)),
               "all_reduce");
    }
    void reduce_scatter(const Tensor& out, const Tensor& in, StreamId stream) override {
        expect_device("reduce_scatter", out);
        expect_device("reduce_scatter", in);
        if (in.numel() != out.numel() * size_ || in.dtype() != out.dtype())
            fail(ErrorKind::shape, "reduce_scatter in the ", description_, ": input ", in.shape().str(), " is not ", size_, " x output ", out.shape().str());
        settle(ncclReduceScatter(in.raw(), out.raw(), count(out), nccl_type(in.dtype(), true), ncclSum, comm_, stream_of_(stream)), "reduce_scatter");
    }
    void all_gather(const Tensor& data, StreamId stream) override {
        expect_device("all_gather", data);
        if (data.numel() % size_ != 0) fail(ErrorKind::shape, "all_gather in the ", description_, ": ", data.numel(), " elements do not split into ", size_, " chunks");
        const size_t chunk = static_cast<size_t>(data.numel() / size_);
        // In place: this rank's chunk already sits at its position in the output.
        const void* mine = static_cast<const char*>(data.raw()) + chunk * dtype_size(data.dtype()) * static_cast<size_t>(rank_);
        settle(ncclAllGather(mine, data.raw(), chunk, nccl_type(data.dtype(), false), comm_, stream_of_(stream)), "all_gather");
    }
    // NCCL has no all-to-all: one group of a send and a receive per peer (NCCL's own recipe).
    void all_to_all(const Tensor& out, const Tensor& in, StreamId stream) override {
        expect_device("all_to_all", out);
        expect_device("all_to_all", in);
        if (in.bytes() != out.bytes() || in.bytes() % static_cast<size_t>(size_) != 0)
            fail(ErrorKind::shape, "all_to_all in the ", description_, ": ", in.bytes(), " bytes in, ", out.bytes(), " bytes out (expected equal, in ", size_,
                 " chunks)");
        const size_t chunk = in.bytes() / static_cast<size_t>(size_);
        settle(ncclGroupStart(), "all_to_all");
        for (int peer = 0; peer < size_; ++peer) {
            const size_t at = chunk * static_cast<size_t>(peer);
            settle(ncclSend(static_cast<const char*>(in.raw()) + at, chunk, ncclUint8, peer, comm_, stream_of_(stream)), "all_to_all");
            settle(ncclRecv(static_cast<char*>(out.raw()) + at, chunk, ncclUint8, peer, comm_, stream_of_(stream)), "all_to_all");
        }
        settle(ncclGroupEnd(), "all_to_all");
    }
    // One group of a send and a receive per peer with a nonzero count.
    void all_to_all_v(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in, std::span<const int64_t> send_counts, StreamId stream) override {
        expect_device("all_to_all_v", out);
        expect_device("all_to_all_v", in);
        const size_t element = dtype_size(in.dtype());
        settle(ncclGroupStart(), "all_to_all_v");
        size_t sent = 0, received = 0;
        for (int peer = 0; peer < size_; ++peer) {
            const auto send_bytes = static_cast<size_t>(send_counts[static_cast<size_t>(peer)]) * element;
            const auto recv_bytes = static_cast<size_t>(recv_counts[static_cast<size_t>(peer)]) * element;
            if (send_bytes > 0) settle(ncclSend(static_cast<const char*>(in.raw()) + sent, send_bytes, ncclUint8, peer, comm_, stream_of_(stream)), "all_to_all_v");
            if (recv_bytes > 0) settle(ncclRecv(static_cast<char*>(out.raw()) + received, recv_bytes, ncclUint8, peer, comm_, stream_of_(stream)), "all_to_all_v");
            sent += send_bytes;
            received += recv_bytes;
        }
        settle(ncclGroupEnd(), "all_to_all_v");
    }
    void send(const Tensor& data, int peer, StreamId stream) override {
        expect_device("send", data);
        settle(ncclSend(data.raw(), count(data), nccl_type(data.dtype(), false), peer, comm_, stream_of_(stream)), "send");
    }
    void recv(const Tensor& data, int peer, StreamId stream) override {
        expect_device("recv", data);
        settle(ncclRecv(data.raw(), count(data), nccl_type(data.dtype(), false), peer, comm_, stream_of_(stream)), "recv");
    }
    void broadcast(const Tensor& data, int root, StreamId stream) override {
        expect_device("broadcast", data);
        settle(ncclBroadcast(data.raw(), data.raw(), count(data), nccl_type(data.dtype(), false), root, comm_, stream_of_(stream)), "broadcast");
    }
    std::string async_error() override {
        if (aborted_) return "the communicator was aborted";
        ncclResult_t state = ncclSuccess;
        ncclCommGetAsyncError(comm_, &state);
        return state == ncclSuccess || state == ncclInProgress ? "" : ncclGetErrorString(state);
    }
    void abort() override {
        if (!aborted_.exchange(true)) ncclCommAbort(comm_);
    }

    // Throws naming the group; aborts the communicator first so that nothing waits on it.
    [[noreturn]] void abort_with(const std::string& op, const std::string& why) {
        abort();
        fail(ErrorKind::runtime, op, " in the ", description_, " (NCCL): ", why);
    }
    bool aborted() const { return aborted_; }

private:
    void check(ncclResult_t result, const std::string& op) const {
        if (result != ncclSuccess) fail(ErrorKind::runtime, op, " in the ", description_, " (NCCL): ", ncclGetErrorString(result));
    }
    // A call on a non-blocking communicator may return ncclInProgress: wait until it settles.
    void settle(ncclResult_t result, const std::string& op) {
        const auto start = std::chrono::steady_clock::now();
        while (result == ncclInProgress) {
            std::this_thread::sleep_for(std::chrono::microseconds(50));
            if (comm_) ncclCommGetAsyncError(comm_, &result);
            if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_seconds_)
                abort_with(op, cat("did not start within ", timeout_seconds_, " s"));
        }
        check(result, op);
    }
    void expect_device(const char* op, const Tensor& t) const {
        if (t.device() != Device::cuda) fail(ErrorKind::unsupported, op, " in the ", description_, " (NCCL): the tensor is in host memory; NCCL needs GPU memory");
    }
    static size_t count(const Tensor& t) { return static_cast<size_t>(t.numel()); }

    std::string description_;
    double timeout_seconds_;
    int rank_ = 0, size_ = 1;
    std::function<cudaStream_t(StreamId)> stream_of_;
    ncclComm_t comm_ = nullptr;
    std::atomic<bool> aborted_{false};
};

int device_for(int local_rank) {
    int devices = 0;
    const cudaError_t code = cudaGetDeviceCount(&devices);
    if (code != cudaSuccess || devices == 0)
        fail(ErrorKind::unsupported, "NCCL needs a GPU, and this machine has none usable (", code == cudaSuccess ? "no CUDA device" : cudaGetErrorString(code), ")");
    return local_rank % devices;
}

class NcclComm;

class NcclRequest final : public CommRequest {
public:
    NcclRequest(const NcclComm& comm, cudaEvent_t event, std::string op) : comm_(comm), event_(event), op_(std::move(op)) {}
    ~NcclRequest() override { cudaEventDestroy(event_); }
    void wait() override;

private:
    const NcclComm& comm_;
    cudaEvent_t event_;
    std::string op_;
};

// A Comm whose handles block the host: the communication benchmark times each operation.
class NcclComm final : public Comm {
public:
    NcclComm(Comm& bootstrap, int device, double timeout_seconds) : name_(bootstrap.name()), timeout_seconds_(timeout_seconds) {
        for (int r = 0; r < bootstrap.size(); ++r) world_ranks_.push_back(bootstrap.world_rank(r));
        rank_ = bootstrap.rank();
        size_ = bootstrap.size();
        check_cuda(cudaSetDevice(device), cat("cudaSetDevice(", device, ")"));
        check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
        check_cuda(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
        nccl_ = std::make_unique<NcclCollectives>(bootstrap, device, timeout_seconds, [this](StreamId) { return stream_; });
    }
    ~NcclComm() override {
        nccl_.reset();
        if (scratch_) cudaFree(scratch_);
        if (stream_) cudaStreamDestroy(stream_);
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    int world_rank(int rank) const override { return world_ranks_.at(static_cast<size_t>(rank)); }
    const std::string& name() const override { return name_; }

    CommHandle all_reduce_async(const Tensor& data, ReduceOp op) override {
        nccl_->all_reduce(data, op, 0);
        return record("all_reduce");
    }
    CommHandle reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override {
        if (op == ReduceOp::max) fail(ErrorKind::unsupported, "reduce_scatter with max in the ", describe(), ": it sums");
        nccl_->reduce_scatter(out, in, 0);
        return record("reduce_scatter");
    }
    CommHandle all_gather_async(const Tensor& data) override {
        nccl_->all_gather(data, 0);
        return record("all_gather");
    }
    CommHandle all_to_all_async(const Tensor& out, const Tensor& in) override {
        nccl_->all_to_all(out, in, 0);
        return record("all_to_all");
    }
    CommHandle all_to_all_v_async(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in, std::span<const int64_t> send_counts) override {
        check_all_to_all_v(*this, out, recv_counts, in, send_counts);
        nccl_->all_to_all_v(out, recv_counts, in, send_counts, 0);
        return record("all_to_all_v");
    }
    CommHandle send_async(const Tensor& data, int peer) override {
        nccl_->send(data, peer, 0);
        return record(cat("send to world rank ", world_rank(peer)));
    }
    void recv(const Tensor& data, int peer) override { recv_async(data, peer).wait(); }
    CommHandle recv_async(const Tensor& data, int peer) override {
        nccl_->recv(data, peer, 0);
        return record(cat("recv from world rank ", world_rank(peer)));
    }
    void broadcast(const Tensor& data, int root) override {
        nccl_->broadcast(data, root, 0);
        record("broadcast").wait();
    }
    void barrier() override { all_reduce(Tensor(scratch_, DType::f32, {1}, Device::cuda), ReduceOp::sum); }

    // Polls the event; NCCL's asynchronous error or the deadline abort the communicator.
    void wait_event(cudaEvent_t event, const std::string& op) const {
        const auto start = std::chrono::steady_clock::now();
        for (int polls = 0;; ++polls) {
            const cudaError_t state = cudaEventQuery(event);
            if (state == cudaSuccess) return;
            if (state != cudaErrorNotReady) check_cuda(state, cat(op, " in the ", describe()));
            const std::string error = nccl_->async_error();
            if (!error.empty()) nccl_->abort_with(op, error);
            if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
            if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_seconds_)
                nccl_->abort_with(op, cat("did not complete within ", timeout_seconds_, " s: a rank of this group has died or hangs"));
        }
    }

private:
    CommHandle record(const std::string& op) {
        cudaEvent_t event = nullptr;
        check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
        check_cuda(cudaEventRecord(event, stream_), "cudaEventRecord");
        return CommHandle(std::make_unique<NcclRequest>(*this, event, op));
    }

    std::string name_;
    std::vector<int> world_ranks_;
    double timeout_seconds_;
    int rank_ = 0, size_ = 1;
    cudaStream_t stream_ = nullptr;
    void* scratch_ = nullptr;
    std::unique_ptr<NcclCollectives> nccl_;
};

void NcclRequest::wait() { comm_.wait_event(event_, op_); }

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(Comm& bootstrap, int local_rank, double timeout_seconds) {
    return std::make_unique<NcclComm>(bootstrap, device_for(local_rank), timeout_seconds);
}

std::unique_ptr<StreamCollectives> make_nccl_collectives(Comm& bootstrap, int local_rank, double timeout_seconds, StreamOrder& order) {
    return std::make_unique<NcclCollectives>(bootstrap, device_for(local_rank), timeout_seconds,
                                             [&order](StreamId stream) { return static_cast<cudaStream_t>(order.native_stream(stream)); });
}

std::string nccl_library_version() {
    int version = 0;
    ncclGetVersion(&version);
    return cat("NCCL ", version / 10000, ".", version / 100 % 100, ".", version % 100);
}

BenchAllocator cuda_bench_allocator() {
    return [](size_t bytes) {
        void* p = nullptr;
        check_cuda(cudaMalloc(&p, bytes), cat("cudaMalloc(", bytes, " bytes)"));
        return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
    };
}

}  // namespace llmtrain
