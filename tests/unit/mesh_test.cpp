// The process mesh against tables written out by hand, and the 1F1B schedule as data.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/context.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_schedule.h"

using namespace llmtrain;

TEST(Mesh, DefaultOrderPutsTensorParallelFastestThenDataThenPipeline) {
    const Mesh mesh(8, 2, 2, 2);
    // world rank -> (tp, dp, pp)
    const std::vector<MeshCoord> table = {{{"tp", 0}, {"dp", 0}, {"pp", 0}}, {{"tp", 1}, {"dp", 0}, {"pp", 0}}, {{"tp", 0}, {"dp", 1}, {"pp", 0}},
                                          {{"tp", 1}, {"dp", 1}, {"pp", 0}}, {{"tp", 0}, {"dp", 0}, {"pp", 1}}, {{"tp", 1}, {"dp", 0}, {"pp", 1}},
                                          {{"tp", 0}, {"dp", 1}, {"pp", 1}}, {{"tp", 1}, {"dp", 1}, {"pp", 1}}};
    for (int r = 0; r < 8; ++r) {
        EXPECT_EQ(mesh.coord(r), table[static_cast<size_t>(r)]) << "rank " << r;
        EXPECT_EQ(mesh.world_rank(table[static_cast<size_t>(r)]), r);
    }
}

TEST(Mesh, GroupsOfEachDimensionForTp2Dp3Pp2) {
    const Mesh mesh(12, 2, 3, 2);
    EXPECT_EQ(mesh.group(mesh_dim::tp, 7), (std::vector<int>{6, 7}));
    EXPECT_EQ(mesh.group(mesh_dim::dp, 7), (std::vector<int>{7, 9, 11}));
    EXPECT_EQ(mesh.group(mesh_dim::pp, 7), (std::vector<int>{1, 7}));
    EXPECT_EQ(mesh.group(mesh_dim::dp, 0), (std::vector<int>{0, 2, 4}));
    EXPECT_EQ(mesh.describe(7), "tp 1, dp 0, pp 1");
}

TEST(Mesh, PipelineFastestOrder) {
    const Mesh mesh(8, 2, 2, 2, "pp-tp-dp");
    EXPECT_EQ(mesh.coord(1), (MeshCoord{{"tp", 0}, {"dp", 0}, {"pp", 1}}));
    EXPECT_EQ(mesh.coord(2), (MeshCoord{{"tp", 1}, {"dp", 0}, {"pp", 0}}));
    EXPECT_EQ(mesh.coord(4), (MeshCoord{{"tp", 0}, {"dp", 1}, {"pp", 0}}));
    EXPECT_EQ(mesh.group(mesh_dim::pp, 2), (std::vector<int>{2, 3}));
    EXPECT_EQ(mesh.group(mesh_dim::dp, 3), (std::vector<int>{3, 7}));
}

TEST(Mesh, EveryRankIsInExactlyOneGroupOfEachDimension) {
    const Mesh mesh(24, 2, 3, 4, "dp-pp-tp");
    for (std::string_view dim : {mesh_dim::tp, mesh_dim::dp, mesh_dim::pp}) {
        std::vector<int> seen(24, 0);
        for (int r = 0; r < 24; ++r)
            if (mesh.group(dim, r).front() == r)
                for (int member : mesh.group(dim, r)) ++seen[static_cast<size_t>(member)];
        for (int r = 0; r < 24; ++r) EXPECT_EQ(seen[static_cast<size_t>(r)], 1) << dim << " rank " << r;
    }
}

// dp 4 of tp 2 x dp 4: dp ranks {0, 1} and {2, 3} shard together; 0 and 2, 1 and 3 replicate.
TEST(Mesh, ShardAndReplicaGroupsOfHybridShardingForTp2Dp4) {
    const Mesh mesh(8, 2, 4, 1);
    EXPECT_EQ(mesh.group(mesh_dim::dp, 5), (std::vector<int>{1, 3, 5, 7}));
    EXPECT_EQ(mesh.shard_group(5, 2), (std::vector<int>{5, 7}));
    EXPECT_EQ(mesh.replica_group(5, 2), (std::vector<int>{1, 5}));
    EXPECT_EQ(mesh.shard_group(0, 2), (std::vector<int>{0, 2}));
    EXPECT_EQ(mesh.replica_group(6, 2), (std::vector<int>{2, 6}));
    EXPECT_EQ(mesh.shard_group(3, 4), (std::vector<int>{1, 3, 5, 7}));
    EXPECT_EQ(mesh.replica_group(3, 4), (std::vector<int>{3}));
    EXPECT_EQ(mesh.shard_group(3, 1), (std::vector<int>{3}));
    EXPECT_EQ(mesh.replica_group(3, 1), (std::vector<int>{1, 3, 5, 7}));
}

TEST(Mesh, ShardSizeNotDividingDp_IsAConfigError) {
    const Mesh mesh(6, 1, 6, 1);
    EXPECT_THROW(mesh.shard_group(0, 4), Error);
    EXPECT_THROW(mesh.replica_group(0, 0), Error);
    EXPECT_EQ(mesh.shard_group(4, 3), (std::vector<int>{3, 4, 5}));
}

TEST(Mesh, ShardSizeNotDividingTheDerivedDp_IsRefusedNamingTheKey) {
    ParallelConfig parallel;
    parallel.tp = 2;
    parallel.shard_size = 3;
    try {
        make_mesh(parallel, 8);
        FAIL() << "expected a config error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_STREQ(e.what(), "parallel.shard_size = 3 does not divide dp = 4 (allowed: a divisor of dp, e.g. the dp ranks of a node; 0: dp)");
    }
    parallel.shard_size = 2;
    EXPECT_EQ(shard_size_of(parallel, make_mesh(parallel, 8).dp()), 2);
    parallel.shard_size = 0;
    EXPECT_EQ(shard_size_of(parallel, make_mesh(parallel, 8).dp()), 4);
}

TEST(Mesh, WorldSizeNotTheProduct_IsAConfigError) {
    try {
        Mesh(6, 2, 2, 2);
        FAIL() << "expected a config error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_STREQ(e.what(), "world size 6 is not tp * dp * pp = 2 * 2 * 2 = 8");
    }
    EXPECT_THROW(Mesh(8, 2, 2, 2, "tp-dp-dp"), Error);
    EXPECT_THROW(Mesh(8, 2, 2, 2, "tp,dp,pp"), Error);
}

TEST(PipelineSchedule, OneFOneBForFourStagesAndSixMicroBatches) {
    EXPECT_EQ(schedule_text(one_f_one_b_schedule(4, 0, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
    EXPECT_EQ(schedule_text(one_f_one_b_schedule(4, 1, 6)), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
    EXPECT_EQ(schedule_text(one_f_one_b_schedule(4, 3, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
}

TEST(PipelineSchedule, InFlightMicroBatchesAreAtMostStagesMinusStage) {
    for (int64_t stage = 0; stage < 4; ++stage) {
        int64_t in_flight = 0, most = 0;
        for (const PipeAction& a : one_f_one_b_schedule(4, stage, 7)) {
            in_flight += a.op == PipeOp::forward ? 1 : -1;
            most = std::max(most, in_flight);
        }
        EXPECT_EQ(in_flight, 0);
        EXPECT_EQ(most, one_f_one_b_in_flight(4, stage, 7)) << "stage " << stage;
        EXPECT_EQ(most, 4 - stage);
    }
}

// Fewer micro-batches than stages: every stage runs all its forwards, then all its
// backwards, and holds all M micro-batches at once.
TEST(PipelineSchedule, FewerMicroBatchesThanStages_ForwardsAllThenBackwardsAll) {
    EXPECT_EQ(schedule_text(one_f_one_b_schedule(4, 0, 2)), "F0 F1 B0 B1");
    EXPECT_EQ(schedule_text(one_f_one_b_schedule(4, 2, 2)), "F0 F1 B0 B1");
    EXPECT_EQ(schedule_text(one_f_one_b_schedule(4, 3, 2)), "F0 B0 F1 B1");
    EXPECT_EQ(schedule_text(one_f_one_b_schedule(2, 0, 1)), "F0 B0");
    EXPECT_EQ(one_f_one_b_in_flight(4, 0, 2), 2);
    EXPECT_EQ(one_f_one_b_in_flight(4, 3, 2), 1);
}

// Every (stages, micro-batches) pair, including fewer micro-batches than stages: the
// in-flight count that sizes the activation sets is the schedule's real peak, and the
// stages together finish. The latter runs each stage's actions in order, as the
// interpreter does, where a forward waits for the previous stage's forward of the same
// micro-batch and a backward for the next stage's backward (or, on the last stage, nothing
// more than its own forward); a schedule that could deadlock leaves actions undone.
TEST(PipelineSchedule, AnyMicroBatchCount_PeaksAtTheInFlightCountAndNeverDeadlocks) {
    for (int64_t stages = 1; stages <= 5; ++stages) {
        for (int64_t micro_batches = 1; micro_batches <= 7; ++micro_batches) {
            std::vector<std::vector<PipeAction>> schedules;
            for (int64_t s = 0; s < stages; ++s) {
                schedules.push_back(one_f_one_b_schedule(stages, s, micro_batches));
                int64_t in_flight = 0, most = 0;
                for (const PipeAction& a : schedules.back()) {
                    in_flight += a.op == PipeOp::forward ? 1 : -1;
                    most = std::max(most, in_flight);
                }
                EXPECT_EQ(most, one_f_one_b_in_flight(stages, s, micro_batches)) << stages << " stages, " << micro_batches << " micro-batches, stage " << s;
            }
            const auto M = static_cast<size_t>(micro_batches);
            std::vector<std::vector<bool>> forward_done(static_cast<size_t>(stages), std::vector<bool>(M)), backward_done = forward_done;
            std::vector<size_t> next(static_cast<size_t>(stages), 0);
            for (bool progressed = true; progressed;) {
                progressed = false;
                for (size_t s = 0; s < schedules.size(); ++s) {
                    if (next[s] == schedules[s].size()) continue;
                    const PipeAction a = schedules[s][next[s]];
                    const auto m = static_cast<size_t>(a.micro_batch);
                    const bool ready = a.op == PipeOp::forward ? (s == 0 || forward_done[s - 1][m])
                                                               : (s + 1 == schedules.size() ? forward_done[s][m] : backward_done[s + 1][m]);
                    if (!ready) continue;
                    (a.op == PipeOp::forward ? forward_done : backward_done)[s][m] = true;
                    ++next[s];
                    progressed = true;
                }
            }
            for (size_t s = 0; s < schedules.size(); ++s)
                EXPECT_EQ(next[s], schedules[s].size()) << stages << " stages, " << micro_batches << " micro-batches: stage " << s << " stuck";
        }
    }
}

TEST(PipelineSchedule, OneStageAlternatesForwardAndBackward) {
    EXPECT_EQ(schedule_text(one_f_one_b_schedule(1, 0, 3)), "F0 B0 F1 B1 F2 B2");
}

// Context parallelism sits just inside dp: the cp ranks of one dp rank are tp apart, and
// the data group (the weights' replicas) runs cp fastest, then dp.
TEST(Mesh, ContextParallelRanksSitJustInsideDataParallel) {
    const Mesh mesh(16, 2, 2, 2, "tp-dp-pp", 2);
    EXPECT_EQ(mesh.coord(2), (MeshCoord{{"tp", 0}, {"dp", 0}, {"pp", 0}, {"cp", 1}}));
    EXPECT_EQ(mesh.coord(4), (MeshCoord{{"tp", 0}, {"dp", 1}, {"pp", 0}, {"cp", 0}}));
    EXPECT_EQ(mesh.group(mesh_dim::cp, 5), (std::vector<int>{5, 7}));
    EXPECT_EQ(mesh.data_group(1), (std::vector<int>{1, 3, 5, 7}));
    EXPECT_EQ(mesh.data_group(9), (std::vector<int>{9, 11, 13, 15}));
    EXPECT_EQ(mesh.data_index(mesh.coord(7)), 3);
    // Hybrid sharding cuts the data group into blocks of shard_size dp ranks with their cp ranks.
    EXPECT_EQ(mesh.shard_group(7, 1), (std::vector<int>{5, 7}));
    EXPECT_EQ(mesh.replica_group(7, 1), (std::vector<int>{3, 7}));
    // With pp inside dp, cp still sits just before dp.
    const Mesh pp_inside(8, 1, 2, 2, "tp-pp-dp", 2);
    EXPECT_EQ(pp_inside.group(mesh_dim::cp, 0), (std::vector<int>{0, 2}));
    EXPECT_EQ(pp_inside.group(mesh_dim::dp, 0), (std::vector<int>{0, 4}));
}

TEST(Mesh, WorldSizeNotTheProductWithCp_NamesCp) {
    try {
        Mesh(8, 2, 2, 2, "tp-dp-pp", 2);
        FAIL() << "expected a config error";
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "world size 8 is not tp * cp * dp * pp = 2 * 2 * 2 * 2 = 16");
    }
}

// The worked example of mesh.h: tp 2 x dp 4 with ep 4. The expert groups are blocks of four
// consecutive ranks (two tp groups each); the ranks holding the same experts are four apart.
TEST(Mesh, ExpertFoldingOfTp2Dp4WithEp4_IsTheHeaderExample) {
    const Mesh mesh(8, 2, 4, 1, "tp-dp-pp", 1, 4);
    EXPECT_EQ(mesh.ep(), 4);
    EXPECT_EQ(mesh.edp(), 2);
    const std::vector<int> ep_rank = {0, 1, 2, 3, 0, 1, 2, 3}, edp_rank = {0, 0, 0, 0, 1, 1, 1, 1};
    for (int r = 0; r < 8; ++r) {
        EXPECT_EQ(mesh.ep_rank(r), ep_rank[static_cast<size_t>(r)]) << "rank " << r;
        EXPECT_EQ(mesh.edp_rank(r), edp_rank[static_cast<size_t>(r)]) << "rank " << r;
    }
    EXPECT_EQ(mesh.expert_group(2), (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(mesh.expert_group(6), (std::vector<int>{4, 5, 6, 7}));
    EXPECT_EQ(mesh.expert_data_group(1), (std::vector<int>{1, 5}));
    EXPECT_EQ(mesh.expert_data_group(7), (std::vector<int>{3, 7}));
    // The dense groups are those of the same mesh without experts.
    EXPECT_EQ(mesh.group(mesh_dim::tp, 5), (std::vector<int>{4, 5}));
    EXPECT_EQ(mesh.data_group(5), (std::vector<int>{1, 3, 5, 7}));
    EXPECT_EQ(mesh.describe(6), "tp 0, dp 3, pp 0, ep 2, edp 1");
    EXPECT_EQ(mesh.describe_sizes(), "tp 2 x dp 4 x pp 1 (experts: ep 4 x edp 2)");
}

// With pp inside dp (order tp-pp-dp) a stage's ranks are not consecutive: they are numbered in
// world-rank order all the same, and no expert group leaves its stage.
TEST(Mesh, ExpertFoldingWithPipelineInsideData_NumbersEachStagesRanksInWorldRankOrder) {
    const Mesh mesh(8, 2, 2, 2, "tp-pp-dp", 1, 2);  // stage 0: ranks 0, 1, 4, 5; stage 1: 2, 3, 6, 7
    EXPECT_EQ(mesh.expert_group(4), (std::vector<int>{4, 5}));
    EXPECT_EQ(mesh.expert_data_group(4), (std::vector<int>{0, 4}));
    EXPECT_EQ(mesh.expert_group(3), (std::vector<int>{2, 3}));
    EXPECT_EQ(mesh.expert_data_group(3), (std::vector<int>{3, 7}));
    const Mesh whole_stage(8, 2, 2, 2, "tp-pp-dp", 1, 4);
    EXPECT_EQ(whole_stage.expert_group(6), (std::vector<int>{2, 3, 6, 7}));
    EXPECT_EQ(whole_stage.expert_data_group(6), (std::vector<int>{6}));
}

// cp x dp ranks fold as tp x dp ranks do: with tp 1 the expert groups of ep 2 are the cp pairs.
TEST(Mesh, ExpertFoldingWithContextParallel_TakesTheCpRanksAsTheStagesFastest) {
    const Mesh mesh(8, 1, 2, 2, "tp-dp-pp", 2, 2);
    EXPECT_EQ(mesh.group(mesh_dim::cp, 5), (std::vector<int>{4, 5}));
    EXPECT_EQ(mesh.expert_group(5), (std::vector<int>{4, 5}));
    EXPECT_EQ(mesh.expert_data_group(5), (std::vector<int>{5, 7}));
    EXPECT_EQ(mesh.expert_data_group(2), (std::vector<int>{0, 2}));
}

// Every layout against the definition, computed the slow way: the ranks of a stage listed in
// world-rank order, s a rank's place there, ep_rank = s mod ep, edp_rank = s / ep. Every rank
// is in exactly one expert group (of ep ranks, in ep_rank order) and one expert-data group (of
// tp * cp * dp / ep ranks, in edp_rank order).
TEST(Mesh, ExpertGroups_PartitionEveryStageAsTheFoldingSays_ForManyLayouts) {
    struct Layout {
        int tp, cp, dp, pp;
        const char* order;
        int ep;
    };
    for (const Layout& l : std::vector<Layout>{{2, 1, 4, 1, "tp-dp-pp", 4}, {2, 1, 3, 2, "tp-dp-pp", 3}, {2, 2, 2, 2, "tp-dp-pp", 4}, {2, 1, 2, 3, "tp-pp-dp", 2},
                                               {2, 2, 2, 2, "pp-tp-dp", 8}, {3, 1, 2, 2, "dp-pp-tp", 2}, {2, 1, 4, 2, "dp-tp-pp", 1}, {1, 2, 3, 2, "pp-dp-tp", 6}}) {
        const int world = l.tp * l.cp * l.dp * l.pp, stage_size = world / l.pp, edp = stage_size / l.ep;
        const Mesh mesh(world, l.tp, l.dp, l.pp, l.order, l.cp, l.ep);
        const std::string layout = cat("tp ", l.tp, " cp ", l.cp, " dp ", l.dp, " pp ", l.pp, " ", l.order, " ep ", l.ep);
        std::vector<std::vector<int>> stages(static_cast<size_t>(l.pp));
        for (int r = 0; r < world; ++r) stages[static_cast<size_t>(mesh.coord(r)[mesh_dim::pp])].push_back(r);
        std::vector<int> in_expert_group(static_cast<size_t>(world), 0), in_expert_data_group(static_cast<size_t>(world), 0);
        for (const std::vector<int>& stage : stages) {
            ASSERT_EQ(static_cast<int>(stage.size()), stage_size) << layout;
            for (int s = 0; s < stage_size; ++s) {
                const int r = stage[static_cast<size_t>(s)];
                EXPECT_EQ(mesh.ep_rank(r), s % l.ep) << layout << ", rank " << r;
                EXPECT_EQ(mesh.edp_rank(r), s / l.ep) << layout << ", rank " << r;
                const std::vector<int> experts = mesh.expert_group(r), holders = mesh.expert_data_group(r);
                ASSERT_EQ(static_cast<int>(experts.size()), l.ep) << layout << ", rank " << r;
                ASSERT_EQ(static_cast<int>(holders.size()), edp) << layout << ", rank " << r;
                for (int i = 0; i < l.ep; ++i) EXPECT_EQ(experts[static_cast<size_t>(i)], stage[static_cast<size_t>(s / l.ep * l.ep + i)]) << layout << ", rank " << r;
                for (int j = 0; j < edp; ++j) EXPECT_EQ(holders[static_cast<size_t>(j)], stage[static_cast<size_t>(s % l.ep + j * l.ep)]) << layout << ", rank " << r;
                if (mesh.ep_rank(r) == 0)
                    for (int member : experts) ++in_expert_group[static_cast<size_t>(member)];
                if (mesh.edp_rank(r) == 0)
                    for (int member : holders) ++in_expert_data_group[static_cast<size_t>(member)];
            }
        }
        for (int r = 0; r < world; ++r) {
            EXPECT_EQ(in_expert_group[static_cast<size_t>(r)], 1) << layout << ", rank " << r;
            EXPECT_EQ(in_expert_data_group[static_cast<size_t>(r)], 1) << layout << ", rank " << r;
        }
    }
}

// ep = 1: each rank is its own expert group, and its whole stage holds the same experts.
TEST(Mesh, ExpertParallelOne_EachRankAloneAndItsStageHoldingTheSameExperts) {
    const Mesh mesh(12, 2, 3, 2);
    EXPECT_EQ(mesh.ep(), 1);
    EXPECT_EQ(mesh.edp(), 6);
    EXPECT_EQ(mesh.expert_group(7), (std::vector<int>{7}));
    EXPECT_EQ(mesh.expert_data_group(7), (std::vector<int>{6, 7, 8, 9, 10, 11}));
    EXPECT_EQ(mesh.describe(7), "tp 1, dp 0, pp 1");
    EXPECT_EQ(mesh.describe_sizes(), "tp 2 x dp 3 x pp 2");
}

// Hybrid sharding of expert state: as many replica blocks as the dense layout's (dp / shard_size),
// cut from the expert-data group; with the default order each lies within a dense shard block.
TEST(Mesh, ExpertShardAndReplicaGroups_KeepTheDenseLayoutsReplicaBlocks) {
    const Mesh ep2(8, 2, 4, 1, "tp-dp-pp", 1, 2);  // expert-data group of rank 0: 0, 2, 4, 6
    EXPECT_EQ(ep2.expert_shard_group(0, 2), (std::vector<int>{0, 2}));
    EXPECT_EQ(ep2.expert_replica_group(0, 2), (std::vector<int>{0, 4}));
    EXPECT_EQ(ep2.expert_shard_group(7, 4), (std::vector<int>{1, 3, 5, 7}));
    EXPECT_EQ(ep2.expert_replica_group(7, 4), (std::vector<int>{7}));
    const Mesh ep4(8, 2, 4, 1, "tp-dp-pp", 1, 4);  // expert-data group of rank 5: 1, 5
    EXPECT_EQ(ep4.expert_shard_group(5, 2), (std::vector<int>{5}));
    EXPECT_EQ(ep4.expert_replica_group(5, 2), (std::vector<int>{1, 5}));
    // A dense shard block of shard_size 2: dp ranks 0-1 or 2-3 (with their tp ranks).
    for (int r = 0; r < 8; ++r)
        for (int member : ep4.expert_shard_group(r, 2))
            EXPECT_EQ(ep4.coord(member)[mesh_dim::dp] / 2, ep4.coord(r)[mesh_dim::dp] / 2) << "rank " << r << ": expert shard member " << member;
    // dp / shard_size = 4 blocks cannot cut an expert-data group of 2.
    EXPECT_THROW(ep4.expert_shard_group(0, 1), Error);
}

namespace {
// The message of the config error make_mesh throws; a failure if it throws none.
std::string mesh_refusal(const ParallelConfig& parallel, int world_size) {
    try {
        make_mesh(parallel, world_size);
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        return e.what();
    }
    ADD_FAILURE() << "expected a config error";
    return "";
}
}  // namespace

TEST(Mesh, ExpertParallelNotDividingTheStage_IsRefusedNamingTheKey) {
    EXPECT_THROW(Mesh(8, 2, 4, 1, "tp-dp-pp", 1, 3), Error);
    ParallelConfig parallel;
    parallel.tp = 2;
    parallel.ep = 3;
    EXPECT_EQ(mesh_refusal(parallel, 8), "parallel.ep = 3 does not divide the ranks of a pipeline stage, tp * dp = 8 (allowed: a divisor of 8)");
    parallel.ep = 4;
    parallel.shard_size = 1;
    EXPECT_EQ(mesh_refusal(parallel, 8), "parallel.shard_size = 1 cuts dp = 4 into 4 replica blocks, which do not divide the 2 ranks holding the same experts "
                                         "(edp = tp * dp / parallel.ep = 8 / 4; allowed: a shard_size with dp / shard_size dividing edp, or 0)");
    parallel.shard_size = 2;
    EXPECT_EQ(make_mesh(parallel, 8).edp(), 2);
}

// The groups a hang's diagnosis asks for by name: ep and edp exist only with parallel.ep > 1.
TEST(Mesh, ContextGroupsNamedEpAndEdp_AreTheExpertGroupsOnlyWithExperts) {
    const Mesh experts(8, 2, 4, 1, "tp-dp-pp", 1, 4), dense(8, 2, 4, 1);
    EXPECT_EQ(context_group_ranks(experts, 4, "ep", 5), (std::vector<int>{4, 5, 6, 7}));
    EXPECT_EQ(context_group_ranks(experts, 4, "edp", 5), (std::vector<int>{1, 5}));
    EXPECT_TRUE(context_group_ranks(dense, 4, "ep", 5).empty());
    EXPECT_TRUE(context_group_ranks(dense, 4, "edp", 5).empty());
}
