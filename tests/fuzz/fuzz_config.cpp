// Arbitrary text as a run's TOML config, with `--set` overrides: each line "#--set KEY=VALUE"
// (a TOML comment, so the file parses without them) is also given as an override, as
// `llmtrain train CONFIG --set KEY=VALUE` would. The config is refused with llmtrain::Error, or
// read; a config that reads is checked the way `train --dry-run` checks it before anything is
// allocated (its layout, stages, micro-batches and memory plan), and its effective config,
// dumped and read back, is the same config.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "fuzz_input.h"
#include "plan/memory_plan.h"
#include "parallel/context.h"

namespace {

std::vector<std::string> set_lines(const std::string& text) {
    constexpr std::string_view marker = "#--set ";
    std::vector<std::string> overrides;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
        if (line.starts_with(marker)) overrides.push_back(line.substr(marker.size()));
    return overrides;
}

// What `train --dry-run` derives from a config that reads, on the world its layout names.
void check_layout(const llmtrain::Config& config) {
    const llmtrain::ParallelConfig& p = config.parallel;
    const int64_t world = p.tp * p.pp * std::max<int64_t>(1, p.dp);
    if (world > (int64_t{1} << 20)) return;  // no job of that many ranks: make_mesh's own int is not what is tested
    const llmtrain::Mesh mesh = llmtrain::make_mesh(p, static_cast<int>(world));
    llmtrain::parse_stage_layers(p.stage_layers, mesh.pp(), config.model.n_layers);
    llmtrain::micro_batches_per_step(config, mesh.dp());
    llmtrain::describe(llmtrain::largest_rank_plan(config, mesh));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text = llmtrain::fuzz::as_text(data, size);
    llmtrain::Config config;
    try {
        config = llmtrain::parse_config(text, "fuzz.toml", set_lines(text), llmtrain::DataFiles::unchecked);
    } catch (const llmtrain::Error&) {
        return 0;
    }
    const std::string dumped = llmtrain::dump_config(config);
    try {
        if (llmtrain::dump_config(llmtrain::parse_config(dumped, "dumped.toml", {}, llmtrain::DataFiles::unchecked)) != dumped) std::abort();
    } catch (const llmtrain::Error&) {
        std::abort();  // a config that was read must read again as dumped
    }
    try {
        check_layout(config);
    } catch (const llmtrain::Error&) {
    }
    return 0;
}
