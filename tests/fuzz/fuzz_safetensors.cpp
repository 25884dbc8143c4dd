// Arbitrary bytes as model.safetensors, read as train.init_from reads it: the header checked
// against the tiny GPT-2's and the tiny Llama's tensors (tests/fuzz/models), then each of
// their tensors read as a rank holding it whole reads it, then every entry the header lists read on its own. Either the weights load or
// llmtrain::Error is thrown; never a crash, a hang, an allocation beyond the file's size or a
// read outside it. The seeds (scripts/fuzz-seeds.sh) are both models' exports, so mutations
// reach the payload and its conversions (Conv1D transposes, vocabulary padding, dtypes).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "model/parameters.h"
#include "tiny_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static llmtrain::fuzz::TinyModel gpt2("gpt2"), llama("llama");
    const std::string path = llmtrain::fuzz::write_scratch_file("model.safetensors", data, size);
    for (llmtrain::fuzz::TinyModel* model : {&gpt2, &llama}) {
        try {
            const std::vector<llmtrain::TensorPlace> tensors = llmtrain::tensor_places(model->parameters());
            const llmtrain::HfWeights weights(path, model->config.model.vocab_size, tensors);
            for (const llmtrain::TensorPlace& t : tensors) {
                std::vector<float> values(static_cast<size_t>(t.numel()));
                weights.read(t, {0, t.numel()}, values.data(), llmtrain::DType::f32);
            }
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
