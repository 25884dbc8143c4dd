// The CUDA path's parallel layouts under mpirun, on the CPU stand-in of the CUDA backend
// (tests/support/stand_in_cuda_backend.h): bf16 activations cross the tensor-parallel ranks
// and ZeRO-1 all-gathers the bf16 compute copy. With parallel.comm = "nccl" the trainer runs
// its event-ordered collectives (the path NCCL takes on a GPU), here on recorded stand-ins
// of the streams that carry each collective out over MPI; with "mpi", MPI's staging of
// device tensors and its f32 sums of bf16. Every run tracks the fp32 run of one CPU process.
// ZeRO-2 sharded within blocks of 2 dp ranks takes the event-ordered path over the shard
// and replica groups' own communicators, with no race between them and the compute stream;
// so do sequence parallelism's collectives overlapped with the matmuls (parallel.tp_overlap)
// and context parallelism's ring (parallel.cp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "support/host_staging.h"
#include "support/parallel_test.h"
#include "support/run_comparisons.h"
#include "support/stand_in_cuda_backend.h"
#include "support/stream_graph.h"

using namespace llmtrain;

namespace {

Config tiny(const std::string& device, int64_t micro_batches, const std::vector<std::string>& layout) {
    std::vector<std::string> more = {"train.sample_tokens=0", "train.grad_accum=" + std::to_string(micro_batches), "parallel.timeout_seconds=120"};
    more.insert(more.end(), layout.begin(), layout.end());
    return test::tiny_cuda_shaped_run("gpt2", device, 2, 32, more);
}

// One CPU process over the whole global batch, computed once per world.
const TrainResult& cpu_reference(int64_t dp) {
    static std::map<int64_t, TrainResult> done;
    if (!done.count(dp)) {
        Trainer trainer(tiny("cpu", 2 * dp, {}), TrainerOptions{.quiet = true});
        done[dp] = trainer.run();
    }
    return done.at(dp);
}

struct StandInRun {
    TrainResult result;
    std::vector<std::string> streams;        // the recording's streams (nccl)
    size_t collectives = 0;                  // work recorded on its communication streams
    std::vector<std::string> races;
    int64_t gather_bytes = 0;  // sent in ZeRO-3's parameter all-gathers
};

StandInRun run_on_stand_in(const Config& config) {
    ParallelContext ctx = make_mpi_context(config.parallel, std::make_shared<test::HostStaging>());
    test::RecordingStreamOrder* recording = nullptr;
    TrainerOptions options{.quiet = true};
    options.make_backend = [](int) { return test::make_stand_in_cuda_backend(); };
    options.device_comms.make_order = [&recording](Backend&) {
        auto order = std::make_unique<test::RecordingStreamOrder>();
        recording = order.get();
        return order;
    };
    options.device_comms.make_collectives = [&recording](Comm& group, StreamOrder&) { return std::make_unique<test::RecordedCollectives>(group, *recording); };
    StandInRun run;
    {
        Trainer trainer(config, options, ctx);
        run.result = trainer.run();
        run.gather_bytes = trainer.parameter_gather_bytes_sent();
        if (recording) {
            run.streams = recording->stream_names();
            for (StreamId s = 1; s < static_cast<StreamId>(run.streams.size()); ++s) run.collectives += recording->work_on(s).size();
            run.races = recording->races();
        }
    }
    ctx.world->barrier();
    return run;
}

void expect_tracks_cpu_with(const std::string& comm, int64_t dp, const std::vector<std::string>& layout) {
    std::vector<std::string> with_comm = layout;
    with_comm.push_back("parallel.comm=\"" + comm + "\"");
    const StandInRun run = run_on_stand_in(tiny("cuda", 2, with_comm));
    test::expect_tracks_cpu(run.result, cpu_reference(dp));
    if (comm == "mpi") {
        EXPECT_TRUE(run.streams.empty()) << "parallel.comm = \"mpi\" must not take the event-ordered path";
        return;
    }
    EXPECT_GT(run.streams.size(), 1u) << "the collectives must have run on streams of their own";
    EXPECT_GT(run.collectives, 0u);
    for (const std::string& race : run.races) ADD_FAILURE() << race;
}

}  // namespace

PARALLEL_TEST(StandInCudaLayouts, TensorParallelBf16OverEventOrderedCollectives_TracksCpuFp32, 2) { expect_tracks_cpu_with("nccl", 1, {"parallel.tp=2"}); }
PARALLEL_TEST(StandInCudaLayouts, TensorParallelBf16OverMpi_TracksCpuFp32, 2) { expect_tracks_cpu_with("mpi", 1, {"parallel.tp=2"}); }
// Sequence parallelism with its collectives in pieces behind the matmuls: two all-gathers in
// flight on the tp stream while the compute stream multiplies the previous piece, the
// reduce-scatters of the pieces queued behind their GEMMs; no race the stream graph sees.
PARALLEL_TEST(StandInCudaLayouts, SequenceParallelTpOverlapOverEventOrderedCollectives_TracksCpuFp32, 2) {
    expect_tracks_cpu_with("nccl", 1, {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.tp_overlap=true"});
}
PARALLEL_TEST(StandInCudaLayouts, SequenceParallelTpOverlapOverMpi_TracksCpuFp32, 2) {
    expect_tracks_cpu_with("mpi", 1, {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.tp_overlap=true"});
}
// Context parallelism's ring in bf16: each step's key/value block is sent on and the next one
// received on the cp group's two point-to-point streams while the compute stream works on the
// current block, and the f32 key/value gradients travel the same way; no race the stream
// graph sees.
PARALLEL_TEST(StandInCudaLayouts, ContextParallelBf16OverEventOrderedCollectives_TracksCpuFp32, 2) { expect_tracks_cpu_with("nccl", 1, {"parallel.cp=2"}); }
PARALLEL_TEST(StandInCudaLayouts, ContextParallelBf16OverMpi_TracksCpuFp32, 2) { expect_tracks_cpu_with("mpi", 1, {"parallel.cp=2"}); }
PARALLEL_TEST(StandInCudaLayouts, ContextTimesTensorParallelOverEventOrderedCollectives_TracksCpuFp32, 4) {
    expect_tracks_cpu_with("nccl", 1, {"parallel.cp=2", "parallel.tp=2"});
}
PARALLEL_TEST(StandInCudaLayouts, DefaultComm_IsTheEventOrderedPath, 2) {
    const StandInRun run = run_on_stand_in(tiny("cuda", 2, {"parallel.tp=2", "train.steps=2"}));
    EXPECT_GT(run.collectives, 0u);
}
// parallel.grad_reduce_dtype = "bf16" on device tensors: the bf16 copies are made by the
// device backend's copy and reduced on the dp stream (event-ordered) or staged to the host (MPI).
PARALLEL_TEST(StandInCudaLayouts, DataParallelBf16ReductionOverEventOrderedCollectives_TracksCpuFp32, 2) {
    expect_tracks_cpu_with("nccl", 2, {"parallel.grad_reduce_dtype=\"bf16\""});
}
PARALLEL_TEST(StandInCudaLayouts, DataParallelBf16ReductionOverMpi_TracksCpuFp32, 2) { expect_tracks_cpu_with("mpi", 2, {"parallel.grad_reduce_dtype=\"bf16\""}); }
PARALLEL_TEST(StandInCudaLayouts, TensorTimesDataZero1OverEventOrderedCollectives_TracksCpuFp32, 4) { expect_tracks_cpu_with("nccl", 2, {"parallel.tp=2"}); }
PARALLEL_TEST(StandInCudaLayouts, TensorTimesDataZero1OverMpi_TracksCpuFp32, 4) { expect_tracks_cpu_with("mpi", 2, {"parallel.tp=2"}); }
// ZeRO-3 under bf16: the compute shard is gathered (16-bit) into the ring on the dp group's
// stream, ordered against the compute stream by events, with no race the stream graph sees.
PARALLEL_TEST(StandInCudaLayouts, Zero3OverEventOrderedCollectives_TracksCpuFp32, 4) {
    const StandInRun run = run_on_stand_in(tiny("cuda", 2, {"parallel.zero_stage=3", "parallel.comm=\"nccl\""}));
    test::expect_tracks_cpu(run.result, cpu_reference(4));
    for (const std::string& race : run.races) ADD_FAILURE() << race;
}
PARALLEL_TEST(StandInCudaLayouts, Zero3OverMpi_TracksCpuFp32, 4) {
    test::expect_tracks_cpu(run_on_stand_in(tiny("cuda", 2, {"parallel.zero_stage=3", "parallel.comm=\"mpi\""})).result, cpu_reference(4));
}
PARALLEL_TEST(StandInCudaLayouts, HybridZero2OverEventOrderedCollectives_TracksCpuFp32, 4) {
    const StandInRun run = run_on_stand_in(tiny("cuda", 2, {"parallel.zero_stage=2", "parallel.shard_size=2", "parallel.comm=\"nccl\""}));
    test::expect_tracks_cpu(run.result, cpu_reference(4));
    for (const char* group : {"shard", "replica"})
        EXPECT_NE(std::find(run.streams.begin(), run.streams.end(), group), run.streams.end()) << "no stream of the " << group << " group's communicator";
    for (const std::string& race : run.races) ADD_FAILURE() << race;
}

// fp8.param_gather on the CUDA path's host side: ZeRO-3's FP8 weights travel as e4m3 bytes
// over the event-ordered collectives, without a race between the streams; the run is bitwise
// the one gathering them in bf16, and its parameter all-gathers send under half the bytes.
PARALLEL_TEST(StandInCudaLayouts, Fp8Zero3ParamGather_IsBitwiseTheBf16GatherAndSendsUnderHalfItsBytes, 2) {
    const std::vector<std::string> fp8 = {"parallel.zero_stage=3", "parallel.comm=\"nccl\"", "train.precision=\"fp8\"", "fp8.bf16_first_layers=0",
                                          "fp8.bf16_last_layers=0"};
    std::vector<std::string> gathering = fp8;
    gathering.push_back("fp8.param_gather=true");
    const StandInRun bf16 = run_on_stand_in(tiny("cuda", 2, fp8)), gathered = run_on_stand_in(tiny("cuda", 2, gathering));
    for (const std::string& race : gathered.races) ADD_FAILURE() << race;
    ASSERT_EQ(gathered.result.steps.size(), bf16.result.steps.size());
    for (size_t i = 0; i < bf16.result.steps.size(); ++i) {
        EXPECT_EQ(gathered.result.steps[i].loss, bf16.result.steps[i].loss) << "step " << i + 1;
        EXPECT_EQ(gathered.result.steps[i].grad_norm, bf16.result.steps[i].grad_norm) << "step " << i + 1;
    }
    ASSERT_GT(bf16.gather_bytes, 0);
    const double ratio = static_cast<double>(gathered.gather_bytes) / static_cast<double>(bf16.gather_bytes);
    EXPECT_GT(gathered.gather_bytes, 0);
    EXPECT_LT(ratio, 0.5) << gathered.gather_bytes << " bytes against " << bf16.gather_bytes;
    if (MpiSession().world_rank() == 0)
        std::printf("[ fp8 gather ] parameter all-gather bytes sent per rank over %zu steps: bf16 %lld, fp8.param_gather %lld (%.3f)\n", bf16.result.steps.size(),
                    static_cast<long long>(bf16.gather_bytes), static_cast<long long>(gathered.gather_bytes), ratio);
}
