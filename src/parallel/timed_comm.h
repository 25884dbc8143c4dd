// Time spent in communication, per group and operation, measured around any Comm without
// touching it: a TimedComm forwards every call to the Comm it wraps and adds the time the
// calling thread was blocked (the call itself, and wait() of an asynchronous operation) to
// a CommTimes table. That is the exposed communication time, what a step loses to it; a
// transfer overlapped with computation costs only its wait.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "parallel/context.h"

namespace llmtrain {

inline constexpr int comm_op_count = 8;  // the values of CommOp (comm.h)

// Seconds per (group, op) since the start, added to on the thread that communicates (the
// step loop's: MPI runs funneled), read on the same thread.
class CommTimes {
public:
    using Row = std::array<double, comm_op_count>;
    struct Group {
        std::string name;
        Row seconds{};
    };
    // A new row for a group; the index stays valid for the table's life.
    size_t add_group(const std::string& name);
    void add(size_t group, CommOp op, double seconds) { groups_[group].seconds[static_cast<size_t>(op)] += seconds; }
    const std::vector<Group>& groups() const { return groups_; }
    double total_seconds() const;

private:
    std::vector<Group> groups_;
};

// A Comm that times every operation of inner into times.
std::unique_ptr<Comm> make_timed_comm(std::unique_ptr<Comm> inner, CommTimes& times);

// Wraps every group of ctx (world, tp, dp, pp, embedding) before anything holds on to them;
// times must outlive ctx's groups.
void time_communication(ParallelContext& ctx, CommTimes& times);

}  // namespace llmtrain
