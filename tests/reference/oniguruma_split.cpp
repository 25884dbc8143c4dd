#include "oniguruma_split.h"

#include <oniguruma.h>

#include <cstring>
#include <stdexcept>

#include "data/byte_level.h"

struct OnigurumaSplitter::Regex {
    regex_t* re = nullptr;
    ~Regex() { onig_free(re); }
};

OnigurumaSplitter::OnigurumaSplitter(const char* pattern) : regex_(std::make_unique<Regex>()) {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
    OnigErrorInfo info;
    const auto* p = reinterpret_cast<const UChar*>(pattern);
    if (onig_new(&regex_->re, p, p + std::strlen(pattern), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info) != ONIG_NORMAL)
        throw std::runtime_error("Oniguruma rejects the pattern");
}

OnigurumaSplitter::~OnigurumaSplitter() = default;

std::vector<std::string> OnigurumaSplitter::split(const std::string& text) const {
    std::vector<std::string> pieces;
    OnigRegion* region = onig_region_new();
    const auto* begin = reinterpret_cast<const UChar*>(text.data());
    const UChar* end = begin + text.size();
    size_t emitted = 0, pos = 0;
    while (pos < text.size()) {
        if (onig_search(regex_->re, begin, end, begin + pos, end, region, ONIG_OPTION_NONE) < 0) break;
        const auto from = static_cast<size_t>(region->beg[0]), to = static_cast<size_t>(region->end[0]);
        if (from > emitted) pieces.push_back(text.substr(emitted, from - emitted));
        if (to == from) {
            pos = from + llmtrain::utf8_sequence_length(text, from);
            continue;
        }
        pieces.push_back(text.substr(from, to - from));
        emitted = pos = to;
    }
    if (emitted < text.size()) pieces.push_back(text.substr(emitted));
    onig_region_free(region, 1);
    return pieces;
}
