// What the fuzz targets share: the input written to a scratch file of this process (for the
// readers that take a path), and the tiny models of tests/fuzz/models.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace llmtrain::fuzz {

// A directory of this process's own under the system's temporary directory, made on first use
// and removed when the process exits.
inline const std::string& scratch_dir() {
    struct ScratchDir {
        std::filesystem::path path = std::filesystem::temp_directory_path() / ("llmtrain-fuzz-" + std::to_string(getpid()));
        std::string text = (std::filesystem::create_directories(path), path.string());
        ~ScratchDir() {
            std::error_code ec;
            std::filesystem::remove_all(path, ec);
        }
    };
    static const ScratchDir dir;
    return dir.text;
}

// Writes the input to scratch_dir()/name (replacing what was there) and returns the path.
inline std::string write_scratch_file(const std::string& name, const uint8_t* data, size_t size) {
    const std::string path = scratch_dir() + "/" + name;
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    return path;
}

inline std::string as_text(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

// tests/fuzz/models/NAME.toml: the configs whose outputs seed the corpora (scripts/fuzz-seeds.sh),
// so that the targets load what the seeds hold.
inline std::string fuzz_model_config(const std::string& name) { return std::string(LLMTRAIN_FUZZ_MODELS_DIR) + "/" + name + ".toml"; }

}  // namespace llmtrain::fuzz
