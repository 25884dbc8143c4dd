// Arbitrary bytes as a checkpoint's manifest.json, beside a valid rank file of the tiny GPT-2
// of tests/fuzz/models (written once, by the target): the checks `--resume auto` and
// `checkpoint verify --full` make (the listed files' names, sizes, XXH64 and every tensor),
// the saved config as generate and eval parse it and as a resumed run compares it with its
// own, then the listed files loaded into the model (the master weights by their boxes, the
// rank-local state). Either it loads or llmtrain::Error is thrown; never a crash, a read
// outside the checkpoint directory, or an allocation the file's sizes do not justify. The
// seeds (scripts/fuzz-seeds.sh) are the manifests of the tiny models' checkpoints; the
// fuzzing build reads on past a file whose XXH64 disagrees (core/checksum_policy.h).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/config_changes.h"
#include "checkpoint/hdf5_file.h"
#include "checkpoint/rank_snapshot.h"
#include "checkpoint/restore.h"
#include "core/error.h"
#include "model/parameters.h"
#include "tiny_model.h"

namespace {

// scratch_dir()/manifest_checkpoint/rank_00000.h5: the model's weights, each tensor whole,
// as one rank's save writes them.
std::string write_checkpoint(llmtrain::fuzz::TinyModel& model) {
    const std::string dir = llmtrain::fuzz::scratch_dir() + "/manifest_checkpoint";
    std::filesystem::create_directories(dir);
    const llmtrain::Parameters& params = model.parameters();
    const std::vector<llmtrain::TensorPlace> tensors = llmtrain::tensor_places(params);
    llmtrain::RankSnapshot snapshot;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const llmtrain::TensorPlace& t = tensors[i];
        const llmtrain::GlobalBox box = llmtrain::whole_box(t.global_shape);
        llmtrain::SavedTensor saved;
        saved.dataset = llmtrain::piece_dataset(llmtrain::TensorRole::weights, t.name, t.global_shape, box);
        saved.name = t.name;
        saved.global_shape = t.global_shape;
        saved.dtype = llmtrain::DType::f32;
        saved.boxes = {{box, 0}};
        saved.byte_offset = snapshot.data.size();
        snapshot.data.resize(snapshot.data.size() + static_cast<size_t>(t.numel()) * sizeof(float));
        model.backend->copy_to_host(snapshot.data.data() + saved.byte_offset, params.master_value(i));
        snapshot.tensors.push_back(saved);
    }
    llmtrain::write_rank_file(dir + "/" + llmtrain::rank_file_name(0), snapshot, {});
    return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static llmtrain::fuzz::TinyModel gpt2("gpt2");
    static const std::string dir = write_checkpoint(gpt2);
    static const std::string own_config = llmtrain::dump_config(gpt2.config);
    llmtrain::fuzz::write_scratch_file("manifest_checkpoint/manifest.json", data, size);
    (void)llmtrain::checkpoint_problem(dir, llmtrain::Verification::full);
    try {
        const llmtrain::Manifest manifest = llmtrain::read_checkpoint_manifest(dir);
        try {
            llmtrain::parse_config(manifest.config_toml, dir + "/manifest.json (config)", {}, llmtrain::DataFiles::unchecked);
            llmtrain::config_changes(manifest.config_toml, own_config);
        } catch (const llmtrain::Error&) {
        }
        llmtrain::load_checkpoint_weights(dir, manifest, gpt2.parameters(), *gpt2.backend);
        llmtrain::load_rank_local_state(dir, manifest, 0, true, *gpt2.optimizer);
    } catch (const llmtrain::Error&) {
    }
    return 0;
}
