// The blocks' linear layers in FP8 (train.precision = "fp8"): per-tensor scaling state and
// the three GEMMs of one linear, out = x w^T + bias, on the backend's FP8 ops (backend.h):
//
//   forward   xq = fp8(x s_x), wq = fp8(w s_w)            (e4m3)
//             out = (1 / s_x)(1 / s_w) xq wq^T + bias      (fast accumulation, as Transformer Engine)
//   backward  gq = fp8(dout s_g)                           (e5m2 under "hybrid", else e4m3)
//             dx  = (1 / s_g)(1 / s_w) gq (wq^T)^T         (wq^T: the weight cast's transposed copy)
//             dw += (1 / s_g)(1 / s_x) (gq^T)(xq^T)^T      (both operands transposed: Hopper's GEMMs
//                                                          take FP8 only with k contiguous, "TN")
//             dbias += column sums of dout                 (the compute dtype, not FP8)
// The compute dtype stays what it is (bf16 on CUDA, f32 on the CPU, whose FP8 ops emulate
// the rounding exactly); only these GEMMs' operands are FP8.
//
// Scales (core/fp8.h: s = fp8 max / amax / 2^margin), per tensor of each linear (x, w, dout):
//   weights   cast once per optimizer step, at their first use after close_step(), from their
//             own amax (both recipes: the whole weight is there before the cast, so delaying
//             its amax buys nothing); the FP8 copy and its transpose are kept for the step.
//   current   x and dout scaled from their own amax as they are cast.
//   delayed   x and dout scaled from their amax history (Transformer Engine's DelayedScaling):
//             within a step the scale is fixed; each cast adds its amax to the step's running
//             max, which close_step() records after the trainer agreed on it over the groups
//             that hold the same layer (max over tp, cp and dp). A tensor with no history yet
//             (the first step, or a run resumed without one) is scaled from its own amax.
// The input is cast again in backward (not kept from forward): the same values with the same
// scale give the same bytes, and no FP8 copy of the input lives across the step.
//
// Tensor parallelism: a tensor split over the tp group (a column-parallel weight's rows and
// its output gradient's columns; a row-parallel weight's columns and its input's columns) has
// one amax over the group, so every rank casts with the same scale and a tp run computes what
// one process does. Under current scaling the amax must be known before the cast: one
// all-reduce (max) over tp per such tensor per cast, and one over cp for an activation or a
// gradient under context parallelism (each cp rank holds other tokens). The delayed recipe
// needs none in the step: its running maxima are agreed once per step, all tensors in one
// buffer (step_amaxes()).
//
// fp8.param_gather (ZeRO-3, parallel/fully_sharded.h): the weights reach this rank already in
// FP8. Once per update every rank casts only its shard of each weight, with one scale per
// weight that every rank holding a piece of it agrees on before the cast (torchao's
// enable_fsdp_float8_all_gather; the scale must be the same on every rank, or the gathered
// bytes would mean different values):
//     amax_w = max over the shard group and tp of each rank's max |w_piece|
//     s_w = e4m3 max / amax_w / 2^margin,   wq_piece = fp8(w_piece s_w)
// One all-reduce (max) over the shard group and one over tp for all weights together. The
// store gathers the pieces' bytes into weight_bytes(id); the first use in the step makes the
// transposed copy from them (a relayout of bytes, no cast). The amax is the whole weight's
// and each element is cast with the same scale as before, so the bytes are those the cast of
// the gathered compute-dtype weight would give: a run computes what it computes without.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "core/fp8.h"
#include "parallel/comm.h"
#include "parallel/fully_sharded.h"

namespace llmtrain {

// How tensor parallelism splits a linear (Megatron-LM): column-parallel splits the weight's
// rows (the input is whole, the output's columns split), row-parallel its columns (the input's
// columns split, the output a partial sum, whole after the reduction).
enum class LinearSplit { column_parallel, row_parallel };

// One FP8 linear's weight, [out, in] (this rank's part).
struct Fp8LinearShape {
    int64_t out_features = 0, in_features = 0;
};

// The device buffers Fp8Linears::allocate makes for `linears` and casts of up to max_rows
// token rows, in bytes: the memory plan counts these (plan/memory_plan.h's fp8 category) and
// allocate sizes its buffers from them, so the two cannot differ. For T = 3 x linears
// scaled tensors (input, weight, output gradient of each) and W the widest in or out:
//   state          f32 [5T]: amaxes (running, this cast's, merged), scales, inverse scales
//   weights        per linear its e4m3 copy and the copy's transpose, 2 x out x in bytes
//   scratch        4 x max_rows x W bytes: the input's and the gradient's casts, both layouts
//   counts         f64 [2]: saturated, flushed
//   weight_amaxes  fp8.param_gather only: f32 per linear (one at least)
// The amax histories are host memory (AmaxHistory), not the backend's.
struct Fp8Buffers {
    size_t state = 0;
    std::vector<size_t> weights;
    size_t scratch = 0;  // each of the four
    size_t counts = 0;
    size_t weight_amaxes = 0;
    size_t total() const;
};
Fp8Buffers fp8_buffers(const std::vector<Fp8LinearShape>& linears, int64_t max_rows, bool weights_gathered);

class Fp8Linears {
public:
    // The groups whose ranks hold parts of one tensor (null or of size 1: none).
    struct Groups {
        Comm* tp = nullptr;
        Comm* cp = nullptr;
    };
    // compute: the compute dtype (not f16: FP8 does not go with fp16's loss scaling).
    Fp8Linears(const Fp8Config& config, Backend& backend, DType compute, Groups groups);

    // fp8.param_gather: the weights arrive in FP8 (weight_bytes) from the store, which casts
    // its shard's pieces with cast_weight_pieces; no weight is cast here. Before allocate().
    void gather_weights_in_fp8() { weights_gathered_ = true; }
    bool weights_gathered() const { return weights_gathered_; }
    // Where weight `id`'s gathered e4m3 bytes go: wq, [out * in] (after allocate()).
    Tensor weight_bytes(int id) const { return weight_q(id).reshape({linears_[static_cast<size_t>(id)].out_features * linears_[static_cast<size_t>(id)].in_features}); }
    // Each FP8 weight's scale from its amax over every rank's pieces, then this rank's pieces
    // cast with it (the header's param_gather); piece.weight is a linear's id, at most one
    // piece per weight. A collective over `shard` and the tp group.
    void cast_weight_pieces(const std::vector<Fp8ShardPiece>& pieces, Comm* shard);

    // A linear whose weight is [out, in] (this rank's part); its id for forward / backward.
    // name: the global name of its (first) weight, which names its state in checkpoints.
    int add(int64_t out_features, int64_t in_features, LinearSplit split, std::string name = {});
    // Device memory for the state and the casts of up to max_rows token rows (fp8_buffers);
    // after add() and gather_weights_in_fp8().
    void allocate(int64_t max_rows);
    // The bytes allocate() took from the backend.
    size_t allocated_bytes() const { return allocated_bytes_; }

    // MatmulFwd's out = x w^T + bias with x and w in FP8 (row_block is the plain matmul's).
    void forward(int id, const MatmulFwd& args);
    // MatmulBwd's dx = dout w (overwritten), dw += dout^T x, dbias += column sums of dout,
    // each where given; x is the forward's input.
    void backward(int id, const MatmulBwd& args);

    bool delayed() const { return config_.recipe == Fp8Recipe::delayed; }
    // Off: the casts add nothing to the step's running amaxes (delayed recipe) nor to its cast
    // counts (evaluation and sampling read the scaling state, never move it: training then does not depend on
    // train.eval_every, and a resumed run, which does not repeat the evaluation at its resume
    // point, casts what the uninterrupted one does). On by default.
    void set_recording(bool on) { recording_ = on; }
    // The delayed recipe's running amax of every activation and gradient this step, f32 in
    // the backend's memory: the trainer all-reduces it (max) over tp, cp and dp before
    // close_step(), so that every rank records the same history as one process would.
    Tensor step_amaxes() const;
    // After the optimizer step (or a skipped one): the weights are cast again at their next
    // use; under the delayed recipe each history records the step's amax (a non-finite one is
    // not recorded) and sets the next step's scale.
    void close_step();

    // f64 [2] in the backend's memory: the elements this rank's casts saturated at their
    // format's largest value and flushed to zero this step (Fp8Cast::counts; evaluation and
    // sampling add none), zeroed by close_step(). The trainer reads it with the step's loss.
    Tensor cast_counts() const { return Tensor(counts_memory_.get(), DType::f64, {2}, backend_.device()); }

    // Host copies of a tensor's state, for tests and checkpoints: role 0 the input, 1 the
    // weight, 2 the output gradient of linear `id`.
    struct TensorState {
        float scale = 1, scale_inv = 1;
        std::vector<float> history;  // oldest first; empty under the current recipe
    };
    TensorState state(int id, int role) const;
    int count() const { return static_cast<int>(linears_.size()); }

    // The delayed recipe's scaling state as a checkpoint holds it, under global names: for
    // each input and output gradient with a history, "<weight name>/input_amax_history" (or
    // grad_: amax_history_len f32, oldest first) and ".../input_scale" (1 f32, the scale the
    // next step casts with). None under the current recipe, nor for a tensor without history.
    // The weights' scales are not state: each step casts them from their own amax.
    struct NamedState {
        std::string name;
        std::vector<float> values;
    };
    std::vector<NamedState> scaling_state() const;
    // Sets every tensor's state from `saved` (name -> values, as scaling_state() gave them)
    // bit-exact, or fresh (no history, scale 1) where saved has none. A history of another
    // length keeps its newest entries (zeros before them); the scale is the saved one either
    // way, and the next close_step() computes it from the history as always. Returns how many
    // tensors were restored. Throws a data error naming the entry of a malformed state.
    int restore_scaling_state(const std::map<std::string, std::vector<float>>& saved);

private:
    enum Role { input = 0, weight = 1, grad = 2 };
    struct Scaled {
        DType format = DType::e4m3;
        bool agree_tp = false, agree_cp = false;  // split over the group: one amax over it
        AmaxHistory history;
        bool has_history = false;
    };
    struct Linear {
        int64_t out_features = 0, in_features = 0;
        std::string name;
        Memory weight_memory;  // wq [out, in] and wq^T [in, out], e4m3
        bool weight_cast = false;
    };
    int tensor(int id, Role role) const { return 3 * id + role; }
    // Views of the device state: the step's running amax, this cast's amax (side by side, so
    // that one fp8_amax over both gives the new running max, into the third), the scale, its
    // inverse.
    Tensor amaxes(int t) const;
    Tensor amax_now(int t) const { return amaxes(t).slice_rows(1, 1); }
    Tensor scale(int t) const;
    Tensor scale_inv(int t) const;
    // xq (and its transpose xt when given) = fp8(x s) with the tensor's scale set first as the
    // recipe says.
    void cast(int t, const Tensor& x, const Tensor& xq, const Tensor& xt);
    void agree(int t);  // the current-scaling amax over the groups that split the tensor
    void cast_weight(int id, const Tensor& w);
    Tensor weight_q(int id) const;
    Tensor weight_t(int id) const;
    Tensor scratch(size_t which, DType dtype, Shape shape) const;
    std::string state_name(int t) const;  // "<weight name>/input" or "/grad"
    Tensor scales() const;                // [T] scales then [T] inverse scales

    Fp8Config config_;
    Backend& backend_;
    DType compute_;
    Groups groups_;
    std::vector<Linear> linears_;
    std::vector<Scaled> tensors_;
    Memory state_memory_;  // f32: [3T] amaxes (running, now, merged), [T] scales, [T] inverse scales
    std::vector<Memory> scratch_;  // input and gradient casts, both layouts
    Memory counts_memory_;         // f64 [2]: saturated, flushed (Fp8Cast::counts)
    Memory weight_amax_memory_;    // f32 [linears]: param_gather's weight amaxes, agreed in one buffer
    int64_t max_rows_ = 0, max_width_ = 0;
    size_t allocated_bytes_ = 0;
    bool recording_ = true;
    bool weights_gathered_ = false;
};

// Recording off while one lives (Fp8Linears::set_recording); fp8 may be null.
class Fp8NotRecording {
public:
    explicit Fp8NotRecording(Fp8Linears* fp8) : fp8_(fp8) {
        if (fp8_) fp8_->set_recording(false);
    }
    ~Fp8NotRecording() {
        if (fp8_) fp8_->set_recording(true);
    }
    Fp8NotRecording(const Fp8NotRecording&) = delete;
    Fp8NotRecording& operator=(const Fp8NotRecording&) = delete;

private:
    Fp8Linears* fp8_;
};

}  // namespace llmtrain
