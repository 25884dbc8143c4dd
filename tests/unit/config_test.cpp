// Config: valid files get the documented defaults; every kind of bad input (syntax, unknown
// key or section, wrong type, out of range, missing key, impossible combination, missing data
// file, bad --set) is one Error naming the file and the key; dump_config parses back equal.
#include <gtest/gtest.h>

#include "test_paths.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"

using namespace llmtrain;
using llmtrain::test::write_temp_file;

namespace {

const std::string& train_file() {
    static const std::string path = write_temp_file("config_test_train.txt", "some training text\n");
    return path;
}

const std::string& val_file() {
    static const std::string path = write_temp_file("config_test_val.txt", "some held-out text\n");
    return path;
}

std::string literal(const std::string& text) { return "'" + text + "'"; }

// A config as sections of `key = value` lines (values as TOML text), starting from the
// smallest valid run of a family.
class TomlText {
public:
    static TomlText gpt2() {
        TomlText t;
        t.set("model.family", "\"gpt2\"").set("model.n_layers", "2").set("model.d_model", "64").set("model.n_heads", "4");
        t.set("model.vocab_size", "257").set("model.max_seq_len", "32");
        t.set("data.train_path", literal(train_file()));
        t.set("train.steps", "10").set("train.batch_size", "2").set("train.seq_len", "16");
        t.set("optimizer.lr", "1e-3");
        return t;
    }
    static TomlText llama() { return gpt2().set("model.family", "\"llama\""); }

    // "checkpoint.local.every_steps": key every_steps of table [checkpoint.local].
    TomlText& set(const std::string& path, const std::string& value) {
        const size_t dot = path.rfind('.');
        sections_[path.substr(0, dot)][path.substr(dot + 1)] = value;
        return *this;
    }
    TomlText& erase(const std::string& path) {
        const size_t dot = path.rfind('.');
        sections_[path.substr(0, dot)].erase(path.substr(dot + 1));
        return *this;
    }
    TomlText& erase_section(const std::string& section) {
        sections_.erase(section);
        return *this;
    }
    std::string str() const {
        std::string text;
        for (const auto& [section, keys] : sections_) {
            text += "[" + section + "]\n";
            for (const auto& [key, value] : keys) text += key + " = " + value + "\n";
        }
        return text;
    }

private:
    std::map<std::string, std::map<std::string, std::string>> sections_;
};

Config parse(const TomlText& toml, const std::vector<std::string>& overrides = {}) {
    return parse_config(toml.str(), "run.toml", overrides);
}

// The message of the Error that parsing throws; checks its kind and that it is one line.
std::string error_of(const std::string& toml, const std::vector<std::string>& overrides = {},
                     ErrorKind kind = ErrorKind::config) {
    try {
        parse_config(toml, "run.toml", overrides);
    } catch (const Error& e) {
        const std::string message = e.what();
        EXPECT_EQ(e.kind(), kind) << message;
        EXPECT_EQ(message.find('\n'), std::string::npos) << message;
        return message;
    }
    ADD_FAILURE() << "expected an Error";
    return "";
}

std::string error_of(const TomlText& toml, const std::vector<std::string>& overrides = {},
                     ErrorKind kind = ErrorKind::config) {
    return error_of(toml.str(), overrides, kind);
}

testing::AssertionResult Contains(const std::string& text, const std::string& part) {
    if (text.find(part) != std::string::npos) return testing::AssertionSuccess();
    return testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

void expect_same(const Config& a, const Config& b) {
    EXPECT_EQ(a.model.family, b.model.family);
    EXPECT_EQ(a.model.n_layers, b.model.n_layers);
    EXPECT_EQ(a.model.d_model, b.model.d_model);
    EXPECT_EQ(a.model.n_heads, b.model.n_heads);
    EXPECT_EQ(a.model.n_kv_heads, b.model.n_kv_heads);
    EXPECT_EQ(a.model.d_ff, b.model.d_ff);
    EXPECT_EQ(a.model.vocab_size, b.model.vocab_size);
    EXPECT_EQ(a.model.pad_vocab_to, b.model.pad_vocab_to);
    EXPECT_EQ(a.model.max_seq_len, b.model.max_seq_len);
    EXPECT_EQ(a.model.norm_eps, b.model.norm_eps);
    EXPECT_EQ(a.model.rope_theta, b.model.rope_theta);
    EXPECT_EQ(a.model.qkv_bias, b.model.qkv_bias);
    EXPECT_EQ(a.model.tied_embeddings, b.model.tied_embeddings);
    EXPECT_EQ(a.model.init_std, b.model.init_std);
    EXPECT_EQ(a.data.format, b.data.format);
    EXPECT_EQ(a.data.train_path, b.data.train_path);
    EXPECT_EQ(a.data.val_path, b.data.val_path);
    EXPECT_EQ(a.data.val_fraction, b.data.val_fraction);
    EXPECT_EQ(a.data.token_dtype, b.data.token_dtype);
    EXPECT_EQ(a.data.document_separator, b.data.document_separator);
    EXPECT_EQ(a.train.seed, b.train.seed);
    EXPECT_EQ(a.train.steps, b.train.steps);
    EXPECT_EQ(a.train.batch_size, b.train.batch_size);
    EXPECT_EQ(a.train.seq_len, b.train.seq_len);
    EXPECT_EQ(a.train.global_batch_size, b.train.global_batch_size);
    EXPECT_EQ(a.train.grad_accum, b.train.grad_accum);
    EXPECT_EQ(a.train.eval_every, b.train.eval_every);
    EXPECT_EQ(a.train.eval_sequences, b.train.eval_sequences);
    EXPECT_EQ(a.train.log_every, b.train.log_every);
    EXPECT_EQ(a.train.threads, b.train.threads);
    EXPECT_EQ(a.train.sample_tokens, b.train.sample_tokens);
    EXPECT_EQ(a.train.sample_prompt, b.train.sample_prompt);
    EXPECT_EQ(a.train.sample_temperature, b.train.sample_temperature);
    EXPECT_EQ(a.optimizer.lr, b.optimizer.lr);
    EXPECT_EQ(a.optimizer.min_lr_ratio, b.optimizer.min_lr_ratio);
    EXPECT_EQ(a.optimizer.warmup_steps, b.optimizer.warmup_steps);
    EXPECT_EQ(a.optimizer.decay, b.optimizer.decay);
    EXPECT_EQ(a.optimizer.beta1, b.optimizer.beta1);
    EXPECT_EQ(a.optimizer.beta2, b.optimizer.beta2);
    EXPECT_EQ(a.optimizer.eps, b.optimizer.eps);
    EXPECT_EQ(a.optimizer.weight_decay, b.optimizer.weight_decay);
    EXPECT_EQ(a.optimizer.grad_clip, b.optimizer.grad_clip);
    EXPECT_EQ(a.parallel.tp, b.parallel.tp);
    EXPECT_EQ(a.parallel.pp, b.parallel.pp);
    EXPECT_EQ(a.parallel.dp, b.parallel.dp);
    EXPECT_EQ(a.checkpoint.dir, b.checkpoint.dir);
    EXPECT_EQ(a.checkpoint.every_steps, b.checkpoint.every_steps);
    EXPECT_EQ(a.checkpoint.keep_last, b.checkpoint.keep_last);
    EXPECT_EQ(a.monitor.on_nonfinite, b.monitor.on_nonfinite);
    EXPECT_EQ(a.metrics.jsonl, b.metrics.jsonl);
}

}  // namespace

// ---- Valid configs and defaults ----

TEST(Config, MinimalGpt2_ParsesWithDocumentedDefaults) {
    const Config c = parse(TomlText::gpt2());
    EXPECT_EQ(c.model.family, ModelFamily::gpt2);
    EXPECT_EQ(c.model.n_kv_heads, 4);
    EXPECT_EQ(c.model.d_ff, 4 * 64);
    EXPECT_TRUE(c.model.tied_embeddings);
    EXPECT_FALSE(c.model.qkv_bias);
    EXPECT_EQ(c.model.head_dim(), 16);
    EXPECT_EQ(c.model.norm_eps, 1e-5);
    EXPECT_EQ(c.data.format, DataFormat::text);
    EXPECT_EQ(c.data.train_path, train_file());
    EXPECT_EQ(c.data.val_path, "");
    EXPECT_EQ(c.data.val_fraction, 0.05);
    EXPECT_EQ(c.train.seed, 1337u);
    EXPECT_EQ(c.train.global_batch_size, 0);
    EXPECT_EQ(c.train.grad_accum, 0);
    EXPECT_EQ(micro_batches_per_step(c, 1), 1);
    EXPECT_EQ(c.train.eval_sequences, 128);
    EXPECT_EQ(c.optimizer.lr, 1e-3);
    EXPECT_EQ(c.optimizer.decay, LrDecay::cosine);
    EXPECT_EQ(c.optimizer.grad_clip, 1.0);
    EXPECT_EQ(c.parallel.tp * c.parallel.pp, 1);
    EXPECT_EQ(c.parallel.dp, 0);  // derived from the world size at launch
    EXPECT_EQ(c.parallel.zero_stage, 1);
    EXPECT_EQ(c.parallel.order, "tp-dp-pp");
    EXPECT_EQ(c.checkpoint.every_steps, 0);
    EXPECT_EQ(c.monitor.on_nonfinite, HealthAction::abort);
    EXPECT_TRUE(c.metrics.jsonl);
    EXPECT_EQ(c.source_path, "");
}

TEST(Config, MinimalLlama_ParsesWithLlamaDefaults) {
    const Config c = parse(TomlText::llama());
    EXPECT_EQ(c.model.family, ModelFamily::llama);
    EXPECT_EQ(c.model.n_kv_heads, 4);
    EXPECT_EQ(c.model.d_ff, 192);  // 8/3 * 64 = 170.7, rounded up to a multiple of 64
    EXPECT_FALSE(c.model.tied_embeddings);
    EXPECT_EQ(c.model.rope_theta, 10000.0);
}

TEST(Config, LlamaDff_Is8Thirds_RoundedUpTo64) {
    EXPECT_EQ(parse(TomlText::llama().set("model.d_model", "2048").set("model.n_heads", "32")).model.d_ff, 5504);
    EXPECT_EQ(parse(TomlText::llama().set("model.d_model", "96").set("model.n_heads", "4")).model.d_ff, 256);
}

TEST(Config, LlamaGroupedQueryAttention_IsAccepted) {
    const Config c = parse(TomlText::llama()
                               .set("model.n_heads", "8")
                               .set("model.n_kv_heads", "2")
                               .set("model.rope_theta", "500000.0")
                               .set("model.qkv_bias", "true")
                               .set("model.tied_embeddings", "true"));
    EXPECT_EQ(c.model.n_kv_heads, 2);
    EXPECT_EQ(c.model.rope_theta, 500000.0);
    EXPECT_TRUE(c.model.qkv_bias);
    EXPECT_TRUE(c.model.tied_embeddings);
}

TEST(Config, Gpt2ExplicitKvHeadsEqualToHeads_IsAccepted) {
    EXPECT_EQ(parse(TomlText::gpt2().set("model.n_kv_heads", "4")).model.n_kv_heads, 4);
}

TEST(Config, ExplicitValues_ReplaceFamilyDefaults) {
    const Config c = parse(TomlText::gpt2().set("model.d_ff", "100").set("model.tied_embeddings", "false"));
    EXPECT_EQ(c.model.d_ff, 100);
    EXPECT_FALSE(c.model.tied_embeddings);
}

TEST(Config, IntegerForFloatKey_IsAccepted) {
    const Config c = parse(TomlText::llama().set("optimizer.lr", "1").set("model.rope_theta", "500000").set("optimizer.grad_clip", "0"));
    EXPECT_EQ(c.optimizer.lr, 1.0);
    EXPECT_EQ(c.model.rope_theta, 500000.0);
    EXPECT_EQ(c.optimizer.grad_clip, 0.0);
}

TEST(Config, EnumsAndStrings_AreReadByName) {
    const Config c = parse(TomlText::gpt2()
                               .set("data.format", "\"tokens\"")
                               .set("data.token_dtype", "\"i32\"")
                               .set("data.document_separator", "\"\\n%\\n\"")
                               .set("optimizer.decay", "\"linear\"")
                               .set("monitor.on_nonfinite", "\"skip\""));
    EXPECT_EQ(c.data.format, DataFormat::tokens);
    EXPECT_EQ(c.data.token_dtype, "i32");
    EXPECT_EQ(c.data.document_separator, "\n%\n");
    EXPECT_EQ(c.optimizer.decay, LrDecay::linear);
    EXPECT_EQ(c.monitor.on_nonfinite, HealthAction::skip);
}

TEST(Config, InclusiveBounds_AreAccepted) {
    const Config c = parse(TomlText::gpt2()
                               .set("model.n_layers", "1024")
                               .set("optimizer.lr", "10")
                               .set("optimizer.beta1", "0")
                               .set("optimizer.min_lr_ratio", "1")
                               .set("data.val_fraction", "0.5")
                               .set("train.seed", "9223372036854775807")
                               .set("optimizer.warmup_steps", "10"));
    EXPECT_EQ(c.model.n_layers, 1024);
    EXPECT_EQ(c.train.seed, 9223372036854775807u);
}

TEST(Config, FamilyName_NamesEachFamily) {
    EXPECT_STREQ(family_name(ModelFamily::gpt2), "gpt2");
    EXPECT_STREQ(family_name(ModelFamily::llama), "llama");
}

// ---- Syntax, unknown names, types, ranges, missing keys ----

TEST(Config, TomlSyntaxError_NamesFileLineAndColumn) {
    const std::string message = error_of("[model]\nfamily = \"gpt2\"\nn_layers = = 2\n");
    EXPECT_TRUE(Contains(message, "run.toml:3:12: ")) << message;
}

TEST(Config, UnknownKey_IsRejectedWithSuggestion) {
    const std::string message = error_of(TomlText::gpt2().erase("model.n_heads").set("model.n_head", "4"));
    EXPECT_TRUE(Contains(message, "run.toml: model.n_head: unknown key (known keys in [model]: family, n_layers, d_model, n_heads"));
    EXPECT_TRUE(Contains(message, "; did you mean model.n_heads?"));
}

TEST(Config, UnknownKeyBelongingElsewhere_SuggestsItsSection) {
    const std::string message = error_of(TomlText::gpt2().set("model.lr", "1e-3"));
    EXPECT_TRUE(Contains(message, "run.toml: model.lr: unknown key"));
    EXPECT_TRUE(Contains(message, "did you mean optimizer.lr?"));
}

TEST(Config, UnknownKeyFarFromAnyKnown_HasNoSuggestion) {
    const std::string message = error_of(TomlText::gpt2().set("model.colour_scheme", "1"));
    EXPECT_TRUE(Contains(message, "run.toml: model.colour_scheme: unknown key"));
    EXPECT_FALSE(Contains(message, "did you mean"));
}

TEST(Config, UnknownKey_IsReportedBeforeTheMissingKeyItMisspells) {
    const std::string message = error_of(TomlText::gpt2().erase("train.steps").set("train.stpes", "10"));
    EXPECT_TRUE(Contains(message, "run.toml: train.stpes: unknown key"));
}

TEST(Config, UnknownSection_IsRejectedWithSuggestion) {
    const std::string message = error_of(TomlText::gpt2().set("trainer.steps", "3"));
    EXPECT_TRUE(Contains(message, "run.toml: trainer: unknown section (known sections: model, model.moe, data, train, optimizer, parallel, "
                                  "fp8, checkpoint, checkpoint.local, monitor, metrics); did you mean [train]?"));
}

TEST(Config, LocalSnapshotKeys_AreReadFromTheirTableInsideCheckpoint) {
    const Config c = parse(TomlText::gpt2().set("checkpoint.local.every_steps", "5").set("checkpoint.local.dir", "\"/dev/shm/x/{node}\""),
                           {"checkpoint.local.replicas=2"});
    EXPECT_EQ(c.checkpoint.local.every_steps, 5);
    EXPECT_EQ(c.checkpoint.local.dir, "/dev/shm/x/{node}");
    EXPECT_EQ(c.checkpoint.local.replicas, 2);
    EXPECT_EQ(c.checkpoint.local.keep, 2);  // the defaults
    EXPECT_EQ(c.checkpoint.local.when_busy, SnapshotWhenBusy::defer);
    EXPECT_EQ(parse(TomlText::gpt2()).checkpoint.local.every_steps, 0);
}

TEST(Config, UnknownKeyInTheLocalSnapshotTable_NamesItsTableAndTheNearestKey) {
    const std::string message = error_of(TomlText::gpt2().set("checkpoint.local.evry_steps", "5"));
    EXPECT_TRUE(Contains(message, "run.toml: checkpoint.local.evry_steps: unknown key (known keys in [checkpoint.local]: every_steps, dir, replicas, keep, when_busy)"))
        << message;
    EXPECT_TRUE(Contains(message, "did you mean checkpoint.local.every_steps?")) << message;
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"checkpoint.local.replicas=-1"}), "checkpoint.local.replicas"));
}

TEST(Config, KeyOutsideAnySection_IsRejectedWithSuggestion) {
    const std::string message = error_of("steps = 3\n" + TomlText::gpt2().str());
    EXPECT_TRUE(Contains(message, "run.toml: steps: unknown key outside any section"));
    EXPECT_TRUE(Contains(message, "did you mean train.steps?"));
}

TEST(Config, SectionThatIsNoTable_IsRejected) {
    const std::string message = error_of("metrics = 3\n" + TomlText::gpt2().str());
    EXPECT_TRUE(Contains(message, "run.toml: metrics: expected a table [metrics], got an integer"));
}

TEST(Config, StringForIntegerKey_IsATypeError) {
    const std::string message = error_of(TomlText::gpt2().set("model.d_model", "\"64\""));
    EXPECT_TRUE(Contains(message, "run.toml: model.d_model: expected an integer, got a string (allowed: integer in [1, 65536])"));
}

TEST(Config, FloatForIntegerKey_IsATypeError) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("model.n_layers", "2.0")), "run.toml: model.n_layers: expected an integer, got a float"));
}

TEST(Config, StringForFloatKey_IsATypeError) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("optimizer.lr", "\"fast\"")), "run.toml: optimizer.lr: expected a number, got a string"));
}

TEST(Config, IntegerForBooleanKey_IsATypeError) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("metrics.jsonl", "1")), "run.toml: metrics.jsonl: expected a boolean, got an integer"));
}

TEST(Config, NumberForEnumKey_IsATypeError) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("model.family", "2")), "run.toml: model.family: expected a string, got an integer"));
}

TEST(Config, UnknownEnumValue_ListsTheAllowedNames) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("model.family", "\"gpt3\"")),
                         "run.toml: model.family: \"gpt3\" is not a known value (allowed: one of \"gpt2\", \"llama\")"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("data.token_dtype", "\"u8\"")), "run.toml: data.token_dtype: \"u8\" is not a known value"));
}

TEST(Config, OutOfRangeLowAndHigh_NameKeyValueAndAllowedRange) {
    struct Case {
        const char* key;
        const char* value;
        const char* expected;
    };
    const Case cases[] = {
        {"model.n_layers", "0", "model.n_layers: 0 is out of range (allowed: integer in [1, 1024])"},
        {"model.n_layers", "1025", "model.n_layers: 1025 is out of range (allowed: integer in [1, 1024])"},
        {"model.vocab_size", "1", "model.vocab_size: 1 is out of range (allowed: integer in [2, 2147483647])"},
        {"model.norm_eps", "0", "model.norm_eps: 0 is out of range (allowed: number in (0, 1))"},
        {"model.norm_eps", "1.0", "model.norm_eps: 1 is out of range (allowed: number in (0, 1))"},
        {"model.init_std", "1.5", "model.init_std: 1.5 is out of range (allowed: number in (0, 1])"},
        {"data.val_fraction", "0.6", "data.val_fraction: 0.6 is out of range (allowed: number in [0, 0.5])"},
        {"train.seed", "-1", "train.seed: -1 is out of range (allowed: integer in [0, 9223372036854775807])"},
        {"train.steps", "0", "train.steps: 0 is out of range (allowed: integer in [1, 1000000000000])"},
        {"train.batch_size", "65537", "train.batch_size: 65537 is out of range"},
        {"train.threads", "4097", "train.threads: 4097 is out of range"},
        {"train.sample_temperature", "0.0", "train.sample_temperature: 0 is out of range (allowed: number in (0, 10])"},
        {"optimizer.lr", "0", "optimizer.lr: 0 is out of range (allowed: number in (0, 10])"},
        {"optimizer.lr", "50.0", "optimizer.lr: 50 is out of range (allowed: number in (0, 10])"},
        {"optimizer.lr", "nan", "optimizer.lr: nan is out of range"},
        {"model.rope_theta", "2e9", "model.rope_theta: 2000000000 is out of range (allowed: number in (0, 1000000000])"},
        {"optimizer.beta2", "1.0", "optimizer.beta2: 1 is out of range (allowed: number in [0, 1))"},
        {"optimizer.weight_decay", "-0.1", "optimizer.weight_decay: -0.1 is out of range (allowed: number in [0, 10])"},
        {"parallel.tp", "0", "parallel.tp: 0 is out of range (allowed: integer in [1, 65536])"},
        {"checkpoint.keep_last", "0", "checkpoint.keep_last: 0 is out of range (allowed: integer in [1, 1000000])"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.key);
        EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set(c.key, c.value)), std::string("run.toml: ") + c.expected));
    }
}

TEST(Config, MissingRequiredKey_NamesKeyAndAllowedValues) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().erase("model.n_layers")),
                         "run.toml: model.n_layers: required key is missing (integer in [1, 1024])"));
    for (const char* key : {"model.family", "model.d_model", "model.n_heads", "model.vocab_size", "model.max_seq_len",
                            "data.train_path", "train.steps", "train.batch_size", "train.seq_len", "optimizer.lr"}) {
        SCOPED_TRACE(key);
        EXPECT_TRUE(Contains(error_of(TomlText::gpt2().erase(key)), std::string("run.toml: ") + key + ": required key is missing ("));
    }
}

TEST(Config, MissingSection_ReportsItsFirstRequiredKey) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().erase_section("optimizer")), "run.toml: optimizer.lr: required key is missing"));
}

// ---- Impossible combinations ----

TEST(Config, HeadsNotDividingDModel_IsRejected) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("model.n_heads", "3")), "run.toml: model.n_heads: must divide model.d_model = 64 (got 3)"));
}

TEST(Config, LlamaOddHeadDimension_IsRejected) {
    const std::string message = error_of(TomlText::llama().set("model.d_model", "36"));  // 36 / 4 heads = 9
    EXPECT_TRUE(Contains(message, "run.toml: model.n_heads: gives an odd head dimension model.d_model / model.n_heads = 9"));
    EXPECT_NO_THROW(parse(TomlText::gpt2().set("model.d_model", "36")));
}

TEST(Config, Gpt2WithFewerKvHeads_NeedsLlama) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("model.n_kv_heads", "2")),
                         "run.toml: model.n_kv_heads: grouped-query attention needs family = \"llama\""));
}

TEST(Config, KvHeadsNotDividingHeads_IsRejected) {
    EXPECT_TRUE(Contains(error_of(TomlText::llama().set("model.n_heads", "8").set("model.n_kv_heads", "3")),
                         "run.toml: model.n_kv_heads: must divide model.n_heads = 8 (got 3)"));
}

TEST(Config, LlamaOnlyKeysWithGpt2_AreRejected) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("model.rope_theta", "10000.0")),
                         "run.toml: model.rope_theta: applies to family = \"llama\" only (model.family = \"gpt2\")"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("model.qkv_bias", "false")),
                         "run.toml: model.qkv_bias: applies to family = \"llama\" only"));
}

TEST(Config, SeqLenAboveMaxSeqLen_IsRejected) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("train.seq_len", "64")),
                         "run.toml: train.seq_len: must be <= model.max_seq_len = 32 (got 64)"));
}

TEST(Config, TextFormatWithVocabBelow257_IsRejected) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("model.vocab_size", "256")),
                         "run.toml: model.vocab_size: data.format = \"text\" needs at least 257 token ids"));
    EXPECT_NO_THROW(parse(TomlText::gpt2().set("model.vocab_size", "256").set("data.format", "\"tokens\"")));
}

TEST(Config, U16TokensWithVocabAbove65536_IsRejected) {
    const TomlText toml = TomlText::gpt2().set("data.format", "\"tokens\"").set("model.vocab_size", "128256");
    EXPECT_TRUE(Contains(error_of(toml), "run.toml: data.token_dtype: \"u16\" holds token ids below 65536"));
    EXPECT_NO_THROW(parse(toml, {"data.token_dtype=i32"}));
}

TEST(Config, WarmupLongerThanTraining_IsAccepted) {
    // A smoke run (--set train.steps=5 on a config with 30 warmup steps) warms up over the whole run.
    EXPECT_EQ(parse(TomlText::gpt2().set("optimizer.warmup_steps", "11")).optimizer.warmup_steps, 11);
}

TEST(Config, GlobalBatchSize_GivesMicroBatchesPerStepForEachDp) {
    const Config c = parse(TomlText::gpt2().set("train.global_batch_size", "12"));
    EXPECT_EQ(micro_batches_per_step(c, 1), 6);
    EXPECT_EQ(micro_batches_per_step(c, 2), 3);
    EXPECT_EQ(micro_batches_per_step(c, 3), 2);
    EXPECT_EQ(micro_batches_per_step(c, 6), 1);
    // Without it, grad_accum is what it says on every dp.
    EXPECT_EQ(micro_batches_per_step(parse(TomlText::gpt2().set("train.grad_accum", "3")), 4), 3);
}

TEST(Config, ResolveOnMesh_DerivesGradAccumIntoACopyAndLeavesTheGivenConfigAlone) {
    const Config given = parse(TomlText::gpt2().set("train.global_batch_size", "12"));
    const Config resolved = resolve_on_mesh(given, 2);
    EXPECT_EQ(resolved.train.grad_accum, 3);
    EXPECT_EQ(given.train.grad_accum, 0);
    EXPECT_EQ(resolved.train.global_batch_size, 12);
    EXPECT_EQ(dump_config(resolve_on_mesh(given, 3)), dump_config(resolve_on_mesh(resolve_on_mesh(given, 3), 3)));
}

TEST(Config, GlobalBatchSizeThatDoesNotSplitOnTheRunsDp_NamesTheKeysAndNumbers) {
    const Config c = parse(TomlText::gpt2().set("train.global_batch_size", "12"));
    try {
        micro_batches_per_step(c, 4);
        ADD_FAILURE() << "expected a config error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_STREQ(e.what(), "train.global_batch_size: 12 sequences per step do not split into micro-batches of train.batch_size = 2 on dp = 4 ranks "
                               "(allowed: a multiple of train.batch_size x dp = 8)");
    }
}

TEST(Config, GlobalBatchSizeNotSplittingOnAGivenDp_IsRejectedWhenRead) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("train.global_batch_size", "7")),
                         "run.toml: train.global_batch_size: 7 sequences per step is not a multiple of train.batch_size = 2"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("train.global_batch_size", "12").set("parallel.dp", "4")),
                         "run.toml: train.global_batch_size: 12 sequences per step do not split into micro-batches of train.batch_size = 2 on dp = 4 ranks"));
}

TEST(Config, GradAccumDisagreeingWithGlobalBatchSize_IsRejected) {
    const TomlText toml = TomlText::gpt2().set("train.global_batch_size", "12").set("train.grad_accum", "2");
    EXPECT_TRUE(Contains(error_of(TomlText(toml).set("parallel.dp", "2")),
                         "run.toml: train.grad_accum: 2 micro-batches x train.batch_size = 2 x dp = 2 = 8 sequences per step, "
                         "but train.global_batch_size = 12 (gives grad_accum = 3"));
    EXPECT_TRUE(Contains(error_of(TomlText(toml).set("train.grad_accum", "4")),
                         "run.toml: train.grad_accum: 4 micro-batches x train.batch_size = 2 = 8 sequences per dp rank do not divide train.global_batch_size = 12"));
    // Agreeing: dp = 3 is the only layout it fits, and the run's mesh is checked again.
    const Config agreeing = parse(toml);
    EXPECT_EQ(micro_batches_per_step(agreeing, 3), 2);
    EXPECT_THROW(micro_batches_per_step(agreeing, 1), Error);
}

TEST(Config, EvalBatches_SaysItWasReplacedByEvalSequences) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("train.eval_batches", "8")), "run.toml: train.eval_batches: replaced by train.eval_sequences"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"train.eval_batches=8"}), "train.eval_batches: replaced by train.eval_sequences"));
}

TEST(Config, EvalRemainderThatSequenceParallelCannotSplit_IsRejected) {
    // 5 sequences in micro-batches of 2 leave one of 1 x 3 tokens for tp = 2; the 2 x 3 of a full one split.
    const TomlText toml = TomlText::gpt2().set("train.seq_len", "3").set("parallel.tp", "2").set("parallel.sequence_parallel", "true")
                              .set("model.vocab_size", "258");
    EXPECT_TRUE(Contains(error_of(TomlText(toml).set("train.eval_sequences", "5")),
                         "run.toml: train.eval_sequences: leaves a last evaluation micro-batch of 1 sequences x train.seq_len = 3 tokens"));
    EXPECT_NO_THROW(parse(TomlText(toml).set("train.eval_sequences", "6")));
}

TEST(Config, NoHeldOutData_IsRejectedOnValFraction) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("data.val_fraction", "0")),
                         "run.toml: data.val_fraction: evaluation needs held-out data: set data.val_path or a val_fraction > 0"));
    EXPECT_NO_THROW(parse(TomlText::gpt2().set("data.val_fraction", "0").set("data.val_path", literal(val_file()))));
}

TEST(Config, TensorParallelNotDividingHeads_IsRejected) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("parallel.tp", "3")), "run.toml: parallel.tp: must divide model.n_heads = 4"));
}

// The vocabulary needs no dividing: its rows are padded to a multiple of tp * pad_vocab_to
// (Megatron's make-vocab-size-divisible-by), and model.vocab_size stays the real one.
TEST(Config, TensorParallelNotDividingVocab_IsAcceptedAndPadsTheRows) {
    const Config c = parse(TomlText::gpt2().set("parallel.tp", "2").set("model.vocab_size", "301"));
    EXPECT_EQ(c.model.vocab_size, 301);
    EXPECT_EQ(c.model.pad_vocab_to, 1);
    EXPECT_EQ(c.model.padded_vocab_size(2), 302);
    EXPECT_EQ(c.model.padded_vocab_size(1), 301);
    const Config wide = parse(TomlText::gpt2().set("parallel.tp", "2").set("model.vocab_size", "301").set("model.pad_vocab_to", "64"));
    EXPECT_EQ(wide.model.padded_vocab_size(2), 384);
    EXPECT_EQ(wide.model.padded_vocab_size(1), 320);
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("model.pad_vocab_to", "0")), "model.pad_vocab_to: 0 is out of range"));
}

TEST(Config, MoreStagesThanLayers_IsRejected) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("parallel.pp", "9").set("train.grad_accum", "9")),
                         "run.toml: parallel.pp: more pipeline stages than model.n_layers"));
}

TEST(Config, FewerMicroBatchesThanStages_IsAccepted) {
    // A larger pipeline bubble, not an error (the trainer warns once).
    EXPECT_NO_THROW(parse(TomlText::gpt2().set("parallel.pp", "2")));
    EXPECT_NO_THROW(parse(TomlText::gpt2().set("parallel.pp", "2").set("train.grad_accum", "1")));
}

TEST(Config, StageLayersThatDoNotAddUp_AreRejected) {
    const TomlText two_stages = TomlText::gpt2().set("parallel.pp", "2").set("train.grad_accum", "2");
    EXPECT_TRUE(Contains(error_of(TomlText(two_stages).set("parallel.stage_layers", "'1,5'")), "run.toml: parallel.stage_layers: \"1,5\" gives 2 stages with 6 layers"));
    EXPECT_TRUE(Contains(error_of(TomlText(two_stages).set("parallel.stage_layers", "'1,x'")), "is not a comma-separated list of positive layer counts"));
}

// The updated parameters' all-gather exists under stages 1 and 2 only: stage 0 has none, stage
// 3 gathers in every forward (prefetch_layers).
TEST(Config, OverlapParamGatherOutsideStagesOneAndTwo_IsRejectedWithTheKeyNamed) {
    const TomlText overlap = TomlText::gpt2().set("parallel.overlap_param_gather", "true");
    EXPECT_NO_THROW(parse(TomlText(overlap).set("parallel.zero_stage", "1")));
    EXPECT_NO_THROW(parse(TomlText(overlap).set("parallel.zero_stage", "2")));
    EXPECT_TRUE(Contains(error_of(TomlText(overlap).set("parallel.zero_stage", "0")),
                         "run.toml: parallel.overlap_param_gather: = true overlaps the all-gathers of the updated parameters of parallel.zero_stage = 1 or 2 "
                         "(got 0: stage 0 gathers nothing; allowed: false)"));
    EXPECT_TRUE(Contains(error_of(TomlText(overlap).set("parallel.zero_stage", "3")), "(got 3: stage 3 prefetches with parallel.prefetch_layers; allowed: false)"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("parallel.overlap_param_gather", "1")), "parallel.overlap_param_gather"));
}

// The tensor-parallel overlap pipelines sequence parallelism's collectives: without them it
// has nothing to overlap.
TEST(Config, TpOverlapWithoutSequenceParallelism_IsRejectedWithTheKeyNamed) {
    const TomlText overlap = TomlText::gpt2().set("parallel.tp_overlap", "true").set("parallel.tp", "2");
    EXPECT_NO_THROW(parse(TomlText(overlap).set("parallel.sequence_parallel", "true")));
    EXPECT_TRUE(Contains(error_of(overlap), "run.toml: parallel.tp_overlap: = true overlaps the collectives of sequence parallelism and needs "
                                            "parallel.sequence_parallel = true with parallel.tp > 1 (got sequence_parallel = false, tp = 2; allowed: false)"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("parallel.tp_overlap", "true").set("parallel.sequence_parallel", "true")),
                         "(got sequence_parallel = true, tp = 1; allowed: false)"));
}

// Context parallelism cuts each sequence into 2 x cp equal chunks and runs attention as a
// ring on the native kernels: a length that does not split, or cuDNN's attention, is refused
// naming the key before anything is allocated.
TEST(Config, ContextParallelSequenceNotInTwoCpChunks_IsRejectedWithTheKeyNamed) {
    const TomlText cp4 = TomlText::gpt2().set("parallel.cp", "4");
    EXPECT_NO_THROW(parse(TomlText(cp4).set("train.seq_len", "32")));
    EXPECT_TRUE(Contains(error_of(TomlText(cp4).set("train.seq_len", "28")),
                         "run.toml: parallel.cp: = 4 cuts each sequence into 2 x cp = 8 equal chunks, but train.seq_len = 28 is not a multiple of 8"));
}

TEST(Config, ContextParallelWithCudnnAttention_IsRejectedWithTheKeyNamed) {
    const TomlText cudnn = TomlText::gpt2().set("parallel.cp", "2").set("train.device", "\"cuda\"").set("model.n_heads", "2");
    EXPECT_TRUE(Contains(error_of(TomlText(cudnn).set("model.attention", "\"cudnn\"")),
                         "run.toml: parallel.cp: = 2 runs attention as a ring of blocks on the native kernels; model.attention = \"cudnn\" cannot take it"));
    EXPECT_NO_THROW(parse(TomlText(cudnn).set("model.attention", "\"native\"")));
}

// Packed documents: causal and no position reset by default; a document mask or position
// reset needs an end-of-text token (the byte vocabulary's, or a tokenizer's), the CPU backend,
// and every model chunk seeing the tokens.
TEST(Config, DocumentMask_DefaultsToCausalAndReadsItsNames) {
    const Config causal = parse(TomlText::gpt2());
    EXPECT_EQ(causal.data.attention_mask, AttentionMask::causal);
    EXPECT_FALSE(causal.data.reset_position_ids);
    const Config document = parse(TomlText::gpt2().set("data.attention_mask", "\"document\"").set("data.reset_position_ids", "true"));
    EXPECT_EQ(document.data.attention_mask, AttentionMask::document);
    EXPECT_TRUE(document.data.reset_position_ids);
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("data.attention_mask", "\"packed\"")), "data.attention_mask"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("data.attention_mask", "\"packed\"")), "document"));
}

TEST(Config, DocumentMaskWithoutATokenizerWithCudnnOrInterleaved_IsRefusedNamingTheKey) {
    const TomlText tokens = TomlText::gpt2().set("data.format", "\"tokens\"").set("data.val_path", literal(val_file()));
    EXPECT_TRUE(Contains(error_of(TomlText(tokens).set("data.attention_mask", "\"document\"")),
                         "run.toml: data.attention_mask: needs the end-of-text token that ends each document: data.format = \"tokens\" has no tokenizer"));
    EXPECT_TRUE(Contains(error_of(TomlText(tokens).set("data.reset_position_ids", "true")), "run.toml: data.reset_position_ids: needs the end-of-text token"));
    EXPECT_NO_THROW(parse(tokens));
    const TomlText cuda = TomlText::gpt2().set("data.attention_mask", "\"document\"").set("train.device", "\"cuda\"").set("model.n_heads", "1");
    EXPECT_NO_THROW(parse(cuda));
    EXPECT_TRUE(Contains(error_of(TomlText(cuda).set("model.attention", "\"cudnn\"")),
                         "data.attention_mask: = \"document\" runs on the native attention kernels; model.attention = \"cudnn\" cannot take it"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("data.attention_mask", "\"document\"").set("model.n_layers", "4").set("parallel.pp", "2")
                                      .set("parallel.virtual_stages", "2").set("train.grad_accum", "2")),
                         "data.attention_mask: needs every model chunk to see its micro-batch's tokens; parallel.virtual_stages = 2"));
}

// Interleaved 1F1B: each stage's layers split into virtual_stages chunks, micro-batches in
// groups of pp, and a pipeline to interleave.
TEST(Config, VirtualStagesThatDoNotFitTheLayout_AreRejectedWithTheKeyNamed) {
    const TomlText two_stages = TomlText::gpt2().set("model.n_layers", "6").set("parallel.pp", "2").set("train.grad_accum", "4");
    EXPECT_NO_THROW(parse(TomlText(two_stages).set("parallel.virtual_stages", "3")));  // 6 layers: 3 per stage, 1 per chunk
    EXPECT_TRUE(Contains(error_of(TomlText(two_stages).set("parallel.virtual_stages", "2")),
                         "run.toml: parallel.virtual_stages: = 2 must divide the layers of each of the parallel.pp = 2 stages"));
    EXPECT_TRUE(Contains(error_of(TomlText(two_stages).set("parallel.virtual_stages", "3").set("train.grad_accum", "3")),
                         "run.toml: train.grad_accum: gives 3 micro-batches per step; parallel.virtual_stages = 3 runs them in groups of parallel.pp = 2 "
                         "stages (allowed: a multiple of 2)"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("parallel.virtual_stages", "2")), "run.toml: parallel.virtual_stages: = 2 interleaves pipeline stages and needs parallel.pp > 1"));
    EXPECT_TRUE(Contains(error_of(TomlText(two_stages).set("parallel.virtual_stages", "3").set("parallel.stage_layers", "'3,3'")),
                         "run.toml: parallel.stage_layers: sets uneven stages; parallel.virtual_stages = 3 needs balanced ones"));
    EXPECT_TRUE(Contains(error_of(TomlText(two_stages).set("parallel.virtual_stages", "0")), "parallel.virtual_stages: 0 is out of range"));
}

// With parallel.dp = 0 the micro-batches of a global batch are known once the world is: the
// partition refuses them before anything is allocated.
TEST(Config, InterleavedGlobalBatchNotInGroupsOfStages_IsRefusedOnTheMesh) {
    const Config config = parse(TomlText::gpt2().set("model.n_layers", "6").set("parallel.pp", "2").set("parallel.virtual_stages", "3")
                                    .set("train.global_batch_size", "12"));
    EXPECT_NO_THROW(require_interleavable_micro_batches(config, 1));  // 6 micro-batches of 2 sequences
    try {
        require_interleavable_micro_batches(config, 2);  // 3 per dp rank
        FAIL() << "3 micro-batches for 2 stages were accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_TRUE(Contains(e.what(), "train.global_batch_size: 12 sequences / (train.batch_size = 2 x dp = 2) gives 3 micro-batches per step; "
                                       "parallel.virtual_stages = 3 runs them in groups of parallel.pp = 2 stages (allowed: a multiple of batch_size x dp x pp = 8)"))
            << e.what();
    }
}

// Neither train.grad_accum nor train.global_batch_size set: a step is one micro-batch, and the
// refusal names virtual_stages and what to set, not a batch key the config never gave.
TEST(Config, InterleavingWithNoBatchKeySet_NamesVirtualStagesAndTheKeyToSet) {
    const std::string error = error_of(TomlText::gpt2().set("model.n_layers", "4").set("parallel.pp", "2").set("parallel.virtual_stages", "2"));
    EXPECT_TRUE(Contains(error, "run.toml: parallel.virtual_stages: = 2 runs the micro-batches of a step in groups of parallel.pp = 2 stages, but a step is "
                                "1 micro-batch (neither train.grad_accum nor train.global_batch_size is set): set train.grad_accum to a multiple of 2"))
        << error;
    EXPECT_FALSE(Contains(error, "global_batch_size:")) << error;
    EXPECT_NO_THROW(parse(TomlText::gpt2().set("model.n_layers", "4").set("parallel.pp", "2").set("parallel.virtual_stages", "2").set("train.grad_accum", "2")));
}

TEST(Config, StageLayers_DefaultToBalancedWithTheRemainderFirst) {
    EXPECT_EQ(parse_stage_layers("", 3, 8), (std::vector<int64_t>{3, 3, 2}));
    EXPECT_EQ(parse_stage_layers(" 1, 3 ", 2, 4), (std::vector<int64_t>{1, 3}));
}

TEST(Config, UnknownMeshOrder_ListsTheAllowedOrders) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("parallel.order", "'tp-tp-dp'")), "parallel.order: \"tp-tp-dp\" is not a known value"));
}

TEST(Config, CheckpointKeys_HaveTheirDefaultsAndRefuseUnknownPolicies) {
    const Config c = parse(TomlText::gpt2().set("checkpoint.every_steps", "100"));
    EXPECT_EQ(c.checkpoint.every_steps, 100);
    EXPECT_EQ(c.checkpoint.keep_last, 3);
    EXPECT_EQ(c.checkpoint.keep_every, 0);
    EXPECT_TRUE(c.checkpoint.async);
    EXPECT_EQ(c.checkpoint.on_save_error, SaveErrorPolicy::warn);
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("checkpoint.on_save_error", "\"ignore\"")), "checkpoint.on_save_error"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("checkpoint.keep_last", "0")), "checkpoint.keep_last"));
    EXPECT_EQ(c.checkpoint.max_failed_saves, 3);
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("checkpoint.max_failed_saves", "0")), "checkpoint.max_failed_saves"));
}

// A resume keeps the saved global batch unless the config states it anew: which keys a config
// states is known, whatever their values (a key left to its default states nothing).
TEST(Config, GivenKeys_AreTheFilesAndTheOverrides_NotTheDefaults) {
    const Config c = parse(TomlText::gpt2().set("checkpoint.every_steps", "100"));
    EXPECT_TRUE(c.states("checkpoint.every_steps"));
    EXPECT_TRUE(c.states("model.n_layers"));
    EXPECT_FALSE(c.states("train.global_batch_size"));
    EXPECT_FALSE(c.states("checkpoint.max_failed_saves"));
    const Config with_set = parse(TomlText::gpt2(), {"train.grad_accum=2"});
    EXPECT_TRUE(with_set.states("train.grad_accum"));
}

// ---- Data files ----

TEST(Config, MissingTrainFile_IsADataErrorNamingKeyAndPath) {
    const std::string message = error_of(TomlText::gpt2().set("data.train_path", "'no-such-corpus.txt'"), {}, ErrorKind::data);
    EXPECT_TRUE(Contains(message, "run.toml: data.train_path: no such file 'no-such-corpus.txt'"));
}

TEST(Config, MissingValFile_IsADataError) {
    const std::string message = error_of(TomlText::gpt2().set("data.val_path", "'no-such-val.txt'"), {}, ErrorKind::data);
    EXPECT_TRUE(Contains(message, "run.toml: data.val_path: no such file 'no-such-val.txt'"));
}

TEST(Config, DirectoryAsTrainFile_IsADataError) {
    const std::string message = error_of(TomlText::gpt2().set("data.train_path", literal(testing::TempDir())), {}, ErrorKind::data);
    EXPECT_TRUE(Contains(message, "run.toml: data.train_path: '" + testing::TempDir() + "' is not a regular file"));
}

TEST(Config, DataFiles_AreCheckedAfterEverythingElse) {
    const std::string message = error_of(TomlText::gpt2().set("data.train_path", "'no-such-corpus.txt'").set("optimizer.lr", "50.0"));
    EXPECT_TRUE(Contains(message, "run.toml: optimizer.lr: 50 is out of range"));
}

// ---- Overrides ----

TEST(Config, Overrides_ChangeValues) {
    const Config c = parse(TomlText::gpt2(), {"train.steps=20", "optimizer.lr=3e-4", "model.family=llama", "metrics.jsonl=false",
                                              "data.token_dtype=\"i32\"", "optimizer.decay = 'linear'"});
    EXPECT_EQ(c.train.steps, 20);
    EXPECT_EQ(c.optimizer.lr, 3e-4);
    EXPECT_EQ(c.model.family, ModelFamily::llama);
    EXPECT_FALSE(c.model.tied_embeddings);  // defaults follow the overridden family
    EXPECT_FALSE(c.metrics.jsonl);
    EXPECT_EQ(c.data.token_dtype, "i32");
    EXPECT_EQ(c.optimizer.decay, LrDecay::linear);
}

TEST(Config, OverrideValueThatIsNoToml_IsTakenAsAString) {
    const Config c = parse(TomlText::gpt2(), {"data.val_path=" + val_file(), "train.sample_prompt=Once upon a time"});
    EXPECT_EQ(c.data.val_path, val_file());
    EXPECT_EQ(c.train.sample_prompt, "Once upon a time");
}

TEST(Config, OverrideOfStringKeyWithNumericText_StaysAString) {
    EXPECT_EQ(parse(TomlText::gpt2(), {"train.sample_prompt=2024"}).train.sample_prompt, "2024");
}

TEST(Config, Override_CanSupplyARequiredKey) {
    EXPECT_EQ(parse(TomlText::gpt2().erase("optimizer.lr"), {"optimizer.lr=0.01"}).optimizer.lr, 0.01);
}

TEST(Config, LaterOverride_Wins) {
    EXPECT_EQ(parse(TomlText::gpt2(), {"train.steps=20", "train.steps=30"}).train.steps, 30);
}

TEST(Config, MalformedOverride_IsRejected) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"steps"}), "run.toml: --set 'steps': expected key.path=value"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"=3"}), "run.toml: --set '=3': expected key.path=value"));
}

TEST(Config, OverrideOfUnknownKey_IsRejectedWithTheSetPrefix) {
    const std::string message = error_of(TomlText::gpt2(), {"model.widht=3"});
    EXPECT_TRUE(Contains(message, "run.toml: --set model.widht=3: model.widht: unknown key (known keys in [model]: family"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"model.n_head=3"}), "did you mean model.n_heads?"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"trainer.steps=3"}), "run.toml: --set trainer.steps=3: trainer: unknown section"));
}

TEST(Config, OverrideOutOfRange_GetsTheSameChecksAsTheFile) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"model.n_layers=0"}),
                         "run.toml: --set model.n_layers=0: model.n_layers: 0 is out of range (allowed: integer in [1, 1024])"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"train.seq_len=4096"}),
                         "run.toml: --set train.seq_len=4096: train.seq_len: must be <= model.max_seq_len = 32 (got 4096)"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"model.d_model=abc"}),
                         "run.toml: --set model.d_model=abc: model.d_model: expected an integer, got a string"));
}

TEST(Config, OverrideOfMissingDataFile_IsADataError) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"data.train_path=foo.txt"}, ErrorKind::data),
                         "run.toml: --set data.train_path=foo.txt: data.train_path: no such file 'foo.txt'"));
}

// ---- Dump and load ----

TEST(Config, DumpThenParse_Gpt2Defaults_YieldsEqualConfig) {
    const Config original = parse(TomlText::gpt2());
    const std::string dumped = dump_config(original);
    EXPECT_FALSE(Contains(dumped, "rope_theta")) << dumped;  // llama-only keys would be rejected for gpt2
    const Config again = parse_config(dumped, "dumped.toml");
    expect_same(original, again);
    EXPECT_EQ(dump_config(again), dumped);
}

TEST(Config, DumpThenParse_EveryKeyChanged_YieldsEqualConfig) {
    const TomlText toml = TomlText::llama()
                              .set("model.n_layers", "3").set("model.d_model", "96").set("model.n_heads", "8")
                              .set("model.n_kv_heads", "2").set("model.d_ff", "300").set("model.vocab_size", "70000").set("model.pad_vocab_to", "128")
                              .set("model.max_seq_len", "64").set("model.norm_eps", "1e-6").set("model.rope_theta", "500000.0")
                              .set("model.qkv_bias", "true").set("model.tied_embeddings", "true").set("model.init_std", "0.1")
                              .set("model.moe.n_experts", "6").set("model.moe.top_k", "3").set("model.moe.d_ff_expert", "40")
                              .set("model.moe.first_dense_layers", "1").set("model.moe.every", "2").set("model.moe.router", "\"sigmoid\"")
                              .set("model.moe.normalize_top_k", "false").set("model.moe.load_balancing", "\"seq_aux_loss\"")
                              .set("model.moe.aux_loss_coeff", "0.001").set("model.moe.z_loss_coeff", "0.002").set("model.moe.capacity_factor", "1.25")
                              .set("data.format", "\"tokens\"").set("data.val_path", literal(val_file()))
                              .set("data.val_fraction", "0.0").set("data.token_dtype", "\"i32\"")
                              .set("data.document_separator", "\"\\n%\\n 'quoted' \\\"double\\\" \\\\ \\t é\"")
                              .set("train.seed", "42").set("train.steps", "1000").set("train.batch_size", "3")
                              .set("train.seq_len", "48").set("train.global_batch_size", "30")
                              .set("train.grad_accum", "5").set("train.eval_every", "7")
                              .set("train.eval_sequences", "9").set("train.log_every", "11").set("train.threads", "2")
                              .set("train.sample_tokens", "13").set("train.sample_prompt", "'The '")
                              .set("train.sample_temperature", "0.7")
                              .set("optimizer.lr", "0.1").set("optimizer.min_lr_ratio", "0.3")
                              .set("optimizer.warmup_steps", "17").set("optimizer.decay", "\"constant\"")
                              .set("optimizer.beta1", "0.8").set("optimizer.beta2", "0.999").set("optimizer.eps", "1e-10")
                              .set("optimizer.weight_decay", "0.01").set("optimizer.grad_clip", "0.0")
                              .set("checkpoint.dir", "'ckpt dir'").set("checkpoint.keep_last", "2")
                              .set("monitor.on_nonfinite", "\"skip\"").set("metrics.jsonl", "false");
    const Config original = parse(toml);
    EXPECT_EQ(original.model.d_ff, 300);
    EXPECT_EQ(original.data.document_separator, "\n%\n 'quoted' \"double\" \\ \t é");
    const std::string dumped = dump_config(original);
    const Config again = parse_config(dumped, "dumped.toml");
    expect_same(original, again);
}

TEST(Config, Dump_GroupsKeysInSectionsWithEffectiveValues) {
    const std::string dumped = dump_config(parse(TomlText::gpt2()));
    for (const char* section : {"[model]", "[data]", "[train]", "[optimizer]", "[parallel]", "[checkpoint]", "[monitor]", "[metrics]"})
        EXPECT_TRUE(Contains(dumped, section));
    EXPECT_TRUE(Contains(dumped, "family = \"gpt2\""));
    EXPECT_TRUE(Contains(dumped, "d_ff = 256"));
    EXPECT_TRUE(Contains(dumped, "norm_eps = 1e-05"));
    EXPECT_TRUE(Contains(dumped, "grad_clip = 1.0"));
    EXPECT_TRUE(Contains(dumped, "on_nonfinite = \"abort\""));
}

TEST(Config, Dump_WritesEverydayNumbersWithoutExponent) {
    const std::string dumped = dump_config(parse(TomlText::llama().set("model.rope_theta", "500000").set("optimizer.lr", "6e-4")));
    EXPECT_TRUE(Contains(dumped, "rope_theta = 500000.0"));
    EXPECT_TRUE(Contains(dumped, "lr = 0.0006"));
    EXPECT_TRUE(Contains(dumped, "eps = 1e-08"));
}

TEST(Config, LoadConfig_ReadsFileSetsSourcePathAndAppliesOverrides) {
    const std::string path = write_temp_file("config_test_run.toml", TomlText::gpt2().str());
    const Config c = load_config(path, {"train.steps=7"});
    EXPECT_EQ(c.source_path, path);
    EXPECT_EQ(c.train.steps, 7);
}

TEST(Config, LoadConfig_ErrorsNameTheFilePath) {
    const std::string path = write_temp_file("config_test_bad.toml", TomlText::gpt2().set("model.n_heads", "3").str());
    try {
        load_config(path);
        FAIL() << "expected an Error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_TRUE(Contains(e.what(), path + ": model.n_heads: must divide"));
    }
}

TEST(Config, LoadConfig_MissingFile_IsAConfigError_Exit2) {
    try {
        load_config(testing::TempDir() + "config_test_does_not_exist.toml");
        FAIL() << "expected an Error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_TRUE(Contains(e.what(), "cannot read config file '" + testing::TempDir() + "config_test_does_not_exist.toml'"));
    }
}

TEST(Config, CommBackend_AutoIsNcclOnCudaAndMpiOnTheCpu) {
    EXPECT_EQ(comm_backend(parse(TomlText::gpt2())), CommBackend::mpi);
    const std::vector<std::string> cuda = {"train.device=\"cuda\"", "model.n_heads=1"};  // head dimension 64
    EXPECT_EQ(comm_backend(parse(TomlText::gpt2(), cuda)), CommBackend::nccl);
    std::vector<std::string> cuda_mpi = cuda;
    cuda_mpi.push_back("parallel.comm=\"mpi\"");
    EXPECT_EQ(comm_backend(parse(TomlText::gpt2(), cuda_mpi)), CommBackend::mpi);
}

TEST(Config, NcclOnTheCpu_IsAConfigErrorNamingTheKey) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"parallel.comm=\"nccl\""}), "parallel.comm: \"nccl\" carries GPU memory and needs train.device = \"cuda\""));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"parallel.comm=\"gloo\""}), "parallel.comm"));
}

TEST(Config, GradReduceDtype_DefaultsToF32AndReadsBackFromItsDump) {
    EXPECT_EQ(parse(TomlText::gpt2()).parallel.grad_reduce_dtype, GradReduceDtype::f32);
    EXPECT_EQ(grad_reduce_dtype(parse(TomlText::gpt2()).parallel, DType::f32), DType::f32);
    const Config c = parse(TomlText::gpt2(), {"parallel.grad_reduce_dtype=\"bf16\""});
    EXPECT_EQ(grad_reduce_dtype(c.parallel, DType::f32), DType::bf16);
    EXPECT_TRUE(Contains(dump_config(c), "grad_reduce_dtype = \"bf16\""));
    EXPECT_EQ(parse_config(dump_config(c), "dumped.toml", {}).parallel.grad_reduce_dtype, GradReduceDtype::bf16);
}

TEST(Config, GradReduceDtypeOtherThanF32OrBf16_IsAConfigErrorNamingTheKeyAndTheChoices) {
    const std::string error = error_of(TomlText::gpt2(), {"parallel.grad_reduce_dtype=\"fp16\""});
    EXPECT_TRUE(Contains(error, "parallel.grad_reduce_dtype")) << error;
    EXPECT_TRUE(Contains(error, "f32") && Contains(error, "bf16")) << error;
}

// ---- ZeRO stage ----

TEST(Config, Zero1_IsRetiredNamingZeroStage) {
    EXPECT_EQ(parse(TomlText::gpt2()).parallel.zero_stage, 1);
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"parallel.zero1=false"}), "parallel.zero1: replaced by parallel.zero_stage"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("parallel.zero1", "true")), "run.toml: parallel.zero1: replaced by parallel.zero_stage"));
}

TEST(Config, ZeroStage_ReadsBackFromItsDump) {
    const Config c = parse(TomlText::gpt2(), {"parallel.zero_stage=2"});
    EXPECT_EQ(c.parallel.zero_stage, 2);
    const Config again = parse_config(dump_config(c), "dumped.toml", {});
    EXPECT_EQ(again.parallel.zero_stage, 2);
    const Config none = parse(TomlText::gpt2(), {"parallel.zero_stage=0"});
    EXPECT_EQ(parse_config(dump_config(none), "dumped.toml", {}).parallel.zero_stage, 0);
}

TEST(Config, ZeroStageOutOfRange_IsRefusedNamingTheKey) {
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"parallel.zero_stage=4"}), "parallel.zero_stage"));
    EXPECT_EQ(parse(TomlText::gpt2(), {"parallel.zero_stage=3"}).parallel.zero_stage, 3);
}

TEST(Config, PrefetchLayers_DefaultsToOneAndRefusesNegativeNamingTheKey) {
    EXPECT_EQ(parse(TomlText::gpt2()).parallel.prefetch_layers, 1);
    EXPECT_EQ(parse(TomlText::gpt2(), {"parallel.zero_stage=3", "parallel.prefetch_layers=0"}).parallel.prefetch_layers, 0);
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"parallel.prefetch_layers=-1"}), "parallel.prefetch_layers"));
}

TEST(Config, OptimizerNameAndFreezeStep_ParseAndAreRangeChecked) {
    EXPECT_EQ(parse(TomlText::gpt2()).optimizer.name, OptimizerName::adamw);
    const Config onebit = parse(TomlText::gpt2(), {"optimizer.name=\"onebit_adam\"", "optimizer.freeze_step=7"});
    EXPECT_EQ(onebit.optimizer.name, OptimizerName::onebit_adam);
    EXPECT_EQ(onebit.optimizer.freeze_step, 7);
    EXPECT_NE(error_of(TomlText::gpt2(), {"optimizer.freeze_step=0"}).find("optimizer.freeze_step"), std::string::npos);
    const std::string bad_name = error_of(TomlText::gpt2(), {"optimizer.name=\"lamb\""});
    EXPECT_NE(bad_name.find("optimizer.name"), std::string::npos) << bad_name;
    EXPECT_NE(bad_name.find("onebit_adam"), std::string::npos) << bad_name;
}

TEST(Config, ShardSizeDefaultsToTheWholeDpGroupAndIsKeptInADump) {
    EXPECT_EQ(parse(TomlText::gpt2()).parallel.shard_size, 0);
    const Config hybrid = parse(TomlText::gpt2(), {"parallel.zero_stage=2", "parallel.shard_size=2"});
    EXPECT_EQ(hybrid.parallel.shard_size, 2);
    EXPECT_EQ(parse_config(dump_config(hybrid), "dumped.toml", {}).parallel.shard_size, 2);
}

// A dense model has no experts to split over ep ranks: refused at parsing, before anything
// is allocated, saying why.
TEST(Config, ExpertParallelOnADenseModel_IsRefusedNamingTheKeyAndWhy) {
    EXPECT_EQ(parse(TomlText::llama()).parallel.ep, 1);
    EXPECT_EQ(error_of(TomlText::llama(), {"parallel.ep=2"}),
              "run.toml: --set parallel.ep=2: parallel.ep: = 2 splits the experts of a mixture-of-experts model; this model (model.family = \"llama\", "
              "model.moe.n_experts = 0) has none (allowed: 1)");
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2().set("parallel.ep", "4")), "this model (model.family = \"gpt2\") has none"));
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"parallel.ep=0"}), "parallel.ep"));
}

// With dp given the stage's ranks are known at parsing: ep must divide tp * cp * dp.
TEST(Config, ExpertParallelNotDividingTheStage_IsRefusedNamingTheKeyAndTheStage) {
    const std::string message = error_of(TomlText::gpt2(), {"parallel.tp=2", "parallel.dp=2", "parallel.ep=3"});
    EXPECT_TRUE(Contains(message, "parallel.ep: = 3 does not divide the ranks of a pipeline stage, tp * cp * dp = 2 * 1 * 2 = 4 (allowed: a divisor of 4)"))
        << message;
}

// seq_aux_loss balances whole sequences, which sequence parallelism cuts across the tp ranks.
TEST(Config, SequenceAuxLossWithSequenceParallelism_IsRefusedNamingBothKeys) {
    const std::vector<std::string> moe = {"model.moe.n_experts=4", "model.moe.load_balancing=\"seq_aux_loss\"", "parallel.tp=2"};
    std::vector<std::string> split = moe;
    split.push_back("parallel.sequence_parallel=true");
    const std::string message = error_of(TomlText::llama(), split);
    EXPECT_TRUE(Contains(message, "model.moe.load_balancing: = \"seq_aux_loss\" balances each sequence's tokens, which parallel.sequence_parallel = true "
                                  "cuts across parallel.tp = 2 ranks")) << message;
    EXPECT_EQ(parse(TomlText::llama(), moe).model.moe.load_balancing, MoeBalancing::seq_aux_loss);
}

TEST(Config, ShardSizeBelowStageTwoOrNegative_IsRefusedNamingTheKey) {
    for (const char* stage : {"parallel.zero_stage=0", "parallel.zero_stage=1"}) {
        const std::string message = error_of(TomlText::gpt2(), {stage, "parallel.shard_size=2"});
        EXPECT_TRUE(Contains(message, "parallel.shard_size: 2 shards the gradients")) << message;
        EXPECT_TRUE(Contains(message, "needs parallel.zero_stage = 2")) << message;
    }
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"parallel.zero_stage=2", "parallel.shard_size=-1"}), "parallel.shard_size"));
}

TEST(Config, Fp8Precision_ParsesItsTableWithTransformerEnginesDefaults) {
    const Config c = parse(TomlText::gpt2(), {"train.precision=\"fp8\""});
    EXPECT_EQ(c.train.precision, Precision::fp8);
    EXPECT_EQ(compute_dtype(c.train), DType::f32);  // the CPU's: only the linears are FP8
    EXPECT_EQ(c.fp8.recipe, Fp8Recipe::current);
    EXPECT_EQ(c.fp8.amax_history_len, 1024);
    EXPECT_EQ(c.fp8.amax_compute, Fp8AmaxCompute::max);
    EXPECT_EQ(c.fp8.format, Fp8Formats::hybrid);
    EXPECT_EQ(c.fp8.bf16_first_layers, 1);
    EXPECT_EQ(c.fp8.bf16_last_layers, 1);
    const Config d = parse(TomlText::gpt2(), {"train.precision=\"fp8\"", "fp8.recipe=\"delayed\"", "fp8.amax_history_len=16",
                                              "fp8.amax_compute=\"most_recent\"", "fp8.margin=2", "fp8.format=\"e4m3\""});
    EXPECT_EQ(d.fp8.recipe, Fp8Recipe::delayed);
    EXPECT_EQ(d.fp8.amax_history_len, 16);
    EXPECT_EQ(d.fp8.amax_compute, Fp8AmaxCompute::most_recent);
    EXPECT_EQ(d.fp8.margin, 2);
    EXPECT_EQ(d.fp8.format, Fp8Formats::e4m3);
    EXPECT_EQ(parse_config(dump_config(d), "dumped.toml", {}).fp8.amax_history_len, 16);
}

TEST(Config, Fp8BadValues_AreRefusedNamingTheKeyAndWhatIsExpected) {
    const std::vector<std::string> fp8 = {"train.precision=\"fp8\""};
    const auto refused = [&](const std::string& key_value, const std::string& expected) {
        std::vector<std::string> overrides = fp8;
        overrides.push_back(key_value);
        const std::string message = error_of(TomlText::gpt2(), overrides);
        EXPECT_TRUE(Contains(message, key_value.substr(0, key_value.find('=')))) << message;
        EXPECT_TRUE(Contains(message, expected)) << message;
    };
    refused("fp8.recipe=\"lazy\"", "delayed");
    refused("fp8.amax_compute=\"mean\"", "most_recent");
    refused("fp8.format=\"e5m2\"", "hybrid");
    refused("fp8.amax_history_len=0", "fp8.amax_history_len");
    refused("fp8.margin=-1", "fp8.margin");
    refused("fp8.bf16_first_layers=-1", "fp8.bf16_first_layers");
    refused("fp8.param_gather=true", "parallel.zero_stage = 3");  // the default stage is 1
    refused("parallel.tp_overlap=true", "train.precision = \"fp8\"");
    const std::string moe = error_of(TomlText::llama(), {"train.precision=\"fp8\"", "model.moe.n_experts=4"});
    EXPECT_TRUE(Contains(moe, "train.precision") && Contains(moe, "mixture-of-experts")) << moe;
    // [fp8] without FP8 says so rather than being ignored.
    EXPECT_TRUE(Contains(error_of(TomlText::gpt2(), {"fp8.recipe=\"delayed\""}), "read only under train.precision = \"fp8\""));
}
