// The transformer: whole-model gradients against central finite differences in double
// precision, parameter names and shapes, layout-independent initialization, f32 vs f64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/generate.h"
#include "model/transformer.h"
#include "support/model_gradients.h"

using namespace llmtrain;

namespace {

ModelConfig tiny_gpt2() {
    ModelConfig m;
    m.family = ModelFamily::gpt2;
    m.n_layers = 2;
    m.d_model = 8;
    m.n_heads = 2;
    m.n_kv_heads = 2;
    m.d_ff = 12;
    m.vocab_size = 11;
    m.max_seq_len = 6;
    m.tied_embeddings = true;
    m.init_std = 0.3;  // large enough that every gradient is well above rounding noise
    return m;
}

ModelConfig tiny_llama() {
    ModelConfig m;
    m.family = ModelFamily::llama;
    m.n_layers = 2;
    m.d_model = 16;
    m.n_heads = 4;
    m.n_kv_heads = 2;  // grouped-query attention
    m.d_ff = 10;
    m.vocab_size = 13;
    m.max_seq_len = 7;
    m.rope_theta = 100.0;
    m.qkv_bias = true;
    m.tied_embeddings = false;
    m.init_std = 0.3;
    return m;
}

using Batch = test::TokenBatch;

void expect_model_gradients_match_finite_differences(const ModelConfig& config) { test::expect_gradients_match_finite_differences(config); }

}  // namespace

TEST(Transformer, Gpt2Gradients_MatchFiniteDifferences) { expect_model_gradients_match_finite_differences(tiny_gpt2()); }

TEST(Transformer, LlamaGqaGradients_MatchFiniteDifferences) { expect_model_gradients_match_finite_differences(tiny_llama()); }

TEST(Transformer, LlamaTiedEmbeddingGradients_MatchFiniteDifferences) {
    ModelConfig m = tiny_llama();
    m.tied_embeddings = true;
    m.qkv_bias = false;
    m.n_kv_heads = 1;  // multi-query attention
    expect_model_gradients_match_finite_differences(m);
}

TEST(Transformer, ParameterNamesFollowHuggingFace) {
    auto backend = make_cpu_backend(1);
    Transformer gpt2(tiny_gpt2(), *backend, DType::f32, 1, 4);
    const Parameters& g = gpt2.parameters();
    EXPECT_EQ(g.info(g.index_of("transformer.h.1.attn.c_attn.weight")).shape, (Shape{24, 8}));
    EXPECT_EQ(g.info(g.index_of("transformer.wpe.weight")).shape, (Shape{6, 8}));
    EXPECT_THROW(g.index_of("lm_head.weight"), Error);  // tied to transformer.wte.weight

    Transformer llama(tiny_llama(), *backend, DType::f32, 1, 4);
    const Parameters& l = llama.parameters();
    EXPECT_EQ(l.info(l.index_of("model.layers.1.self_attn.k_proj.weight")).shape, (Shape{8, 16}));
    EXPECT_EQ(l.info(l.index_of("model.layers.0.self_attn.q_proj.bias")).shape, (Shape{16}));
    EXPECT_EQ(l.info(l.index_of("model.layers.0.mlp.gate_proj.weight")).shape, (Shape{10, 16}));
    EXPECT_EQ(l.info(l.index_of("lm_head.weight")).shape, (Shape{13, 16}));
    EXPECT_FALSE(l.info(l.index_of("model.norm.weight")).weight_decay);
    EXPECT_TRUE(l.info(l.index_of("model.layers.0.mlp.down_proj.weight")).weight_decay);
}

// The registration order is the flat buffer's layout, which checkpoints, ZeRO's shards and the
// initial weights follow: each layer's parts (norm, attention, norm, MLP) register their
// parameters in this order, with these tensor-parallel splits, whatever parts a model takes.
namespace {
std::vector<std::string> registered(const ModelConfig& config) {
    auto backend = make_cpu_backend(1);
    const Transformer model(config, *backend, DType::f32, 1, 4);
    std::vector<std::string> out;
    for (const ParamInfo& p : model.parameters().infos()) {
        const char* split = p.split.kind == TpSplit::rows ? " rows" : p.split.kind == TpSplit::cols ? " cols" : "";
        out.push_back(cat(p.name, split, p.split.blocks > 1 ? cat("/", p.split.blocks) : std::string()));
    }
    return out;
}

std::vector<std::string> per_layer(const std::string& prefix, int64_t layers, const std::vector<std::string>& names) {
    std::vector<std::string> out;
    for (int64_t l = 0; l < layers; ++l)
        for (const std::string& name : names) out.push_back(cat(prefix, l, '.', name));
    return out;
}
}  // namespace

TEST(Transformer, LayerPartsRegisterInHuggingFaceOrder_Gpt2AndQwen2) {
    std::vector<std::string> gpt2 = {"transformer.wte.weight rows", "transformer.wpe.weight"};
    for (const std::string& name : per_layer("transformer.h.", 2, {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight rows/3", "attn.c_attn.bias rows/3",
                                                                   "attn.c_proj.weight cols", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                                                   "mlp.c_fc.weight rows", "mlp.c_fc.bias rows", "mlp.c_proj.weight cols", "mlp.c_proj.bias"}))
        gpt2.push_back(name);
    gpt2.insert(gpt2.end(), {"transformer.ln_f.weight", "transformer.ln_f.bias"});
    EXPECT_EQ(registered(tiny_gpt2()), gpt2);

    ModelConfig qwen2 = tiny_llama();
    qwen2.qkv_bias = true;
    qwen2.tied_embeddings = false;
    std::vector<std::string> llama = {"model.embed_tokens.weight rows"};
    for (const std::string& name :
         per_layer("model.layers.", 2, {"input_layernorm.weight", "self_attn.q_proj.weight rows", "self_attn.k_proj.weight rows", "self_attn.v_proj.weight rows",
                                        "self_attn.q_proj.bias rows", "self_attn.k_proj.bias rows", "self_attn.v_proj.bias rows", "self_attn.o_proj.weight cols",
                                        "post_attention_layernorm.weight", "mlp.gate_proj.weight rows", "mlp.up_proj.weight rows", "mlp.down_proj.weight cols"}))
        llama.push_back(name);
    llama.insert(llama.end(), {"model.norm.weight", "lm_head.weight rows"});
    EXPECT_EQ(registered(qwen2), llama);
}

TEST(Transformer, InitializationDependsOnlyOnSeedAndName) {
    // Another depth and an extra bias change every parameter's position in the flat
    // buffer, not its initial values.
    ModelConfig other = tiny_llama();
    other.n_layers = 3;
    other.qkv_bias = false;
    auto backend = make_cpu_backend(1);
    Transformer a(tiny_llama(), *backend, DType::f32, 1, 4), b(other, *backend, DType::f32, 1, 4);
    a.initialize(9);
    b.initialize(9);
    for (const char* name : {"model.layers.0.self_attn.v_proj.weight", "model.layers.1.mlp.up_proj.weight", "model.embed_tokens.weight"}) {
        const Tensor va = a.parameters().value(a.parameters().index_of(name));
        const Tensor vb = b.parameters().value(b.parameters().index_of(name));
        ASSERT_EQ(va.numel(), vb.numel());
        EXPECT_EQ(0, std::memcmp(va.raw(), vb.raw(), va.bytes())) << name;
    }
}

TEST(Transformer, F32LossMatchesF64Reference) {
    for (const ModelConfig& config : {tiny_gpt2(), tiny_llama()}) {
        auto backend = make_cpu_backend(1);
        Transformer f32(config, *backend, DType::f32, 2, 5), f64(config, *backend, DType::f64, 2, 5);
        f32.initialize(3);
        f64.initialize(3);
        Batch batch(10, config.vocab_size, 4);
        const double a = f32.forward(batch.tokens, batch.targets, 2, 5), b = f64.forward(batch.tokens, batch.targets, 2, 5);
        EXPECT_NEAR(a, b, 1e-5 * std::abs(b)) << family_name(config.family);
    }
}

TEST(Transformer, ShorterForwardUsesAPrefixOfThePlannedActivations) {
    // A forward over fewer positions gives the same logits as the first positions of a
    // longer one: attention is causal and positions start at 0 in both.
    auto backend = make_cpu_backend(1);
    Transformer model(tiny_llama(), *backend, DType::f64, 1, 6);
    model.initialize(1);
    Batch batch(6, 13, 2);
    model.forward(batch.tokens, Tensor(), 1, 6);
    std::vector<double> full(model.logits().data<double>(), model.logits().data<double>() + 4 * 13);
    model.forward(batch.tokens.view().slice_rows(0, 4), Tensor(), 1, 4);
    for (size_t i = 0; i < full.size(); ++i) EXPECT_NEAR(model.logits().data<double>()[i], full[i], 1e-12);
}

TEST(Transformer, TwoHalfBatchesAccumulated_EqualOneFullBatch) {
    // Gradient accumulation: backward(1/2) over each half of a batch adds up to the
    // gradient of the mean loss over the whole batch.
    auto backend = make_cpu_backend(1);
    const ModelConfig config = tiny_llama();
    Transformer model(config, *backend, DType::f64, 4, 5);
    model.initialize(8);
    Batch batch(20, config.vocab_size, 9);
    model.forward(batch.tokens, batch.targets, 4, 5);
    model.backward(1.0);
    const Tensor g = model.parameters().all_grads();
    const std::vector<double> full(g.data<double>(), g.data<double>() + g.numel());
    backend->fill_zero(g);
    for (int64_t half = 0; half < 2; ++half) {
        model.forward(batch.tokens.view().slice_rows(half * 10, 10), batch.targets.view().slice_rows(half * 10, 10), 2, 5);
        model.backward(0.5);
    }
    for (int64_t i = 0; i < g.numel(); ++i) EXPECT_NEAR(g.data<double>()[i], full[static_cast<size_t>(i)], 1e-12) << i;
}

TEST(Generate, IsReproducibleAndStaysInTheVocabulary) {
    auto backend = make_cpu_backend(1);
    Transformer model(tiny_gpt2(), *backend, DType::f32, 1, 6);
    model.initialize(2);
    const auto a = generate_tokens(model, {1, 2}, 12, 1.0, 77);
    const auto b = generate_tokens(model, {1, 2}, 12, 1.0, 77);
    EXPECT_EQ(a, b);
    ASSERT_EQ(a.size(), 12u);
    for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < 11);
}

// Decoding one position against the KV cache gives the logits of a forward over the whole
// prefix, at every position (f64: to rounding), for GPT-2 (learned positions) and Llama
// (RoPE, grouped-query heads).
void expect_decode_matches_forward(const ModelConfig& config) {
    auto backend = make_cpu_backend(1);
    Transformer model(config, *backend, DType::f64, 1, config.max_seq_len);
    model.initialize(3);
    const Batch batch(config.max_seq_len, config.vocab_size, 9);
    KvCache cache = model.make_kv_cache();
    for (int64_t t = 0; t < config.max_seq_len; ++t) {
        model.decode(batch.tokens.data<int32_t>()[t], cache);
        const std::vector<double> decoded = model.logits_row(0);
        model.forward(batch.tokens.view().slice_rows(0, t + 1), Tensor(), 1, t + 1);
        const std::vector<double> full = model.logits_row(t);
        for (size_t v = 0; v < full.size(); ++v) EXPECT_NEAR(decoded[v], full[v], 1e-12) << "position " << t << " class " << v;
    }
    EXPECT_EQ(cache.length, config.max_seq_len);
}

TEST(Generate, KvCacheDecodeEqualsFullForward_Gpt2) { expect_decode_matches_forward(tiny_gpt2()); }
TEST(Generate, KvCacheDecodeEqualsFullForward_LlamaGqa) { expect_decode_matches_forward(tiny_llama()); }

// Same seed, same tokens with and without the cache, past the window (max_seq_len 6 or 7:
// the cache is refilled as the window slides), with top-k and top-p.
TEST(Generate, KvCacheDrawsTheTokensOfFullRecompute) {
    for (const ModelConfig& config : {tiny_gpt2(), tiny_llama()}) {
        auto backend = make_cpu_backend(1);
        Transformer model(config, *backend, DType::f32, 1, config.max_seq_len);
        model.initialize(4);
        SamplingOptions options;
        options.seed = 21;
        for (const auto& [k, p] : {std::pair<int64_t, double>{0, 1.0}, {3, 1.0}, {0, 0.8}}) {
            options.top_k = k;
            options.top_p = p;
            options.kv_cache = true;
            std::vector<int32_t> streamed;
            const auto cached = generate_tokens(model, {1, 2, 3}, 20, options, [&](int32_t t) { streamed.push_back(t); });
            options.kv_cache = false;
            const auto recomputed = generate_tokens(model, {1, 2, 3}, 20, options);
            EXPECT_EQ(cached, recomputed) << "top_k " << k << " top_p " << p;
            EXPECT_EQ(streamed, cached);
        }
    }
}

TEST(Generate, TopKTopPAndGreedyKeepOnlyTheMostLikelyClasses) {
    const std::vector<double> logits = {0.0, 3.0, 1.0, 2.9, -1.0, 9.0};  // class 5 is padding
    SamplingOptions options;
    options.temperature = 0;
    EXPECT_EQ(sample_from_logits(logits, 5, options, 0.99), 1);  // greedy: the largest real class
    options.temperature = 1;
    options.top_k = 2;
    for (double u = 0; u < 1; u += 0.01) {
        const int32_t t = sample_from_logits(logits, 5, options, u);
        EXPECT_TRUE(t == 1 || t == 3) << u;
    }
    options.top_k = 0;
    options.top_p = 0.5;  // class 1 alone holds about 47% of the mass, with class 3 about 90%
    for (double u = 0; u < 1; u += 0.01) {
        const int32_t t = sample_from_logits(logits, 5, options, u);
        EXPECT_TRUE(t == 1 || t == 3) << u;
    }
    options.top_p = 0.01;
    EXPECT_EQ(sample_from_logits(logits, 5, options, 0.99), 1);
}

// Tensor-parallel parts hold exactly the slices of the whole tensors that the global
// indices say, so the initialization is the same for every tp size.
TEST(Transformer, TensorParallelShardsInitializeAsSlicesOfTheWholeTensors) {
    ModelConfig m = tiny_gpt2();
    m.vocab_size = 12;
    auto backend = make_cpu_backend(1);
    Transformer whole(m, *backend, DType::f64, 1, 4);
    whole.initialize(3);
    for (int rank = 0; rank < 2; ++rank) {
        Parameters part(rank, 2);
        part.add("transformer.h.0.attn.c_attn.weight", {3 * 8, 8}, ParamInit::normal, true, {TpSplit::rows, 3});
        part.add("transformer.h.0.attn.c_proj.weight", {8, 8}, ParamInit::normal_residual, true, {TpSplit::cols, 1});
        part.allocate(DType::f64);
        part.initialize(3, m.init_std, m.n_layers);
        for (size_t i = 0; i < part.count(); ++i) {
            const Tensor full = whole.parameters().value(whole.parameters().index_of(part.info(i).name));
            for (int64_t k = 0; k < part.value(i).numel(); ++k)
                EXPECT_EQ(part.value(i).data<double>()[k], full.data<double>()[part.global_index(i, k)]) << part.info(i).name << "[" << k << "]";
        }
        // Rank 1's first q row is global row 4 (q rows 0-7: rank 0 has 0-3, rank 1 has 4-7);
        // its first k row is global row 8 + 4 = 12.
        EXPECT_EQ(part.global_index(0, 0), 4 * 8 * rank);
        EXPECT_EQ(part.global_index(0, 4 * 8), (8 + 4 * rank) * 8);
    }
}

// ---- padded vocabulary (model.pad_vocab_to) ----

namespace {
ModelConfig with_pad_vocab_to(ModelConfig m, int64_t pad_vocab_to) {
    m.pad_vocab_to = pad_vocab_to;
    return m;
}
}  // namespace

// The padded rows (11 -> 12 tied, 13 -> 16 untied) are among the elements checked: their
// finite difference is 0, since the loss masks their classes.
TEST(Transformer, PaddedVocabGradients_MatchFiniteDifferences) {
    expect_model_gradients_match_finite_differences(with_pad_vocab_to(tiny_gpt2(), 4));
    expect_model_gradients_match_finite_differences(with_pad_vocab_to(tiny_llama(), 8));
}

// Padding changes nothing but the tables' extra rows: the real rows start with the same
// values and the padded ones at zero; the loss and every real gradient are the unpadded
// model's, and the padded rows get no gradient (so AdamW leaves them at zero).
TEST(Transformer, PaddedVocab_GivesTheUnpaddedInitializationLossAndGradients) {
    for (const ModelConfig& config : {tiny_gpt2(), tiny_llama()}) {
        SCOPED_TRACE(family_name(config.family));
        auto backend = make_cpu_backend(1);
        Transformer plain(config, *backend, DType::f64, 2, 5), padded(with_pad_vocab_to(config, 8), *backend, DType::f64, 2, 5);
        EXPECT_EQ(plain.padded_vocab_size(), config.vocab_size);
        EXPECT_EQ(padded.padded_vocab_size(), 16);
        plain.initialize(6);
        padded.initialize(6);
        Batch batch(10, config.vocab_size, 7);
        const double loss = plain.forward(batch.tokens, batch.targets, 2, 5);
        EXPECT_NEAR(padded.forward(batch.tokens, batch.targets, 2, 5), loss, 1e-13 * loss);
        plain.backward(1.0);
        padded.backward(1.0);
        const Parameters& a = plain.parameters();
        const Parameters& b = padded.parameters();
        ASSERT_EQ(a.count(), b.count());
        for (size_t i = 0; i < a.count(); ++i) {
            ASSERT_EQ(a.info(i).name, b.info(i).name);
            const double* va = a.value(i).data<double>();
            const double* vb = b.value(i).data<double>();
            const double* ga = a.grad(i).data<double>();
            const double* gb = b.grad(i).data<double>();
            const int64_t real = a.value(i).numel();  // a vocabulary table's real rows come first
            for (int64_t k = 0; k < real; ++k) {
                EXPECT_EQ(vb[k], va[k]) << b.info(i).name << "[" << k << "]";
                EXPECT_NEAR(gb[k], ga[k], 1e-12 * std::max(1.0, std::abs(ga[k]))) << b.info(i).name << " grad [" << k << "]";
            }
            for (int64_t k = real; k < b.value(i).numel(); ++k) {
                EXPECT_EQ(vb[k], 0.0) << b.info(i).name << " padded [" << k << "]";
                EXPECT_EQ(gb[k], 0.0) << b.info(i).name << " padded grad [" << k << "]";
            }
        }
    }
}

// The final norm is made to output its bias (weight 0, bias 1), and the padded head rows
// are set to 10: every padded logit is 10 * d_model = 80 while the real ones stay near 0, so
// a sampler that did not mask the padding would draw almost nothing else.
TEST(Generate, NeverDrawsAPaddedClass) {
    const ModelConfig config = with_pad_vocab_to(tiny_gpt2(), 8);  // 11 real classes of 16 rows
    auto backend = make_cpu_backend(1);
    Transformer model(config, *backend, DType::f32, 1, 6);
    model.initialize(2);
    Parameters& p = model.parameters();
    const auto fill = [&](const char* name, int64_t begin, float value) {
        const Tensor t = p.value(p.index_of(name));
        for (int64_t k = begin; k < t.numel(); ++k) t.data<float>()[k] = value;
    };
    fill("transformer.ln_f.weight", 0, 0.f);
    fill("transformer.ln_f.bias", 0, 1.f);
    fill("transformer.wte.weight", config.vocab_size * config.d_model, 10.f);  // the tied head's padded rows

    const OwnedTensor context(DType::i32, {2});
    model.forward(context, Tensor(), 1, 2);
    const std::vector<double> row = model.logits_row(1);
    ASSERT_EQ(row.size(), 16u);
    EXPECT_GT(*std::min_element(row.begin() + 11, row.end()), *std::max_element(row.begin(), row.begin() + 11) + 50)
        << "the padded logits must dominate for the check to mean anything";

    for (int32_t t : generate_tokens(model, {1, 2}, 40, 1.0, 5)) EXPECT_TRUE(t >= 0 && t < 11) << "drew " << t;
}
