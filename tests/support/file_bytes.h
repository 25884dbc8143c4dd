// A file's bytes whole, read and written as tests damage and forge files.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace llmtrain::test {

inline std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes; }

}  // namespace llmtrain::test
