// `llmtrain checkpoint list|verify|inspect|export` and `train.init_from`, through the binary:
// tiny runs save checkpoints, the commands are run on them (and on copies damaged on
// purpose), and an exported model.safetensors is read back by a reader written here from
// the format's description alone.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "checkpoint/hdf5_file.h"
#include "checkpoint/safetensors.h"
#include "config/config.h"
#include "core/dtype.h"
#include "support/file_bytes.h"
#include "test_paths.h"
#include "train/trainer.h"

using namespace llmtrain;
namespace fs = std::filesystem;

namespace {

struct Outcome {
    int exit_code = -1;
    std::string output;  // stdout and stderr
};

Outcome llmtrain_cli(const std::string& args) {
    const std::string command = std::string(LLMTRAIN_BINARY) + " " + args + " 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    Outcome outcome;
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) outcome.output.append(buffer, n);
    const int status = pclose(pipe);
    outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return outcome;
}

using test::read_bytes;
using test::write_bytes;

// A scratch directory of this test process, empty.
std::string scratch(const std::string& name) {
    const std::string dir = test::process_temp_path(name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

// A tiny run. Its training text is exactly one window (seq_len + 1 bytes), so every step
// trains on the same batch: the first step loss of two runs then depends on their weights
// alone, whatever step they start at.
std::string tiny_run(const std::string& dir, const std::string& family, const std::string& more = "") {
    const std::string window = dir + "/one-window.txt";
    if (!fs::exists(window)) write_bytes(window, "Fortune favours!?");
    std::string flags = "train configs/tiny.toml --set model.n_layers=2 --set model.d_model=32 --set train.batch_size=2 --set train.seq_len=16"
                        " --set train.eval_sequences=2 --set train.sample_tokens=0 --set train.threads=1 --set optimizer.warmup_steps=1"
                        " --set data.train_path=" + window + " --set data.val_path=data/fortunes.txt"
                        " --set checkpoint.dir=" + dir + "/checkpoints --set model.family=" + family;
    if (family == "qwen2") flags = std::regex_replace(flags, std::regex("family=qwen2"), "family=llama --set model.qkv_bias=true --set model.n_kv_heads=2");
    return flags + " " + more;
}

// The loss of the first step record of a run directory's log.jsonl.
double first_step_loss(const std::string& run_dir) {
    std::ifstream in(run_dir + "/log.jsonl");
    std::string line;
    while (std::getline(in, line)) {
        const nlohmann::json record = nlohmann::json::parse(line);
        if (record.at("event") == "step") return record.at("loss").get<double>();
    }
    ADD_FAILURE() << "no step record in " << run_dir << "/log.jsonl";
    return 0;
}

// Trains 4 steps saving at 2 and 4, and exports step 2 to dir/hf.
void train_and_export(const std::string& dir, const std::string& family) {
    const Outcome a = llmtrain_cli(tiny_run(dir, family, "--set train.steps=4 --set checkpoint.every_steps=2 --run-dir " + dir + "/a"));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    const Outcome e = llmtrain_cli("checkpoint export " + dir + "/checkpoints/step_00000002 --format safetensors " + dir + "/hf");
    ASSERT_EQ(e.exit_code, 0) << e.output;
    EXPECT_TRUE(fs::exists(dir + "/hf/model.safetensors") && fs::exists(dir + "/hf/config.json"));
}

// Resuming step 2 and starting from its export give the same first loss, bit for bit: the
// export carried every weight exactly (fp32) into Hugging Face's layout and back.
void expect_init_from_export_matches_resume(const std::string& family) {
    const std::string dir = scratch("init-from-" + family);
    train_and_export(dir, family);
    // A checkpoint found by --resume wins over train.init_from (here a path that does not exist).
    const Outcome resumed = llmtrain_cli(tiny_run(dir, family, "--set train.steps=4 --set train.init_from=" + dir + "/no-such-weights --resume " + dir +
                                                              "/checkpoints/step_00000002 --run-dir " + dir + "/b"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    const Outcome started = llmtrain_cli(tiny_run(dir, family, "--set train.steps=4 --set train.init_from=" + dir + "/hf --run-dir " + dir + "/c"));
    ASSERT_EQ(started.exit_code, 0) << started.output;
    EXPECT_NE(started.output.find("train.init_from"), std::string::npos) << started.output;
    EXPECT_EQ(first_step_loss(dir + "/b"), first_step_loss(dir + "/c"));
    // ... and not because the weights were never loaded: the random initialization differs.
    EXPECT_NE(first_step_loss(dir + "/a"), first_step_loss(dir + "/c"));
}

// ---- an independent safetensors reader ----

struct StEntry {
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;
};

struct StFile {
    std::map<std::string, StEntry> entries;
    std::string data;  // the bytes after the header
    std::vector<float> values(const std::string& name) const {
        const StEntry& e = entries.at(name);
        std::vector<float> v((e.end - e.begin) / 4);
        std::memcpy(v.data(), data.data() + e.begin, e.end - e.begin);
        return v;
    }
};

StFile read_safetensors_independently(const std::string& path) {
    const std::string bytes = read_bytes(path);
    StFile file;
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes.at(static_cast<size_t>(i)));
    EXPECT_LE(8 + n, bytes.size());
    EXPECT_EQ((8 + n) % 8, 0u) << "the data starts 8-byte aligned";
    std::string header = bytes.substr(8, n);
    const size_t close = header.rfind('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "the header is padded with spaces only";
    const nlohmann::json j = nlohmann::json::parse(header);
    EXPECT_EQ(j.at("__metadata__").at("format"), "pt");
    file.data = bytes.substr(8 + n);
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const auto& [name, value] : j.items()) {
        if (name == "__metadata__") continue;
        StEntry e{value.at("dtype").get<std::string>(), value.at("shape").get<std::vector<int64_t>>(), value.at("data_offsets").at(0).get<uint64_t>(),
                  value.at("data_offsets").at(1).get<uint64_t>()};
        int64_t numel = 1;
        for (int64_t d : e.shape) numel *= d;
        EXPECT_EQ(e.dtype, "F32") << name;
        EXPECT_EQ(e.end - e.begin, static_cast<uint64_t>(numel) * 4) << name;
        ranges.emplace_back(e.begin, e.end);
        file.entries[name] = e;
    }
    std::sort(ranges.begin(), ranges.end());
    uint64_t at = 0;
    for (const auto& [begin, end] : ranges) {
        EXPECT_EQ(begin, at) << "tensors lie back to back from offset 0";
        at = end;
    }
    EXPECT_EQ(at, file.data.size()) << "the last tensor ends at the end of the file";
    return file;
}

// The checkpoint's own values of a weight (one rank: whole tensors), [out, in] as trained.
std::vector<double> checkpoint_values(const std::string& checkpoint, const std::string& name) {
    const RankFileReader reader(checkpoint + "/rank_00000.h5");
    for (const SavedTensor& t : reader.tensors())
        if (t.dataset == "model/" + name) return reader.read(t);
    ADD_FAILURE() << "no tensor " << name;
    return {};
}

using Shape64 = std::vector<int64_t>;

}  // namespace

TEST(CheckpointExport, Gpt2_InitFromTheExport_GivesBitwiseTheFirstLossOfResumingTheCheckpoint) { expect_init_from_export_matches_resume("gpt2"); }

TEST(CheckpointExport, Llama_InitFromTheExport_GivesBitwiseTheFirstLossOfResumingTheCheckpoint) { expect_init_from_export_matches_resume("llama"); }

TEST(CheckpointExport, Gpt2Safetensors_HoldHuggingFaceNamesConv1dLayoutsAndTheCheckpointsValues) {
    const std::string dir = scratch("export-gpt2");
    train_and_export(dir, "gpt2");
    const StFile file = read_safetensors_independently(dir + "/hf/model.safetensors");
    const int64_t C = 32, V = 257, T = 128;
    const std::map<std::string, Shape64> expected = {
        {"transformer.wte.weight", {V, C}},          {"transformer.wpe.weight", {T, C}},          {"transformer.ln_f.weight", {C}},
        {"transformer.h.1.attn.c_attn.weight", {C, 3 * C}}, {"transformer.h.1.attn.c_attn.bias", {3 * C}},
        {"transformer.h.1.attn.c_proj.weight", {C, C}},     {"transformer.h.1.mlp.c_fc.weight", {C, 4 * C}},
        {"transformer.h.1.mlp.c_proj.weight", {4 * C, C}},  {"transformer.h.0.ln_2.bias", {C}}};
    for (const auto& [name, shape] : expected) {
        ASSERT_TRUE(file.entries.count(name)) << name;
        EXPECT_EQ(file.entries.at(name).shape, shape) << name;
    }
    EXPECT_EQ(file.entries.size(), 2u + 12u * 2u + 2u);
    EXPECT_FALSE(file.entries.count("lm_head.weight")) << "tied: transformers ties the head to wte itself";
    // Conv1D: HF [in, out] (c, r) is our [out, in] (r, c).
    const std::string checkpoint = dir + "/checkpoints/step_00000002";
    const std::vector<double> ours = checkpoint_values(checkpoint, "transformer.h.1.attn.c_attn.weight");
    const std::vector<float> hf = file.values("transformer.h.1.attn.c_attn.weight");
    for (const auto& [r, c] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {95, 31}, {40, 7}, {64, 30}})
        EXPECT_EQ(hf[static_cast<size_t>(c * 3 * C + r)], static_cast<float>(ours[static_cast<size_t>(r * C + c)])) << r << ", " << c;
    const std::vector<double> wte = checkpoint_values(checkpoint, "transformer.wte.weight");
    for (size_t i : {size_t{0}, size_t{5000}, wte.size() - 1}) EXPECT_EQ(file.values("transformer.wte.weight")[i], static_cast<float>(wte[i]));
    const nlohmann::json config = nlohmann::json::parse(read_bytes(dir + "/hf/config.json"));
    EXPECT_EQ(config.at("model_type"), "gpt2");
    EXPECT_EQ(config.at("architectures").at(0), "GPT2LMHeadModel");
    EXPECT_EQ(config.at("n_embd"), C);
    EXPECT_EQ(config.at("n_layer"), 2);
    EXPECT_EQ(config.at("n_head"), 4);
    EXPECT_EQ(config.at("n_positions"), T);
    EXPECT_EQ(config.at("vocab_size"), V);
    EXPECT_EQ(config.at("tie_word_embeddings"), true);
    EXPECT_DOUBLE_EQ(config.at("layer_norm_epsilon").get<double>(), 1e-5);
}

TEST(CheckpointExport, Qwen2Safetensors_HoldLinearLayoutsBiasesAndAnUntiedHead) {
    const std::string dir = scratch("export-qwen2");
    train_and_export(dir, "qwen2");
    const StFile file = read_safetensors_independently(dir + "/hf/model.safetensors");
    const int64_t C = 32, V = 257, kv = 2 * 8;
    const nlohmann::json config = nlohmann::json::parse(read_bytes(dir + "/hf/config.json"));
    EXPECT_EQ(config.at("model_type"), "qwen2");
    EXPECT_EQ(config.at("architectures").at(0), "Qwen2ForCausalLM");
    EXPECT_EQ(config.at("num_key_value_heads"), 2);
    EXPECT_EQ(config.at("tie_word_embeddings"), false);
    EXPECT_EQ(config.at("torch_dtype"), "float32");
    const int64_t F = config.at("intermediate_size").get<int64_t>();
    const std::map<std::string, Shape64> expected = {
        {"model.embed_tokens.weight", {V, C}}, {"lm_head.weight", {V, C}}, {"model.norm.weight", {C}},
        {"model.layers.0.self_attn.q_proj.weight", {C, C}}, {"model.layers.0.self_attn.k_proj.weight", {kv, C}},
        {"model.layers.0.self_attn.k_proj.bias", {kv}},     {"model.layers.0.self_attn.o_proj.weight", {C, C}},
        {"model.layers.1.mlp.gate_proj.weight", {F, C}},    {"model.layers.1.mlp.down_proj.weight", {C, F}}};
    for (const auto& [name, shape] : expected) {
        ASSERT_TRUE(file.entries.count(name)) << name;
        EXPECT_EQ(file.entries.at(name).shape, shape) << name;
    }
    const std::string checkpoint = dir + "/checkpoints/step_00000002";
    for (const std::string name : {"model.layers.1.self_attn.v_proj.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.bias"}) {
        const std::vector<double> ours = checkpoint_values(checkpoint, name);
        const std::vector<float> hf = file.values(name);
        ASSERT_EQ(hf.size(), ours.size()) << name;
        for (size_t i : {size_t{0}, ours.size() / 3, ours.size() - 1}) EXPECT_EQ(hf[i], static_cast<float>(ours[i])) << name << "[" << i << "]";
    }
}

TEST(CheckpointCli, ListVerifyInspect_TellGoodIncompleteDamagedAndTruncatedCheckpointsApart) {
    const std::string dir = scratch("cli");
    // 11 layers: the table lists layer 2 before layer 10.
    const Outcome a = llmtrain_cli(tiny_run(dir, "gpt2", "--set model.n_layers=11 --set train.steps=4 --set checkpoint.every_steps=2 --run-dir " + dir + "/a"));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    const std::string root = dir + "/checkpoints";
    // A save that did not finish: no manifest.
    fs::copy(root + "/step_00000004", root + "/step_00000006", fs::copy_options::recursive);
    fs::remove(root + "/step_00000006/manifest.json");

    const Outcome list = llmtrain_cli("checkpoint list " + root);
    EXPECT_EQ(list.exit_code, 0) << list.output;
    // list's file count and verify's rank files say the same thing: 2 files = 1 rank file + manifest.json.
    EXPECT_NE(list.output.find("files  status (files: rank files + manifest.json)\n"), std::string::npos) << list.output;
    EXPECT_TRUE(std::regex_search(list.output, std::regex(R"(\n2 +[0-9.]+ +2  ok\n)"))) << list.output;
    EXPECT_TRUE(std::regex_search(list.output, std::regex(R"(\n4 +[0-9.]+ +2  ok  <- latest\n)"))) << list.output;
    EXPECT_TRUE(std::regex_search(list.output, std::regex(R"(\n6 +[0-9.]+ +1  incomplete \(no manifest\)\n)"))) << list.output;

    const Outcome good = llmtrain_cli("checkpoint verify " + root + "/step_00000002");
    EXPECT_EQ(good.exit_code, 0) << good.output;
    EXPECT_NE(good.output.find("step_00000002: ok (step 2, 1 rank file(s) and manifest.json: 2 files, "), std::string::npos) << good.output;
    const Outcome all = llmtrain_cli("checkpoint verify " + root);
    EXPECT_EQ(all.exit_code, 2) << all.output;
    EXPECT_NE(all.output.find("step_00000004: ok"), std::string::npos) << all.output;
    EXPECT_NE(all.output.find("step_00000006: INCOMPLETE (no manifest.json)"), std::string::npos) << all.output;
    EXPECT_NE(all.output.find("llmtrain: data error: 1 of 3 checkpoint(s) failed verification"), std::string::npos) << all.output;

    const Outcome inspect = llmtrain_cli("checkpoint inspect " + root + "/step_00000004");
    EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
    for (const char* pattern : {R"(step +4\n)", R"(tokens seen +128\n)", R"(optimizer steps +4\n)", R"(loss scale +1 )",
                                R"(mesh +tp 1 x dp 1 x pp 1 = 1 rank\(s\), ZeRO-1 off)", R"(rank_00000\.h5 +[0-9.]+ MB)",
                                R"(transformer\.wte\.weight +\[257, 32\] +whole +rank 0 +rank 0)", R"(transformer\.h\.1\.attn\.c_attn\.weight +\[96, 32\])"})
        EXPECT_TRUE(std::regex_search(inspect.output, std::regex(pattern))) << pattern << "\n" << inspect.output;
    EXPECT_LT(inspect.output.find("transformer.h.2.ln_1.bias"), inspect.output.find("transformer.h.10.ln_1.bias")) << inspect.output;
    const Outcome config = llmtrain_cli("checkpoint inspect --config " + root);
    EXPECT_EQ(config.exit_code, 0);
    EXPECT_TRUE(std::regex_search(config.output, std::regex(R"(\[model\][^[]*d_model = 32)"))) << config.output;

    // One byte flipped inside the embedding's stored values: found by its bytes in the file.
    const std::string flipped = dir + "/flipped/step_00000002";
    fs::create_directories(dir + "/flipped");
    fs::copy(root + "/step_00000002", flipped, fs::copy_options::recursive);
    std::vector<float> wte;
    for (double v : checkpoint_values(flipped, "transformer.wte.weight")) wte.push_back(static_cast<float>(v));
    std::string file = read_bytes(flipped + "/rank_00000.h5");
    const std::string needle(reinterpret_cast<const char*>(wte.data() + 4000), 64);
    const size_t at = file.find(needle);
    ASSERT_NE(at, std::string::npos);
    file[at + 9] = static_cast<char>(file[at + 9] ^ 0x10);
    write_bytes(flipped + "/rank_00000.h5", file);
    const Outcome damaged = llmtrain_cli("checkpoint verify " + flipped);
    EXPECT_EQ(damaged.exit_code, 2) << damaged.output;
    EXPECT_NE(damaged.output.find("rank_00000.h5' fails its XXH64 checksum"), std::string::npos) << damaged.output;
    EXPECT_TRUE(std::regex_search(damaged.output, std::regex(R"(rank_00000\.h5': tensor 'model/transformer\.wte\.weight' is damaged)"))) << damaged.output;
    EXPECT_TRUE(std::regex_search(damaged.output, std::regex(R"(llmtrain: data error: .*fails its XXH64 checksum.*; .*tensor 'model/transformer\.wte\.weight' is damaged)")))
        << "the error line names the file and the tensor\n" << damaged.output;
    EXPECT_EQ(std::count(damaged.output.begin(), damaged.output.end(), '\n'), 3) << "the verdict, the one damaged tensor, the error line\n" << damaged.output;

    // A truncated rank file.
    const std::string truncated = dir + "/truncated/step_00000002";
    fs::create_directories(dir + "/truncated");
    fs::copy(root + "/step_00000002", truncated, fs::copy_options::recursive);
    fs::resize_file(truncated + "/rank_00000.h5", fs::file_size(truncated + "/rank_00000.h5") / 2);
    const Outcome cut = llmtrain_cli("checkpoint verify " + truncated);
    EXPECT_EQ(cut.exit_code, 2) << cut.output;
    EXPECT_TRUE(std::regex_search(cut.output, std::regex(R"(rank_00000\.h5' has [0-9]+ bytes, the manifest says [0-9]+ \(truncated\?\))"))) << cut.output;
    EXPECT_EQ(llmtrain_cli("checkpoint export " + truncated + " " + dir + "/no-export").exit_code, 2);
}

TEST(CheckpointCli, InitFromWeightsOfAnotherModel_NamesTheTensorAndLeavesNoRunBehind) {
    const std::string dir = scratch("mismatch");
    train_and_export(dir, "gpt2");
    const Outcome wider = llmtrain_cli(tiny_run(dir, "gpt2", "--set train.steps=1 --set model.d_model=64 --set train.init_from=" + dir +
                                                           "/hf/model.safetensors --run-dir " + dir + "/wider"));
    EXPECT_EQ(wider.exit_code, 2) << wider.output;
    EXPECT_NE(wider.output.find("tensor transformer.wte.weight: checkpoint [257, 32], model [257, 64]"), std::string::npos) << wider.output;
    EXPECT_FALSE(fs::exists(dir + "/wider/log.jsonl"));
    const Outcome llama = llmtrain_cli(tiny_run(dir, "llama", "--set train.steps=1 --set train.init_from=" + dir + "/hf --run-dir " + dir + "/llama"));
    EXPECT_EQ(llama.exit_code, 2) << llama.output;
    EXPECT_NE(llama.output.find("holds no tensor 'model.embed_tokens.weight'"), std::string::npos) << llama.output;
}

// Hugging Face's own GPT-2 files are bf16 or f32, and name GPT2Model's tensors without
// "transformer.": both load, values rounded as bf16.
TEST(CheckpointImport, Bf16WeightsWithoutTheTransformerPrefix_LoadIntoThisRanksParameters) {
    const std::string dir = scratch("bf16");
    train_and_export(dir, "gpt2");
    const StFile f32 = read_safetensors_independently(dir + "/hf/model.safetensors");
    nlohmann::ordered_json header;
    std::string data;
    for (const auto& [name, e] : f32.entries) {
        const std::vector<float> values = f32.values(name);
        const std::string short_name = name.substr(std::strlen("transformer."));
        header[short_name] = {{"dtype", "BF16"}, {"shape", e.shape}, {"data_offsets", {data.size(), data.size() + 2 * values.size()}}};
        for (float v : values) {
            const uint16_t bits = float_to_bf16(v);
            data.append(reinterpret_cast<const char*>(&bits), 2);
        }
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t n = text.size();
    write_bytes(dir + "/bf16.safetensors", std::string(reinterpret_cast<const char*>(&n), 8) + text + data);

    const Config config = load_config("configs/tiny.toml", {"model.n_layers=2", "model.d_model=32", "train.batch_size=2", "train.seq_len=16",
                                                            "train.threads=1", "data.train_path=\"" + dir + "/one-window.txt\"", "data.val_path=\"data/fortunes.txt\""});
    Trainer trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true});
    trainer.load_initial_weights(dir + "/bf16.safetensors");
    const Parameters& params = trainer.model().parameters();
    const auto bf16 = [](float v) { return bf16_to_float(float_to_bf16(v)); };
    const size_t qkv = params.index_of("transformer.h.0.attn.c_attn.weight");
    const float* ours = params.master_value(qkv).data<float>();
    const std::vector<float> hf = f32.values("transformer.h.0.attn.c_attn.weight");
    for (const auto& [r, c] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {95, 31}, {40, 7}})
        EXPECT_EQ(ours[r * 32 + c], bf16(hf[static_cast<size_t>(c * 96 + r)])) << r << ", " << c;
    const float* wte = params.master_value(params.index_of("transformer.wte.weight")).data<float>();
    EXPECT_EQ(wte[8000], bf16(f32.values("transformer.wte.weight")[8000]));
}

// Vocabulary rows beyond model.vocab_size (padding) are cut on export and zero on import.
TEST(CheckpointImport, PaddedVocabularyRows_MapToNoHuggingFaceRow) {
    EXPECT_EQ(hf_shape("model.embed_tokens.weight", {264, 32}, 257).str(), "[257, 32]");
    EXPECT_EQ(hf_shape("transformer.h.0.mlp.c_fc.weight", {128, 32}, 257).str(), "[32, 128]");
    EXPECT_EQ(hf_index("lm_head.weight", {264, 32}, 257, 256 * 32 + 3), 256 * 32 + 3);
    EXPECT_EQ(hf_index("lm_head.weight", {264, 32}, 257, 257 * 32), -1);
    EXPECT_EQ(hf_index("transformer.h.0.mlp.c_fc.weight", {128, 32}, 257, 1 * 32 + 2), 2 * 128 + 1);
}
