#include "data/input_files.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace llmtrain {

namespace {

namespace fs = std::filesystem;

// The input files under a directory: those of a known input format, at any depth, sorted.
std::vector<std::string> files_under(const std::string& dir) {
    std::vector<std::string> found;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec), end; !ec && it != end; it.increment(ec)) {
        if (it->path().filename().string().starts_with(".")) {  // hidden: not entered, not read
            if (it->is_directory()) it.disable_recursion_pending();
            continue;
        }
        if (it->is_regular_file() && is_input_name(it->path().string())) found.push_back(it->path().string());
    }
    if (ec) fail(ErrorKind::data, "cannot list input directory '", dir, "': ", ec.message());
    if (found.empty()) fail(ErrorKind::data, "input directory '", dir, "' holds no input file (", kInputNames, ")");
    std::sort(found.begin(), found.end());
    return found;
}

}  // namespace

bool is_input_name(std::string_view path) {
    for (const std::string_view compressed : {".gz", ".zst", ".zstd"})
        if (path.ends_with(compressed)) path.remove_suffix(compressed.size());
    for (const std::string_view format : {".parquet", ".pq", ".jsonl", ".json", ".txt", ".text"})
        if (path.ends_with(format)) return true;
    return false;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
    std::vector<std::string> files;
    for (const std::string& pattern : patterns) {
        if (std::filesystem::is_regular_file(pattern)) { files.push_back(pattern); continue; }
        if (std::filesystem::is_directory(pattern)) {
            const std::vector<std::string> found = files_under(pattern);
            files.insert(files.end(), found.begin(), found.end());
            continue;
        }
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
