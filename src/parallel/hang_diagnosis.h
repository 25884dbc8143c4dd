// Which ranks held up an operation that timed out, from the progress they published
// (progress_board.h). A member of the group never arrived at collective #n when it has
// entered fewer than n of that group's collectives on that lane. Such a rank is either the
// cause (stopped, dead, busy elsewhere: "never arrived") or itself held up, waiting in
// another group's collective, whose missing members are looked for in turn: the answer
// names the ranks at the end of those chains, which is where an operator has to look.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "parallel/progress_board.h"

namespace llmtrain {

// A rank's record, or null when it could not be read.
using ProgressLookup = std::function<const RankProgress*(int world_rank)>;
using NodeNameOf = std::function<std::string(int world_rank)>;

struct HangExplanation {
    std::string text;          // "world rank 1 on host n07 never arrived (its last collective: ...)"
    std::vector<int> unread;   // ranks the explanation needed whose records were not there
};

// The members of hung's group (or its peer) that did not arrive, each explained: following
// the ranks they wait on, to a depth of a few groups; at most 8 ranks are named per list.
HangExplanation explain_hang(const HungOperation& hung, const ProgressLookup& progress, const GroupRanks& group_ranks, const NodeNameOf& node_name);

// The members of hung's group, other than hung.self, whose records say they did not arrive.
std::vector<int> ranks_not_arrived(const HungOperation& hung, const ProgressLookup& progress);

}  // namespace llmtrain
