// Scratch paths for tests. CTest runs every test case in a process of its own, several at
// once: a fixed name under the temporary directory would be written by one case while
// another reads it, so each process gets names of its own.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace llmtrain::test {

inline std::string process_temp_path(const std::string& name) { return testing::TempDir() + "llmtrain." + std::to_string(getpid()) + "." + name; }

// This process's scratch directory `name`, made empty; returns its path.
inline std::string fresh_temp_dir(const std::string& name) {
    const std::string dir = process_temp_path(name);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
}

// Writes bytes to this process's scratch file `name`; returns its path.
inline std::string write_temp_file(const std::string& name, const std::string& bytes) {
    const std::string path = process_temp_path(name);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return path;
}

}  // namespace llmtrain::test
