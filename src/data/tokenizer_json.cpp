// Tokenizer files: Hugging Face tokenizer.json (read and write) and GPT-2's encoder.json +
// vocab.bpe (read). Only what changes the token ids is read; a setting this tokenizer cannot
// honour (another model type, a normalizer, byte fallback, a prefix space) is refused with
// the file's name instead of giving different ids than the reference.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/byte_level.h"
#include "data/tokenizer.h"

namespace llmtrain {

namespace {

using nlohmann::json;

std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorKind::data, "cannot open tokenizer file '", path, "'");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) fail(ErrorKind::io, "read error on '", path, "'");
    return text;
}

json parse_json(const std::string& text, const std::string& source) {
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        fail(ErrorKind::data, source, ": not valid JSON: ", e.what());
    }
}

[[noreturn]] void unsupported(const std::string& source, const std::string& what) {
    fail(ErrorKind::data, source, ": ", what, "; only byte-level BPE tokenizers (GPT-2, Llama 3 style) are supported");
}

// Ids run from 0 to one less than the tokens of model.vocab and added_tokens together (an added
// token may repeat one of the vocabulary): a larger id would leave ids without a token, and
// have the table of tokens grow far beyond what the file holds.
size_t id_limit(const json& root, const json& vocab) {
    const auto added = root.find("added_tokens");
    return vocab.size() + (added != root.end() && added->is_array() ? added->size() : 0);
}

// An integer node as int64_t (larger unsigned ones as INT64_MAX, beyond every limit).
int64_t integer_id(const json& node) {
    return node.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(node.get<uint64_t>(), INT64_MAX)) : node.get<int64_t>();
}

void expect_id_below(int64_t id, size_t limit, const std::string& source, const std::string& where) {
    if (id < 0 || static_cast<uint64_t>(id) >= limit)
        fail(ErrorKind::data, source, ": ", where, " has id ", id, "; ids run from 0 to ", limit - 1, " (one per token of model.vocab and added_tokens)");
}

// Sets token `id` to `bytes`; an id that already is another token is refused, since one of
// the two would decode as the other.
void set_token(TokenizerSpec& spec, size_t id, const std::string& bytes, const std::string& source, const std::string& where) {
    if (id >= spec.token_bytes.size()) spec.token_bytes.resize(id + 1);
    std::string& slot = spec.token_bytes[id];
    if (!slot.empty() && slot != bytes) fail(ErrorKind::data, source, ": ", where, " has id ", id, ", which is already another token's");
    slot = bytes;
}

// vocab (byte-level string -> id) into token_bytes (id -> bytes).
void read_vocab(const json& vocab, size_t limit, const std::string& source, TokenizerSpec& spec) {
    if (!vocab.is_object()) fail(ErrorKind::data, source, ": model.vocab is not an object of token -> id");
    for (const auto& [token, id_node] : vocab.items()) {
        if (!id_node.is_number_integer()) fail(ErrorKind::data, source, ": model.vocab: token '", token, "' has no valid id");
        expect_id_below(integer_id(id_node), limit, source, cat("model.vocab: token '", token, "'"));
        const auto bytes = byte_level_to_bytes(token);
        if (!bytes) unsupported(source, cat("model.vocab: token '", token, "' is not a byte-level string"));
        set_token(spec, id_node.get<size_t>(), *bytes, source, cat("model.vocab: token '", token, "'"));
    }
}

std::pair<std::string, std::string> merge_parts(const json& merge, size_t rank, const std::string& source) {
    if (merge.is_string()) {
        const auto text = merge.get<std::string>();
        const size_t space = text.find(' ');
        if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
            fail(ErrorKind::data, source, ": merge #", rank, " '", text, "' is not two tokens separated by one space");
        return {text.substr(0, space), text.substr(space + 1)};
    }
    if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
        return {merge[0].get<std::string>(), merge[1].get<std::string>()};
    fail(ErrorKind::data, source, ": merge #", rank, " is neither \"a b\" nor [\"a\", \"b\"]");
}

// Merges as byte-level token strings -> id pairs, looked up in the vocabulary read before.
void read_merges(const json& merges, const json& vocab, const std::string& source, TokenizerSpec& spec) {
    if (!merges.is_array()) fail(ErrorKind::data, source, ": model.merges is not an array");
    spec.merges.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const auto [left, right] = merge_parts(merges[rank], rank, source);
        const auto l = vocab.find(left), r = vocab.find(right);
        if (l == vocab.end() || r == vocab.end())
            fail(ErrorKind::data, source, ": merge #", rank, " '", left, " ", right, "' names a token missing from model.vocab");
        spec.merges.emplace_back(l->get<int32_t>(), r->get<int32_t>());
    }
}

void read_added_tokens(const json& root, size_t limit, const std::string& source, TokenizerSpec& spec) {
    const auto it = root.find("added_tokens");
    if (it == root.end() || it->is_null()) return;
    for (const json& t : *it) {
        if (!t.contains("id") || !t.contains("content") || !t["id"].is_number_integer() || !t["content"].is_string())
            fail(ErrorKind::data, source, ": added_tokens: an entry lacks an integer id or a string content");
        const json& id_node = t["id"];
        expect_id_below(integer_id(id_node), limit, source, cat("added token '", t["content"].get<std::string>(), "'"));
        AddedToken added{t["content"].get<std::string>(), id_node.get<int32_t>(), t.value("special", true)};
        const auto id = static_cast<size_t>(added.id);
        set_token(spec, id, added.content, source, cat("added token '", added.content, "'"));
        spec.added.push_back(std::move(added));
    }
}

// The split pattern of the pre-tokenizer: ByteLevel(use_regex) gives GPT-2's; a Split with
// a Regex and behavior Isolated before a ByteLevel(use_regex = false) gives its own.
void read_pre_tokenizer(const json& node, const std::string& source, std::string& pattern, bool& byte_level) {
    if (node.is_null()) unsupported(source, "pre_tokenizer is null");
    const std::string type = node.value("type", "");
    if (type == "Sequence") {
        for (const json& inner : node.at("pretokenizers")) read_pre_tokenizer(inner, source, pattern, byte_level);
    } else if (type == "ByteLevel") {
        if (node.value("add_prefix_space", false)) unsupported(source, "pre_tokenizer ByteLevel with add_prefix_space = true");
        byte_level = true;
        if (node.value("use_regex", true)) {
            if (!pattern.empty()) unsupported(source, "pre_tokenizer holds two split patterns");
            pattern = kGpt2Pattern;
        }
    } else if (type == "Split") {
        if (!node.contains("pattern") || !node["pattern"].contains("Regex") || node.value("behavior", "") != "Isolated" || node.value("invert", false))
            unsupported(source, "pre_tokenizer Split other than an Isolated Regex");
        if (!pattern.empty()) unsupported(source, "pre_tokenizer holds two split patterns");
        pattern = node["pattern"]["Regex"].get<std::string>();
    } else {
        unsupported(source, cat("pre_tokenizer type \"", type, "\""));
    }
}

TokenizerSpec spec_from_hf(const json& root, const std::string& source) {
    if (!root.is_object() || !root.contains("model")) fail(ErrorKind::data, source, ": no \"model\" section; not a tokenizer.json");
    const json& model = root["model"];
    const std::string type = model.value("type", "BPE");
    if (type != "BPE") unsupported(source, cat("model.type is \"", type, "\""));
    if (model.value("byte_fallback", false)) unsupported(source, "model.byte_fallback = true (SentencePiece style)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) unsupported(source, cat("model.", key, " is set"));
    if (root.contains("normalizer") && !root["normalizer"].is_null())
        unsupported(source, cat("normalizer \"", root["normalizer"].value("type", "?"), "\" is set"));
    TokenizerSpec spec;
    bool byte_level = false;
    read_pre_tokenizer(root.value("pre_tokenizer", json()), source, spec.pattern, byte_level);
    if (!byte_level || spec.pattern.empty()) unsupported(source, "pre_tokenizer is not ByteLevel with a split pattern");
    const size_t limit = id_limit(root, model.at("vocab"));
    read_vocab(model.at("vocab"), limit, source, spec);
    read_merges(model.value("merges", json::array()), model["vocab"], source, spec);
    read_added_tokens(root, limit, source, spec);
    spec.ignore_merges = model.value("ignore_merges", false);
    return spec;
}

}  // namespace

Tokenizer Tokenizer::from_hf_json(const std::string& json_text, const std::string& source) {
    try {
        return Tokenizer(spec_from_hf(parse_json(json_text, source), source), source);
    } catch (const json::exception& e) {
        fail(ErrorKind::data, source, ": malformed tokenizer.json: ", e.what());
    }
}

Tokenizer Tokenizer::from_gpt2_files(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
    const json encoder = parse_json(read_text_file(encoder_json_path), encoder_json_path);
    TokenizerSpec spec;
    read_vocab(encoder, encoder.size(), encoder_json_path, spec);
    std::ifstream in(vocab_bpe_path);
    if (!in) fail(ErrorKind::data, "cannot open tokenizer file '", vocab_bpe_path, "'");
    std::string line;
    json merges = json::array();
    while (std::getline(in, line)) {
        if (line.rfind("#version", 0) == 0 || line.empty()) continue;
        merges.push_back(line);
    }
    read_merges(merges, encoder, vocab_bpe_path, spec);
    spec.pattern = kGpt2Pattern;
    // encoder.json lists <|endoftext|> among the ordinary tokens; it is GPT-2's special token.
    if (const auto it = encoder.find("<|endoftext|>"); it != encoder.end()) spec.added.push_back({"<|endoftext|>", it->get<int32_t>(), true});
    return Tokenizer(std::move(spec), encoder_json_path);
}

Tokenizer Tokenizer::load(const std::string& path) {
    namespace fs = std::filesystem;
    if (fs::is_directory(path)) {
        const fs::path dir(path);
        if (fs::exists(dir / "tokenizer.json")) return load((dir / "tokenizer.json").string());
        if (fs::exists(dir / "encoder.json") && fs::exists(dir / "vocab.bpe"))
            return from_gpt2_files((dir / "encoder.json").string(), (dir / "vocab.bpe").string());
        fail(ErrorKind::data, "tokenizer directory '", path, "' holds neither tokenizer.json nor encoder.json + vocab.bpe");
    }
    return from_hf_json(read_text_file(path), path);
}

std::string Tokenizer::to_hf_json() const {
    using ojson = nlohmann::ordered_json;
    // Appended to the object's vector directly: ordered_json's operator[] searches the keys
    // linearly, which made a 100k-token vocabulary take seconds. The keys are distinct
    // (index_spec refuses two tokens with the same bytes).
    ojson vocab = ojson::object();
    auto& entries = vocab.get_ref<ojson::object_t&>();
    entries.reserve(spec_.token_bytes.size());
    for (size_t id = 0; id < spec_.token_bytes.size(); ++id)
        if (!is_added_[id] && !spec_.token_bytes[id].empty()) entries.emplace_back(bytes_to_byte_level(spec_.token_bytes[id]), id);
    ojson merges = ojson::array();
    for (const auto& [left, right] : spec_.merges)
        merges.push_back(bytes_to_byte_level(spec_.token_bytes[static_cast<size_t>(left)]) + " " +
                         bytes_to_byte_level(spec_.token_bytes[static_cast<size_t>(right)]));
    ojson added = ojson::array();
    for (const AddedToken& t : spec_.added)
        added.push_back({{"id", t.id}, {"content", t.content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", t.special}});
    const ojson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", spec_.pattern == kGpt2Pattern}};
    ojson pre_tokenizer = byte_level;
    if (spec_.pattern != kGpt2Pattern) {
        const ojson split = {{"type", "Split"}, {"pattern", {{"Regex", spec_.pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
        pre_tokenizer = {{"type", "Sequence"}, {"pretokenizers", ojson::array({split, byte_level})}};
    }
    ojson root = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}, {"normalizer", nullptr},
                  {"pre_tokenizer", pre_tokenizer}, {"post_processor", nullptr},
                  {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
                  {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                             {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", spec_.ignore_merges},
                             {"vocab", vocab}, {"merges", merges}}}};
    return root.dump(1) + "\n";
}

}  // namespace llmtrain
