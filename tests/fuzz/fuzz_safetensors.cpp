// Arbitrary bytes as model.safetensors, read as train.init_from reads it: the header, then
// every tensor of the tiny GPT-2 and the tiny Llama of tests/fuzz/models loaded into their
// parameters, then every entry the header lists read on its own. Either the weights load or
// llmtrain::Error is thrown; never a crash, a hang, an allocation beyond the file's size or a
// read outside it. The seeds (scripts/fuzz-seeds.sh) are both models' exports, so mutations
// reach the payload and its conversions (Conv1D transposes, vocabulary padding, dtypes).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "checkpoint/safetensors.h"
#include "config/config.h"
#include "core/error.h"
#include "fuzz_input.h"
#include "model/transformer.h"

namespace {

struct TinyModel {
    llmtrain::ModelConfig config;
    std::unique_ptr<llmtrain::Backend> backend = llmtrain::make_cpu_backend(1);
    std::unique_ptr<llmtrain::Transformer> transformer;

    explicit TinyModel(const std::string& name)
        : config(llmtrain::load_config(llmtrain::fuzz::fuzz_model_config(name), {}, llmtrain::DataFiles::unchecked).model),
          transformer(std::make_unique<llmtrain::Transformer>(config, *backend, llmtrain::DType::f32, 1, config.max_seq_len)) {}
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static TinyModel gpt2("gpt2"), llama("llama");
    const std::string path = llmtrain::fuzz::write_scratch_file("model.safetensors", data, size);
    for (TinyModel* model : {&gpt2, &llama}) {
        try {
            llmtrain::load_hf_weights(path, model->config.vocab_size, model->transformer->parameters(), *model->backend);
        } catch (const llmtrain::Error&) {
        }
    }
    try {
        const llmtrain::SafetensorsFile file(path);
        for (const llmtrain::SafetensorsEntry& entry : file.entries()) file.read(entry);
    } catch (const llmtrain::Error&) {
    }
    return 0;
}
