#include "parallel/replica_exchange.h"

#include <algorithm>

namespace llmtrain {

namespace {
// A run of consecutive elements of one part: what fits in the staging buffer at once.
struct Span {
    Tensor values;
    int64_t at = 0;  // in the staging buffer
};

// Broadcasts one batch of spans from their holder: packed into staging there, unpacked everywhere else.
void broadcast_batch(Comm& group, int holder, const std::vector<Span>& batch, int64_t numel, const Tensor& staging, const FlatOps& ops) {
    const Tensor packed = staging.slice_rows(0, numel);
    if (group.rank() == holder)
        for (const Span& s : batch) ops.copy(packed.slice_rows(s.at, s.values.numel()), s.values);
    group.broadcast(packed, holder);
    if (group.rank() != holder)
        for (const Span& s : batch) ops.copy(s.values, packed.slice_rows(s.at, s.values.numel()));
}
}  // namespace

void exchange_parts(Comm& group, const std::vector<ReplicaPart>& parts, const FlatOps& ops, const std::function<OwnedTensor(DType, Shape)>& allocate,
                    int64_t max_staging_elements) {
    if (group.size() == 1 || parts.empty()) return;
    const DType dtype = parts.front().values.dtype();
    int64_t total = 0;
    for (const ReplicaPart& p : parts) {
        if (p.values.dtype() != dtype) fail(ErrorKind::runtime, "replica exchange of parts in ", dtype_name(dtype), " and ", dtype_name(p.values.dtype()));
        if (p.holder < 0 || p.holder >= group.size()) fail(ErrorKind::runtime, "replica exchange: holder ", p.holder, " of a group of ", group.size());
        total += p.values.numel();
    }
    if (total == 0) return;
    const int64_t capacity = std::max<int64_t>(1, std::min(total, max_staging_elements));
    const OwnedTensor staging = allocate(dtype, Shape{capacity});
    // Holder by holder, its parts cut into batches that fill the staging buffer.
    for (int holder = 0; holder < group.size(); ++holder) {
        std::vector<Span> batch;
        int64_t filled = 0;
        for (const ReplicaPart& p : parts) {
            if (p.holder != holder) continue;
            for (int64_t done = 0; done < p.values.numel();) {
                const int64_t n = std::min(p.values.numel() - done, capacity - filled);
                batch.push_back({p.values.reshape(Shape{p.values.numel()}).slice_rows(done, n), filled});
                filled += n;
                done += n;
                if (filled == capacity) {
                    broadcast_batch(group, holder, batch, filled, staging.view(), ops);
                    batch.clear();
                    filled = 0;
                }
            }
        }
        if (filled > 0) broadcast_batch(group, holder, batch, filled, staging.view(), ops);
    }
}

}  // namespace llmtrain
