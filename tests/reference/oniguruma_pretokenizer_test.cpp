// Pre-tokenization equals Oniguruma's, the regex engine Hugging Face's tokenizers run the
// split patterns with: the same pieces for the GPT-2 and the cl100k pattern on the bundled
// corpus and on random text mixing scripts, digits, emoji, every Unicode space (U+0085
// included) and random code points of the Basic Multilingual Plane.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "data/byte_level.h"
#include "data/pretokenizer.h"
#include "oniguruma_split.h"

using namespace llmtrain;

namespace {

std::vector<std::string> our_pieces(const Pretokenizer& p, const std::string& text) {
    std::vector<std::string> pieces;
    p.split(text, [&](std::string_view piece) { pieces.emplace_back(piece); });
    return pieces;
}

std::vector<std::string> test_lines() {
    std::vector<std::string> lines;
    std::ifstream corpus("data/fortunes.txt", std::ios::binary);
    for (std::string line; std::getline(corpus, line) && lines.size() < 10000;) {
        bool valid = true;
        for (size_t i = 0; i < line.size() && valid;) {
            const size_t n = utf8_sequence_length(line, i);
            valid = n > 0;
            i += n;
        }
        if (valid && !line.empty()) lines.push_back(line);
    }
    const std::vector<std::string> fragments = {
        "the", " The", "it's", "IT'S", "we'Ve", "I'll", "naïve", "Straße", "e\u0301", "Ελληνικά", "Русский", "中文", "日本語", "한국어", "العربية",
        "עברית", "हिन्दी", "ไทย", "🙂", "👍🏽", "👨‍👩‍👧‍👦", "🇩🇪", "42", "1234567", "٣٤٥", "１２３", "½", "Ⅻ", "²", "!?", "...", "—", "«»", "$5",
        "\t", "  ", "\r", "\n", "\u0085", "\u00a0", "\u1680", "\u2000", "\u2007", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000",
        "\u200b", "\ufeff", "\u180e", "ſ", "K", "İ", "ǅ"};
    std::mt19937 gen(2024);
    for (int i = 0; i < 10000; ++i) {
        std::string line;
        const int parts = 1 + static_cast<int>(gen() % 12);
        for (int p = 0; p < parts; ++p) {
            if (gen() % 4 == 0) {
                uint32_t cp;
                do cp = 0x20 + gen() % (0xFFFE - 0x20);
                while (cp >= 0xD800 && cp < 0xE000);
                append_utf8(line, cp);
            } else {
                line += fragments[gen() % fragments.size()];
            }
            if (gen() % 3 == 0) line += ' ';
        }
        lines.push_back(line);
    }
    return lines;
}

void expect_same_pieces(const char* pattern) {
    const OnigurumaSplitter reference(pattern);
    const Pretokenizer ours(pattern);
    const std::vector<std::string> lines = test_lines();
    size_t differing = 0;
    for (const std::string& line : lines) {
        if (our_pieces(ours, line) == reference.split(line)) continue;
        if (++differing <= 5) ADD_FAILURE() << "pieces differ on: " << line;
    }
    EXPECT_EQ(differing, 0u) << "of " << lines.size() << " lines";
    std::printf("%zu of %zu lines split identically\n", lines.size() - differing, lines.size());
}

}  // namespace

TEST(OnigurumaParity, Gpt2PatternSplitsLikeOniguruma) { expect_same_pieces(kGpt2Pattern); }

TEST(OnigurumaParity, Cl100kPatternSplitsLikeOniguruma) { expect_same_pieces(kCl100kPattern); }
