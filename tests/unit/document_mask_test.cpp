// Packed documents (data.attention_mask = "document", data.reset_position_ids = true): a
// document's tokens compute the same logits, loss and parameter gradients wherever it sits in
// a sequence, as if it were alone. Each check isolates document B's share of a run over the
// sequence [A, B] (support/document_pair.h). With the mask off B attends to A and sits at
// positions la.., and the identity fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <cmath>
#include <vector>

#include "test_paths.h"

#include "backend/backend.h"
#include "data/batch_source.h"
#include "data/byte_level.h"
#include "data/token_source.h"
#include "model/transformer.h"
#include "support/document_pair.h"

using namespace llmtrain;

namespace {

using namespace llmtrain::test::document_pair;

Isolation isolate_document_b(ModelFamily family, bool mask, bool reset) {
    auto backend = make_cpu_backend(1);
    const ModelConfig config = tiny(family);
    Transformer model(config, *backend, DType::f64, 1, config.max_seq_len, documents(mask, reset));
    model.initialize(7);
    const RunResult both = run(model, joined(kDocA, kDocB), joined(kTargetsA, kTargetsB));
    const RunResult a = run(model, kDocA, kTargetsA);
    const RunResult b = run(model, kDocB, kTargetsB);
    Isolation out = share_of_b(both, a, b);
    for (size_t row = 0; row < kDocB.size(); ++row)
        for (size_t v = 0; v < b.logits[row].size(); ++v)
            out.logits_error = std::max(out.logits_error, relative(both.logits[kDocA.size() + row][v], b.logits[row][v]));
    return out;
}

void expect_document_isolated(ModelFamily family) {
    const Isolation masked = isolate_document_b(family, true, true);
    EXPECT_LT(masked.logits_error, 1e-12);
    EXPECT_LT(masked.loss_error, 1e-12);
    EXPECT_LT(masked.grad_error, 1e-10);
    // Causal over the whole sequence: B sees A, its logits, loss and gradients move.
    const Isolation causal = isolate_document_b(family, false, false);
    EXPECT_GT(causal.logits_error, 1e-3);
    EXPECT_GT(causal.loss_error, 1e-4);
    EXPECT_GT(causal.grad_error, 1e-3);
    // The mask alone: B sees only itself, at positions la... GPT-2's learned positions make its
    // logits differ from B alone at 0; rotary scores depend on q and k positions only through
    // their difference, so Llama's agree up to rounding.
    const Isolation mask_only = isolate_document_b(family, true, false);
    if (family == ModelFamily::gpt2) EXPECT_GT(mask_only.logits_error, 1e-3);
    else EXPECT_LT(mask_only.logits_error, 1e-9);
}

}  // namespace

TEST(DocumentMask, StartsFollowMegatronsConventionEndOfTextIsTheLastTokenOfItsDocument) {
    // Two sequences of 6: the token after an end-of-text token starts a new document; an
    // end-of-text token at the last position starts nothing; each sequence starts at 0.
    const std::vector<int32_t> tokens = {1, kEnd, 2, 2, kEnd, 4, /* next sequence */ kEnd, kEnd, 5, 6, 7, kEnd};
    const std::vector<int32_t> starts = document_starts(tokens.data(), 2, 6, kEnd);
    EXPECT_EQ(starts, (std::vector<int32_t>{0, 0, 2, 2, 2, 5, 0, 1, 2, 2, 2, 2}));
}

TEST(DocumentMask, Gpt2DocumentAfterAnother_HasTheLogitsLossAndGradientsOfItAlone) { expect_document_isolated(ModelFamily::gpt2); }

TEST(DocumentMask, LlamaGqaDocumentAfterAnother_HasTheLogitsLossAndGradientsOfItAlone) { expect_document_isolated(ModelFamily::llama); }

TEST(DocumentMask, WithoutTheEndOfTextTokenInTheSequence_IsBitwiseTheCausalModel) {
    // No boundary: the document starts are all zero, and every op takes the causal path.
    auto backend = make_cpu_backend(1);
    const ModelConfig config = tiny(ModelFamily::llama);
    Transformer masked(config, *backend, DType::f64, 1, config.max_seq_len, documents(true, true));
    Transformer causal(config, *backend, DType::f64, 1, config.max_seq_len);
    masked.initialize(7);
    causal.initialize(7);
    const RunResult m = run(masked, kDocB, kTargetsB), c = run(causal, kDocB, kTargetsB);
    EXPECT_EQ(m.weighted_loss, c.weighted_loss);
    EXPECT_EQ(m.logits, c.logits);
    EXPECT_EQ(m.weighted_grads, c.weighted_grads);
}

TEST(DocumentMask, PartitionWithoutAnEndOfTextToken_IsAConfigErrorNamingTheKey) {
    auto backend = make_cpu_backend(1);
    ModelPartition part;
    part.document_mask = true;
    try {
        Transformer model(tiny(ModelFamily::gpt2), *backend, DType::f32, 1, 4, part);
        FAIL() << "a document mask without an end-of-text token was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_NE(std::string(e.what()).find("data.attention_mask"), std::string::npos) << e.what();
    }
}

// The end-of-text id comes from the data: the byte vocabulary's for text, else the run's
// tokenizer's; a tokenizer without one is refused naming the key that needs it.
TEST(DocumentMask, EndOfTextToken_IsTheBytesOrTheTokenizersAndRefusedWithoutOne) {
    Config config;
    config.data.format = DataFormat::text;
    config.data.attention_mask = AttentionMask::document;
    EXPECT_EQ(document_end_token(config), byte_eos_token);

    // A byte-level BPE of the 256 bytes and no merges, with and without <|endoftext|> (id 256).
    std::string vocab;
    for (int b = 0; b < 256; ++b) {
        std::string name = byte_to_unicode(static_cast<uint8_t>(b));
        if (name == "\"" || name == "\\") name = "\\" + name;
        vocab += (b ? ", \"" : "\"") + name + "\": " + std::to_string(b);
    }
    const std::string bpe = R"("model": {"type": "BPE", "vocab": {)" + vocab + R"(}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"})";
    config.data.format = DataFormat::tokens;
    config.data.tokenizer = llmtrain::test::write_temp_file("document_mask_eot.json",
        "{" + bpe + R"(, "added_tokens": [{"id": 256, "content": "<|endoftext|>", "special": true}]})");
    EXPECT_EQ(document_end_token(config), 256);

    config.data.tokenizer = llmtrain::test::write_temp_file("document_mask_no_eot.json", "{" + bpe + "}");
    config.data.attention_mask = AttentionMask::causal;
    config.data.reset_position_ids = true;
    try {
        document_end_token(config);
        FAIL() << "a tokenizer without an end-of-text token was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_NE(std::string(e.what()).find("data.reset_position_ids: the tokenizer"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("has no end-of-text token"), std::string::npos) << e.what();
    }
}
