// The FP8 delayed recipe's scaling state in checkpoints (fp8_state.h).
#include "train/fp8_state.h"

#include <nlohmann/json.hpp>

#include "checkpoint/restore.h"
#include "core/error.h"

namespace llmtrain {

namespace {
constexpr const char* kPrefix = "fp8/";

bool first_of_stage(const MeshCoord& c) { return c[mesh_dim::tp] == 0 && c[mesh_dim::cp] == 0 && c[mesh_dim::dp] == 0; }
}  // namespace

std::vector<HostDataset> fp8_checkpoint_datasets(const Fp8Linears* fp8) {
    std::vector<HostDataset> out;
    if (!fp8) return out;
    for (Fp8Linears::NamedState& s : fp8->scaling_state()) out.push_back({kPrefix + s.name, std::move(s.values)});
    return out;
}

std::string fp8_manifest_state(const Config& config, const Mesh& mesh) {
    if (config.train.precision != Precision::fp8 || config.fp8.recipe != Fp8Recipe::delayed) return "";
    std::vector<int> ranks;
    for (int r = 0; r < mesh.world_size(); ++r)
        if (first_of_stage(mesh.coord(r))) ranks.push_back(r);
    return nlohmann::ordered_json{{"recipe", fp8_recipe_name(config.fp8.recipe)}, {"amax_history_len", config.fp8.amax_history_len}, {"state_ranks", ranks}}
        .dump();
}

std::string restore_fp8_state(Fp8Linears* fp8, const ParallelContext& ctx, const std::string& path, const Manifest& manifest) {
    if (!fp8 || !fp8->delayed()) return "";
    const Mesh& mesh = ctx.mesh;
    const bool same_layout = manifest.world_size == mesh.world_size() && manifest.tp == mesh.tp() && manifest.dp == mesh.dp() && manifest.pp == mesh.pp() &&
                             manifest.cp == mesh.cp();
    std::vector<int> ranks;
    if (!manifest.fp8_state.empty() && same_layout) {
        ranks = {ctx.world_rank};  // its own file holds its layers' state
    } else if (!manifest.fp8_state.empty()) {
        const nlohmann::json saved = nlohmann::json::parse(manifest.fp8_state);
        if (!saved.contains("state_ranks") || !saved.at("state_ranks").is_array())
            fail(ErrorKind::data, "'", path, "': the manifest's \"fp8\" entry has no \"state_ranks\" list");
        ranks = saved.at("state_ranks").get<std::vector<int>>();
    }
    std::map<std::string, std::vector<float>> state;
    for (auto& [dataset, values] : read_host_state(path, manifest, ranks, kPrefix)) state[dataset.substr(std::string_view(kPrefix).size())] = std::move(values);
    const int restored = fp8->restore_scaling_state(state);
    if (manifest.fp8_state.empty())
        return "fp8: the checkpoint holds no delayed-scaling state (saved without fp8.recipe = \"delayed\"): the amax histories start empty, as in a new run";
    return restored == 0 && fp8->count() > 0 ? "fp8: the checkpoint's delayed-scaling state names none of this run's FP8 linears: the amax histories start empty" : "";
}

}  // namespace llmtrain
