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
    if (family == "moe")
        flags = std::regex_replace(flags, std::regex("family=moe"), "family=llama --set model.n_kv_heads=2 --set model.moe.n_experts=4 --set model.moe.top_k=2"
                                                                    " --set model.moe.d_ff_expert=48");
    // Qwen2-MoE's shape: QKV biases, a dense first layer, a gated shared expert, unnormalized gates.
    if (family == "qwen2moe")
        flags = std::regex_replace(flags, std::regex("family=qwen2moe"),
                                   "family=llama --set model.qkv_bias=true --set model.n_kv_heads=2 --set model.moe.n_experts=4 --set model.moe.top_k=2"
                                   " --set model.moe.d_ff_expert=48 --set model.moe.first_dense_layers=1 --set model.moe.n_shared_experts=1"
                                   " --set model.moe.shared_expert_gate=true --set model.moe.normalize_top_k=false");
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

// Writes a safetensors file of these tensors (name -> dtype, shape, bytes) as the format
// describes it, without padding between tensors.
struct StTensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::string bytes;
};
void write_safetensors_independently(const std::string& path, const std::map<std::string, StTensor>& tensors) {
    nlohmann::ordered_json header;
    std::string data;
    for (const auto& [name, t] : tensors) {
        header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
        data += t.bytes;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t n = text.size();
    write_bytes(path, std::string(reinterpret_cast<const char*>(&n), 8) + text + data);
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
    std::map<std::string, StTensor> bf16_tensors;
    for (const auto& [name, e] : f32.entries) {
        StTensor& t = bf16_tensors[name.substr(std::strlen("transformer."))] = {"BF16", e.shape, ""};
        for (float v : f32.values(name)) {
            const uint16_t bits = float_to_bf16(v);
            t.bytes.append(reinterpret_cast<const char*>(&bits), 2);
        }
    }
    write_safetensors_independently(dir + "/bf16.safetensors", bf16_tensors);

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

// ---- mixture-of-experts models as Mixtral ----

namespace {

// The logits of the tiny MoE model of tiny_run(dir, "moe") started from `weights` (a checkpoint
// or Hugging Face weights, as train.init_from reads them; "": the random initialization) on
// one fixed batch, f32 as computed.
std::vector<float> moe_logits(const std::string& dir, const std::string& weights) {
    const Config config = load_config("configs/tiny.toml", {"model.n_layers=2", "model.d_model=32", "model.family=\"llama\"", "model.n_kv_heads=2",
                                                            "model.moe.n_experts=4", "model.moe.top_k=2", "model.moe.d_ff_expert=48", "train.batch_size=2",
                                                            "train.seq_len=16", "train.threads=1", "data.train_path=\"" + dir + "/one-window.txt\"",
                                                            "data.val_path=\"data/fortunes.txt\""});
    Trainer trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true});
    if (!weights.empty()) trainer.load_initial_weights(weights);
    const int64_t B = 2, T = 16;
    OwnedTensor tokens(DType::i32, {B * T}), targets(DType::i32, {B * T});
    for (int64_t i = 0; i < B * T; ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + 11) % 257), targets.data<int32_t>()[i] = static_cast<int32_t>(i % 257);
    trainer.model().forward(tokens, targets, B, T);
    const Tensor logits = trainer.model().logits();
    EXPECT_EQ(logits.dtype(), DType::f32);
    return std::vector<float>(logits.data<float>(), logits.data<float>() + logits.numel());
}

// config.json of the model `base` plus `key` is refused as Error(unsupported) saying `why`.
void expect_export_refused(std::vector<std::string> base, const std::string& key, const std::string& why) {
    base.push_back(key);
    try {
        hf_config_json(load_config("configs/tiny.toml", base, DataFiles::unchecked).model);
        ADD_FAILURE() << key << " was exported";
    } catch (const Error& error) {
        EXPECT_EQ(error.kind(), ErrorKind::unsupported) << key;
        EXPECT_NE(std::string(error.what()).find(why), std::string::npos) << error.what();
    }
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Mixtral's names back to ours (Qwen2-MoE's), written here from the two models' layouts.
std::string qwen2_moe_name(const std::string& mixtral) {
    std::string name = std::regex_replace(mixtral, std::regex(R"(\.block_sparse_moe\.)"), ".mlp.");
    for (const auto& [theirs, ours] : {std::pair{"w1", "gate_proj"}, {"w3", "up_proj"}, {"w2", "down_proj"}})
        name = std::regex_replace(name, std::regex(std::string(R"((\.experts\.[0-9]+\.))") + theirs + R"(\.weight$)"), std::string("$1") + ours + ".weight");
    return name;
}

}  // namespace

TEST(CheckpointExport, Moe_IsMixtralForCausalLM_ItsConfigKeysAndExpertTensorsNamedAsMixtrals) {
    const std::string dir = scratch("export-moe");
    train_and_export(dir, "moe");
    const nlohmann::json config = nlohmann::json::parse(read_bytes(dir + "/hf/config.json"));
    EXPECT_EQ(config.at("architectures"), nlohmann::json::array({"MixtralForCausalLM"}));
    EXPECT_EQ(config.at("model_type"), "mixtral");
    EXPECT_EQ(config.at("num_local_experts"), 4);
    EXPECT_EQ(config.at("num_experts_per_tok"), 2);
    EXPECT_EQ(config.at("intermediate_size"), 48) << "each expert's width (model.moe.d_ff_expert)";
    EXPECT_DOUBLE_EQ(config.at("router_aux_loss_coef").get<double>(), 0.01);
    EXPECT_EQ(config.at("output_router_logits"), false);
    EXPECT_DOUBLE_EQ(config.at("router_jitter_noise").get<double>(), 0.0);
    EXPECT_TRUE(config.at("sliding_window").is_null());
    EXPECT_EQ(config.at("hidden_size"), 32);
    EXPECT_EQ(config.at("num_hidden_layers"), 2);
    EXPECT_EQ(config.at("num_attention_heads"), 4);
    EXPECT_EQ(config.at("num_key_value_heads"), 2);
    EXPECT_EQ(config.at("head_dim"), 8);
    EXPECT_EQ(config.at("hidden_act"), "silu");
    EXPECT_EQ(config.at("tie_word_embeddings"), false);
    EXPECT_DOUBLE_EQ(config.at("rope_theta").get<double>(), 10000.0) << "Mixtral's default is 1e6: it must be written";
    EXPECT_DOUBLE_EQ(config.at("rms_norm_eps").get<double>(), 1e-5);
    EXPECT_FALSE(config.contains("attention_bias")) << "not a Mixtral key";

    const StFile file = read_safetensors_independently(dir + "/hf/model.safetensors");
    const int64_t C = 32, F = 48, E = 4;
    const std::map<std::string, Shape64> expected = {
        {"model.layers.0.block_sparse_moe.gate.weight", {E, C}},         {"model.layers.1.block_sparse_moe.experts.3.w1.weight", {F, C}},
        {"model.layers.1.block_sparse_moe.experts.3.w3.weight", {F, C}}, {"model.layers.1.block_sparse_moe.experts.3.w2.weight", {C, F}},
        {"model.layers.0.self_attn.k_proj.weight", {16, C}},             {"model.layers.0.post_attention_layernorm.weight", {C}}};
    for (const auto& [name, shape] : expected) {
        ASSERT_TRUE(file.entries.count(name)) << name;
        EXPECT_EQ(file.entries.at(name).shape, shape) << name;
    }
    // embed, head, final norm; per layer 2 norms, 4 attention projections, the router, 3 per expert.
    EXPECT_EQ(file.entries.size(), 3u + 2u * (2u + 4u + 1u + 3u * 4u));
    for (const auto& [name, e] : file.entries) EXPECT_EQ(name.find(".mlp."), std::string::npos) << name << ": not one of Mixtral's names";
    const std::string checkpoint = dir + "/checkpoints/step_00000002";
    for (const auto& [ours, theirs] : std::map<std::string, std::string>{
             {"model.layers.1.mlp.gate.weight", "model.layers.1.block_sparse_moe.gate.weight"},
             {"model.layers.1.mlp.experts.2.gate_proj.weight", "model.layers.1.block_sparse_moe.experts.2.w1.weight"},
             {"model.layers.1.mlp.experts.2.up_proj.weight", "model.layers.1.block_sparse_moe.experts.2.w3.weight"},
             {"model.layers.0.mlp.experts.3.down_proj.weight", "model.layers.0.block_sparse_moe.experts.3.w2.weight"}}) {
        const std::vector<double> trained = checkpoint_values(checkpoint, ours);
        const std::vector<float> exported = file.values(theirs);
        ASSERT_EQ(exported.size(), trained.size()) << theirs;
        for (size_t i = 0; i < trained.size(); ++i) ASSERT_EQ(exported[i], static_cast<float>(trained[i])) << theirs << "[" << i << "]";
    }
}

// The export read back by train.init_from, in Mixtral's names and in ours, computes the
// checkpoint's logits bit for bit (f32); the random initialization's differ.
TEST(CheckpointExport, Moe_InitFromTheExportInMixtralsOrOurNames_GivesTheCheckpointsLogitsBitwise) {
    const std::string dir = scratch("init-from-moe");
    train_and_export(dir, "moe");
    const StFile mixtral = read_safetensors_independently(dir + "/hf/model.safetensors");
    std::map<std::string, StTensor> ours;
    for (const auto& [name, e] : mixtral.entries) ours[qwen2_moe_name(name)] = {"F32", e.shape, mixtral.data.substr(e.begin, e.end - e.begin)};
    ASSERT_TRUE(ours.count("model.layers.1.mlp.experts.3.up_proj.weight"));
    write_safetensors_independently(dir + "/ours.safetensors", ours);

    const std::vector<float> checkpoint = moe_logits(dir, dir + "/checkpoints/step_00000002");
    EXPECT_TRUE(bitwise_equal(moe_logits(dir, dir + "/hf"), checkpoint));
    EXPECT_TRUE(bitwise_equal(moe_logits(dir, dir + "/ours.safetensors"), checkpoint));
    EXPECT_FALSE(bitwise_equal(moe_logits(dir, ""), checkpoint)) << "the weights were loaded: the random initialization computes other logits";
}

// A model MixtralForCausalLM does not compute is refused with the key and the reason, before
// anything is written; config.json alone says the same for every such key.
TEST(CheckpointExport, MoeThatNoHuggingFaceClassComputes_IsRefusedNamingTheKeyAndWhy) {
    const std::string dir = scratch("export-moe-sigmoid");
    const Outcome a = llmtrain_cli(tiny_run(dir, "moe", "--set model.moe.router=sigmoid --set train.steps=2 --set checkpoint.every_steps=2 --run-dir " + dir + "/a"));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    const Outcome e = llmtrain_cli("checkpoint export " + dir + "/checkpoints/step_00000002 " + dir + "/hf");
    EXPECT_EQ(e.exit_code, 2) << e.output;
    EXPECT_NE(e.output.find("model.moe.router = \"sigmoid\": MixtralForCausalLM routes by a softmax over all experts"), std::string::npos) << e.output;
    EXPECT_FALSE(fs::exists(dir + "/hf")) << "nothing is left behind";

    const Config base = load_config("configs/tiny.toml", {"model.family=\"llama\"", "model.moe.n_experts=4", "model.n_layers=2"}, DataFiles::unchecked);
    EXPECT_EQ(nlohmann::json::parse(hf_config_json(base.model)).at("model_type"), "mixtral");
    const std::vector<std::pair<std::string, std::string>> refused = {
        {"model.moe.normalize_top_k=false", "model.moe.normalize_top_k = false: MixtralForCausalLM renormalizes the chosen experts' scores to sum to one "
                                            "(Qwen2MoeForCausalLM, which need not, always adds a shared expert"},
        {"model.moe.first_dense_layers=1", "model.moe.first_dense_layers = 1: every layer of MixtralForCausalLM is a mixture-of-experts layer"},
        {"model.moe.every=2", "model.moe.every = 2: every layer of MixtralForCausalLM is a mixture-of-experts layer"},
        {"model.qkv_bias=true", "model.qkv_bias = true: MixtralForCausalLM's attention has no biases"}};
    for (const auto& [key, why] : refused) expect_export_refused({"model.family=\"llama\"", "model.moe.n_experts=4", "model.n_layers=2"}, key, why);
}

// Weights whose experts do not fit model.moe stop the run before it starts (no log.jsonl),
// naming the key and the value the weights need.
TEST(CheckpointImport, MoeWeightsThatDoNotFitModelMoe_AreRefusedNamingTheKeyAndTheValueTheyNeed) {
    const std::string dir = scratch("moe-mismatch");
    train_and_export(dir, "moe");
    const std::string hf = dir + "/hf";
    const std::string file = hf + "/model.safetensors";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--set model.moe.n_experts=8", "model.moe.n_experts = 8 here: the weights of train.init_from '" + file +
                                            "' hold 4 experts in layer 0 (model.layers.0.block_sparse_moe.experts.0.w1.weight); expected model.moe.n_experts = 4"},
        {"--set model.moe.d_ff_expert=64", "model.moe.d_ff_expert = 64 here: the weights of train.init_from '" + file +
                                               "' hold experts 48 wide (model.layers.0.block_sparse_moe.experts.0.w1.weight: [48, 32]); expected model.moe.d_ff_expert = 48"},
        {"--set model.moe.first_dense_layers=1", "model.moe.first_dense_layers = 1 here: the weights of train.init_from '" + file +
                                                     "' make layer 0 a mixture-of-experts layer, this config makes it dense; expected model.moe.first_dense_layers = 0"},
        {"--set model.moe.n_experts=0", "model.moe.n_experts = 0 (a dense model) here: the weights of train.init_from '" + file +
                                            "' hold 4 experts in layer 0 (model.layers.0.block_sparse_moe.experts.0.w1.weight); expected model.moe.n_experts = 4"}};
    int i = 0;
    for (const auto& [key, message] : cases) {
        const std::string run = dir + "/run" + std::to_string(i++);
        const Outcome o = llmtrain_cli(tiny_run(dir, "moe", "--set train.steps=1 " + key + " --set train.init_from=" + hf + " --run-dir " + run));
        EXPECT_EQ(o.exit_code, 2) << key << "\n" << o.output;
        EXPECT_NE(o.output.find("llmtrain: config error: " + message), std::string::npos) << key << "\n" << o.output;
        EXPECT_FALSE(fs::exists(run + "/log.jsonl")) << key;
    }
    // A dense model's weights into a MoE config.
    const std::string dense = scratch("moe-mismatch-dense");
    train_and_export(dense, "llama");
    const Outcome o = llmtrain_cli(tiny_run(dir, "moe", "--set train.steps=1 --set train.init_from=" + dense + "/hf --run-dir " + dir + "/from-dense"));
    EXPECT_EQ(o.exit_code, 2) << o.output;
    EXPECT_NE(o.output.find("model.moe.n_experts = 4 here: the weights of train.init_from '" + dense +
                            "/hf/model.safetensors' hold no experts (a dense model's); expected model.moe.n_experts = 0"),
              std::string::npos)
        << o.output;
}

// A MoE checkpoint with another expert count: refused at resume, and as train.init_from,
// naming model.moe.n_experts and both values.
TEST(CheckpointCli, MoeCheckpointOfAnotherExpertCount_IsRefusedAtResumeAndAsInitFromNamingTheKey) {
    const std::string dir = scratch("moe-resume-mismatch");
    const Outcome a = llmtrain_cli(tiny_run(dir, "moe", "--set train.steps=2 --set checkpoint.every_steps=2 --run-dir " + dir + "/a"));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    const std::string checkpoint = dir + "/checkpoints/step_00000002";
    const Outcome resumed = llmtrain_cli(tiny_run(dir, "moe", "--set train.steps=4 --set model.moe.n_experts=8 --resume " + checkpoint + " --run-dir " + dir + "/b"));
    EXPECT_EQ(resumed.exit_code, 2) << resumed.output;
    EXPECT_NE(resumed.output.find("model.moe.n_experts: the checkpoint '" + checkpoint + "' was saved by a model with model.moe.n_experts = 4, this config has 8"),
              std::string::npos)
        << resumed.output;
    EXPECT_FALSE(fs::exists(dir + "/b/log.jsonl"));
    const Outcome started = llmtrain_cli(tiny_run(dir, "moe", "--set train.steps=1 --set model.moe.n_experts=8 --set train.init_from=" + checkpoint + " --run-dir " + dir + "/c"));
    EXPECT_EQ(started.exit_code, 2) << started.output;
    EXPECT_NE(started.output.find("train.init_from: the checkpoint '" + checkpoint + "' was saved by a model with model.moe.n_experts = 4, this config has 8"),
              std::string::npos)
        << started.output;
}

// ---- mixture-of-experts models with shared experts as Qwen2-MoE ----

TEST(CheckpointExport, MoeWithASharedExpert_IsQwen2MoeForCausalLM_ItsConfigKeysAndTensorsInOurNames) {
    const std::string dir = scratch("export-qwen2moe");
    train_and_export(dir, "qwen2moe");
    const nlohmann::json config = nlohmann::json::parse(read_bytes(dir + "/hf/config.json"));
    EXPECT_EQ(config.at("architectures"), nlohmann::json::array({"Qwen2MoeForCausalLM"}));
    EXPECT_EQ(config.at("model_type"), "qwen2_moe");
    EXPECT_EQ(config.at("num_experts"), 4);
    EXPECT_EQ(config.at("num_experts_per_tok"), 2);
    EXPECT_EQ(config.at("moe_intermediate_size"), 48);
    EXPECT_EQ(config.at("shared_expert_intermediate_size"), 48);
    EXPECT_EQ(config.at("norm_topk_prob"), false);
    EXPECT_EQ(config.at("decoder_sparse_step"), 1);
    EXPECT_EQ(config.at("mlp_only_layers"), nlohmann::json::array({0})) << "layer 0 is dense (model.moe.first_dense_layers = 1)";
    EXPECT_EQ(config.at("qkv_bias"), true);
    EXPECT_EQ(config.at("use_sliding_window"), false);
    EXPECT_EQ(config.at("output_router_logits"), false);
    EXPECT_EQ(config.at("hidden_size"), 32);
    EXPECT_EQ(config.at("num_key_value_heads"), 2);

    const StFile file = read_safetensors_independently(dir + "/hf/model.safetensors");
    const int64_t C = 32, F = 48, E = 4;
    const std::map<std::string, Shape64> expected = {
        {"model.layers.1.mlp.gate.weight", {E, C}},
        {"model.layers.1.mlp.experts.3.gate_proj.weight", {F, C}},
        {"model.layers.1.mlp.experts.3.down_proj.weight", {C, F}},
        {"model.layers.1.mlp.shared_expert.gate_proj.weight", {F, C}},
        {"model.layers.1.mlp.shared_expert.up_proj.weight", {F, C}},
        {"model.layers.1.mlp.shared_expert.down_proj.weight", {C, F}},
        {"model.layers.1.mlp.shared_expert_gate.weight", {1, C}},
        {"model.layers.0.self_attn.q_proj.bias", {C}}};
    for (const auto& [name, shape] : expected) {
        ASSERT_TRUE(file.entries.count(name)) << name;
        EXPECT_EQ(file.entries.at(name).shape, shape) << name;
    }
    EXPECT_TRUE(file.entries.count("model.layers.0.mlp.gate_proj.weight")) << "layer 0's dense MLP";
    EXPECT_FALSE(file.entries.count("model.layers.0.mlp.gate.weight")) << "layer 0 has no router";
    const std::string checkpoint = dir + "/checkpoints/step_00000002";
    for (const std::string name : {"model.layers.1.mlp.shared_expert.down_proj.weight", "model.layers.1.mlp.shared_expert_gate.weight"}) {
        const std::vector<double> trained = checkpoint_values(checkpoint, name);
        const std::vector<float> exported = file.values(name);
        ASSERT_EQ(exported.size(), trained.size()) << name;
        for (size_t i = 0; i < trained.size(); ++i) ASSERT_EQ(exported[i], static_cast<float>(trained[i])) << name << "[" << i << "]";
    }
}

TEST(CheckpointExport, MoeWithASharedExpert_InitFromTheExportMatchesTheResume) { expect_init_from_export_matches_resume("qwen2moe"); }

// Shared experts Qwen2-MoE cannot express are refused with the key and the reason.
TEST(CheckpointExport, SharedExpertsThatQwen2MoeDoesNotCompute_AreRefusedNamingTheKeyAndWhy) {
    const std::vector<std::string> qwen2_moe = {"model.family=\"llama\"", "model.moe.n_experts=4", "model.n_layers=2", "model.qkv_bias=true",
                                                "model.moe.n_shared_experts=1", "model.moe.shared_expert_gate=true"};
    EXPECT_EQ(nlohmann::json::parse(hf_config_json(load_config("configs/tiny.toml", qwen2_moe, DataFiles::unchecked).model)).at("model_type"), "qwen2_moe");
    const std::vector<std::pair<std::string, std::string>> refused = {
        {"model.moe.shared_expert_gate=false", "model.moe.shared_expert_gate = false: Qwen2MoeForCausalLM weighs its shared expert by a sigmoid gate, "
                                               "and MixtralForCausalLM has no shared expert (model.moe.n_shared_experts = 1)"},
        {"model.qkv_bias=false", "model.qkv_bias = false: Qwen2MoeForCausalLM's attention has q, k and v biases"},
        {"model.moe.router=\"sigmoid\"", "model.moe.router = \"sigmoid\": Qwen2MoeForCausalLM routes by a softmax over all experts"}};
    for (const auto& [key, why] : refused) expect_export_refused(qwen2_moe, key, why);
}

// Qwen2-MoE weights whose shared expert does not fit model.moe stop the run before it starts.
TEST(CheckpointImport, SharedExpertWeightsThatDoNotFitModelMoe_AreRefusedNamingTheKeyAndTheValueTheyNeed) {
    const std::string dir = scratch("qwen2moe-mismatch");
    train_and_export(dir, "qwen2moe");
    const std::string hf = dir + "/hf", file = hf + "/model.safetensors";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--set model.moe.n_shared_experts=0 --set model.moe.shared_expert_gate=false",
         "model.moe.n_shared_experts = 0 here: the weights of train.init_from '" + file +
             "' hold a shared expert 48 wide in layer 1 (model.layers.1.mlp.shared_expert.gate_proj.weight); expected model.moe.n_shared_experts = 1"},
        {"--set model.moe.n_shared_experts=2", "model.moe.n_shared_experts = 2 here: the weights of train.init_from '" + file +
                                                   "' hold a shared expert 48 wide in layer 1 (model.layers.1.mlp.shared_expert.gate_proj.weight); "
                                                   "expected model.moe.n_shared_experts = 1"},
        {"--set model.moe.shared_expert_gate=false", "model.moe.shared_expert_gate = false here: the weights of train.init_from '" + file +
                                                         "' gate layer 1's shared expert (model.layers.1.mlp.shared_expert_gate.weight); "
                                                         "expected model.moe.shared_expert_gate = true"}};
    int i = 0;
    for (const auto& [key, message] : cases) {
        const std::string run = dir + "/run" + std::to_string(i++);
        const Outcome o = llmtrain_cli(tiny_run(dir, "qwen2moe", "--set train.steps=1 " + key + " --set train.init_from=" + hf + " --run-dir " + run));
        EXPECT_EQ(o.exit_code, 2) << key << "\n" << o.output;
        EXPECT_NE(o.output.find("llmtrain: config error: " + message), std::string::npos) << key << "\n" << o.output;
        EXPECT_FALSE(fs::exists(run + "/log.jsonl")) << key;
    }
}
