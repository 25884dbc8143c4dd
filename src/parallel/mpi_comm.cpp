// MpiComm: the Comm interface over MPI, on host memory. Every operation is started
// non-blocking and then waited for with a deadline (wait_bounded): MPI's own blocking calls
// would wait forever on a dead or hung peer. While waiting, the rank polls MPI_Test and
// yields the core (ranks may outnumber cores), sleeping between polls once a wait is long.
// Every operation is published on the progress board (progress_board.h): a collective's
// sequence number when it is called, and what the host waits on once a wait is long; a
// timeout names the ranks that never arrived, from their records.
#include "parallel/mpi_comm.h"

#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "core/log.h"
#include "parallel/context.h"
#include "parallel/device_staging.h"
#include "parallel/launch_env.h"
#include "parallel/progress_board.h"

namespace llmtrain {

namespace {

MPI_Datatype mpi_type(DType dtype) {
    switch (dtype) {
        case DType::f32: return MPI_FLOAT;
        case DType::f64: return MPI_DOUBLE;
        case DType::i32: return MPI_INT32_T;
        case DType::bf16:
        case DType::f16:
        case DType::u16: return MPI_UINT16_T;
        case DType::e4m3:
        case DType::e5m2: return MPI_BYTE;  // FP8 bytes: gathered, never reduced
    }
    return MPI_BYTE;
}

bool is_half(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

// ReduceOp::sum_in_dtype over 16-bit floats, as MPI user-defined operations on 2-byte words:
// inout[i] = round(widen(in[i]) + widen(inout[i])), rounding to nearest even as everywhere
// else (core/dtype.h). The f32 sum may itself be rounded, but f32's 24 significant bits are
// at least 2p + 2 for p = 8 (bf16) and 11 (f16), so rounding it to 16 bits gives the correctly
// rounded 16-bit sum (Figueroa, "When is double rounding innocuous?", 1995).
template <DType dtype>
void sum_16bit_words(void* in, void* inout, int* count, MPI_Datatype*) {
    const auto* a = static_cast<const uint16_t*>(in);
    auto* b = static_cast<uint16_t*>(inout);
    for (int i = 0; i < *count; ++i) {
        if constexpr (dtype == DType::bf16) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
        else b[i] = float_to_f16(f16_to_float(a[i]) + f16_to_float(b[i]));
    }
}

// Created once, after MPI_Init (the first reduction asks), and kept until MPI_Finalize.
template <DType dtype>
MPI_Op sum_in_dtype_op() {
    static const MPI_Op op = [] {
        MPI_Op created = MPI_OP_NULL;
        MPI_Op_create(&sum_16bit_words<dtype>, /*commute=*/1, &created);
        return created;
    }();
    return op;
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
    if (dtype == DType::u16 || is_fp8(dtype)) fail(ErrorKind::unsupported, "MPI reductions of ", dtype_name(dtype), " tensors");
    if (op == ReduceOp::max) return MPI_MAX;
    if (op == ReduceOp::sum_in_dtype && dtype == DType::bf16) return sum_in_dtype_op<DType::bf16>();
    if (op == ReduceOp::sum_in_dtype && dtype == DType::f16) return sum_in_dtype_op<DType::f16>();
    return MPI_SUM;
}

// Whether a reduction's 16-bit floats travel widened to f32 (Staged, below).
bool widens(ReduceOp op) { return op != ReduceOp::sum_in_dtype; }

int count_of(const Tensor& t) {
    if (t.numel() > std::numeric_limits<int>::max()) fail(ErrorKind::unsupported, "MPI transfer of ", t.numel(), " elements exceeds 2^31 - 1");
    return static_cast<int>(t.numel());
}

// 16-bit floats <-> f32, rounding to nearest even.
void widen(float* out, const uint16_t* in, int64_t n, DType dtype) {
    for (int64_t i = 0; i < n; ++i) out[i] = dtype == DType::bf16 ? bf16_to_float(in[i]) : f16_to_float(in[i]);
}
void narrow(uint16_t* out, const float* in, int64_t n, DType dtype) {
    for (int64_t i = 0; i < n; ++i) out[i] = dtype == DType::bf16 ? float_to_bf16(in[i]) : float_to_f16(in[i]);
}

// A tensor as MPI sees it: host memory as it is, GPU memory through a pooled host buffer that
// is filled before the operation (when the operation reads it) and copied back after it.
//
// bf16 / f16 sums (ReduceOp::sum) travel as f32 (`widened`): each rank's values are widened
// into an f32 buffer, MPI sums those, and the sum is rounded to 16 bits once at the end. The
// tensor-parallel activations of a CUDA run over MPI rely on this (their sums stay within one
// rounding of the f32 sum whatever the rank count); it costs twice the bytes on the wire.
// ReduceOp::sum_in_dtype (the bf16 gradient reduction, asked for to halve the bytes) travels
// as the 16-bit words, summed by the user-defined operation above, which rounds after every
// pairwise addition, so its result depends on the reduction tree MPI picks.
class Staged {
public:
    // pinned: buffers GPU memory is copied through; host: the f32 values of 16-bit tensors.
    Staged(DeviceStaging& staging, StagingPool& pinned, StagingPool& host, const Tensor& t, bool read, bool widened)
        : tensor_(t), widened_(widened && is_half(t.dtype())), staging_(staging) {
        if (t.device() != Device::cpu) {
            raw_ = pinned.take(t.bytes());
            if (read) staging.to_host(raw_.data(), t.raw(), t.bytes());
        }
        if (widened_) {
            wide_ = host.take(static_cast<size_t>(t.numel()) * sizeof(float));
            if (read) widen(static_cast<float*>(wide_.data()), static_cast<const uint16_t*>(host_raw()), t.numel(), t.dtype());
        }
    }
    void* data() const { return widened_ ? wide_.data() : host_raw(); }
    MPI_Datatype type() const { return widened_ ? MPI_FLOAT : mpi_type(tensor_.dtype()); }
    void write_back() const {
        if (widened_) narrow(static_cast<uint16_t*>(host_raw()), static_cast<const float*>(wide_.data()), tensor_.numel(), tensor_.dtype());
        if (tensor_.device() != Device::cpu) staging_.to_device(tensor_.raw(), raw_.data(), tensor_.bytes());
    }

private:
    void* host_raw() const { return tensor_.device() == Device::cpu ? tensor_.raw() : raw_.data(); }

    Tensor tensor_;
    bool widened_;
    StagingBuffer raw_;   // the tensor's bytes in host memory (GPU tensors)
    StagingBuffer wide_;  // its f32 values (16-bit reductions)
    DeviceStaging& staging_;
};

class MpiComm;

// An operation as messages name it: a collective and its sequence number in the group, or a
// transfer and its peer (a group rank).
struct Operation {
    CommOp op = CommOp::barrier;
    uint64_t seq_or_peer = 0;
};

class MpiRequest final : public CommRequest {
public:
    MpiRequest(MpiComm& comm, MPI_Request request, Operation op, std::unique_ptr<Staged> result, std::unique_ptr<Staged> input)
        : comm_(comm), request_(request), op_(op), result_(std::move(result)), input_(std::move(input)) {}
    void wait() override;
    // One MPI_Test: advances the collective's schedule; once it completes the request is
    // MPI_REQUEST_NULL and wait() only writes the result back.
    void progress() override {
        int done = 0;
        MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
    }
    bool done() override {
        int done = 0;
        MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
        return done != 0;
    }

private:
    MpiComm& comm_;
    MPI_Request request_;
    Operation op_;
    std::unique_ptr<Staged> result_;  // written back to GPU memory once complete
    std::unique_ptr<Staged> input_;   // a host copy MPI reads until completion
};

class MpiComm final : public Comm {
public:
    // progress: the board this group's operations are published on (null: none).
    MpiComm(MPI_Comm comm, std::string name, std::vector<int> world_ranks, double timeout_seconds, std::shared_ptr<DeviceStaging> staging,
            std::shared_ptr<ProgressBoard> progress)
        : comm_(comm), name_(std::move(name)), world_ranks_(std::move(world_ranks)), timeout_seconds_(timeout_seconds), staging_(std::move(staging)),
          pinned_([s = staging_](size_t bytes) { return s->allocate_host(bytes); }), host_([](size_t bytes) { return allocate_host_memory(bytes); }),
          board_(std::move(progress)) {
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &size_);
        if (board_) channel_ = board_->channel(name_, CommLane::host);
    }
    ~MpiComm() override {
        if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    int world_rank(int rank) const override { return world_ranks_.at(static_cast<size_t>(rank)); }
    const std::string& name() const override { return name_; }

    CommHandle all_reduce_async(const Tensor& data, ReduceOp op) override {
        if (size_ == 1) return {};
        auto staged = stage(data, true, widens(op));
        MPI_Request r;
        const Operation started = collective(CommOp::all_reduce);
        check(MPI_Iallreduce(MPI_IN_PLACE, staged->data(), count_of(data), staged->type(), mpi_op(op, data.dtype()), comm_, &r), started);
        return handle(r, started, std::move(staged));
    }
    CommHandle reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override {
        if (in.numel() != out.numel() * size_ || in.dtype() != out.dtype())
            fail(ErrorKind::shape, "reduce_scatter in the ", describe(), ": input ", in.shape().str(), " is not ", size_, " x output ", out.shape().str());
        auto staged_out = stage(out, false, widens(op));
        auto staged_in = stage(in, true, widens(op));
        MPI_Request r;
        const Operation started = collective(CommOp::reduce_scatter);
        check(MPI_Ireduce_scatter_block(staged_in->data(), staged_out->data(), count_of(out), staged_in->type(), mpi_op(op, in.dtype()), comm_, &r), started);
        return handle(r, started, std::move(staged_out), std::move(staged_in));
    }
    CommHandle all_gather_async(const Tensor& data) override {
        if (size_ == 1) return {};
        if (data.numel() % size_ != 0) fail(ErrorKind::shape, "all_gather in the ", describe(), ": ", data.numel(), " elements do not split into ", size_, " chunks");
        if (data.numel() / size_ > std::numeric_limits<int>::max())
            fail(ErrorKind::unsupported, "MPI all_gather chunk of ", data.numel() / size_, " elements exceeds 2^31 - 1");
        auto staged = stage(data, true, false);
        MPI_Request r;
        const int chunk = static_cast<int>(data.numel() / size_);
        const Operation started = collective(CommOp::all_gather);
        check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, staged->data(), chunk, staged->type(), comm_, &r), started);
        return handle(r, started, std::move(staged));
    }
    CommHandle all_to_all_async(const Tensor& out, const Tensor& in) override {
        if (in.bytes() != out.bytes() || in.bytes() % static_cast<size_t>(size_) != 0)
            fail(ErrorKind::shape, "all_to_all in the ", describe(), ": ", in.bytes(), " bytes in, ", out.bytes(), " bytes out (expected equal, in ", size_,
                 " chunks)");
        if (in.bytes() / static_cast<size_t>(size_) > static_cast<size_t>(std::numeric_limits<int>::max()))
            fail(ErrorKind::unsupported, "MPI all_to_all chunk of ", in.bytes() / static_cast<size_t>(size_), " bytes exceeds 2^31 - 1");
        auto staged_out = stage(out, false, false);
        auto staged_in = stage(in, true, false);
        MPI_Request r;
        const int chunk = static_cast<int>(in.bytes() / static_cast<size_t>(size_));
        const Operation started = collective(CommOp::all_to_all);
        check(MPI_Ialltoall(staged_in->data(), chunk, MPI_BYTE, staged_out->data(), chunk, MPI_BYTE, comm_, &r), started);
        return handle(r, started, std::move(staged_out), std::move(staged_in));
    }
    // Counts and displacements in bytes: MPI's are int, so a chunk or an offset past 2^31 - 1
    // bytes is refused (as the other collectives refuse their counts).
    CommHandle all_to_all_v_async(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in, std::span<const int64_t> send_counts) override {
        check_all_to_all_v(*this, out, recv_counts, in, send_counts);
        const std::vector<int> send_bytes = byte_counts(in, send_counts), recv_bytes = byte_counts(out, recv_counts);
        const std::vector<int> send_at = byte_offsets(send_bytes), recv_at = byte_offsets(recv_bytes);
        auto staged_out = stage(out, false, false);
        auto staged_in = stage(in, true, false);
        MPI_Request r;
        const Operation started = collective(CommOp::all_to_all);
        check(MPI_Ialltoallv(staged_in->data(), send_bytes.data(), send_at.data(), MPI_BYTE, staged_out->data(), recv_bytes.data(), recv_at.data(), MPI_BYTE,
                             comm_, &r),
              started);
        return handle(r, started, std::move(staged_out), std::move(staged_in));
    }
    CommHandle send_async(const Tensor& data, int peer) override {
        auto staged = stage(data, true, false);
        MPI_Request r;
        const Operation started = transfer(CommOp::send, peer);
        check(MPI_Isend(staged->data(), count_of(data), staged->type(), peer, 0, comm_, &r), started);
        return handle(r, started, nullptr, std::move(staged));
    }
    void recv(const Tensor& data, int peer) override {
        const auto staged = stage(data, false, false);
        MPI_Request r;
        const Operation started = transfer(CommOp::recv, peer);
        check(MPI_Irecv(staged->data(), count_of(data), staged->type(), peer, 0, comm_, &r), started);
        wait_bounded(r, started);
        staged->write_back();
    }
    CommHandle recv_async(const Tensor& data, int peer) override {
        auto staged = stage(data, false, false);
        MPI_Request r;
        const Operation started = transfer(CommOp::recv, peer);
        check(MPI_Irecv(staged->data(), count_of(data), staged->type(), peer, 0, comm_, &r), started);
        return handle(r, started, std::move(staged));
    }
    void broadcast(const Tensor& data, int root) override {
        const auto staged = stage(data, true, false);
        MPI_Request r;
        const Operation started = collective(CommOp::broadcast);
        check(MPI_Ibcast(staged->data(), count_of(data), staged->type(), root, comm_, &r), started);
        wait_bounded(r, started);
        staged->write_back();
    }
    void barrier() override {
        MPI_Request r;
        const Operation started = collective(CommOp::barrier);
        check(MPI_Ibarrier(comm_, &r), started);
        wait_bounded(r, started);
    }

    // Polls until the request completes; throws naming the op, the group and the ranks that
    // never arrived once the timeout has passed. A long wait is published (the host waits on
    // op), and answers other nodes' questions about this node's progress meanwhile.
    void wait_bounded(MPI_Request& request, Operation op) {
        using clock = std::chrono::steady_clock;
        const auto start = clock::now();
        bool published = false;
        for (int polls = 0;; ++polls) {
            int done = 0;
            check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), op);
            if (done) {
                if (published) channel_.done_waiting(Waiter::host);
                return;
            }
            if (polls < 2000) {
                std::this_thread::yield();
                continue;
            }
            if (!published) channel_.waiting(Waiter::host, op.op, op.seq_or_peer), published = true;
            if (board_) board_->answer_questions();
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            const double waited = std::chrono::duration<double>(clock::now() - start).count();
            if (waited > timeout_seconds_)
                fail(ErrorKind::runtime, text(op), " in the ", describe(), " did not complete within ", timeout_seconds_, " s (parallel.timeout_seconds): ",
                     why_hung(op));
        }
    }

private:
    // widened: a reduction (16-bit floats travel as f32).
    std::unique_ptr<Staged> stage(const Tensor& t, bool read, bool widened) { return std::make_unique<Staged>(*staging_, pinned_, host_, t, read, widened); }
    CommHandle handle(MPI_Request r, Operation op, std::unique_ptr<Staged> result, std::unique_ptr<Staged> input = nullptr) {
        return CommHandle(std::make_unique<MpiRequest>(*this, r, op, std::move(result), std::move(input)));
    }
    // A collective entered: its sequence number in this group, published.
    std::vector<int> byte_counts(const Tensor& t, std::span<const int64_t> counts) const {
        std::vector<int> bytes(counts.size());
        int64_t total = 0;
        for (size_t r = 0; r < counts.size(); ++r) {
            const int64_t b = counts[r] * static_cast<int64_t>(dtype_size(t.dtype()));
            total += b;
            if (total > std::numeric_limits<int>::max())
                fail(ErrorKind::unsupported, "MPI all_to_all_v in the ", describe(), ": ", total, " bytes to rank ", r, " and before it exceed 2^31 - 1");
            bytes[r] = static_cast<int>(b);
        }
        return bytes;
    }
    static std::vector<int> byte_offsets(const std::vector<int>& bytes) {
        std::vector<int> at(bytes.size(), 0);
        for (size_t r = 1; r < bytes.size(); ++r) at[r] = at[r - 1] + bytes[r - 1];
        return at;
    }
    Operation collective(CommOp op) {
        const Operation started{op, channel_.next_collective()};
        channel_.arrived(op, started.seq_or_peer);
        return started;
    }
    Operation transfer(CommOp op, int peer) {
        channel_.point_to_point(op, world_rank(peer));
        return {op, static_cast<uint64_t>(peer)};
    }
    // "all_reduce #12", "recv from world rank 3"
    std::string text(Operation op) const {
        if (op.op == CommOp::send) return cat("send to world rank ", world_rank(static_cast<int>(op.seq_or_peer)));
        if (op.op == CommOp::recv) return cat("recv from world rank ", world_rank(static_cast<int>(op.seq_or_peer)));
        return channel_ ? cat(comm_op_name(op.op), " #", op.seq_or_peer) : comm_op_name(op.op);
    }
    // The ranks that never arrived at op, from the progress board; the other nodes' records
    // are waited for up to the timeout, at most 10 s.
    std::string why_hung(Operation op) {
        if (!board_) return "a rank of this group has died or hangs";
        HungOperation hung{name_, CommLane::host, op.op, op.seq_or_peer, -1, world_ranks_, world_rank(rank_)};
        if (op.op == CommOp::send || op.op == CommOp::recv) hung.seq = 0, hung.peer = world_rank(static_cast<int>(op.seq_or_peer));
        return board_->diagnose_hang(hung, std::min(timeout_seconds_, 10.0));
    }
    void check(int code, Operation op) const {
        if (code == MPI_SUCCESS) return;
        char message[MPI_MAX_ERROR_STRING];
        int length = 0;
        MPI_Error_string(code, message, &length);
        fail(ErrorKind::runtime, text(op), " in the ", describe(), " failed: ", std::string(message, static_cast<size_t>(length)));
    }

    MPI_Comm comm_;
    std::string name_;
    std::vector<int> world_ranks_;
    double timeout_seconds_;
    int rank_ = 0, size_ = 1;
    // Buffers kept from operation to operation: pinned ones for GPU tensors, plain ones for
    // the f32 values of 16-bit reductions.
    std::shared_ptr<DeviceStaging> staging_;
    StagingPool pinned_, host_;
    std::shared_ptr<ProgressBoard> board_;
    ProgressChannel channel_;
};

void MpiRequest::wait() {
    comm_.wait_bounded(request_, op_);
    if (result_) result_->write_back();
}

// The sub-communicator of `ranks` (world ranks, in group order) that contains this rank;
// ranks outside any group pass an empty list.
std::unique_ptr<Comm> split_group(const std::vector<int>& ranks, const std::string& name, double timeout_seconds,
                                  const std::shared_ptr<DeviceStaging>& staging, const std::shared_ptr<ProgressBoard>& progress) {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    const int color = ranks.empty() ? MPI_UNDEFINED : ranks.front();
    int key = 0;
    for (size_t i = 0; i < ranks.size(); ++i)
        if (ranks[i] == world_rank) key = static_cast<int>(i);
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm);
    if (ranks.empty()) return nullptr;
    return std::make_unique<MpiComm>(comm, name, ranks, timeout_seconds, staging, progress);
}

}  // namespace

std::string mpi_library_version() {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(text, &length);
    const std::string version(text, static_cast<size_t>(length));
    return version.substr(0, version.find_first_of(",\n"));
}

bool launched_by_mpi() { return launch_environment().needs_mpi(); }

MpiSession::MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    try {
        check_mpi_world_matches(launch_environment(), world_size());
    } catch (const Error&) {
        MPI_Finalize();
        throw;
    }
    owns_ = true;
}

MpiSession::~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
}

int MpiSession::world_rank() const {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

int MpiSession::world_size() const {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return size;
}

int MpiSession::first_failing_rank(bool failed) const {
    const int mine = failed ? world_rank() : world_size();
    int first = 0;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return first < world_size() ? first : -1;
}

int MpiSession::broadcast_from(int root, int value) const {
    MPI_Bcast(&value, 1, MPI_INT, root, MPI_COMM_WORLD);
    return value;
}

std::string MpiSession::broadcast_text(int root, std::string text) const {
    const int length = broadcast_from(root, static_cast<int>(text.size()));
    text.resize(static_cast<size_t>(length));
    MPI_Bcast(text.data(), length, MPI_CHAR, root, MPI_COMM_WORLD);
    return text;
}

void MpiSession::abort_job(int exit_code) {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::exit(exit_code);
}

ParallelContext make_mpi_context(const ParallelConfig& parallel, std::shared_ptr<DeviceStaging> staging) {
    if (!staging) staging = cuda_device_staging();
    int world_rank = 0, world_size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    ParallelContext ctx;
    ctx.mesh = make_mesh(parallel, world_size);
    ctx.world_rank = world_rank;
    const double timeout = parallel.timeout_seconds;
    // Every rank decides alike (from the config) whether the dp group is cut into blocks.
    const int shard_size = shard_size_of(parallel, ctx.mesh.dp());
    const Mesh mesh = ctx.mesh;
    const auto ranks_of = [mesh, shard_size](const std::string& group, int rank) { return context_group_ranks(mesh, shard_size, group, rank); };
    ctx.progress = make_mpi_progress_board(ranks_of);
    const auto split = [&](const std::string& group) { return split_group(ranks_of(group, world_rank), group, timeout, staging, ctx.progress); };

    ctx.world = split("world");
    ctx.snapshot_copies = split("snapshot copies");
    ctx.tp = split("tp");
    ctx.dp = split("dp");  // with its cp ranks
    ctx.pp = split("pp");
    ctx.cp = split("cp");
    ctx.embedding = split("embedding");  // the first and last stage of a column, when pp > 1
    if (shard_size < ctx.mesh.dp()) {
        ctx.shard = split("shard");
        ctx.replica = split("replica");
    }
    if (ctx.mesh.ep() > 1) {
        ctx.ep = split("ep");
        ctx.edp = split("edp");
    }

    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &ctx.local_rank);
    MPI_Comm_size(node, &ctx.local_size);
    MPI_Comm_free(&node);
    return ctx;
}

}  // namespace llmtrain
