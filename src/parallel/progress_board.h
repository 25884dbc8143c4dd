// ProgressBoard: how far each rank got in its communication, published so that a timeout can
// name the ranks that never arrived instead of "a rank of this group has died or hangs".
//
// Every rank owns one record in a memory segment shared by the ranks of its node. A Comm
// publishes into its channel of that record (one per group and lane: the dp group's host
// collectives, its device collectives, ...): the number of collectives it has entered and
// the last one's op and start time, its last point-to-point operation, and, while the host
// or the device waits on one, which. Publishing is a few relaxed atomic stores and a read of
// the monotonic clock (no system call): nothing a collective would notice.
//
// At a timeout the rank reads the records of its group's members (diagnose_hang): those on
// its node from the shared segment, whatever state their process is in (a stopped or dead
// rank's last record stays readable); those on other nodes by asking their node's ranks over
// a communicator of its own (ProgressExchange), answered by every rank that is still
// polling MPI (any rank waiting in a collective), within a bounded time. A record compares by
// sequence number: collective #n of a group is the same operation on every member, since
// every member enters a group's collectives in the same order.
//
// What is guaranteed: a rank on the diagnosing rank's node is always read. A rank on another
// node is read only when some rank of that node answers within the budget; a node all of
// whose ranks are stopped, dead or busy outside communication is reported as not answering.
// A record is read while its owner may be writing it: fields published together may be
// read one operation apart (a running rank); a stopped or dead rank's record is still.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace llmtrain {

// Who waits on a channel's operation: the host (MPI) or the device (a stream).
enum class Waiter { host, device };

// Which lane of a group a channel counts: the host's (MPI) collectives, the device's main
// stream, the device's stream toward lower ranks (event_ordered_comm.h).
enum class CommLane : uint8_t { host, device, device_reverse };

constexpr size_t kGroupNameBytes = 24;
constexpr int kMaxChannels = 24;

// One channel as read at one moment; ages are seconds before that moment.
struct ChannelProgress {
    char group[kGroupNameBytes] = {};
    CommLane lane = CommLane::host;
    uint64_t collectives = 0;  // entered so far; the last is #collectives, a collective_op
    CommOp collective_op = CommOp::barrier;
    bool any_p2p = false;   // whether p2p_op and p2p_peer say anything
    CommOp p2p_op = CommOp::send;
    int32_t p2p_peer = -1;  // world rank
    double collective_age_s = 0, p2p_age_s = 0;
};

// What a rank waits on: an index into its channels, the operation and its sequence number
// (collectives) or peer (point-to-point).
struct WaitProgress {
    int32_t channel = -1;  // -1: not waiting
    CommOp op = CommOp::barrier;
    uint64_t value = 0;
    double age_s = 0;
};

enum class ProcessState : int32_t { unknown, running, stopped, uninterruptible, gone };

// One rank's record as read at one moment: plain bytes, sent as they are between nodes.
struct RankProgress {
    int32_t world_rank = -1;
    ProcessState process = ProcessState::unknown;  // only for ranks read on their own node
    WaitProgress host_wait, device_wait;
    int32_t channels = 0;
    ChannelProgress channel[kMaxChannels];
    // The channel of (group, lane), or null.
    const ChannelProgress* find(const std::string& group, CommLane lane) const;
};

// The shared segment's layout, written through std::atomic_ref.
struct SharedChannel {
    char group[kGroupNameBytes];
    uint64_t lane;
    uint64_t collective;  // op << 56 | count
    int64_t collective_ns;
    uint64_t p2p;  // (op + 1) << 56 | peer world rank; 0: none yet
    int64_t p2p_ns;
};
struct SharedRank {
    int32_t pid;
    int32_t channels;
    uint64_t wait[2];  // by Waiter: (channel + 1) << 56 | op << 48 | seq or peer; 0: none
    int64_t wait_ns[2];
    SharedChannel channel[kMaxChannels];
};

// The publishing end of one channel, held by a Comm. Default-constructed: publishes nothing.
// next_collective is called by the thread that issues the channel's operations; the others
// by whoever sees the operation start (the issuing thread, or a device watchdog's thread).
class ProgressChannel {
public:
    ProgressChannel() = default;
    ProgressChannel(SharedRank* rank, int index) : rank_(rank), index_(index) {}
    explicit operator bool() const { return rank_ != nullptr; }
    int index() const { return index_; }

    // The sequence number of the channel's next collective (1, 2, ...).
    uint64_t next_collective() { return ++issued_; }
    // Collective #seq has started on this rank (it arrived).
    void arrived(CommOp op, uint64_t seq) const;
    void point_to_point(CommOp op, int peer_world_rank) const;
    // `who` waits on an operation of this channel (seq: a collective's; peer for send and recv).
    void waiting(Waiter who, CommOp op, uint64_t seq_or_peer) const;
    void done_waiting(Waiter who) const;

private:
    SharedRank* rank_ = nullptr;
    int index_ = -1;
    uint64_t issued_ = 0;
};

// An operation that did not complete, as the diagnosis needs it.
struct HungOperation {
    std::string group;          // "dp"
    CommLane lane = CommLane::host;
    CommOp op = CommOp::barrier;
    uint64_t seq = 0;           // collectives: its sequence number in the channel
    int peer = -1;              // send / recv: the peer's world rank
    std::vector<int> members;   // the group's world ranks
    int self = 0;               // the diagnosing rank's world rank
};

// The world ranks of `group` (a ParallelContext group name) that hold `world_rank`.
using GroupRanks = std::function<std::vector<int>(const std::string& group, int world_rank)>;

// Reads records on other nodes: asks, and answers others' questions.
class ProgressExchange {
public:
    virtual ~ProgressExchange() = default;
    // The records of `world_ranks` (all on other nodes), asked of their nodes' ranks and
    // waited for until `deadline`; ranks whose node did not answer are left out.
    virtual std::vector<RankProgress> ask(const std::vector<int>& world_ranks, std::chrono::steady_clock::time_point deadline) = 0;
    // Answers the questions that have arrived (never blocks). Only from the thread that
    // calls MPI.
    virtual void answer() = 0;
};

class ProgressBoard {
public:
    struct Layout {
        int world_rank = 0;
        // By world rank (a few bytes per rank of the job, kept from start-up): the node whose
        // memory it shares (MPI's), its record's index in that node's segment, and the name
        // of its node as messages give it (this_node_name, which a test may set per rank).
        std::vector<int> node_of_rank;
        std::vector<int> local_index_of_rank;
        std::vector<std::string> host_of_rank;
        GroupRanks group_ranks;
    };
    // node_records: this node's segment (local_size records), owned by `segment`.
    ProgressBoard(Layout layout, SharedRank* node_records, std::shared_ptr<void> segment);
    // A board of this process alone (tests, a single process): one record, nothing remote.
    static std::shared_ptr<ProgressBoard> private_board(int world_rank, const std::string& node_name, GroupRanks group_ranks);

    void set_exchange(std::unique_ptr<ProgressExchange> exchange) { exchange_ = std::move(exchange); }
    // This rank's channel of (group, lane), counting from 0 (one made before for the same
    // group and lane is taken over); throws past kMaxChannels.
    ProgressChannel channel(const std::string& group, CommLane lane);

    const std::string& node_name_of(int world_rank) const;
    bool on_this_node(int world_rank) const;
    // The record of a rank of this node, read now.
    RankProgress read_local(int world_rank) const;
    // Answers other nodes' questions: call where the host waits (rate-limited inside).
    void answer_questions();
    // Why `hung` did not complete, from the records of the ranks it concerns (the text after
    // "did not complete within ... s: "). Waits up to `budget_seconds` for other nodes.
    std::string diagnose_hang(const HungOperation& hung, double budget_seconds);

private:
    Layout layout_;
    SharedRank* records_;
    std::shared_ptr<void> segment_;
    std::unique_ptr<ProgressExchange> exchange_;
    std::mutex mutex_;  // channel registration
    std::chrono::steady_clock::time_point last_answer_{};
};

// The board of an MPI job: a collective over MPI_COMM_WORLD (MPI initialized). Each node's
// segment is a POSIX shared-memory object, unlinked as soon as the node's ranks have mapped
// it (nothing is left behind, whatever ends the job); other nodes are asked over a duplicate
// of MPI_COMM_WORLD used for nothing else. Throws when the segment cannot be made.
// NodeScope::each_rank makes every rank a node of its own, so that a test on one machine
// reads every other rank's record through the exchange between nodes.
enum class NodeScope { shared_memory, each_rank };
std::shared_ptr<ProgressBoard> make_mpi_progress_board(GroupRanks group_ranks, NodeScope scope = NodeScope::shared_memory);

// The records a node answers with: `world_ranks`' records read by `board` (those on its node).
std::vector<RankProgress> read_on_this_node(const ProgressBoard& board, const std::vector<int>& world_ranks);

}  // namespace llmtrain
