// Arbitrary bytes as a checkpoint's rank file (rank_00000.h5, HDF5), read as generate, eval,
// `checkpoint verify` and a resumed run read it: its attributes and every tensor's
// description, every tensor's values, then the whole file loaded into the tiny GPT-2 and the
// tiny Llama of tests/fuzz/models (master weights, AdamW moments, the optimizer's rank-local
// state) through a manifest of one rank that lists it. Either it loads or llmtrain::Error is
// thrown; never a crash or a read outside a tensor. The seeds (scripts/fuzz-seeds.sh) are the
// rank files of both models' checkpoints; the fuzzing build reads on past HDF5's Fletcher32
// chunk checksums (core/checksum_policy.h), so mutated values reach the assembly.
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/hdf5_file.h"
#include "checkpoint/restore.h"
#include "core/error.h"
#include "tiny_model.h"

namespace {

// A checkpoint directory of one rank, whose file is the input.
llmtrain::Manifest one_rank_manifest(size_t bytes) {
    llmtrain::Manifest manifest;
    manifest.files = {{llmtrain::rank_file_name(0), bytes, 0}};
    return manifest;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static llmtrain::fuzz::TinyModel gpt2("gpt2"), llama("llama");
    static const std::string dir = llmtrain::fuzz::scratch_dir() + "/rank_file_checkpoint";
    std::filesystem::create_directories(dir);
    const std::string path = llmtrain::fuzz::write_scratch_file("rank_file_checkpoint/" + llmtrain::rank_file_name(0), data, size);
    try {
        const llmtrain::RankFileReader reader(path);
        for (const llmtrain::SavedTensor& tensor : reader.tensors()) reader.read(tensor);
    } catch (const llmtrain::Error&) {
    }
    const llmtrain::Manifest manifest = one_rank_manifest(size);
    for (llmtrain::fuzz::TinyModel* model : {&gpt2, &llama}) {
        try {
            llmtrain::load_checkpoint_tensors(dir, manifest, model->parameters(), *model->optimizer, *model->backend);
            llmtrain::load_rank_local_state(dir, manifest, 0, true, *model->optimizer);
        } catch (const llmtrain::Error&) {
        }
    }
    return 0;
}
