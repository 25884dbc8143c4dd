// Input file lists for `prepare` and `tokenizer train`: each argument is a file, a directory
// or a glob pattern. A directory stands for the files under it, at any depth, whose names say
// an input format (is_input_name; hidden files and directories, such as a download tool's
// .cache, are passed over). The files of a pattern or a directory are sorted, so the order
// (and thus every output) is the same on every machine. An argument that gives no file is an
// error naming it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace llmtrain {

// The names a directory's files are taken by: .parquet, .pq, .jsonl, .json, .txt, .text, and
// those under .gz, .zst or .zstd.
constexpr const char* kInputNames = ".parquet, .pq, .jsonl, .json, .txt, .text, also under .gz / .zst";
bool is_input_name(std::string_view path);

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns);

// The whole file; errors name the path.
std::string read_whole_file(const std::string& path);

}  // namespace llmtrain
