// Splits text with a pattern the way Hugging Face's tokenizers do (Oniguruma, Split with
// behavior Isolated: matches and the gaps between them). Kept apart from the test file:
// oniguruma.h and GoogleTest's <regex.h> both define struct re_registers.
#pragma once

#include <memory>
#include <string>
#include <vector>

class OnigurumaSplitter {
public:
    explicit OnigurumaSplitter(const char* pattern);
    ~OnigurumaSplitter();
    std::vector<std::string> split(const std::string& text) const;

private:
    struct Regex;
    std::unique_ptr<Regex> regex_;
};
