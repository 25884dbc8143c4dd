// Input file lists for `prepare` and `tokenizer train`: each argument is a file or a glob
// pattern; the matches of a pattern are sorted, so the order (and thus every output) is the
// same on every machine. A pattern matching nothing is an error naming it.
#pragma once

#include <string>
#include <vector>

namespace llmtrain {

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns);

// The whole file; errors name the path.
std::string read_whole_file(const std::string& path);

}  // namespace llmtrain
