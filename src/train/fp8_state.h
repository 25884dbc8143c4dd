// The FP8 delayed recipe's scaling state in checkpoints (Transformer Engine keeps the same as
// each module's extra_state): the amax history and the scale of every activation and gradient
// an FP8 linear casts (model/fp8_linear.h), under global names, so that a resumed delayed run
// casts its first step with the scales the uninterrupted one would, bit for bit, on any layout.
//
// Where it goes: HDF5 datasets of the checkpoint's rank files, not the manifest's JSON. At
// the default amax_history_len = 1024, a 72B model's 80 layers x 4 linears x 2 tensors hold
// 2.6 MB of f32 histories: binary and checksummed in a rank file, where JSON would make the
// manifest (read and parsed by every rank at every resume) some 30 MB of text.
//
// Who writes it: close_step agrees every history over tp, cp and dp (max), so all ranks of
// a pipeline stage hold the same histories for its layers. Every rank writes its layers'
// under "fp8/<weight name>/input_amax_history" and so on (at 72B on pp 8, 0.3 MB beside its
// gigabytes of weights and moments), so that a resume on the same layout reads its own file
// alone, as a node-local snapshot, which holds no other node's files, must; the manifest
// lists each stage's first rank (tp, cp and dp ranks 0; "fp8": {"recipe",
// "amax_history_len", "state_ranks"}), whose files a resume on another layout reads, taking
// what its layers need by name.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/rank_snapshot.h"
#include "config/config.h"
#include "model/fp8_linear.h"
#include "parallel/context.h"

namespace llmtrain {

// This rank's datasets of the state (empty unless the recipe is delayed).
std::vector<HostDataset> fp8_checkpoint_datasets(const Fp8Linears* fp8);
// The manifest's "fp8" entry (JSON): the recipe and the ranks whose files hold the state;
// empty unless train.precision = "fp8" with the delayed recipe.
std::string fp8_manifest_state(const Config& config, const Mesh& mesh);
// Sets the recipe's state from the checkpoint at `path`: the saved histories where it has
// them, fresh ones where it has none (a bf16 checkpoint, or one of the current recipe). A
// run without the delayed recipe leaves the saved state unread. Returns what to log (empty:
// nothing to say).
std::string restore_fp8_state(Fp8Linears* fp8, const ParallelContext& ctx, const std::string& path, const Manifest& manifest);

}  // namespace llmtrain
