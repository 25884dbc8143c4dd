// The event-ordered path on a GPU with NCCL and CUDA events. One process has one GPU here, and
// NCCL refuses two ranks on one GPU, so the group is one rank: its reduce-scatter and
// broadcast still run as NCCL kernels on the group's own stream, between kernels of the
// backend's compute stream that produce their input and read their output, with no host wait
// in between. Wrong ordering shows as stale values. Skipped (and counted skipped) without a
// GPU or a CUDA build; multi-GPU runs cover the rest (see the report of the change).
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "parallel/event_ordered_comm.h"
#include "parallel/stream_collectives.h"

using namespace llmtrain;

TEST(NcclEventOrder, OneRankGroup_CollectivesSitBetweenTheirProducerAndConsumerKernels) {
    std::unique_ptr<Backend> gpu;
    try {
        gpu = make_cuda_backend(0);
    } catch (const Error& e) {
        GTEST_SKIP() << "no GPU: " << e.what();
    }
    const std::unique_ptr<StreamOrder> order = make_cuda_stream_order(gpu->device_stream());
    const std::unique_ptr<Comm> self = make_self_comm("tp");
    CommWatchdog watchdog(*order, 60, 0);
    watchdog.start(std::chrono::milliseconds(10));
    EventOrderedComm comm(*self, make_nccl_collectives(*self, 0, 60, *order), nullptr, *order, watchdog);

    const int64_t n = 1 << 20;  // large enough that an unordered copy would be caught mid-way
    const Memory in_memory = gpu->allocate(n * 2), out_memory = gpu->allocate(n * 2);
    const Tensor in(in_memory.get(), DType::bf16, {n}, Device::cuda), out(out_memory.get(), DType::bf16, {n}, Device::cuda);
    const std::vector<uint16_t> ones(static_cast<size_t>(n), float_to_bf16(1.0f));
    gpu->copy_from_host(in, ones.data());
    for (int i = 0; i < 4; ++i) gpu->add(in, in, in);  // 16, produced on the compute stream
    comm.reduce_scatter(out, in);                      // a group of one: out = in
    gpu->add(out, out, out);                           // 32, read after the collective's event
    comm.broadcast(out, 0);
    gpu->add(out, out, in);                            // 48

    std::vector<uint16_t> host(static_cast<size_t>(n));
    gpu->copy_to_host(host.data(), out);
    for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(bf16_to_float(host[static_cast<size_t>(i)]), 48.0f) << "element " << i;
    watchdog.poll();
    EXPECT_EQ(watchdog.watched(), 0u);
    EXPECT_NO_THROW(watchdog.check());
}
