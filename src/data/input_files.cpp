#include "data/input_files.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace llmtrain {

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
    std::vector<std::string> files;
    for (const std::string& pattern : patterns) {
        if (std::filesystem::is_regular_file(pattern)) { files.push_back(pattern); continue; }
        glob_t matches{};
        const int rc = glob(pattern.c_str(), 0, nullptr, &matches);
        std::vector<std::string> found;
        for (size_t i = 0; rc == 0 && i < matches.gl_pathc; ++i)
            if (std::filesystem::is_regular_file(matches.gl_pathv[i])) found.emplace_back(matches.gl_pathv[i]);
        globfree(&matches);
        if (found.empty()) fail(ErrorKind::data, "input '", pattern, "' matches no file");
        std::sort(found.begin(), found.end());
        files.insert(files.end(), found.begin(), found.end());
    }
    return files;
}

std::string read_whole_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorKind::data, "cannot open '", path, "'");
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) fail(ErrorKind::io, "read error on '", path, "'");
    return bytes;
}

}  // namespace llmtrain
