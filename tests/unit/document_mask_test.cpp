// Packed documents (data.attention_mask = "document", data.reset_position_ids = true): a
// document's tokens compute the same logits, loss and parameter gradients wherever it sits in
// a sequence, as if it were alone. Each check isolates document B's share of a run over the
// sequence [A, B]: the mean loss over T tokens is (la mean_A + lb mean_B) / T, so
//   T * run([A, B]) - la * run([A] alone) = lb * run([B] alone)
// for the loss and for every parameter gradient when A and B do not see each other. With the
// mask off B attends to A and sits at positions la.., and the identity fails.
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

using namespace llmtrain;

namespace {

constexpr int32_t kEnd = 3;  // the end-of-text id of these tests

ModelConfig tiny(ModelFamily family) {
    ModelConfig m;
    m.family = family;
    m.n_layers = 2;
    m.d_model = 16;
    m.n_heads = 4;
    m.n_kv_heads = family == ModelFamily::llama ? 2 : 4;
    m.d_ff = 12;
    m.vocab_size = 13;
    m.max_seq_len = 12;
    m.rope_theta = 100.0;
    m.tied_embeddings = family == ModelFamily::gpt2;
    m.init_std = 0.3;
    return m;
}

// Document A ends with the end-of-text token (its last token); B follows it.
const std::vector<int32_t> kDocA = {5, 9, 1, 7, kEnd};
const std::vector<int32_t> kDocB = {4, 4, 11, 2, 8, 6, 10};
// Each token's target: the next token of its own document, or an arbitrary id at the end.
const std::vector<int32_t> kTargetsA = {9, 1, 7, kEnd, 12};
const std::vector<int32_t> kTargetsB = {4, 11, 2, 8, 6, 10, 0};

std::vector<int32_t> joined(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    std::vector<int32_t> out = a;
    out.insert(out.end(), b.begin(), b.end());
    return out;
}

// One run of the model over one sequence: its mean loss, its parameter gradients (scaled by
// `weight`, the sequence's token count, to undo the mean) and the logits of each row.
struct RunResult {
    double weighted_loss = 0;
    std::vector<std::vector<double>> weighted_grads;
    std::vector<std::vector<double>> logits;
};

RunResult run(Transformer& model, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
    const auto T = static_cast<int64_t>(tokens.size());
    OwnedTensor tok(DType::i32, {T}), tgt(DType::i32, {T});
    std::copy(tokens.begin(), tokens.end(), tok.data<int32_t>());
    std::copy(targets.begin(), targets.end(), tgt.data<int32_t>());
    Parameters& p = model.parameters();
    model.backend().fill_zero(p.all_grads());
    RunResult r;
    r.weighted_loss = static_cast<double>(T) * model.forward(tok.view(), tgt.view(), 1, T);
    for (int64_t row = 0; row < T; ++row) r.logits.push_back(model.logits_row(row));
    model.backward(1.0);
    for (size_t i = 0; i < p.count(); ++i) {
        const double* g = p.grad(i).data<double>();
        std::vector<double> scaled(g, g + p.grad(i).numel());
        for (double& x : scaled) x *= static_cast<double>(T);
        r.weighted_grads.push_back(std::move(scaled));
    }
    return r;
}

ModelPartition documents(bool mask, bool reset) {
    ModelPartition part;
    part.document_mask = mask;
    part.reset_position_ids = reset;
    part.document_end_token = kEnd;
    return part;
}

// The largest relative difference between B alone and B's share of [A, B] (loss and every
// gradient element), and whether B's logits in [A, B] equal those of B alone within `tol`.
struct Isolation {
    double loss_error = 0, grad_error = 0, logits_error = 0;
};

Isolation isolate_document_b(ModelFamily family, bool mask, bool reset) {
    auto backend = make_cpu_backend(1);
    const ModelConfig config = tiny(family);
    Transformer model(config, *backend, DType::f64, 1, config.max_seq_len, documents(mask, reset));
    model.initialize(7);
    const RunResult both = run(model, joined(kDocA, kDocB), joined(kTargetsA, kTargetsB));
    const RunResult a = run(model, kDocA, kTargetsA);
    const RunResult b = run(model, kDocB, kTargetsB);
    Isolation out;
    const auto relative = [](double x, double y) { return std::abs(x - y) / std::max({std::abs(x), std::abs(y), 1e-6}); };
    out.loss_error = relative(both.weighted_loss - a.weighted_loss, b.weighted_loss);
    for (size_t i = 0; i < b.weighted_grads.size(); ++i) {
        double scale = 1e-6;
        for (double g : b.weighted_grads[i]) scale = std::max(scale, std::abs(g));
        for (size_t k = 0; k < b.weighted_grads[i].size(); ++k) {
            const double share = both.weighted_grads[i][k] - a.weighted_grads[i][k];
            out.grad_error = std::max(out.grad_error, std::abs(share - b.weighted_grads[i][k]) / scale);
        }
    }
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
