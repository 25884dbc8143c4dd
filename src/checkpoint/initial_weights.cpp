#include "checkpoint/initial_weights.h"

#include <filesystem>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/config_changes.h"
#include "checkpoint/hf_moe.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace llmtrain {

namespace fs = std::filesystem;

namespace {
bool is_checkpoint_directory(const std::string& path) { return fs::exists(fs::path(path) / "manifest.json"); }

// A checkpoint of another model's shape would not fit the parameters: named by its first key.
void check_same_model(const std::string& path, const Manifest& manifest, const Config& config) {
    const ConfigChanges changes = config_changes(manifest.config_toml, dump_config(config));
    if (changes.model_shape.empty()) return;
    const ConfigChange& c = changes.model_shape.front();
    fail(ErrorKind::config, "train.init_from: the checkpoint '", path, "' was saved by a model with ", c.key, " = ", c.saved, ", this config has ", c.now);
}
}  // namespace

void check_initial_weights_fit(const Config& config) {
    const std::string& path = config.train.init_from;
    if (path.empty() || is_checkpoint_directory(path)) return;
    check_hf_experts(SafetensorsFile(safetensors_file_of(path)), config.model);
}

std::string initial_weights_source(const std::string& path) { return is_checkpoint_directory(path) ? path : safetensors_file_of(path); }

std::optional<Manifest> checkpoint_to_start_from(const std::string& path, const Config& config, const ProblemOf& problem_of) {
    if (!is_checkpoint_directory(path)) return std::nullopt;
    if (const std::optional<std::string> problem = problem_of(path))
        fail(ErrorKind::data, "train.init_from: checkpoint '", path, "' cannot be loaded: ", *problem);
    Manifest manifest = read_checkpoint_manifest(path);
    check_same_model(path, manifest, config);
    return manifest;
}

}  // namespace llmtrain
