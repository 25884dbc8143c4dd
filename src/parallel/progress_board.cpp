#include "parallel/progress_board.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <map>

#include "core/error.h"
#include "parallel/hang_diagnosis.h"

namespace llmtrain {

namespace {

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <class T>
void publish(T& field, T value) {
    std::atomic_ref<T>(field).store(value, std::memory_order_relaxed);
}
template <class T>
T peek(const T& field) {
    return std::atomic_ref<T>(const_cast<T&>(field)).load(std::memory_order_relaxed);
}

constexpr uint64_t kLow56 = (uint64_t{1} << 56) - 1, kLow48 = (uint64_t{1} << 48) - 1;

double age_of(int64_t then_ns, int64_t now) { return static_cast<double>(now - then_ns) * 1e-9; }

// The state /proc gives a process of this node: R running, S sleeping, D uninterruptible, T
// stopped, t traced, Z zombie; no entry: it has exited.
ProcessState process_state(int32_t pid) {
    if (pid <= 0) return ProcessState::unknown;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    if (!stat) return ProcessState::gone;
    std::string line;
    std::getline(stat, line);
    const size_t name_end = line.rfind(')');  // the command name may hold spaces
    if (name_end == std::string::npos || name_end + 2 >= line.size()) return ProcessState::unknown;
    switch (line[name_end + 2]) {
        case 'T':
        case 't': return ProcessState::stopped;
        case 'Z':
        case 'X': return ProcessState::gone;
        case 'D': return ProcessState::uninterruptible;
        default: return ProcessState::running;
    }
}

WaitProgress read_wait(const SharedRank& record, Waiter who, int64_t now) {
    const uint64_t word = peek(record.wait[static_cast<int>(who)]);
    if (word == 0) return {};
    return {static_cast<int32_t>(word >> 56) - 1, static_cast<CommOp>((word >> 48) & 0xff), word & kLow48,
            age_of(peek(record.wait_ns[static_cast<int>(who)]), now)};
}

}  // namespace

const ChannelProgress* RankProgress::find(const std::string& group, CommLane lane) const {
    for (int c = 0; c < channels; ++c)
        if (channel[c].lane == lane && group == channel[c].group) return &channel[c];
    return nullptr;
}

void ProgressChannel::arrived(CommOp op, uint64_t seq) const {
    if (!rank_) return;
    SharedChannel& ch = rank_->channel[index_];
    publish(ch.collective_ns, now_ns());
    publish(ch.collective, uint64_t{static_cast<uint8_t>(op)} << 56 | (seq & kLow56));
}

void ProgressChannel::point_to_point(CommOp op, int peer_world_rank) const {
    if (!rank_) return;
    SharedChannel& ch = rank_->channel[index_];
    publish(ch.p2p_ns, now_ns());
    publish(ch.p2p, (uint64_t{static_cast<uint8_t>(op)} + 1) << 56 | static_cast<uint64_t>(peer_world_rank));
}

void ProgressChannel::waiting(Waiter who, CommOp op, uint64_t seq_or_peer) const {
    if (!rank_) return;
    publish(rank_->wait_ns[static_cast<int>(who)], now_ns());
    publish(rank_->wait[static_cast<int>(who)], uint64_t(index_ + 1) << 56 | uint64_t{static_cast<uint8_t>(op)} << 48 | (seq_or_peer & kLow48));
}

void ProgressChannel::done_waiting(Waiter who) const {
    if (rank_) publish(rank_->wait[static_cast<int>(who)], uint64_t{0});
}

ProgressBoard::ProgressBoard(Layout layout, SharedRank* node_records, std::shared_ptr<void> segment)
    : layout_(std::move(layout)), records_(node_records), segment_(std::move(segment)) {
    SharedRank& mine = records_[layout_.local_index_of_rank.at(static_cast<size_t>(layout_.world_rank))];
    publish(mine.pid, static_cast<int32_t>(getpid()));
}

std::shared_ptr<ProgressBoard> ProgressBoard::private_board(int world_rank, const std::string& node_name, GroupRanks group_ranks) {
    auto record = std::make_shared<SharedRank>();
    Layout layout;
    layout.world_rank = world_rank;
    layout.node_of_rank.assign(static_cast<size_t>(world_rank) + 1, -1);
    layout.local_index_of_rank.assign(static_cast<size_t>(world_rank) + 1, -1);
    layout.host_of_rank.assign(static_cast<size_t>(world_rank) + 1, "");
    layout.node_of_rank.back() = 0;
    layout.local_index_of_rank.back() = 0;
    layout.host_of_rank.back() = node_name;
    layout.group_ranks = std::move(group_ranks);
    return std::make_shared<ProgressBoard>(std::move(layout), record.get(), record);
}

ProgressChannel ProgressBoard::channel(const std::string& group, CommLane lane) {
    const std::lock_guard lock(mutex_);
    SharedRank& mine = records_[layout_.local_index_of_rank.at(static_cast<size_t>(layout_.world_rank))];
    const int channels = peek(mine.channels);
    const std::string name = group.substr(0, kGroupNameBytes - 1);
    // A group's communicator made again (another trainer on the same context) counts afresh
    // in its old channel: every rank makes them in the same order.
    for (int c = 0; c < channels; ++c) {
        SharedChannel& ch = mine.channel[c];
        if (ch.lane != static_cast<uint64_t>(lane) || name != ch.group) continue;
        publish(ch.collective, uint64_t{0});
        publish(ch.p2p, uint64_t{0});
        return ProgressChannel(&mine, c);
    }
    const int index = channels;
    if (index >= kMaxChannels) fail(ErrorKind::runtime, "progress board: more than ", kMaxChannels, " communication channels on world rank ", layout_.world_rank);
    SharedChannel& ch = mine.channel[index];
    std::memset(ch.group, 0, sizeof ch.group);
    std::memcpy(ch.group, name.data(), name.size());
    ch.lane = static_cast<uint64_t>(lane);
    // Readers take the channel count first (acquire), then the name it covers.
    std::atomic_ref<int32_t>(mine.channels).store(index + 1, std::memory_order_release);
    return ProgressChannel(&mine, index);
}

const std::string& ProgressBoard::node_name_of(int world_rank) const {
    return layout_.host_of_rank.at(static_cast<size_t>(world_rank));
}

bool ProgressBoard::on_this_node(int world_rank) const {
    const auto& node_of = layout_.node_of_rank;
    return world_rank >= 0 && static_cast<size_t>(world_rank) < node_of.size() && node_of[static_cast<size_t>(world_rank)] >= 0 &&
           node_of[static_cast<size_t>(world_rank)] == node_of[static_cast<size_t>(layout_.world_rank)];
}

RankProgress ProgressBoard::read_local(int world_rank) const {
    const SharedRank& record = records_[layout_.local_index_of_rank.at(static_cast<size_t>(world_rank))];
    const int64_t now = now_ns();
    RankProgress p;
    p.world_rank = world_rank;
    p.process = process_state(peek(record.pid));
    p.host_wait = read_wait(record, Waiter::host, now);
    p.device_wait = read_wait(record, Waiter::device, now);
    p.channels = std::min(std::atomic_ref<int32_t>(const_cast<int32_t&>(record.channels)).load(std::memory_order_acquire), kMaxChannels);
    for (int c = 0; c < p.channels; ++c) {
        const SharedChannel& from = record.channel[c];
        ChannelProgress& to = p.channel[c];
        std::memcpy(to.group, from.group, sizeof to.group);
        to.group[sizeof to.group - 1] = 0;
        to.lane = static_cast<CommLane>(from.lane);
        const uint64_t collective = peek(from.collective), p2p = peek(from.p2p);
        to.collective_op = static_cast<CommOp>(collective >> 56);
        to.collectives = collective & kLow56;
        to.collective_age_s = age_of(peek(from.collective_ns), now);
        to.any_p2p = p2p != 0;
        to.p2p_op = static_cast<CommOp>((p2p >> 56) - (p2p != 0));
        to.p2p_peer = static_cast<int32_t>(p2p & kLow56);
        to.p2p_age_s = age_of(peek(from.p2p_ns), now);
    }
    return p;
}

std::vector<RankProgress> read_on_this_node(const ProgressBoard& board, const std::vector<int>& world_ranks) {
    std::vector<RankProgress> records;
    for (int rank : world_ranks)
        if (board.on_this_node(rank)) records.push_back(board.read_local(rank));
    return records;
}

void ProgressBoard::answer_questions() {
    if (!exchange_) return;
    // Asking MPI costs microseconds; a waiting host asks 100 times a second at most.
    const auto now = std::chrono::steady_clock::now();
    if (now - last_answer_ < std::chrono::milliseconds(10)) return;
    last_answer_ = now;
    exchange_->answer();
}

std::string ProgressBoard::diagnose_hang(const HungOperation& hung, double budget_seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(budget_seconds));
    std::map<int, RankProgress> known;
    std::vector<int> asked;
    const ProgressLookup lookup = [&](int rank) -> const RankProgress* {
        if (rank < 0 || static_cast<size_t>(rank) >= layout_.node_of_rank.size()) return nullptr;
        if (!known.count(rank) && on_this_node(rank)) known.emplace(rank, read_local(rank));
        const auto found = known.find(rank);
        return found == known.end() ? nullptr : &found->second;
    };
    const NodeNameOf node_name = [this](int rank) { return node_name_of(rank); };
    // Each pass names the ranks on other nodes it needed and could not read; they are asked
    // for, and the explanation is made again with their records, until nothing new is needed.
    for (;;) {
        HangExplanation explanation = explain_hang(hung, lookup, layout_.group_ranks, node_name);
        std::vector<int> wanted;
        for (int rank : explanation.unread)
            if (std::find(asked.begin(), asked.end(), rank) == asked.end()) wanted.push_back(rank);
        if (wanted.empty() || !exchange_ || std::chrono::steady_clock::now() >= deadline) return explanation.text;
        asked.insert(asked.end(), wanted.begin(), wanted.end());
        for (RankProgress& p : exchange_->ask(wanted, deadline)) known[p.world_rank] = p;
    }
}

}  // namespace llmtrain
