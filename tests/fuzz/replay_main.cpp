// The fuzz targets in the normal build: `fuzz_replay TARGET PATH...` runs TARGET's
// LLVMFuzzerTestOneInput (compiled as fuzz_one_TARGET) on each file, and on each file of each
// directory, in name order, as libFuzzer would replay them. CTest replays tests/fuzz/regressions
// this way: an input that once crashed a target must now pass through it.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#define LLMTRAIN_FUZZ_TARGET(name) extern "C" int fuzz_one_##name(const uint8_t* data, size_t size);
#include "fuzz_targets.inc"
#undef LLMTRAIN_FUZZ_TARGET

namespace {

using TargetFunction = int (*)(const uint8_t*, size_t);

const std::map<std::string, TargetFunction>& targets() {
    static const std::map<std::string, TargetFunction> table = {
#define LLMTRAIN_FUZZ_TARGET(name) {#name, fuzz_one_##name},
#include "fuzz_targets.inc"
#undef LLMTRAIN_FUZZ_TARGET
    };
    return table;
}

std::vector<std::filesystem::path> inputs_under(const std::filesystem::path& path) {
    if (!std::filesystem::is_directory(path)) return {path};
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(path))
        if (entry.is_regular_file()) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    return files;
}

}  // namespace

int main(int argc, char** argv) {
    const auto target = argc > 1 ? targets().find(argv[1]) : targets().end();
    if (target == targets().end()) {
        std::fprintf(stderr, "usage: fuzz_replay TARGET PATH...; targets:");
        for (const auto& [name, function] : targets()) std::fprintf(stderr, " %s", name.c_str());
        std::fprintf(stderr, "\n");
        return 2;
    }
    size_t replayed = 0;
    for (int i = 2; i < argc; ++i) {
        if (!std::filesystem::exists(argv[i])) {
            std::fprintf(stderr, "fuzz_replay: no such file or directory '%s'\n", argv[i]);
            return 2;
        }
        for (const std::filesystem::path& file : inputs_under(argv[i])) {
            std::ifstream in(file, std::ios::binary);
            const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
            std::printf("%s: %s (%zu bytes)\n", target->first.c_str(), file.c_str(), bytes.size());
            std::fflush(stdout);
            target->second(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
            ++replayed;
        }
    }
    std::printf("fuzz_replay %s: %zu input(s) passed\n", target->first.c_str(), replayed);
    return replayed > 0 ? 0 : 2;
}
