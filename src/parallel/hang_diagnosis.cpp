#include "parallel/hang_diagnosis.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "core/error.h"

namespace llmtrain {

namespace {

constexpr size_t kNamedPerList = 8;
constexpr int kMaxDepth = 3;  // groups followed from the hung one

bool is_point_to_point(CommOp op) { return op == CommOp::send || op == CommOp::recv; }

std::string seconds(double s) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f", s);
    return text;
}

std::string lane_text(CommLane lane) {
    if (lane == CommLane::device) return " on the device";
    if (lane == CommLane::device_reverse) return " on the device, toward lower ranks";
    return "";
}

// "all_reduce #12 in the dp group", "send to world rank 3 in the pp group on the device"
std::string operation_text(CommOp op, uint64_t seq_or_peer, const std::string& group, CommLane lane) {
    const std::string where = cat(" in the ", group, " group", lane_text(lane));
    if (op == CommOp::send) return cat("send to world rank ", seq_or_peer, where);
    if (op == CommOp::recv) return cat("recv from world rank ", seq_or_peer, where);
    return cat(comm_op_name(op), " #", seq_or_peer, where);
}

bool arrived(const RankProgress& p, const std::string& group, CommLane lane, uint64_t seq) {
    const ChannelProgress* channel = p.find(group, lane);
    return channel && channel->collectives >= seq;
}

// "its last collective: all_reduce #1233 in the tp group, 10.2 s ago"
std::string last_activity(const RankProgress& p) {
    const ChannelProgress* newest = nullptr;
    bool newest_is_p2p = false;
    double age = 0;
    for (int c = 0; c < p.channels; ++c) {
        const ChannelProgress& ch = p.channel[c];
        if (ch.collectives > 0 && (!newest || ch.collective_age_s < age)) newest = &ch, newest_is_p2p = false, age = ch.collective_age_s;
        if (ch.any_p2p && (!newest || ch.p2p_age_s < age)) newest = &ch, newest_is_p2p = true, age = ch.p2p_age_s;
    }
    if (!newest) return "it has entered no collective yet";
    if (newest_is_p2p)
        return cat("its last operation: ", operation_text(newest->p2p_op, static_cast<uint64_t>(newest->p2p_peer), newest->group, newest->lane), ", ",
                   seconds(age), " s ago");
    return cat("its last collective: ", operation_text(newest->collective_op, newest->collectives, newest->group, newest->lane), ", ", seconds(age), " s ago");
}

std::string process_text(ProcessState state) {
    switch (state) {
        case ProcessState::stopped: return "; its process is stopped (SIGSTOP, or a debugger)";
        case ProcessState::gone: return "; its process has exited";
        case ProcessState::uninterruptible: return "; its process is in uninterruptible sleep (I/O, or a driver)";
        case ProcessState::running:
        case ProcessState::unknown: break;
    }
    return "";
}

std::string rank_list(const std::vector<int>& ranks) {
    std::string text;
    for (size_t i = 0; i < ranks.size(); ++i) text += cat(i ? ", " : "", ranks[i]);
    return text;
}

// Splits `members` (but the skipped ones) into those that did not arrive at collective #seq
// of (group, lane) and those whose records are missing.
template <class Skip>
void split_members(const std::vector<int>& members, const std::string& group, CommLane lane, uint64_t seq, const ProgressLookup& progress, Skip skip,
                   std::vector<int>& missing, std::vector<int>& unknown) {
    for (int rank : members) {
        if (skip(rank)) continue;
        const RankProgress* p = progress(rank);
        if (!p) unknown.push_back(rank);
        else if (!arrived(*p, group, lane, seq)) missing.push_back(rank);
    }
}

class Explainer {
public:
    Explainer(const ProgressLookup& progress, const GroupRanks& group_ranks, const NodeNameOf& node_name)
        : progress_(progress), group_ranks_(group_ranks), node_name_(node_name) {}

    std::string explain(const HungOperation& hung) {
        visited_.insert(hung.self);
        std::vector<int> missing, unknown;
        if (is_point_to_point(hung.op)) {
            (progress_(hung.peer) ? missing : unknown).push_back(hung.peer);
        } else {
            sort_out(hung.members, hung.group, hung.lane, hung.seq, missing, unknown);
        }
        std::string text = missing.empty() ? "" : accounts(missing, 0);
        if (!unknown.empty()) text += cat(text.empty() ? "" : "; ", unread_text(unknown));
        if (text.empty()) text = "every rank of the group arrived at it: the transfer itself is stuck (the network, or a device that does not progress)";
        return text;
    }

    std::vector<int> unread;

private:
    void sort_out(const std::vector<int>& members, const std::string& group, CommLane lane, uint64_t seq, std::vector<int>& missing, std::vector<int>& unknown) const {
        split_members(members, group, lane, seq, progress_, [this](int rank) { return visited_.count(rank) > 0; }, missing, unknown);
    }

    std::string unread_text(const std::vector<int>& ranks) {
        unread.insert(unread.end(), ranks.begin(), ranks.end());
        return cat("no record of world rank", ranks.size() > 1 ? "s " : " ", rank_list(ranks), " could be read (no rank of ", ranks.size() > 1 ? "their" : "its",
                   " node answered)");
    }

    std::string accounts(const std::vector<int>& ranks, int depth) {
        const size_t named = std::min(ranks.size(), kNamedPerList);
        for (size_t i = 0; i < named; ++i) visited_.insert(ranks[i]);
        std::string text;
        for (size_t i = 0; i < named; ++i) text += cat(i ? "; " : "", account(ranks[i], depth));
        if (ranks.size() > named) text += cat("; and ", ranks.size() - named, " more");
        return text;
    }

    std::string account(int rank, int depth) {
        const RankProgress& p = *progress_(rank);
        const std::string who = cat("world rank ", rank, " on host ", node_name_(rank));
        const WaitProgress& wait = p.host_wait.channel >= 0 ? p.host_wait : p.device_wait;
        if (wait.channel < 0 || wait.channel >= p.channels || depth >= kMaxDepth)
            return cat(who, " never arrived (", last_activity(p), process_text(p.process), ")");
        const ChannelProgress& ch = p.channel[wait.channel];
        std::string text = cat(who, " is held up: it waits in ", operation_text(wait.op, wait.value, ch.group, ch.lane), " (for ", seconds(wait.age_s), " s)");
        std::vector<int> missing, unknown;
        if (is_point_to_point(wait.op)) {
            const int peer = static_cast<int>(wait.value);
            if (!visited_.count(peer)) (progress_(peer) ? missing : unknown).push_back(peer);
        } else {
            sort_out(group_ranks_(ch.group, rank), ch.group, ch.lane, wait.value, missing, unknown);
        }
        if (!missing.empty()) text += cat(", where ", accounts(missing, depth + 1));
        if (!unknown.empty()) text += cat(", where ", unread_text(unknown));
        return text;
    }

    const ProgressLookup& progress_;
    const GroupRanks& group_ranks_;
    const NodeNameOf& node_name_;
    std::set<int> visited_;
};

}  // namespace

HangExplanation explain_hang(const HungOperation& hung, const ProgressLookup& progress, const GroupRanks& group_ranks, const NodeNameOf& node_name) {
    Explainer explainer(progress, group_ranks, node_name);
    std::string text = explainer.explain(hung);
    return {std::move(text), std::move(explainer.unread)};
}

std::vector<int> ranks_not_arrived(const HungOperation& hung, const ProgressLookup& progress) {
    std::vector<int> missing, unknown;
    split_members(hung.members, hung.group, hung.lane, hung.seq, progress, [&hung](int rank) { return rank == hung.self; }, missing, unknown);
    return missing;
}

}  // namespace llmtrain
