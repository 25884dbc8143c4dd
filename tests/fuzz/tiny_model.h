// The tiny models of tests/fuzz/models as the targets load files into them: the model on the
// CPU backend in f32, with its AdamW (for the checkpoint targets' moments).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "config/config.h"
#include "fuzz_input.h"
#include "model/transformer.h"
#include "optim/adamw.h"

namespace llmtrain::fuzz {

struct TinyModel {
    Config config;
    std::unique_ptr<Backend> backend = make_cpu_backend(1);
    std::unique_ptr<Transformer> transformer;
    std::unique_ptr<AdamW> optimizer;

    explicit TinyModel(const std::string& name)
        : config(load_config(fuzz_model_config(name), {}, DataFiles::unchecked)),
          transformer(std::make_unique<Transformer>(config.model, *backend, DType::f32, 1, config.model.max_seq_len)),
          optimizer(std::make_unique<AdamW>(config.optimizer, transformer->parameters())) {}

    Parameters& parameters() { return transformer->parameters(); }
};

}  // namespace llmtrain::fuzz
