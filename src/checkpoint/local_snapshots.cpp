#include "checkpoint/local_snapshots.h"

#include <algorithm>
#include <cstring>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <sys/resource.h>
#include <unistd.h>
#include <xxhash.h>

#include "checkpoint/checkpoint_store.h"
#include "core/durable_file.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"

namespace llmtrain {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.json";
// A replica travels in messages of this many bytes (MPI counts are ints), this many (1 GiB) in
// flight per peer, refilled at every step boundary: a transport that moves posted messages by
// itself (RDMA) moves a GiB per step, and the host memory pinned for the transfer stays
// bounded. plan/goodput.cpp models the same numbers: keep the two in step.
constexpr size_t kMessageBytes = size_t{64} << 20;
constexpr size_t kMessagesInFlight = 16;
constexpr size_t kNameBytes = 64;

double now_seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The file's bytes in one read (a stream's buffer, 8 KiB at a time, reads a GB ten times
// slower) into `bytes`, resized to whole 32-bit words (what the last message of a transfer
// carries) and reused from call to call: a fresh GB costs more in page faults than the read.
// Returns the file's size.
size_t read_file_words(const std::string& path, std::vector<char>& bytes) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) fail(ErrorKind::io, "cannot read '", path, "'");
    const auto length = static_cast<size_t>(in.tellg());
    bytes.resize((length + 3) / 4 * 4);
    in.seekg(0);
    if (!in.read(bytes.data(), static_cast<std::streamsize>(length))) fail(ErrorKind::io, "cannot read '", path, "'");
    return length;
}
std::vector<char> read_file_words(const std::string& path, size_t& length) {
    std::vector<char> bytes;
    length = read_file_words(path, bytes);
    return bytes;
}

std::string read_whole_file(const std::string& path) {
    size_t length = 0;
    const std::vector<char> bytes = read_file_words(path, length);
    return std::string(bytes.data(), length);
}


// path holds exactly these bytes, fsynced (an ENOSPC or EIO an Error(io) naming it).
void write_bytes_durably(const std::string& path, const char* data, size_t length) {
    OutputFile out(path);
    out.append(data, length);
    out.finish();
}

// Writes path through a name of this rank's own (ranks of a node write the same manifest)
// and a rename, so a reader sees the old bytes or the new ones.
void write_replacing(const std::string& path, const char* data, size_t length, int world_rank) {
    const std::string part = cat(path, ".", world_rank, ".part");
    write_bytes_durably(part, data, length);
    std::error_code ec;
    fs::rename(part, path, ec);
    if (ec) {
        fs::remove(part, ec);
        fail(ErrorKind::io, "cannot rename '", part, "' to '", path, "': ", ec.message());
    }
}
void write_replacing(const std::string& path, const std::string& bytes, int world_rank) { write_replacing(path, bytes.data(), bytes.size(), world_rank); }

// Text from root to every rank of world: its length, then its bytes as 32-bit words.
std::string broadcast_text(Comm& world, int root, std::string text) {
    if (world.size() == 1) return text;
    double length = static_cast<double>(text.size());
    world.broadcast(Tensor(&length, DType::f64, {1}), root);
    std::vector<int32_t> words((static_cast<size_t>(length) + 3) / 4 + 1, 0);
    std::memcpy(words.data(), text.data(), text.size());
    world.broadcast(Tensor(words.data(), DType::i32, {static_cast<int64_t>(words.size())}), root);
    text.assign(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(length));
    return text;
}

// Element-wise maximum over world of a vector of doubles.
std::vector<double> max_over(Comm& world, std::vector<double> values) {
    if (world.size() > 1) world.all_reduce(Tensor(values.data(), DType::f64, {static_cast<int64_t>(values.size())}), ReduceOp::max);
    return values;
}

// Message i of a transfer of `bytes` bytes: its offset and length (whole 32-bit words on the
// wire; the last message's tail is padding).
struct Message {
    size_t offset = 0, bytes = 0;
};
size_t message_count(size_t bytes) { return std::max<size_t>(1, (bytes + kMessageBytes - 1) / kMessageBytes); }
Message message(size_t total, size_t i) {
    const size_t offset = i * kMessageBytes;
    return {offset, std::min(kMessageBytes, total - std::min(total, offset))};
}
Tensor words_of(char* data, size_t bytes) { return Tensor(data, DType::i32, {static_cast<int64_t>((bytes + 3) / 4)}); }

// `length` bytes in a buffer of whole 32-bit words (what the last message carries).
std::vector<char> word_buffer(size_t length) { return std::vector<char>((length + 3) / 4 * 4); }
uint64_t xxh64_of(const std::vector<char>& buffer, size_t length) { return XXH64(buffer.data(), length, 0); }

// The snapshot steps under root (its step_* directories, as checkpoint.dir's are named), newest
// first.
std::vector<int64_t> steps_under(const std::string& root) {
    std::vector<int64_t> steps;
    for (const CheckpointEntry& entry : list_checkpoints(root)) steps.push_back(entry.step);
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    std::reverse(steps.begin(), steps.end());
    return steps;
}

}  // namespace

// ---- Nodes ----

std::vector<int> NodeMap::ranks_on(int node) const {
    std::vector<int> ranks;
    for (size_t r = 0; r < node_of_rank.size(); ++r)
        if (node_of_rank[r] == node) ranks.push_back(static_cast<int>(r));
    return ranks;
}

int NodeMap::local_index(int rank) const {
    const std::vector<int> ranks = ranks_on(node_of_rank.at(static_cast<size_t>(rank)));
    return static_cast<int>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
}

NodeMap gather_node_map(Comm& world) {
    const size_t ranks = static_cast<size_t>(world.size());
    std::vector<char> names(ranks * kNameBytes, 0);
    const std::string mine = this_node_name().substr(0, kNameBytes - 1);
    std::memcpy(names.data() + static_cast<size_t>(world.rank()) * kNameBytes, mine.data(), mine.size());
    if (ranks > 1) world.all_gather(Tensor(names.data(), DType::i32, {static_cast<int64_t>(names.size() / 4)}));
    NodeMap map;
    for (size_t r = 0; r < ranks; ++r) {
        const std::string name(names.data() + r * kNameBytes);
        auto found = std::find(map.names.begin(), map.names.end(), name);
        if (found == map.names.end()) found = map.names.insert(map.names.end(), name);
        map.node_of_rank.push_back(static_cast<int>(found - map.names.begin()));
    }
    return map;
}

std::vector<int> replica_holders(const NodeMap& nodes, int rank, int replicas) {
    std::vector<int> holders;
    const int home = nodes.node_of_rank.at(static_cast<size_t>(rank)), index = nodes.local_index(rank);
    for (int k = 1; k <= replicas && k < nodes.nodes(); ++k) {
        const std::vector<int> there = nodes.ranks_on((home + k) % nodes.nodes());
        holders.push_back(there[static_cast<size_t>(index) % there.size()]);
    }
    return holders;
}

std::string local_snapshot_root(const LocalSnapshotConfig& config, const std::string& node, const std::string& run_id) {
    std::string dir = config.dir;
    for (size_t at; (at = dir.find("{node}")) != std::string::npos;) dir.replace(at, 6, node);
    return (fs::path(dir) / run_id).string();
}

void check_node_local(Comm& world, const NodeMap& nodes, const std::string& root) {
    const int rank = world.rank(), node = nodes.node_of_rank.at(static_cast<size_t>(rank));
    std::string nonce = rank == 0 ? cat(std::random_device{}(), "-", now_seconds()) : "";
    nonce = broadcast_text(world, 0, nonce);
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) fail(ErrorKind::config, "checkpoint.local.dir: cannot create '", root, "': ", ec.message());
    const fs::path marker = fs::path(root) / cat(".node-", nodes.names[static_cast<size_t>(node)]);
    if (nodes.local_index(rank) == 0) write_replacing(marker.string(), nonce, rank);
    world.barrier();
    std::string shared_with;
    for (int other = 0; other < nodes.nodes(); ++other) {
        if (other == node) continue;
        const fs::path theirs = fs::path(root) / cat(".node-", nodes.names[static_cast<size_t>(other)]);
        std::ifstream in(theirs);
        std::string text;
        if (in && std::getline(in, text) && text == nonce) shared_with = nodes.names[static_cast<size_t>(other)];
    }
    const double shared = max_over(world, {shared_with.empty() ? 0.0 : 1.0})[0];
    if (!shared_with.empty())
        fail(ErrorKind::config, "checkpoint.local.dir: '", root, "' on node ", nodes.names[static_cast<size_t>(node)], " is also seen by node ", shared_with,
             ": it is not node-local (a shared file system would count one copy of a snapshot as two); use a node-local path such as /dev/shm/llmtrain, or put "
             "\"{node}\" in it");
    if (shared > 0) fail(ErrorKind::config, "checkpoint.local.dir: '", root, "' is seen by more than one node (another rank names them): it is not node-local");
}

// ---- Snapshots during the run ----

// One peer's copy of a file: the messages posted so far, each waited for by its handle.
struct LocalSnapshotter::Transfer {
    int peer = 0;                // world rank
    bool sending = false;
    int piece = 0;               // whose file (a receive: the peer's)
    char* data = nullptr;        // what is sent (this rank's file) or received (a buffer kept for the source)
    size_t length = 0;
    size_t posted = 0, messages = 0;
    std::vector<CommHandle> in_flight;
};

LocalSnapshotter::LocalSnapshotter(const LocalSnapshotConfig& config, Comm& world, Comm& copies, FileAttributes file, NodeMap nodes, std::string root,
                                   int64_t start_step, LocalSnapshotHooks hooks)
    : config_(config), world_(world), copies_(copies), file_(file), nodes_(std::move(nodes)), root_(std::move(root)), hooks_(std::move(hooks)) {
    // Snapshots of steps after the one this run starts from belong to a timeline a failure
    // abandoned: they go before this run writes any (every rank waits for this in the
    // first step's collectives, and none writes a snapshot before that step ends).
    if (nodes_.local_index(file_.world_rank) == 0)
        for (int64_t step : steps_under(root_)) {
            if (step <= start_step) break;
            std::error_code ec;
            fs::remove_all(step_dir(step), ec);
        }
    const int replicas = static_cast<int>(config_.replicas);
    holders_ = replica_holders(nodes_, file_.world_rank, replicas);
    for (int r = 0; r < world_.size(); ++r) {
        const std::vector<int> of_r = replica_holders(nodes_, r, replicas);
        if (std::find(of_r.begin(), of_r.end(), file_.world_rank) != of_r.end()) sources_.push_back(r);
    }
    if (file_.world_rank == 0 && static_cast<int>(holders_.size()) < replicas)
        log_warn("checkpoint.local.replicas = ", replicas, ", but the job has ", nodes_.nodes(), " node(s): each snapshot is kept on ", holders_.size() + 1,
                 " node(s); a lost node's pieces then come from the persistent checkpoint");
    hooks_.capture(0, snapshot_);  // the host buffer allocated and touched before the first step
    worker_ = std::thread([this] { worker_loop(); });
}

LocalSnapshotter::~LocalSnapshotter() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    changed_.notify_all();
    worker_.join();
}

void LocalSnapshotter::after_step(const StepRecord& record) {
    if (phase_ != Phase::idle) advance(false);
    const bool due = config_.every_steps > 0 && record.step % config_.every_steps == 0;
    if (!due && !(deferred_ && phase_ == Phase::idle)) return;
    if (phase_ == Phase::idle) {
        deferred_ = false;
        return start(record.step, 0);
    }
    const int64_t previous = in_flight_.step;
    if (config_.when_busy == SnapshotWhenBusy::defer) {
        // Every rank reaches the same phase at the same boundary (it moves on agreements only).
        deferred_ = true;
        if (++busy_snapshots_ == 1 && file_.world_rank == 0)
            log_warn("local snapshot due at step ", record.step, " deferred: the one of step ", previous,
                     " is still being written or copied; it is taken at the first step boundary after that one completes (raise "
                     "checkpoint.local.every_steps, or checkpoint.local.when_busy = \"wait\"; said once, log.jsonl has the steps taken)");
        return;
    }
    // when_busy = wait: every due step is snapshotted; the wait shows in the blocked time.
    Stopwatch clock;
    finish();
    if (++busy_snapshots_ == 1 && file_.world_rank == 0)
        log_warn("local snapshot at step ", record.step, ": the one of step ", previous, " was still being written or copied, and the step loop waited ",
                 fixed(clock.seconds(), 3), " s for it (raise checkpoint.local.every_steps; said once, the waits count in each snapshot's blocked time)");
    start(record.step, clock.seconds());
}

void LocalSnapshotter::after_anomaly(const AnomalyRecord& anomaly) {
    if (anomaly.action != "rollback" || anomaly.rollback_to < 0) return;
    finish();
    wait_job();
    if (nodes_.local_index(file_.world_rank) == 0)
        for (int64_t step : steps_under(root_)) {
            std::error_code ec;
            fs::remove_all(step_dir(step), ec);
        }
    if (file_.world_rank == 0 && newest_complete_)
        log_info("local snapshots deleted after the rollback to step ", anomaly.rollback_to, ": they hold the steps it abandoned");
    newest_complete_.reset();
}

void LocalSnapshotter::finish() {
    while (phase_ != Phase::idle) advance(true);
}

std::string LocalSnapshotter::step_dir(int64_t step) const { return (fs::path(root_) / checkpoint_name(step)).string(); }

void LocalSnapshotter::start(int64_t step, double waited_seconds) {
    Stopwatch clock;
    started_at_ = now_seconds();
    hooks_.capture(step, snapshot_);
    const double copy_seconds = clock.seconds();
    std::string text;
    if (file_.world_rank == 0) {
        Manifest m = hooks_.manifest(step);
        for (int r = 0; r < world_.size(); ++r) m.files.push_back({rank_file_name(r), 0, 0});  // sizes and XXH64 once written
        text = manifest_to_json(m);
    }
    manifest_ = manifest_from_json(broadcast_text(world_, 0, text), "the local snapshot's manifest");
    in_flight_ = {step, false, "", copy_seconds, waited_seconds + clock.seconds(), 0, 0, 0};
    phase_ = Phase::writing;
    wait_job();  // the last snapshot's retention
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_error_.clear();
    }
    post([this] { write_own_file(); });
}

// Each rank says 1 when done, W + 1 when failed: the sum tells both counts, and the lowest
// failing rank is -max(-rank) over those that failed.
std::optional<int> LocalSnapshotter::agree_done(bool done, bool failed) {
    const double ranks = world_.size();
    const double mine = failed ? ranks + 1 : done ? 1.0 : 0.0;
    const double sum = world_.size() == 1 ? mine : world_.all_reduce_scalar(mine, ReduceOp::sum);
    const double failures = std::floor(sum / (ranks + 1)), finished = sum - failures * (ranks + 1);
    if (failures + finished < ranks) return std::nullopt;
    if (failures == 0) return -1;
    const double lowest = world_.size() == 1 ? -file_.world_rank : world_.all_reduce_scalar(failed ? -file_.world_rank : -ranks, ReduceOp::max);
    return static_cast<int>(-lowest);
}

void LocalSnapshotter::advance(bool wait) {
    if (wait) wait_job();
    if (phase_ == Phase::writing) {
        const bool running = job_running();
        const std::optional<int> failed = agree_done(!running, !running && !job_error_.empty());
        if (!failed) return;
        if (*failed >= 0) return abandon(*failed);
        begin_replication();
        return;
    }
    // Replicating: the copies move at every boundary; once this rank's have arrived they are
    // stored in the background, after which it says it is done.
    do {
        if (!storing_ && transfers_done()) {
            storing_ = true;
            post([this] { store_replicas(); });
        }
        if (wait) wait_job();
        const bool done = storing_ && !job_running();
        const std::optional<int> failed = agree_done(done, done && !job_error_.empty());
        if (failed) return *failed >= 0 ? abandon(*failed) : complete();
        if (wait) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } while (wait);
}

// Every file is written: the manifest lists them all (size and XXH64 from an all-gather), each
// node stores it, and the copies start.
void LocalSnapshotter::begin_replication() {
    const size_t ranks = static_cast<size_t>(world_.size());
    std::vector<double> figures(2 * ranks, 0);
    // XXH64 travels as two exact 32-bit halves.
    figures[2 * static_cast<size_t>(file_.world_rank)] = static_cast<double>(own_length_);
    figures[2 * static_cast<size_t>(file_.world_rank) + 1] = 0;
    std::vector<double> hashes(2 * ranks, 0);
    hashes[2 * static_cast<size_t>(file_.world_rank)] = static_cast<double>(own_xxh64_ >> 32);
    hashes[2 * static_cast<size_t>(file_.world_rank) + 1] = static_cast<double>(own_xxh64_ & 0xffffffffu);
    figures.insert(figures.end(), hashes.begin(), hashes.end());
    figures = max_over(world_, figures);
    manifest_.files.clear();
    for (size_t r = 0; r < ranks; ++r) {
        const uint64_t hash = (static_cast<uint64_t>(figures[2 * ranks + 2 * r]) << 32) | static_cast<uint64_t>(figures[2 * ranks + 2 * r + 1]);
        manifest_.files.push_back({rank_file_name(static_cast<int>(r)), static_cast<uint64_t>(figures[2 * r]), hash});
    }
    in_flight_.own_bytes = own_length_;
    in_flight_.write_seconds = write_seconds_;
    transfers_.clear();
    for (int peer : holders_) {
        auto t = std::make_unique<Transfer>();
        t->peer = peer;
        t->sending = true;
        t->piece = file_.world_rank;
        t->data = own_bytes_.data();
        t->length = own_length_;
        transfers_.push_back(std::move(t));
    }
    for (int source : sources_) {
        auto t = std::make_unique<Transfer>();
        t->peer = source;
        t->piece = source;
        t->length = manifest_.files[static_cast<size_t>(source)].bytes;
        std::vector<char>& buffer = received_[source];  // reused: a fresh GB costs its page faults again
        buffer.resize((t->length + 3) / 4 * 4);
        t->data = buffer.data();
        transfers_.push_back(std::move(t));
    }
    for (auto& t : transfers_) t->messages = message_count(t->length);
    storing_ = false;
    phase_ = Phase::replicating;
    post([this] { write_manifest(); });
}

// Posts what the window allows and reaps what completed; true once every message of every
// transfer has arrived.
bool LocalSnapshotter::transfers_done() {
    bool all = true;
    for (auto& t : transfers_) {
        std::erase_if(t->in_flight, [](CommHandle& h) { return h.done(); });
        while (t->posted < t->messages && t->in_flight.size() < kMessagesInFlight) {
            const Message m = message(t->length, t->posted++);
            const Tensor words = words_of(t->data + m.offset, m.bytes);
            t->in_flight.push_back(t->sending ? copies_.send_async(words, t->peer) : copies_.recv_async(words, t->peer));
        }
        all = all && t->posted == t->messages && t->in_flight.empty();
    }
    return all;
}

void LocalSnapshotter::complete() {
    for (const auto& t : transfers_)
        if (!t->sending) in_flight_.replica_bytes += t->length;
    transfers_.clear();
    in_flight_.complete = true;
    in_flight_.seconds_to_complete = now_seconds() - started_at_;
    newest_complete_ = in_flight_.step;
    phase_ = Phase::idle;
    // Said for the first and then about every 100 steps (log.jsonl has every one).
    const int64_t every = std::max<int64_t>(1, 100 / config_.every_steps);
    if (file_.world_rank == 0 && completed_++ % every == 0)
        log_info("local snapshot of step ", in_flight_.step, ": complete in ", fixed(in_flight_.seconds_to_complete, 3), " s | step loop blocked ",
                 fixed(in_flight_.blocked_seconds, 3), " s (copy to host ", fixed(in_flight_.copy_seconds, 3), " s) | rank 0 keeps ",
                 megabytes(static_cast<double>(in_flight_.own_bytes)), " of its own and ", megabytes(static_cast<double>(in_flight_.replica_bytes)),
                 " of other nodes' ranks | ", holders_.size(), " cop", holders_.size() == 1 ? "y" : "ies", " of each piece on other nodes | ", root_);
    notify(in_flight_);
    if (nodes_.local_index(file_.world_rank) == 0) post([this] { apply_retention(); });
}

// A failed snapshot leaves the older ones as they are; its own pieces go, so that a restart
// never mistakes them for whole.
void LocalSnapshotter::abandon(int failed_rank) {
    wait_job();
    transfers_.clear();  // the handles wait for their messages first
    in_flight_.reason = !job_error_.empty() ? job_error_ : cat("rank ", failed_rank, " failed (its log names the reason)");
    if (!job_error_.empty()) log_warn("local snapshot of step ", in_flight_.step, " failed on rank ", file_.world_rank, ": ", job_error_);
    std::error_code ec;
    fs::remove(fs::path(step_dir(in_flight_.step)) / rank_file_name(file_.world_rank), ec);
    if (file_.world_rank == 0)
        log_warn("local snapshot of step ", in_flight_.step, " failed (", in_flight_.reason, "); training goes on, the persistent checkpoints are untouched",
                 newest_complete_ ? cat("; the newest local snapshot is step ", *newest_complete_) : "");
    phase_ = Phase::idle;
    notify(in_flight_);
}

void LocalSnapshotter::notify(const LocalSnapshotOutcome& outcome) {
    for (const auto& listener : listeners_) listener(outcome);
}

// ---- The background thread ----

// After the job before it; a job's error stays until the next snapshot starts.
void LocalSnapshotter::post(std::function<void()> job) {
    wait_job();
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_ = std::move(job);
        busy_ = true;
    }
    changed_.notify_all();
}

bool LocalSnapshotter::job_running() {
    std::lock_guard<std::mutex> lock(mutex_);
    return busy_;
}

void LocalSnapshotter::wait_job() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !busy_; });
}

void LocalSnapshotter::worker_loop() {
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10);  // below the training threads
    for (;;) {
        std::function<void()> job;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            changed_.wait(lock, [&] { return stopping_ || busy_; });
            if (!busy_) return;
            job = std::move(job_);
        }
        std::string error;
        try {
            job();
        } catch (const std::exception& e) {
            error = e.what();
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            busy_ = false;
            if (job_error_.empty()) job_error_ = error;
        }
        changed_.notify_all();
    }
}

void LocalSnapshotter::write_own_file() {
    Stopwatch clock;
    if (hooks_.before_write) hooks_.before_write(snapshot_.step);
    const std::string dir = step_dir(snapshot_.step);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) fail(ErrorKind::io, "cannot create '", dir, "': ", ec.message());
    fs::remove(fs::path(dir) / kManifest, ec);  // a manifest of an abandoned timeline's save of this step
    const std::string path = (fs::path(dir) / rank_file_name(file_.world_rank)).string(), part = path + ".part";
    FileAttributes attributes = file_;
    attributes.step = snapshot_.step;
    write_rank_file(part, snapshot_, attributes);
    own_length_ = read_file_words(part, own_bytes_);  // the bytes the peers get
    own_xxh64_ = xxh64_of(own_bytes_, own_length_);
    write_seconds_ = clock.seconds();
    fs::rename(part, path, ec);
    if (ec) fail(ErrorKind::io, "cannot rename '", part, "': ", ec.message());
}

void LocalSnapshotter::write_manifest() {
    write_replacing((fs::path(step_dir(manifest_.step)) / kManifest).string(), manifest_to_json(manifest_), file_.world_rank);
}

void LocalSnapshotter::store_replicas() {
    for (const auto& t : transfers_) {
        if (t->sending) continue;
        const CheckpointFile& expected = manifest_.files.at(static_cast<size_t>(t->piece));
        if (XXH64(t->data, t->length, 0) != expected.xxh64)
            fail(ErrorKind::io, "the copy of rank ", t->piece, "'s snapshot of step ", manifest_.step, " arrived damaged (XXH64 differs)");
        write_replacing((fs::path(step_dir(manifest_.step)) / rank_file_name(t->piece)).string(), t->data, t->length, file_.world_rank);
    }
}

// The node's first rank: the snapshots beyond the newest `keep` up to the one just completed
// go (a later one is the next snapshot, which another rank of the node may be writing).
void LocalSnapshotter::apply_retention() {
    const int64_t newest = *newest_complete_;
    int64_t kept = 0;
    for (int64_t step : steps_under(root_)) {
        if (step > newest || kept++ < config_.keep) continue;
        std::error_code ec;
        fs::remove_all(step_dir(step), ec);
        if (ec) log_warn("local snapshot retention: cannot delete '", step_dir(step), "': ", ec.message());
    }
}

// ---- Restart ----

namespace {

// This rank's verdict on the pieces of a snapshot its node holds: its own, and the copies of
// other nodes' ranks split among the node's ranks.
struct PieceCheck {
    std::optional<Manifest> manifest;
    std::vector<bool> verified;  // by world rank
};

PieceCheck check_pieces(const std::string& dir, const NodeMap& nodes, int rank, int ranks, const std::string& run_id, const LayoutCheck& same_layout,
                        std::string& why_not) {
    PieceCheck check;
    check.verified.assign(static_cast<size_t>(ranks), false);
    const std::string manifest_path = (fs::path(dir) / kManifest).string();
    try {
        Manifest m = manifest_from_json(read_whole_file(manifest_path), manifest_path);
        if (m.run_id != run_id) {
            why_not = cat("'", manifest_path, "' belongs to ", describe_run(m.run_id));
            return check;
        }
        if (const auto other = same_layout(m)) {
            why_not = *other;
            return check;
        }
        if (m.files.size() != static_cast<size_t>(ranks)) return check;
        check.manifest = std::move(m);
    } catch (const std::exception& e) {
        if (fs::exists(manifest_path)) why_not = e.what();
        return check;
    }
    const int node = nodes.node_of_rank.at(static_cast<size_t>(rank));
    const std::vector<int> local = nodes.ranks_on(node);
    const size_t index = static_cast<size_t>(nodes.local_index(rank));
    size_t remote_seen = 0;
    for (int q = 0; q < ranks; ++q) {
        const bool on_this_node = nodes.node_of_rank.at(static_cast<size_t>(q)) == node;
        const bool mine = on_this_node ? q == rank : remote_seen++ % local.size() == index;
        if (!mine) continue;
        const CheckpointFile& f = check.manifest->files[static_cast<size_t>(q)];
        const std::string path = (fs::path(dir) / f.name).string();
        std::error_code ec;
        if (fs::file_size(path, ec) != f.bytes || ec) continue;
        try {
            size_t length = 0;
            const std::vector<char> bytes = read_file_words(path, length);
            check.verified[static_cast<size_t>(q)] = xxh64_of(bytes, length) == f.xxh64;
        } catch (const std::exception&) {
        }
    }
    return check;
}

// holder[q]: the lowest rank that verified piece q (-1: none); need[q]: rank q lacks its own.
struct Availability {
    std::vector<int> holder;
    std::vector<bool> need;
    int manifest_holder = -1;
};

Availability agree_availability(Comm& world, const PieceCheck& check) {
    const size_t ranks = static_cast<size_t>(world.size());
    const double none = -static_cast<double>(ranks) - 1;
    std::vector<double> v(2 * ranks + 1, none);
    for (size_t q = 0; q < ranks; ++q) {
        if (check.verified[q]) v[q] = -world.rank();
        v[ranks + q] = (q == static_cast<size_t>(world.rank()) && !check.verified[q]) ? 1.0 : 0.0;
    }
    if (check.manifest) v[2 * ranks] = -world.rank();
    v = max_over(world, v);
    Availability a;
    for (size_t q = 0; q < ranks; ++q) {
        a.holder.push_back(v[q] == none ? -1 : static_cast<int>(-v[q]));
        a.need.push_back(v[ranks + q] > 0);
    }
    a.manifest_holder = v[2 * ranks] == none ? -1 : static_cast<int>(-v[2 * ranks]);
    return a;
}

// Rank q's file from its holder into q's node, in the order of q (no rank waits on another in
// a cycle); q checks the XXH64 before the rename.
uint64_t fetch_missing(Comm& copies, const Availability& a, const Manifest& manifest, const std::string& dir) {
    uint64_t fetched = 0;
    for (int q = 0; q < copies.size(); ++q) {
        if (!a.need[static_cast<size_t>(q)]) continue;
        const int holder = a.holder[static_cast<size_t>(q)];
        const CheckpointFile& f = manifest.files[static_cast<size_t>(q)];
        const std::string path = (fs::path(dir) / f.name).string();
        if (copies.rank() == holder) {
            size_t length = 0;
            std::vector<char> bytes = read_file_words(path, length);
            for (size_t i = 0; i < message_count(f.bytes); ++i) {
                const Message m = message(f.bytes, i);
                copies.send(words_of(bytes.data() + m.offset, m.bytes), q);
            }
        } else if (copies.rank() == q) {
            std::vector<char> bytes = word_buffer(f.bytes);
            for (size_t i = 0; i < message_count(f.bytes); ++i) {
                const Message m = message(f.bytes, i);
                copies.recv(words_of(bytes.data() + m.offset, m.bytes), holder);
            }
            if (xxh64_of(bytes, f.bytes) != f.xxh64) fail(ErrorKind::io, "rank ", q, "'s snapshot piece fetched from rank ", holder, " arrived damaged (XXH64 differs)");
            std::error_code ec;
            fs::create_directories(dir, ec);
            write_replacing(path, bytes.data(), f.bytes, q);
        }
        fetched += f.bytes;
    }
    return fetched;
}

}  // namespace

std::optional<LocalResume> agree_on_local_snapshot(Comm& world, Comm& copies, const NodeMap& nodes, const std::string& root, const std::string& run_id, int64_t newer_than,
                                                   const LayoutCheck& same_layout, const std::function<void(const std::string&)>& skipped) {
    const std::vector<int64_t> mine = steps_under(root);
    const int ranks = world.size();
    for (double below = std::numeric_limits<double>::infinity();;) {
        // The newest step below the last candidate that any rank holds.
        double step = -1;
        for (int64_t s : mine)
            if (static_cast<double>(s) < below) {
                step = static_cast<double>(s);
                break;
            }
        step = max_over(world, {step})[0];
        if (step < 0 || step <= static_cast<double>(newer_than)) return std::nullopt;
        below = step;
        const std::string dir = (fs::path(root) / checkpoint_name(static_cast<int64_t>(step))).string();
        std::string why_not;
        const PieceCheck check = check_pieces(dir, nodes, world.rank(), ranks, run_id, same_layout, why_not);
        const Availability a = agree_availability(world, check);
        std::vector<int> lost;
        for (int q = 0; q < ranks; ++q)
            if (a.holder[static_cast<size_t>(q)] < 0) lost.push_back(q);
        if (a.manifest_holder < 0 || !lost.empty()) {
            const double layout_refused = max_over(world, {why_not.empty() ? 0.0 : 1.0})[0];
            std::string reason = a.manifest_holder < 0 ? "no node holds its manifest" : cat("no node holds a whole copy of the piece of rank ", lost.front(), lost.size() > 1 ? cat(" and ", lost.size() - 1, " other rank(s)") : "",
                                                                       " (missing, or failing its size or XXH64)");
            if (layout_refused > 0) reason += why_not.empty() ? "; another rank found it was written by another run or layout" : cat("; ", why_not);
            skipped(cat("local snapshot of step ", static_cast<int64_t>(step), " passed over: ", reason));
            continue;
        }
        const Manifest manifest = manifest_from_json(broadcast_text(world, a.manifest_holder, world.rank() == a.manifest_holder ? manifest_to_json(*check.manifest) : ""),
                                                     "the local snapshot's manifest");
        LocalResume resume{dir, manifest, 0, 0};
        for (int q = 0; q < ranks; ++q) resume.fetched += a.need[static_cast<size_t>(q)] ? 1 : 0;
        resume.fetched_bytes = fetch_missing(copies, a, manifest, dir);
        if (!check.manifest) {
            std::error_code ec;
            fs::create_directories(dir, ec);
            write_replacing((fs::path(dir) / kManifest).string(), manifest_to_json(manifest), world.rank());
        }
        return resume;
    }
}

}  // namespace llmtrain
