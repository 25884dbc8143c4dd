// A hostile file of each format llmtrain reads, through the binary: it is refused with exit 2
// and one error line naming the file and, where it applies, the tensor, key or line, and
// nothing is written (the run directory or output is not made, every file beside the input is
// as it was). Each file is well formed up to what it attacks, with its checksums recomputed as
// an attacker would, so that the parser refuses it, not a checksum.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/hdf5_file.h"
#include "checkpoint/manifest.h"
#include "support/file_bytes.h"
#include "test_paths.h"

namespace fs = std::filesystem;

namespace {

struct Outcome {
    int exit_code = -1;
    std::string error;  // stderr
};

Outcome run_llmtrain(const std::string& args) {
    const std::string error_path = llmtrain::test::process_temp_path("hostile.stderr");
    const std::string command = std::string(LLMTRAIN_BINARY) + " " + args + " >/dev/null 2>" + error_path;
    const int status = std::system(command.c_str());
    std::ifstream in(error_path);
    std::ostringstream error;
    error << in.rdbuf();
    fs::remove(error_path);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), error.str()};
}

using llmtrain::test::read_bytes;
using llmtrain::test::write_bytes;

template <class T>
std::string pod_bytes(const T& value) {
    return std::string(reinterpret_cast<const char*>(&value), sizeof value);
}

// Every file under dir with its bytes: what "nothing written" compares.
std::map<std::string, std::string> files_under(const std::string& dir) {
    std::map<std::string, std::string> files;
    for (const auto& entry : fs::recursive_directory_iterator(dir))
        files[fs::relative(entry.path(), dir).string()] = entry.is_regular_file() ? read_bytes(entry.path().string()) : "(directory)";
    return files;
}

// A directory of this test's own, empty; the hostile inputs go in it, and so do the paths
// where the refused command would have written.
std::string scratch(const std::string& name) {
    const std::string dir = llmtrain::test::process_temp_path(name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

// Runs llmtrain ARGS and checks that it refused as this file's header says: exit 2, one line
// "llmtrain: ..." holding every one of `names`, and dir as it was.
void expect_refused(const std::string& dir, const std::string& args, const std::vector<std::string>& names) {
    const auto before = files_under(dir);
    const Outcome outcome = run_llmtrain(args);
    EXPECT_EQ(outcome.exit_code, 2) << outcome.error;
    EXPECT_EQ(std::count(outcome.error.begin(), outcome.error.end(), '\n'), 1) << outcome.error;
    EXPECT_EQ(outcome.error.rfind("llmtrain: ", 0), 0u) << outcome.error;
    for (const std::string& name : names) EXPECT_NE(outcome.error.find(name), std::string::npos) << "no '" << name << "' in: " << outcome.error;
    const auto after = files_under(dir);
    EXPECT_EQ(after.size(), before.size()) << "files were written or removed in " << dir;
    for (const auto& [path, bytes] : before) {
        const auto found = after.find(path);
        EXPECT_TRUE(found != after.end() && found->second == bytes) << path << " was changed or removed";
    }
}

// `train` of the fuzz targets' tiny GPT-2 with everything it writes inside dir.
std::string tiny_train(const std::string& dir, const std::string& more) {
    return "train tests/fuzz/models/gpt2.toml --set checkpoint.dir=" + dir + "/checkpoints --run-dir " + dir + "/run " + more;
}

// A safetensors file: the header's length, the header, then data_bytes zero bytes.
std::string safetensors(const std::string& header, size_t data_bytes) {
    return pod_bytes(uint64_t{header.size()}) + header + std::string(data_bytes, '\0');
}

// The newest checkpoint of tiny_train(dir, ""), trained here.
std::string tiny_checkpoint(const std::string& dir) {
    const Outcome trained = run_llmtrain(tiny_train(dir, ""));
    EXPECT_EQ(trained.exit_code, 0) << trained.error;
    std::string latest = read_bytes(dir + "/checkpoints/latest");
    latest.erase(latest.find_last_not_of("\n") + 1);
    return dir + "/checkpoints/" + latest;
}

// Records the size and XXH64 of the checkpoint's rank file in its manifest, as an attacker who
// replaced the file would.
void rehash_rank_file(const std::string& checkpoint) {
    const std::string manifest_path = checkpoint + "/manifest.json";
    llmtrain::Manifest manifest = llmtrain::manifest_from_json(read_bytes(manifest_path), manifest_path);
    const std::string bytes = read_bytes(checkpoint + "/" + manifest.files.at(0).name);
    manifest.files[0].bytes = bytes.size();
    manifest.files[0].xxh64 = XXH64(bytes.data(), bytes.size(), 0);
    write_bytes(manifest_path, llmtrain::manifest_to_json(manifest));
}

}  // namespace

TEST(HostileFiles, Safetensors_TensorBeyondItsData_IsRefusedBeforeTheRunStarts) {
    const std::string dir = scratch("hostile_safetensors_offsets");
    write_bytes(dir + "/model.safetensors",
                safetensors(R"({"transformer.wte.weight": {"dtype": "F32", "shape": [257, 8], "data_offsets": [0, 8224]}})", 64));
    expect_refused(dir, tiny_train(dir, "--set train.init_from=" + dir + "/model.safetensors"),
                   {dir + "/model.safetensors", "tensor 'transformer.wte.weight'"});
}

TEST(HostileFiles, Safetensors_ShapeOfMoreValuesThanAnyFile_IsRefused) {
    const std::string dir = scratch("hostile_safetensors_shape");
    // 2^62 x 2^62 values: a product that overflows 64 bits.
    write_bytes(dir + "/model.safetensors",
                safetensors(R"({"transformer.wte.weight": {"dtype": "F32", "shape": [4611686018427387904, 4611686018427387904], "data_offsets": [0, 0]}})", 8));
    expect_refused(dir, tiny_train(dir, "--set train.init_from=" + dir + "/model.safetensors"),
                   {dir + "/model.safetensors", "tensor transformer.wte.weight", "checkpoint [4611686018427387904, 4611686018427387904]"});
}

TEST(HostileFiles, Config_IntegerBeyond64Bits_IsRefusedNamingTheLine) {
    const std::string dir = scratch("hostile_config");
    std::string config = read_bytes("tests/fuzz/models/gpt2.toml");
    const size_t at = config.find("d_model = 8");
    ASSERT_NE(at, std::string::npos);
    config.replace(at, std::strlen("d_model = 8"), "d_model = 99999999999999999999999");
    const auto line = 1 + std::count(config.begin(), config.begin() + static_cast<std::ptrdiff_t>(at), '\n');
    write_bytes(dir + "/hostile.toml", config);
    expect_refused(dir, "train " + dir + "/hostile.toml --set checkpoint.dir=" + dir + "/checkpoints --run-dir " + dir + "/run",
                   {dir + "/hostile.toml:" + std::to_string(line) + ":"});
}

TEST(HostileFiles, ConfigOverride_NestedArrayForAnInteger_IsRefusedNamingTheKey) {
    const std::string dir = scratch("hostile_override");
    expect_refused(dir, tiny_train(dir, "--set 'model.d_model=[[[[[[[[1]]]]]]]]'"),
                   {"gpt2.toml", "--set model.d_model=[[[[[[[[1]]]]]]]]: model.d_model: expected an integer"});
}

TEST(HostileFiles, Jsonl_RecordNested100000Deep_IsRefusedNamingTheLine) {
    const std::string dir = scratch("hostile_jsonl");
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    write_bytes(dir + "/input.jsonl", "{\"text\": \"one\"}\n{\"text\": \"two\"}\n{\"text\": " + deep + "}\n{\"text\": \"four\"}\n");
    expect_refused(dir, "prepare --tokenizer tests/e2e/bad_data/bytes_tokenizer.json --input " + dir + "/input.jsonl --threads 1 --output " + dir + "/dataset",
                   {dir + "/input.jsonl:3:", "no string field \"text\""});
}

TEST(HostileFiles, Shard_BlockOffsetsOutOfOrderUnderAValidChecksum_IsRefused) {
    const std::string dir = scratch("hostile_shard");
    std::string text;
    for (int i = 0; i < 40; ++i) text += "Entry " + std::to_string(i) + ": a few words of text to tokenize, byte by byte.\n%\n";
    write_bytes(dir + "/input.txt", text);
    const Outcome prepared = run_llmtrain("prepare --tokenizer tests/e2e/bad_data/bytes_tokenizer.json --input " + dir +
                                      "/input.txt --separator '\\n%\\n' --val-fraction 0.2 --block-tokens 256 --threads 1 --output " + dir + "/dataset");
    ASSERT_EQ(prepared.exit_code, 0) << prepared.error;
    // Header: 56 hashed bytes and their XXH3; then the block offsets (one more than the blocks)
    // and the document starts, which the XXH3 covers too.
    const std::string shard_path = dir + "/dataset/train-00000.ltshard";
    std::string shard = read_bytes(shard_path);
    uint32_t blocks = 0;
    std::memcpy(&blocks, shard.data() + 44, 4);
    uint64_t documents = 0;
    std::memcpy(&documents, shard.data() + 32, 8);
    ASSERT_GE(blocks, 3u);
    uint64_t second = 0;
    std::memcpy(&second, shard.data() + 64 + 2 * 8, 8);
    std::memcpy(shard.data() + 64 + 1 * 8, &second, 8);  // block 1 starts where block 2 does
    const size_t metadata_bytes = (blocks + 1 + documents + 1) * 8;
    std::string hashed = shard.substr(0, 56) + shard.substr(64, metadata_bytes);
    const uint64_t checksum = XXH3_64bits(hashed.data(), hashed.size());
    std::memcpy(shard.data() + 56, &checksum, 8);
    write_bytes(shard_path, shard);
    expect_refused(dir, tiny_train(dir, "--set data.format=shards --set data.train_path=" + dir + "/dataset/dataset.json"),
                   {"shard '" + shard_path + "'", "block 1 has offset"});
}

TEST(HostileFiles, Llmc_TokenCountBeyondTheFile_IsRefused) {
    const std::string dir = scratch("hostile_llmc");
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520, header[1] = 1, header[2] = 2147483647;
    write_bytes(dir + "/train.bin", std::string(reinterpret_cast<const char*>(header.data()), 1024) + std::string(200, '\1'));
    expect_refused(dir, tiny_train(dir, "--set data.format=llmc --set data.train_path=" + dir + "/train.bin"),
                   {"llm.c shard '" + dir + "/train.bin'", "2147483647 tokens"});
}

TEST(HostileFiles, MegatronIndex_SequenceOutsideTheBin_IsRefused) {
    const std::string dir = scratch("hostile_megatron");
    write_bytes(dir + "/train.bin", std::string(200, '\1'));  // 100 uint16 ids
    std::string idx = std::string("MMIDIDX\0\0", 9) + pod_bytes(uint64_t{1}) + std::string(1, '\x08') + pod_bytes(uint64_t{1}) + pod_bytes(uint64_t{2});
    idx += pod_bytes(int32_t{1000}) + pod_bytes(int64_t{0}) + pod_bytes(int64_t{0}) + pod_bytes(int64_t{1});  // 1000 tokens at byte 0
    write_bytes(dir + "/train.idx", idx);
    expect_refused(dir, tiny_train(dir, "--set data.format=megatron --set data.train_path=" + dir + "/train.bin"),
                   {"'" + dir + "/train.idx'", "sequence 0 (1000 tokens at byte 0) lies outside the 200-byte .bin"});
}

TEST(HostileFiles, TokenizerJson_VocabularyIdFarBeyondItsTokens_IsRefusedNamingTheToken) {
    const std::string dir = scratch("hostile_tokenizer");
    // One id of 373 million in a vocabulary of 257 tokens: a table of tokens indexed by id
    // would take 12 GB.
    std::string tokenizer = read_bytes("tests/e2e/bad_data/bytes_tokenizer.json");
    const size_t at = tokenizer.find("\"a\": 97,");
    ASSERT_NE(at, std::string::npos);
    tokenizer.replace(at, std::strlen("\"a\": 97,"), "\"a\": 373333333,");
    write_bytes(dir + "/tokenizer.json", tokenizer);
    write_bytes(dir + "/input.txt", "some text\n");
    expect_refused(dir, "prepare --tokenizer " + dir + "/tokenizer.json --input " + dir + "/input.txt --threads 1 --output " + dir + "/dataset",
                   {dir + "/tokenizer.json", "model.vocab: token 'a' has id 373333333"});
}

TEST(HostileFiles, Gzip_DeflateBlockOfAReservedType_IsRefusedNamingTheFile) {
    const std::string dir = scratch("hostile_gzip");
    // A gzip header, then a final deflate block of type 3, which deflate reserves.
    write_bytes(dir + "/input.jsonl.gz", std::string("\x1f\x8b\x08\0\0\0\0\0\0\x03\x07", 11));
    expect_refused(dir, "prepare --tokenizer tests/e2e/bad_data/bytes_tokenizer.json --input " + dir + "/input.jsonl.gz --threads 1 --output " + dir + "/dataset",
                   {dir + "/input.jsonl.gz", "corrupt gzip data"});
}

TEST(HostileFiles, Zstd_FrameAskingForA2TiBWindow_IsRefusedNamingTheFile) {
    const std::string dir = scratch("hostile_zstd");
    // A zstd frame header whose window descriptor asks for 2^41 bytes of window.
    write_bytes(dir + "/input.jsonl.zst", std::string("\x28\xb5\x2f\xfd\x00\xf8", 6));
    expect_refused(dir, "prepare --tokenizer tests/e2e/bad_data/bytes_tokenizer.json --input " + dir + "/input.jsonl.zst --threads 1 --output " + dir + "/dataset",
                   {dir + "/input.jsonl.zst", "zstd"});
}

TEST(HostileFiles, CheckpointManifest_RankFileNamedOutsideTheCheckpoint_IsRefusedNamingTheKey) {
    const std::string dir = scratch("hostile_manifest");
    const std::string checkpoint = tiny_checkpoint(dir);
    // With the manifest's own checksum recomputed, as an attacker would.
    const std::string manifest_path = checkpoint + "/manifest.json";
    llmtrain::Manifest manifest = llmtrain::manifest_from_json(read_bytes(manifest_path), manifest_path);
    manifest.files.at(0).name = "../../run/rank_00000.h5";
    write_bytes(manifest_path, llmtrain::manifest_to_json(manifest));
    expect_refused(dir, "checkpoint export " + checkpoint + " " + dir + "/hf",
                   {checkpoint + "/manifest.json", "files[0].name is '../../run/rank_00000.h5', expected 'rank_00000.h5'"});
}

TEST(HostileFiles, CheckpointManifest_MeshBeyond64Bits_IsRefusedNamingTheKey) {
    const std::string dir = scratch("hostile_manifest_mesh");
    const std::string checkpoint = tiny_checkpoint(dir);
    // dp of 1.9e19, which JSON reads as a float, and the manifest's own checksum recomputed as
    // the writer computes it (XXH64 of the compact document without its key).
    const std::string manifest_path = checkpoint + "/manifest.json";
    nlohmann::ordered_json manifest = nlohmann::ordered_json::parse(read_bytes(manifest_path));
    manifest["mesh"]["dp"] = 1.9223372036854776e19;
    manifest.erase("manifest_xxh64");
    const std::string compact = manifest.dump();
    char checksum[17];
    std::snprintf(checksum, sizeof checksum, "%016llx", static_cast<unsigned long long>(XXH64(compact.data(), compact.size(), 0)));
    manifest["manifest_xxh64"] = checksum;
    write_bytes(manifest_path, manifest.dump(2));
    expect_refused(dir, "checkpoint export " + checkpoint + " " + dir + "/hf", {manifest_path, "key 'mesh'", "dp is 1.9223372036854776e+19, not an integer"});
}

TEST(HostileFiles, CheckpointRankFile_BoxOutsideItsTensor_IsRefusedNamingTheTensor) {
    const std::string dir = scratch("hostile_rank_file");
    const std::string checkpoint = tiny_checkpoint(dir);
    const std::string rank_file = checkpoint + "/rank_00000.h5";
    // The file written again with every value as it was, but the token embedding's box moved
    // one row past the end of its tensor: a load placing its values would write beyond the
    // rows that exist.
    llmtrain::RankSnapshot snapshot;
    llmtrain::FileAttributes attributes;
    {
        const llmtrain::RankFileReader reader(rank_file);
        attributes = reader.attributes();
        for (llmtrain::SavedTensor tensor : reader.tensors()) {
            const std::vector<double> values = reader.read(tensor);
            tensor.byte_offset = snapshot.data.size();
            if (tensor.dtype == llmtrain::DType::f64) {
                snapshot.data.insert(snapshot.data.end(), reinterpret_cast<const char*>(values.data()), reinterpret_cast<const char*>(values.data() + values.size()));
            } else {
                const std::vector<float> narrow(values.begin(), values.end());
                snapshot.data.insert(snapshot.data.end(), reinterpret_cast<const char*>(narrow.data()), reinterpret_cast<const char*>(narrow.data() + narrow.size()));
            }
            if (tensor.dataset == "model/transformer.wte.weight") tensor.boxes.front().box.start.dims[0] += 1;
            snapshot.tensors.push_back(tensor);
        }
    }
    llmtrain::write_rank_file(rank_file, snapshot, attributes);
    rehash_rank_file(checkpoint);
    expect_refused(dir, "checkpoint export " + checkpoint + " " + dir + "/hf",
                   {rank_file, "tensor 'model/transformer.wte.weight'", "outside its global shape"});
}
