// The specialised split matchers (GPT-2, cl100k / Llama 3, Qwen2) against PCRE2 running the
// same pattern: the same pieces on random text built to hit every alternative and its edges
// (contractions in any case and the long s, every Unicode space, line breaks in runs, digits
// of other scripts, combining marks, emoji, invalid bytes), on every code point after an
// apostrophe and between letters; and BPE over small arrays against the textbook loop.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "data/bpe_trainer.h"
#include "data/byte_level.h"
#include "data/pretokenizer.h"
#include "data/tokenizer.h"
#include "data/unicode_classes.h"

using namespace llmtrain;

namespace {

std::vector<std::string> pieces_of(const Pretokenizer& p, std::string_view text) {
    std::vector<std::string> out;
    p.split(text, [&](std::string_view piece) { out.emplace_back(piece); });
    return out;
}

std::string utf8(uint32_t cp) {
    std::string s;
    append_utf8(s, cp);
    return s;
}

// Fragments chosen for the patterns' alternatives; random code points fill in the rest.
const std::vector<std::string>& fragments() {
    static const std::vector<std::string> list = {
        "'", "'s", "'S", "'t", "'T", "'re", "'RE", "'rE", "'ve", "'Ve", "'m", "'M", "'ll", "'lL", "'d", "'D", "'\u017f", "'\u212a", "'x", "''",
        " ", "  ", "   ", "\t", "\n", "\r", "\r\n", "\n\n", " \n", "\n ", "\v", "\f", "\u0085", "\u00a0", "\u1680", "\u2000", "\u200a", "\u2028",
        "\u2029", "\u202f", "\u205f", "\u3000", "\u180e", "\u200b", "\ufeff", "a", "Z", "word", "Word", "é", "e\u0301", "ß", "Ελληνικά", "中文",
        "日本語", "한국어", "العربية", "हिन्दी", "0", "7", "42", "123", "1234", "12345", "٣٤٥", "１２３", "½", "Ⅻ", "²", "!", "?!", "...", ",",
        ".", "-", "(", ")", "$", "€", "—", "🙂", "👍🏽", "👨‍👩‍👧", "🇩🇪", "\xff", "\x80", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82",
        "\x00", "\x1b", "_", "@", "#", "\\", "\"", "<|endoftext|>",
    };
    return list;
}

std::string random_text(std::mt19937& gen) {
    std::string text;
    const int parts = 1 + static_cast<int>(gen() % 16);
    for (int p = 0; p < parts; ++p) {
        const uint32_t pick = gen() % 8;
        if (pick == 0) {
            uint32_t cp;
            do cp = gen() % 0x110000;
            while (cp >= 0xD800 && cp < 0xE000);
            text += utf8(cp);
        } else if (pick == 1) {
            text += utf8(0x80 + gen() % (0x3000 - 0x80));  // the dense part of the BMP: scripts, marks, symbols, spaces
        } else {
            text += fragments()[gen() % fragments().size()];
        }
    }
    return text;
}

void expect_matcher_equals_pcre2(const char* pattern, const char* name) {
    const Pretokenizer fast(pattern, SplitEngine::fastest), reference(pattern, SplitEngine::pcre2);
    ASSERT_STREQ(fast.engine_name(), name);
    ASSERT_STREQ(reference.engine_name(), "pcre2");
    std::mt19937 gen(20260);
    size_t differing = 0;
    constexpr int kTexts = 40000;
    for (int i = 0; i < kTexts; ++i) {
        const std::string text = random_text(gen);
        if (pieces_of(fast, text) == pieces_of(reference, text)) continue;
        if (++differing <= 5) ADD_FAILURE() << name << " differs from PCRE2 on " << ::testing::PrintToString(text);
    }
    EXPECT_EQ(differing, 0u) << "of " << kTexts << " texts";
}

// Every code point after an apostrophe, after an apostrophe and a contraction's first
// letter, and between letters and spaces: the contractions' case folding and the classes.
void expect_every_code_point_splits_like_pcre2(const char* pattern) {
    const Pretokenizer fast(pattern, SplitEngine::fastest), reference(pattern, SplitEngine::pcre2);
    size_t differing = 0;
    for (uint32_t cp = 1; cp < 0x110000; ++cp) {
        if (cp >= 0xD800 && cp < 0xE000) continue;
        const std::string c = utf8(cp);
        for (const std::string& text : {"'" + c, "'r" + c, "'" + c + "e", "a" + c + "1", " " + c + "\n"}) {
            if (pieces_of(fast, text) == pieces_of(reference, text)) continue;
            if (++differing <= 5) ADD_FAILURE() << "differs from PCRE2 on " << ::testing::PrintToString(text) << " (U+" << std::hex << cp << ")";
        }
    }
    EXPECT_EQ(differing, 0u);
}

}  // namespace

TEST(SplitMatchers, KnownPatternsGetTheirMatcherAndOthersRunOnPcre2) {
    EXPECT_STREQ(Pretokenizer(kGpt2Pattern).engine_name(), "gpt2");
    EXPECT_STREQ(Pretokenizer(kCl100kPattern).engine_name(), "cl100k");
    EXPECT_STREQ(Pretokenizer(kQwen2Pattern).engine_name(), "qwen2");
    EXPECT_STREQ(Pretokenizer(R"(\p{L}+|\s+|.)").engine_name(), "pcre2");
}

TEST(SplitMatchers, Gpt2MatcherSplitsLikePcre2OnRandomUnicodeText) { expect_matcher_equals_pcre2(kGpt2Pattern, "gpt2"); }
TEST(SplitMatchers, Cl100kMatcherSplitsLikePcre2OnRandomUnicodeText) { expect_matcher_equals_pcre2(kCl100kPattern, "cl100k"); }
TEST(SplitMatchers, Qwen2MatcherSplitsLikePcre2OnRandomUnicodeText) { expect_matcher_equals_pcre2(kQwen2Pattern, "qwen2"); }

TEST(SplitMatchers, Gpt2MatcherSplitsLikePcre2AroundEveryCodePoint) { expect_every_code_point_splits_like_pcre2(kGpt2Pattern); }
TEST(SplitMatchers, Cl100kMatcherSplitsLikePcre2AroundEveryCodePoint) { expect_every_code_point_splits_like_pcre2(kCl100kPattern); }

TEST(SplitMatchers, CharClassesOfKnownCodePoints) {
    EXPECT_EQ(char_class('a'), CharClass::letter);
    EXPECT_EQ(char_class(0x4E2D), CharClass::letter);   // 中
    EXPECT_EQ(char_class(0x0663), CharClass::number);   // Arabic-Indic three
    EXPECT_EQ(char_class(0x216B), CharClass::number);   // Roman numeral twelve (Nl)
    EXPECT_EQ(char_class(0x00BD), CharClass::number);   // ½ (No)
    EXPECT_EQ(char_class(0x0085), CharClass::space);
    EXPECT_EQ(char_class(0x3000), CharClass::space);
    EXPECT_EQ(char_class(0x180E), CharClass::other);   // not White_Space since Unicode 6.3
    EXPECT_EQ(char_class(0xFEFF), CharClass::other);
    EXPECT_EQ(char_class(0x0301), CharClass::other);   // a combining mark
    EXPECT_EQ(char_class(0x1F642), CharClass::other);  // 🙂
}

namespace {

// The textbook BPE: merge the lowest-ranked adjacent pair (leftmost among equals) until none
// is in the merge list.
std::vector<int32_t> textbook_bpe(const Tokenizer& t, std::string_view piece) {
    std::map<std::pair<int32_t, int32_t>, size_t> rank;
    std::map<std::string, int32_t> id_of;
    const TokenizerSpec& spec = t.spec();
    for (size_t r = 0; r < spec.merges.size(); ++r) rank[spec.merges[r]] = r;
    for (size_t id = 0; id < spec.token_bytes.size(); ++id) id_of.emplace(spec.token_bytes[id], static_cast<int32_t>(id));
    std::vector<int32_t> ids;
    for (char c : piece) ids.push_back(id_of.at(std::string(1, c)));
    for (;;) {
        size_t best = SIZE_MAX, best_rank = SIZE_MAX;
        for (size_t i = 0; i + 1 < ids.size(); ++i) {
            const auto it = rank.find({ids[i], ids[i + 1]});
            if (it != rank.end() && it->second < best_rank) { best = i; best_rank = it->second; }
        }
        if (best == SIZE_MAX) return ids;
        ids[best] = id_of.at(spec.token_bytes[static_cast<size_t>(ids[best])] + spec.token_bytes[static_cast<size_t>(ids[best + 1])]);
        ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
}

}  // namespace

TEST(Tokenizer, BpeOverSmallArraysAndOverTheHeapEqualTheTextbookLoop) {
    BpeTrainer trainer({700, kGpt2Pattern, {"<|endoftext|>"}, 2});
    std::string corpus;
    for (int i = 0; i < 50; ++i) corpus += "aaaa abab abcabc the theme thesis ====---- ++++++++ lalalala banana bandana ";
    trainer.add_text(corpus);
    const Tokenizer t = trainer.train("bpe-test");
    std::mt19937 gen(7);
    const std::string alphabet = "abcdehlmnst=+- ";
    for (int i = 0; i < 3000; ++i) {
        std::string piece(1 + gen() % 300, ' ');  // short pieces use the arrays, those over 96 bytes the heap
        for (char& c : piece) c = alphabet[gen() % alphabet.size()];
        std::vector<int32_t> ids;
        t.encode_piece(piece, ids);
        ASSERT_EQ(ids, textbook_bpe(t, piece)) << piece;
    }
}

TEST(Tokenizer, FastestAndPcre2SplitEnginesGiveTheSameIds) {
    BpeTrainer trainer({600, kCl100kPattern, {"<|endoftext|>"}, 2});
    std::mt19937 gen(11);
    std::string corpus;
    for (int i = 0; i < 3000; ++i) corpus += random_text(gen);
    trainer.add_text(corpus);
    Tokenizer fast = trainer.train("engines-test");
    Tokenizer reference = fast;
    reference.use_split_engine(SplitEngine::pcre2);
    for (int i = 0; i < 5000; ++i) {
        const std::string text = random_text(gen);
        ASSERT_EQ(fast.encode(text), reference.encode(text)) << ::testing::PrintToString(text);
    }
}
