// Arbitrary bytes as a checkpoint's rank file (rank_00000.h5, HDF5), read as generate, eval,
// `checkpoint verify` and a resumed run read it: its attributes and every tensor's
// description, every tensor's values whole and the first half of its box as a hyperslab
// (as a resume on another layout reads its part), then the file loaded into the tiny GPT-2
// and the tiny Llama of tests/fuzz/models (the master weights by their boxes, the
// optimizer's rank-local state) through a manifest of one rank that lists it. Either it loads or llmtrain::Error is
// thrown; never a crash or a read outside a tensor. The seeds (scripts/fuzz-seeds.sh) are the
// rank files of both models' checkpoints; the fuzzing build reads on past HDF5's Fletcher32
// chunk checksums (core/checksum_policy.h), so mutated values reach the assembly.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

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

// The first half (by its first dimension) of a dataset's one box, read as a part.
void read_first_half(const llmtrain::RankFileReader& reader, const llmtrain::SavedTensor& tensor) {
    if (reader.format() < 2 || tensor.boxes.size() != 1 || tensor.boxes.front().box.count.rank < 1) return;
    llmtrain::GlobalBox part = tensor.boxes.front().box;
    part.count.dims[0] = (part.count[0] + 1) / 2;
    std::vector<double> out(static_cast<size_t>(part.numel()));
    llmtrain::Shape at_origin;
    at_origin.rank = part.count.rank;
    reader.read_part(tensor, part, out.data(), llmtrain::DType::f64, part.count, at_origin);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static llmtrain::fuzz::TinyModel gpt2("gpt2"), llama("llama");
    static const std::string dir = llmtrain::fuzz::scratch_dir() + "/rank_file_checkpoint";
    std::filesystem::create_directories(dir);
    const std::string path = llmtrain::fuzz::write_scratch_file("rank_file_checkpoint/" + llmtrain::rank_file_name(0), data, size);
    try {
        const llmtrain::RankFileReader reader(path);
        for (const llmtrain::SavedTensor& tensor : reader.tensors()) {
            reader.read(tensor);
            read_first_half(reader, tensor);
        }
    } catch (const llmtrain::Error&) {
    }
    const llmtrain::Manifest manifest = one_rank_manifest(size);
    for (llmtrain::fuzz::TinyModel* model : {&gpt2, &llama}) {
        try {
            llmtrain::load_checkpoint_weights(dir, manifest, model->parameters(), *model->backend);
            llmtrain::load_rank_local_state(dir, manifest, 0, true, *model->optimizer);
        } catch (const llmtrain::Error&) {
        }
    }
    return 0;
}
