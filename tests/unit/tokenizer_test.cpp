// Byte-level BPE: the byte alphabet, the split patterns, merges by rank, added tokens, the
// file formats, training, and decode(encode(x)) == x for arbitrary bytes.
#include <gtest/gtest.h>

#include "test_paths.h"

#include <fstream>
#include <random>

#include "core/error.h"
#include "data/bpe_trainer.h"
#include "data/byte_level.h"
#include "data/pretokenizer.h"
#include "data/tokenizer.h"

using namespace llmtrain;
using llmtrain::test::write_temp_file;

namespace {

std::vector<std::string> pieces(const Pretokenizer& p, std::string_view text) {
    std::vector<std::string> out;
    p.split(text, [&](std::string_view piece) { out.emplace_back(piece); });
    return out;
}

const Tokenizer& small_tokenizer() {
    static const Tokenizer tokenizer = [] {
        BpeTrainer trainer({400, kGpt2Pattern, {"<|endoftext|>"}, 2});
        for (int i = 0; i < 20; ++i) trainer.add_text("The quick brown fox jumps over the lazy dog. It's 2024! Ünïcödé 日本語 🙂\n");
        return trainer.train("test-tokenizer");
    }();
    return tokenizer;
}

// Tokens a b c ab bc (ids 0..4 after the 256 bytes) with merges (b, c) before (a, b).
TokenizerSpec abc_spec() {
    TokenizerSpec spec;
    for (int b = 0; b < 256; ++b) spec.token_bytes.emplace_back(1, static_cast<char>(b));
    spec.token_bytes.push_back("bc");  // 256
    spec.token_bytes.push_back("ab");  // 257
    spec.merges = {{'b', 'c'}, {'a', 'b'}};
    spec.pattern = kGpt2Pattern;
    return spec;
}

void expect_data_error(const std::function<void()>& fn, const std::string& needle) {
    try {
        fn();
        FAIL() << "expected an error containing '" << needle << "'";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::data);
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

}  // namespace

TEST(ByteLevel, EveryByteMapsToOneCharacterAndBack) {
    std::string all;
    for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
    EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");   // U+0120 'Ġ', as in GPT-2's vocabulary
    EXPECT_EQ(byte_to_unicode('\n'), "\xC4\x8A");  // U+010A 'Ċ'
    EXPECT_EQ(byte_to_unicode('A'), "A");
    EXPECT_EQ(byte_level_to_bytes(bytes_to_byte_level(all)), all);
    EXPECT_FALSE(byte_level_to_bytes("\xE6\x97\xA5"));  // a character outside the map
}

TEST(Pretokenizer, Gpt2PatternSplitsLikeGpt2) {
    const Pretokenizer p(kGpt2Pattern);
    EXPECT_EQ(pieces(p, "Hello world's 123  x\n"), (std::vector<std::string>{"Hello", " world", "'s", " 123", " ", " x", "\n"}));
}

TEST(Pretokenizer, Cl100kPatternGroupsDigitsByThreeAndFoldsContractionCase) {
    const Pretokenizer p(kCl100kPattern);
    EXPECT_EQ(pieces(p, "I'LL pay 1234567"), (std::vector<std::string>{"I", "'LL", " pay", " ", "123", "456", "7"}));
}

TEST(Pretokenizer, WhitespaceIsUnicodeWhiteSpaceAsInOniguruma) {
    const Pretokenizer p(kGpt2Pattern);
    // U+0085 (NEL) is whitespace, so "a" and "," stay apart; U+FEFF and U+180E are not, so they join ",".
    EXPECT_EQ(pieces(p, "a\xC2\x85,"), (std::vector<std::string>{"a", "\xC2\x85", ","}));
    EXPECT_EQ(pieces(p, "a\xEF\xBB\xBF,"), (std::vector<std::string>{"a", "\xEF\xBB\xBF,"}));
    EXPECT_EQ(pieces(p, "a\xE1\xA0\x8E,"), (std::vector<std::string>{"a", "\xE1\xA0\x8E,"}));  // U+180E: not since Unicode 6.3
}

TEST(Pretokenizer, InvalidUtf8BytesBecomeSinglePiecesAndNothingIsLost) {
    const Pretokenizer p(kGpt2Pattern);
    const std::string text = "ab\xFF\xC3 cd\xED\xA0\x80";
    const auto got = pieces(p, text);
    std::string joined;
    for (const auto& s : got) joined += s;
    EXPECT_EQ(joined, text);
    EXPECT_EQ(got[1], "\xFF");
}

TEST(Tokenizer, MergesApplyByRankNotByPosition) {
    const Tokenizer t(abc_spec(), "abc");
    // (b, c) has the lower rank, so "abc" is a + bc although (a, b) comes first in the text.
    EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{'a', 256}));
    EXPECT_EQ(t.encode("abab"), (std::vector<int32_t>{257, 257}));
}

TEST(Tokenizer, DecodeOfEncodeIsIdentityOnRandomBytes) {
    const Tokenizer& t = small_tokenizer();
    std::mt19937 gen(7);
    for (int trial = 0; trial < 300; ++trial) {
        std::string text(gen() % 200, '\0');
        for (char& c : text) c = static_cast<char>(gen() % 4 == 0 ? gen() % 256 : " aeTh'\n9."[gen() % 9]);
        EXPECT_EQ(t.decode(t.encode(text)), text);
    }
}

TEST(Tokenizer, SpecialTokenInTextIsOneId) {
    const Tokenizer& t = small_tokenizer();
    const auto eos = t.end_of_text_id();
    ASSERT_TRUE(eos);
    EXPECT_EQ(*eos, t.vocab_size() - 1);  // special tokens take the last ids
    const auto ids = t.encode("fox<|endoftext|>dog");
    EXPECT_EQ(std::count(ids.begin(), ids.end(), *eos), 1);
    EXPECT_EQ(t.decode(ids), "fox<|endoftext|>dog");
}

TEST(Tokenizer, CacheDoesNotChangeIds) {
    const Tokenizer& t = small_tokenizer();
    EncodeCache cache;
    const std::string text = "The the the quick quick lazy dog dog. It's";
    EXPECT_EQ(t.encode(text, &cache), t.encode(text));
    EXPECT_EQ(t.encode(text, &cache), t.encode(text));
}

TEST(Tokenizer, SavedJsonLoadsBackWithTheSameIdsAndHash) {
    const Tokenizer& t = small_tokenizer();
    const Tokenizer back = Tokenizer::from_hf_json(t.to_hf_json(), "saved.json");
    const std::string text = "The lazy fox's 2024 Ünïcödé <|endoftext|> 🙂";
    EXPECT_EQ(back.encode(text), t.encode(text));
    EXPECT_EQ(back.hash(), t.hash());
}

TEST(Tokenizer, MergesAsPairsReadLikeMergesAsStrings) {
    const Tokenizer& t = small_tokenizer();
    std::string json = t.to_hf_json();
    // Rewrite "a b" merge strings as ["a", "b"] pairs, the newer tokenizers format.
    const size_t start = json.find("\"merges\"");
    std::string merges = json.substr(start);
    std::string pairs;
    for (size_t i = 0; i < merges.size(); ++i) {
        if (merges[i] == '"' && i > 10 && merges.compare(i - 1, 1, " ") == 0 && merges[i + 1] != 'm') {
            const size_t end = merges.find('"', i + 1);
            const std::string body = merges.substr(i + 1, end - i - 1);
            const size_t space = body.find(' ');
            pairs += "[\"" + body.substr(0, space) + "\", \"" + body.substr(space + 1) + "\"]";
            i = end;
        } else {
            pairs += merges[i];
        }
    }
    const Tokenizer back = Tokenizer::from_hf_json(json.substr(0, start) + pairs, "pairs.json");
    EXPECT_EQ(back.spec().merges, t.spec().merges);
}

TEST(Tokenizer, Gpt2EncoderAndVocabFilesLoad) {
    const Tokenizer& t = small_tokenizer();
    std::string encoder = "{";
    for (size_t id = 0; id < t.spec().token_bytes.size(); ++id) {
        const std::string& bytes = t.spec().token_bytes[id];
        const std::string name = static_cast<int64_t>(id) == t.vocab_size() - 1 ? bytes : bytes_to_byte_level(bytes);
        std::string escaped;
        for (char c : name) escaped += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
        encoder += (id ? "," : "") + std::string("\"") + escaped + "\":" + std::to_string(id);
    }
    encoder += "}";
    std::string vocab = "#version: 0.2\n";
    for (const auto& [l, r] : t.spec().merges)
        vocab += bytes_to_byte_level(t.spec().token_bytes[static_cast<size_t>(l)]) + " " + bytes_to_byte_level(t.spec().token_bytes[static_cast<size_t>(r)]) + "\n";
    const Tokenizer gpt2 = Tokenizer::from_gpt2_files(write_temp_file("encoder.json", encoder), write_temp_file("vocab.bpe", vocab));
    const std::string text = "It's the quick brown fox.<|endoftext|>";
    EXPECT_EQ(gpt2.encode(text), t.encode(text));
    EXPECT_EQ(gpt2.end_of_text_id(), t.end_of_text_id());
}

TEST(Tokenizer, OtherModelTypeIsRefusedNamingTheFile) {
    expect_data_error([] { Tokenizer::from_hf_json(R"({"model": {"type": "WordPiece", "vocab": {}}})", "bert/tokenizer.json"); },
                      "bert/tokenizer.json: model.type is \"WordPiece\"");
    expect_data_error([] { Tokenizer::from_hf_json("{not json", "broken.json"); }, "broken.json: not valid JSON");
    expect_data_error([] { Tokenizer::from_hf_json(R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "ByteLevel"}})", "qwen.json"); },
                      "qwen.json: normalizer \"NFC\"");
}

TEST(Tokenizer, VocabularyWithoutEveryByteIsRefused) {
    TokenizerSpec spec = abc_spec();
    spec.token_bytes[7] = "";
    expect_data_error([&] { Tokenizer(spec, "holes.json"); }, "holes.json: the vocabulary has no token for byte 0x7");
}

TEST(Tokenizer, DecodeOfUnknownIdNamesItsPosition) {
    const Tokenizer& t = small_tokenizer();
    expect_data_error([&] { t.decode(std::vector<int32_t>{1, 2, 4000}); }, "token id 4000 at position 2");
}

TEST(BpeTrainer, FirstMergeIsTheMostFrequentPairAndTrainingIsDeterministic) {
    BpeTrainer trainer({260, kGpt2Pattern, {}, 2});
    trainer.add_text("aaab aab xyz aab");
    const Tokenizer a = trainer.train("a"), b = trainer.train("b");
    ASSERT_FALSE(a.spec().merges.empty());
    EXPECT_EQ(a.spec().merges[0], (std::pair<int32_t, int32_t>{'a', 'a'}));
    EXPECT_EQ(a.to_hf_json(), b.to_hf_json());
}
