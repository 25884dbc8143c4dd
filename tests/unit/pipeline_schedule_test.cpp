// Interleaved 1F1B: the generated tables against tables written by hand, the activation sets
// each chunk needs, the bubble, and a run of every stage's table over in-order channels.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline_schedule.h"

namespace llmtrain {
namespace {

// Written out from the rule (warm-up (P - s - 1) * 2 + (V - 1) * P, micro-batches in groups
// of P per chunk, backwards from the last chunk), one table per stage.
TEST(InterleavedSchedule, TwoStagesTwoChunksFourMicroBatches_MatchesTheHandMadeTables) {
    EXPECT_EQ(schedule_text(interleaved_schedule(2, 0, 4, 2)), "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
    EXPECT_EQ(schedule_text(interleaved_schedule(2, 1, 4, 2)), "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
}

// M = P: the first two stages' warm-up covers every forward.
TEST(InterleavedSchedule, FourStagesTwoChunksFourMicroBatches_MatchesTheHandMadeTables) {
    const std::string all_forwards_first = "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 B0.1 B1.1 B2.1 B3.1 B0.0 B1.0 B2.0 B3.0";
    EXPECT_EQ(schedule_text(interleaved_schedule(4, 0, 4, 2)), all_forwards_first);
    EXPECT_EQ(schedule_text(interleaved_schedule(4, 1, 4, 2)), all_forwards_first);
    EXPECT_EQ(schedule_text(interleaved_schedule(4, 2, 4, 2)), "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 B0.1 F3.1 B1.1 B2.1 B3.1 B0.0 B1.0 B2.0 B3.0");
    EXPECT_EQ(schedule_text(interleaved_schedule(4, 3, 4, 2)), "F0.0 F1.0 F2.0 F3.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 B0.0 B1.0 B2.0 B3.0");
}

TEST(InterleavedSchedule, TwoStagesThreeChunksTwoMicroBatches_MatchesTheHandMadeTables) {
    // Warm-up 2 + 4 = 6 = M * V on stage 0; 0 + 4 on stage 1.
    EXPECT_EQ(schedule_text(interleaved_schedule(2, 0, 2, 3)), "F0.0 F1.0 F0.1 F1.1 F0.2 F1.2 B0.2 B1.2 B0.1 B1.1 B0.0 B1.0");
    EXPECT_EQ(schedule_text(interleaved_schedule(2, 1, 2, 3)), "F0.0 F1.0 F0.1 F1.1 F0.2 B0.2 F1.2 B1.2 B0.1 B1.1 B0.0 B1.0");
}

TEST(InterleavedSchedule, OneChunkIsOneFOneB) {
    for (int64_t stage = 0; stage < 3; ++stage) EXPECT_EQ(interleaved_schedule(3, stage, 5, 1), one_f_one_b_schedule(3, stage, 5));
}

TEST(InterleavedSchedule, MicroBatchesNotAMultipleOfTheStages_AreRefused) {
    EXPECT_THROW(interleaved_schedule(2, 0, 3, 2), Error);
    EXPECT_THROW(interleaved_schedule(4, 0, 6, 2), Error);
}

TEST(InterleavedSchedule, ChunkInFlight_CountsEachChunksPeak) {
    const std::vector<PipeAction> first = interleaved_schedule(2, 0, 4, 2), last = interleaved_schedule(2, 1, 4, 2);
    EXPECT_EQ(chunk_in_flight(first, 0), 4);
    EXPECT_EQ(chunk_in_flight(first, 1), 2);
    EXPECT_EQ(chunk_in_flight(last, 0), 3);
    EXPECT_EQ(chunk_in_flight(last, 1), 1);
    EXPECT_EQ(chunk_in_flight(one_f_one_b_schedule(4, 1, 6), 0), one_f_one_b_in_flight(4, 1, 6));
}

TEST(InterleavedSchedule, Bubble_IsLowerThanOneFOneBsForTheSameMicroBatches) {
    EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(2, 4, 1), 1.0 / 5.0);
    EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(2, 4, 2), 1.0 / 9.0);
    EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(4, 8, 2), 3.0 / 19.0);
    EXPECT_LT(pipeline_bubble_fraction(4, 8, 2), pipeline_bubble_fraction(4, 8, 1));
}

// Every stage's table run as the interpreter runs it, over FIFO channels between each pair
// of ranks that carry activations and gradients alike (NCCL, or MPI without tags, match
// messages in order). Model chunk g = c * P + s; a forward of g > 0 receives g - 1's output,
// a backward of g < P * V - 1 receives g + 1's input gradient. A receive whose channel
// holds another message first is a mismatch; a table that cannot go on is a deadlock. Sends
// are asynchronous but, as large messages do, complete only once received: an action on an
// activation set (chunk c, micro-batch m % sets of c) first waits for that set's previous
// send, and a backward for its gradient buffer's (one per set with chunks, else one shared).
struct Message {
    PipeOp op;
    int64_t model_chunk, micro_batch;  // the receiver's
    int64_t id;
    bool same(const Message& o) const { return op == o.op && model_chunk == o.model_chunk && micro_batch == o.micro_batch; }
};

struct StageBuffers {
    std::vector<int64_t> first_set, sets;
    std::map<int64_t, int64_t> activation_send, grad_send;  // buffer -> id of its last send
};

std::string run_tables(int64_t stages, int64_t micro_batches, int64_t chunks) {
    const int64_t pieces = stages * chunks;
    std::vector<std::vector<PipeAction>> tables;
    std::vector<StageBuffers> buffers(static_cast<size_t>(stages));
    for (int64_t s = 0; s < stages; ++s) {
        tables.push_back(interleaved_schedule(stages, s, micro_batches, chunks));
        StageBuffers& b = buffers[static_cast<size_t>(s)];
        for (int64_t c = 0, total = 0; c < chunks; total += b.sets.back(), ++c) {
            b.first_set.push_back(total);
            b.sets.push_back(chunk_in_flight(tables.back(), c));
        }
    }
    std::map<std::pair<int64_t, int64_t>, std::deque<Message>> channels;  // (from, to)
    std::vector<bool> received;
    const auto done = [&](const std::map<int64_t, int64_t>& sends, int64_t buffer) {
        const auto it = sends.find(buffer);
        return it == sends.end() || received[static_cast<size_t>(it->second)];
    };
    std::vector<size_t> next(static_cast<size_t>(stages), 0);
    for (bool progressed = true; progressed;) {
        progressed = false;
        for (int64_t s = 0; s < stages; ++s) {
            auto& at = next[static_cast<size_t>(s)];
            if (at == tables[static_cast<size_t>(s)].size()) continue;
            const PipeAction a = tables[static_cast<size_t>(s)][at];
            StageBuffers& b = buffers[static_cast<size_t>(s)];
            const auto c = static_cast<size_t>(a.chunk);
            const int64_t set = b.first_set[c] + a.micro_batch % b.sets[c], grad_buffer = chunks == 1 ? 0 : set;
            const int64_t g = a.chunk * stages + s;
            const bool forward = a.op == PipeOp::forward;
            if (!(forward ? done(b.activation_send, set) : done(b.grad_send, grad_buffer))) continue;
            const bool receives = forward ? g > 0 : g < pieces - 1;
            const int64_t from = (s + (forward ? stages - 1 : 1)) % stages;
            if (receives) {
                std::deque<Message>& in = channels[{from, s}];
                if (in.empty()) continue;
                if (!in.front().same(Message{a.op, g, a.micro_batch, 0}))
                    return cat("stage ", s, " action ", at, " (", schedule_text({a}), ") finds another message first");
                received[static_cast<size_t>(in.front().id)] = true;
                in.pop_front();
            }
            const bool sends = forward ? g < pieces - 1 : g > 0;
            const int64_t to = (s + (forward ? 1 : stages - 1)) % stages;
            if (sends) {
                const auto id = static_cast<int64_t>(received.size());
                received.push_back(false);
                channels[{s, to}].push_back({a.op, forward ? g + 1 : g - 1, a.micro_batch, id});
                (forward ? b.activation_send[set] : b.grad_send[grad_buffer]) = id;
            }
            ++at;
            progressed = true;
        }
    }
    for (int64_t s = 0; s < stages; ++s)
        if (next[static_cast<size_t>(s)] != tables[static_cast<size_t>(s)].size()) return cat("stage ", s, " stuck at action ", next[static_cast<size_t>(s)]);
    return "";
}

TEST(InterleavedSchedule, EveryLayout_RunsOverInOrderChannelsWithoutDeadlock) {
    for (int64_t stages = 2; stages <= 5; ++stages)
        for (int64_t chunks = 1; chunks <= 4; ++chunks)
            for (int64_t groups = 1; groups <= 3; ++groups)
                EXPECT_EQ(run_tables(stages, groups * stages, chunks), "") << stages << " stages, " << chunks << " chunks, " << groups * stages << " micro-batches";
}

}  // namespace
}  // namespace llmtrain
