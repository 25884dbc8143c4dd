// Token sources and batch windows.
#include <gtest/gtest.h>

#include "test_paths.h"

#include <fstream>

#include "data/batch_windows.h"
#include "data/token_source.h"

using namespace llmtrain;
using llmtrain::test::write_temp_file;

TEST(TokenSource, SeparatorBecomesEosAndBytesKeepTheirValues) {
    const std::vector<int32_t> ids = bytes_to_tokens("ab\n%\n\xc3\xa9", "\n%\n");
    EXPECT_EQ(ids, (std::vector<int32_t>{'a', 'b', byte_eos_token, 0xc3, 0xa9}));
}

TEST(TokenSource, HoldsOutTheLastFractionForValidation) {
    DataConfig d;
    d.train_path = write_temp_file("split.txt", std::string(100, 'x'));
    d.val_fraction = 0.2;
    const TokenSplits s = load_token_splits(d, byte_vocab_size, 8);
    EXPECT_EQ(s.train.size(), 80u);
    EXPECT_EQ(s.val.size(), 20u);
}

TEST(TokenSource, TokenIdOutsideVocabulary_NamesFileAndOffset) {
    DataConfig d;
    d.format = DataFormat::tokens;
    d.token_dtype = "u16";
    std::string bytes(40, '\0');
    bytes[2 * 7] = 100;  // token 7 = 100
    d.train_path = write_temp_file("ids.bin", bytes);
    d.val_fraction = 0.1;
    try {
        load_token_splits(d, 50, 4);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::data);
        EXPECT_NE(std::string(e.what()).find("ids.bin"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("token offset 7"), std::string::npos) << e.what();
    }
}

TEST(TokenSource, OddByteCountForU16_IsRejected) {
    DataConfig d;
    d.format = DataFormat::tokens;
    d.train_path = write_temp_file("odd.bin", std::string(41, '\0'));
    EXPECT_THROW(load_token_splits(d, 50, 4), Error);
}

TEST(TokenSource, EmptyFileOrTooShortSplit_IsRejected) {
    DataConfig d;
    d.train_path = write_temp_file("empty.txt", "");
    EXPECT_THROW(load_token_splits(d, byte_vocab_size, 4), Error);
    d.train_path = write_temp_file("short.txt", std::string(40, 'y'));
    d.val_fraction = 0.05;  // 2 validation tokens < seq_len + 1
    EXPECT_THROW(load_token_splits(d, byte_vocab_size, 4), Error);
}

TEST(BatchWindows, TargetsAreInputsShiftedByOne) {
    std::vector<int32_t> tokens(1000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i);
    BatchBuffers b(3, 16);
    fill_train_batch(b, tokens, 7, 5, 0, 1, 3, 16);
    for (int64_t row = 0; row < 3; ++row)
        for (int64_t t = 0; t < 16; ++t) {
            const int32_t in = b.inputs.data<int32_t>()[row * 16 + t];
            EXPECT_EQ(b.targets.data<int32_t>()[row * 16 + t], in + 1);
            if (t > 0) {
                EXPECT_EQ(in, b.inputs.data<int32_t>()[row * 16 + t - 1] + 1);
            }
        }
}

TEST(BatchWindows, TrainWindowsDependOnlyOnSeedStepAndPosition) {
    std::vector<int32_t> tokens(5000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i);
    BatchBuffers a(2, 8), b(2, 8), c(2, 8);
    fill_train_batch(a, tokens, 1, 3, 1, 2, 2, 8);
    fill_train_batch(b, tokens, 1, 3, 1, 2, 2, 8);
    fill_train_batch(c, tokens, 1, 4, 1, 2, 2, 8);
    EXPECT_EQ(0, std::memcmp(a.inputs.data<int32_t>(), b.inputs.data<int32_t>(), 16 * 4));
    EXPECT_NE(0, std::memcmp(a.inputs.data<int32_t>(), c.inputs.data<int32_t>(), 16 * 4));
}

TEST(BatchWindows, EvalWindowsAreConsecutiveAndWrap) {
    std::vector<int32_t> tokens(40);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i);
    BatchBuffers b(2, 8);
    fill_eval_batch(b, tokens, 0, 2, 8);
    EXPECT_EQ(b.inputs.data<int32_t>()[0], 0);
    EXPECT_EQ(b.inputs.data<int32_t>()[8], 8);
    fill_eval_batch(b, tokens, 4, 2, 8);  // windows 4, 5 start at 32 % 32 = 0 and 40 % 32 = 8
    EXPECT_EQ(b.inputs.data<int32_t>()[0], 0);
    EXPECT_EQ(b.inputs.data<int32_t>()[8], 8);
}
