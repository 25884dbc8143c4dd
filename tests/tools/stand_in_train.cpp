// stand_in_train CONFIG RUN_DIR [KEY=VALUE ...]: one process trains CONFIG, with the overrides
// of `llmtrain train --set`, on the CPU stand-in of the CUDA backend
// (support/stand_in_cuda_backend.h): train.device = "cuda" and its number formats (bf16 or
// fp16 activations and compute weights, f32 master weights, gradients and optimizer state;
// train.precision = "fp8" casts the blocks' linears to FP8 from bf16), every op computed by
// the CPU reference in f32 and its 16-bit outputs rounded to nearest even. Writes
// RUN_DIR/log.jsonl (start, step and eval records, end) as a run directory holds it.
//
// What a GPU's formats do to training, measured on a machine without one
// (scripts/fp8-quality.sh). A test tool: llmtrain itself never links the stand-in.
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "core/exit_code.h"
#include "metrics/run_log.h"
#include "support/stand_in_cuda_backend.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

int train_on_stand_in(const std::string& config_path, const std::string& run_dir, std::vector<std::string> overrides) {
    overrides.push_back("train.device=\"cuda\"");
    const Config config = load_config(config_path, overrides);
    const int cpu_threads = static_cast<int>(config.train.threads);
    std::filesystem::create_directories(run_dir);
    RunLog log((std::filesystem::path(run_dir) / "log.jsonl").string());
    log.write("start", {{"config", config_path}, {"overrides", overrides}, {"steps", config.train.steps},
                        {"backend", "CPU stand-in of the CUDA backend"}, {"precision", precision_name(config.train.precision)}});
    TrainerOptions options{.quiet = true};
    options.make_backend = [cpu_threads](int) { return test::make_stand_in_cuda_backend(cpu_threads); };
    options.observers = {&log};
    Trainer trainer(config, options);
    const TrainResult result = trainer.run();
    log.write("end", {{"steps", result.steps_taken}, {"seconds", result.train_seconds}, {"exit_code", 0}});
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::cerr << "usage: stand_in_train CONFIG RUN_DIR [KEY=VALUE ...]  (the overrides of llmtrain train --set)\n";
        return 2;
    }
    try {
        return train_on_stand_in(argv[1], argv[2], std::vector<std::string>(argv + 3, argv + argc));
    } catch (const Error& e) {
        std::cerr << "stand_in_train: " << e.what() << "\n";
        return exit_code_for(e.kind());
    }
}
