#include "data/external_formats.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/durable_file.h"
#include "core/error.h"
#include "data/token_shard.h"

namespace llmtrain {

namespace {

namespace fs = std::filesystem;

// A file read with pread; errors name it.
class RandomFile {
public:
    explicit RandomFile(std::string path) : path_(std::move(path)) {
        fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd_ < 0) fail(ErrorKind::data, "cannot open '", path_, "': ", std::strerror(errno));
        struct stat st{};
        if (::fstat(fd_, &st) != 0) fail(ErrorKind::io, "cannot stat '", path_, "'");
        size_ = static_cast<uint64_t>(st.st_size);
    }
    ~RandomFile() { ::close(fd_); }
    RandomFile(const RandomFile&) = delete;
    RandomFile& operator=(const RandomFile&) = delete;
    uint64_t size() const { return size_; }
    const std::string& path() const { return path_; }
    void read(uint64_t offset, uint64_t count, void* out) const {
        uint64_t done = 0;
        while (done < count) {
            const ssize_t n = ::pread(fd_, static_cast<char*>(out) + done, count - done, static_cast<off_t>(offset + done));
            if (n <= 0) fail(ErrorKind::data, "'", path_, "': cannot read ", count, " bytes at offset ", offset, ": file ends early");
            done += static_cast<uint64_t>(n);
        }
    }
    std::string read_all() const {
        std::string bytes(size_, '\0');
        read(0, size_, bytes.data());
        return bytes;
    }

private:
    std::string path_;
    int fd_ = -1;
    uint64_t size_ = 0;
};

// Element types of token files; Megatron's dtype codes index the table.
struct IdType {
    uint8_t megatron_code;
    uint32_t bytes;
    bool is_signed;
    const char* name;
};
constexpr IdType kIdTypes[] = {{1, 1, false, "uint8"}, {2, 1, true, "int8"}, {3, 2, true, "int16"}, {4, 4, true, "int32"}, {5, 8, true, "int64"}, {8, 2, false, "uint16"}};

const IdType* id_type_of_code(uint8_t code) {
    for (const IdType& t : kIdTypes)
        if (t.megatron_code == code) return &t;
    return nullptr;
}

// Raw ids -> int32, each checked against [0, vocab); first_offset names the token in errors.
void convert_ids(const char* raw, uint64_t count, const IdType& type, uint64_t vocab, int32_t* out, const std::string& where, uint64_t first_offset) {
    for (uint64_t i = 0; i < count; ++i) {
        int64_t id = 0;
        const char* p = raw + i * type.bytes;
        switch (type.bytes) {
            case 1: id = type.is_signed ? static_cast<int8_t>(*p) : static_cast<uint8_t>(*p); break;
            case 2: { uint16_t v; std::memcpy(&v, p, 2); id = type.is_signed ? static_cast<int16_t>(v) : v; break; }
            case 4: { uint32_t v; std::memcpy(&v, p, 4); id = type.is_signed ? static_cast<int32_t>(v) : static_cast<int64_t>(v); break; }
            default: std::memcpy(&id, p, 8); break;
        }
        if (id < 0 || static_cast<uint64_t>(id) >= vocab)
            fail(ErrorKind::data, where, ": token id ", id, " at token offset ", first_offset + i, " is outside the vocabulary [0, ", vocab, ")");
        out[i] = static_cast<int32_t>(id);
    }
}

void append_ids(std::string& out, const int32_t* tokens, size_t count, uint32_t bytes) {
    for (size_t i = 0; i < count; ++i) {
        const auto v = static_cast<uint32_t>(tokens[i]);
        out.append(reinterpret_cast<const char*>(&v), bytes);
    }
}

void check_ids_fit(const int32_t* tokens, size_t count, uint64_t limit, const std::string& path) {
    for (size_t i = 0; i < count; ++i)
        if (tokens[i] < 0 || static_cast<uint64_t>(tokens[i]) >= limit) fail(ErrorKind::data, "'", path, "': token id ", tokens[i], " does not fit this format (limit ", limit, ")");
}

// ---- Megatron ----

constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kMegatronHeaderBytes = 9 + 8 + 1 + 8 + 8;

struct MegatronIndex {
    const IdType* type = nullptr;
    std::vector<int32_t> lengths;
    std::vector<int64_t> pointers;
    std::vector<int64_t> document_indices;
};

template <class T>
T load_pod(const std::string& bytes, size_t offset) {
    T v;
    std::memcpy(&v, bytes.data() + offset, sizeof v);
    return v;
}

MegatronIndex parse_megatron_index(const std::string& name, const std::string& b, uint64_t bin_bytes) {
    const auto bad = [&](auto&&... what) { fail(ErrorKind::data, "'", name, "': ", what...); };
    if (b.size() < kMegatronHeaderBytes) bad("truncated: ", b.size(), " bytes, the header needs ", kMegatronHeaderBytes);
    if (std::memcmp(b.data(), kMegatronMagic, sizeof kMegatronMagic) != 0) bad("wrong magic at offset 0 (expected MMIDIDX\\0\\0): not a Megatron index");
    if (const auto version = load_pod<uint64_t>(b, 9); version != 1) bad("version ", version, " at offset 9 (supported: 1)");
    MegatronIndex idx;
    const auto code = static_cast<uint8_t>(b[17]);
    idx.type = id_type_of_code(code);
    if (!idx.type) bad("dtype code ", int{code}, " at offset 17 is not an integer token type (allowed: 1, 2, 3, 4, 5, 8)");
    const auto sequences = load_pod<uint64_t>(b, 18), documents = load_pod<uint64_t>(b, 26);
    if (sequences > b.size() / 12 || documents > b.size() / 8 || documents == 0)
        bad("sequence count ", sequences, " (offset 18) or document count ", documents, " (offset 26) does not fit the ", b.size(), "-byte file");
    const uint64_t expected = kMegatronHeaderBytes + sequences * 12 + documents * 8;
    if (expected != b.size()) bad(b.size(), " bytes but the counts (", sequences, " sequences, ", documents, " document indices) need ", expected, ": truncated or wrong counts");
    idx.lengths.resize(sequences);
    idx.pointers.resize(sequences);
    idx.document_indices.resize(documents);
    // An index of zero sequences is valid; memcpy must not see its null data() (UB).
    if (sequences > 0) {
        std::memcpy(idx.lengths.data(), b.data() + kMegatronHeaderBytes, sequences * 4);
        std::memcpy(idx.pointers.data(), b.data() + kMegatronHeaderBytes + sequences * 4, sequences * 8);
    }
    std::memcpy(idx.document_indices.data(), b.data() + kMegatronHeaderBytes + sequences * 12, documents * 8);
    for (uint64_t s = 0; s < sequences; ++s) {
        const int32_t length = idx.lengths[s];
        const int64_t pointer = idx.pointers[s];
        if (length < 0 || pointer < 0 || static_cast<uint64_t>(pointer) > bin_bytes || uint64_t(length) * idx.type->bytes > bin_bytes - static_cast<uint64_t>(pointer))
            bad("sequence ", s, " (", length, " tokens at byte ", pointer, ") lies outside the ", bin_bytes, "-byte .bin");
    }
    if (idx.document_indices.front() != 0 || static_cast<uint64_t>(idx.document_indices.back()) != sequences) bad("document indices do not run from 0 to the sequence count ", sequences);
    for (size_t d = 0; d + 1 < idx.document_indices.size(); ++d)
        if (idx.document_indices[d] > idx.document_indices[d + 1]) bad("document index ", d, " is larger than the next one");
    return idx;
}

std::string megatron_prefix(const std::string& path) {
    const fs::path p(path);
    return p.extension() == ".bin" || p.extension() == ".idx" ? (p.parent_path() / p.stem()).string() : path;
}

class MegatronSource : public TokenSource {
public:
    MegatronSource(const std::string& prefix, uint64_t vocab) : bin_(prefix + ".bin"), vocab_(vocab) {
        const RandomFile idx_file(prefix + ".idx");
        index_ = parse_megatron_index(idx_file.path(), idx_file.read_all(), bin_.size());
        starts_.assign(1, 0);
        for (int32_t length : index_.lengths) starts_.push_back(starts_.back() + static_cast<uint64_t>(length));
    }
    uint64_t token_count() const override { return starts_.back(); }
    std::string describe() const override { return cat("Megatron ", bin_.path()); }
    void read(uint64_t start, uint64_t count, int32_t* out) override {
        const uint32_t size = index_.type->bytes;
        while (count > 0) {
            const size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin() - 1);
            const uint64_t within = start - starts_[s];
            const uint64_t n = std::min<uint64_t>(count, starts_[s + 1] - start);
            buffer_.resize(n * size);
            bin_.read(static_cast<uint64_t>(index_.pointers[s]) + within * size, n * size, buffer_.data());
            convert_ids(buffer_.data(), n, *index_.type, vocab_, out, cat("'", bin_.path(), "' sequence ", s), within);
            out += n;
            start += n;
            count -= n;
        }
    }
    const MegatronIndex& index() const { return index_; }
    const std::vector<uint64_t>& starts() const { return starts_; }

private:
    RandomFile bin_;
    uint64_t vocab_;
    MegatronIndex index_;
    std::vector<uint64_t> starts_;  // token offset of each sequence, then the total
    std::string buffer_;
};

// The .bin is streamed into PREFIX.bin.tmp and renamed after the .idx is written; a writer
// that never finishes removes it.
class MegatronWriter : public TokenStreamWriter {
public:
    MegatronWriter(std::string prefix, uint64_t vocab)
        : prefix_(std::move(prefix)), type_(vocab <= 65536 ? kIdTypes[5] : kIdTypes[3]), vocab_(vocab), bin_(std::make_unique<OutputFile>(prefix_ + ".bin.tmp")) {}
    ~MegatronWriter() override {
        if (!bin_) return;
        bin_.reset();
        ::unlink((prefix_ + ".bin.tmp").c_str());
    }
    void add_document(const int32_t* tokens, size_t count) override {
        check_ids_fit(tokens, count, vocab_, prefix_ + ".bin");
        std::string bytes;
        append_ids(bytes, tokens, count, type_.bytes);
        bin_->append(bytes);
        pointers_.push_back(static_cast<int64_t>(bin_bytes_));
        lengths_.push_back(static_cast<int32_t>(count));
        bin_bytes_ += bytes.size();
    }
    void finish() override {
        bin_->finish();
        std::string idx(kMegatronMagic, sizeof kMegatronMagic);
        const uint64_t version = 1, sequences = lengths_.size(), documents = lengths_.size() + 1;
        idx.append(reinterpret_cast<const char*>(&version), 8);
        idx += static_cast<char>(type_.megatron_code);
        idx.append(reinterpret_cast<const char*>(&sequences), 8);
        idx.append(reinterpret_cast<const char*>(&documents), 8);
        idx.append(reinterpret_cast<const char*>(lengths_.data()), lengths_.size() * 4);
        idx.append(reinterpret_cast<const char*>(pointers_.data()), pointers_.size() * 8);
        for (uint64_t d = 0; d < documents; ++d) idx.append(reinterpret_cast<const char*>(&d), 8);  // one sequence per document
        write_file_atomically(prefix_ + ".idx", idx);
        const std::string tmp = prefix_ + ".bin.tmp", bin = prefix_ + ".bin";
        if (::rename(tmp.c_str(), bin.c_str()) != 0) fail(ErrorKind::io, "cannot rename '", tmp, "' to '", bin, "': ", std::strerror(errno));
        bin_.reset();
    }

private:
    std::string prefix_;
    IdType type_;
    uint64_t vocab_;
    std::unique_ptr<OutputFile> bin_;  // null once finished
    uint64_t bin_bytes_ = 0;
    std::vector<int32_t> lengths_;
    std::vector<int64_t> pointers_;
};

// ---- llm.c ----

constexpr int32_t kLlmcMagicU16 = 20240520, kLlmcMagicU32 = 20240801;
constexpr uint64_t kLlmcHeaderBytes = 256 * 4;

class LlmcSource : public TokenSource {
public:
    LlmcSource(const std::string& path, uint64_t vocab) : file_(path), vocab_(vocab) {
        const auto bad = [&](auto&&... what) { fail(ErrorKind::data, "llm.c shard '", path, "': ", what...); };
        if (file_.size() < kLlmcHeaderBytes) bad("truncated: ", file_.size(), " bytes, the header needs ", kLlmcHeaderBytes);
        int32_t header[3];
        file_.read(0, sizeof header, header);
        if (header[0] == kLlmcMagicU16 && header[1] == 1) type_ = kIdTypes[5];
        else if (header[0] == kLlmcMagicU32 && header[1] == 7) type_ = IdType{0, 4, false, "uint32"};
        else bad("magic ", header[0], " version ", header[1], " at offset 0 (expected 20240520 version 1, or 20240801 version 7)");
        if (header[2] < 0) bad("negative token count ", header[2], " at offset 8");
        tokens_ = static_cast<uint64_t>(header[2]);
        const uint64_t expected = kLlmcHeaderBytes + tokens_ * type_.bytes;
        if (expected != file_.size()) bad(file_.size(), " bytes but the header's ", tokens_, " tokens need ", expected, ": truncated or wrong count");
    }
    uint64_t token_count() const override { return tokens_; }
    std::string describe() const override { return cat("llm.c ", file_.path()); }
    void read(uint64_t start, uint64_t count, int32_t* out) override {
        buffer_.resize(count * type_.bytes);
        file_.read(kLlmcHeaderBytes + start * type_.bytes, count * type_.bytes, buffer_.data());
        convert_ids(buffer_.data(), count, type_, vocab_, out, cat("'", file_.path(), "'"), start);
    }

private:
    RandomFile file_;
    uint64_t vocab_;
    IdType type_{};
    uint64_t tokens_ = 0;
    std::string buffer_;
};

// Tokens are collected in memory: llm.c shards hold at most 2^31 - 1 tokens by design.
class FlatWriter : public TokenStreamWriter {
public:
    FlatWriter(std::string path, uint64_t vocab, bool llmc_header)
        : path_(std::move(path)), vocab_(vocab), llmc_header_(llmc_header), bytes_(vocab <= 65536 ? 2 : 4) {
        if (!llmc_header_ && vocab > 65536) fail(ErrorKind::data, "'", path_, "': nanoGPT's .bin holds uint16 ids but the vocabulary has ", vocab, " tokens");
    }
    void add_document(const int32_t* tokens, size_t count) override {
        check_ids_fit(tokens, count, vocab_, path_);
        append_ids(ids_, tokens, count, bytes_);
    }
    void finish() override {
        std::string out;
        if (llmc_header_) {
            const uint64_t tokens = ids_.size() / bytes_;
            if (tokens > INT32_MAX) fail(ErrorKind::data, "'", path_, "': ", tokens, " tokens exceed an llm.c shard's limit of 2^31 - 1");
            std::vector<int32_t> header(256, 0);
            header[0] = bytes_ == 2 ? kLlmcMagicU16 : kLlmcMagicU32;
            header[1] = bytes_ == 2 ? 1 : 7;
            header[2] = static_cast<int32_t>(tokens);
            out.assign(reinterpret_cast<const char*>(header.data()), kLlmcHeaderBytes);
        }
        out += ids_;
        write_file_atomically(path_, out);
    }

private:
    std::string path_;
    uint64_t vocab_;
    bool llmc_header_;
    uint32_t bytes_;
    std::string ids_;
};

class NanoGptSource : public TokenSource {
public:
    NanoGptSource(const std::string& path, uint64_t vocab) : file_(path), vocab_(vocab) {
        if (file_.size() % 2 != 0) fail(ErrorKind::data, "nanoGPT file '", path, "' has ", file_.size(), " bytes, not a whole number of uint16 ids: truncated");
    }
    uint64_t token_count() const override { return file_.size() / 2; }
    std::string describe() const override { return cat("nanoGPT ", file_.path()); }
    void read(uint64_t start, uint64_t count, int32_t* out) override {
        buffer_.resize(count * 2);
        file_.read(start * 2, count * 2, buffer_.data());
        convert_ids(buffer_.data(), count, kIdTypes[5], vocab_, out, cat("'", file_.path(), "'"), start);
    }

private:
    RandomFile file_;
    uint64_t vocab_;
    std::string buffer_;
};

// ---- llmtrain shards ----

nlohmann::json parse_manifest(const std::string& path) {
    std::ifstream in(path);
    if (!in) fail(ErrorKind::data, "cannot open dataset manifest '", path, "'");
    try {
        return nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        fail(ErrorKind::data, "'", path, "': not valid JSON: ", e.what());
    }
}

// The manifest's format, and its vocabulary size.
uint64_t check_manifest(const nlohmann::json& m, const std::string& manifest_path) {
    if (m.at("format") != "llmtrain-token-shards" || m.at("version") != 1)
        fail(ErrorKind::data, "'", manifest_path, "': not an llmtrain dataset manifest (format llmtrain-token-shards, version 1)");
    return m.at("tokenizer").at("vocab_size").get<uint64_t>();
}

std::vector<ManifestShard> manifest_shards(const nlohmann::json& m, const std::string& manifest_path, const char* split) {
    const fs::path dir = fs::path(manifest_path).parent_path();
    std::vector<ManifestShard> shards;
    for (const auto& shard : m.at(split).at("shards"))
        shards.push_back({split, (dir / shard.at("file").get<std::string>()).string(), shard.at("tokens").get<uint64_t>(), shard.at("bytes").get<uint64_t>()});
    return shards;
}

class ShardDatasetSource : public TokenSource {
public:
    ShardDatasetSource(const std::string& manifest_path, const std::string& split, uint64_t vocab) : manifest_(manifest_path), split_(split) {
        const nlohmann::json m = parse_manifest(manifest_path);
        const auto bad = [&](auto&&... what) { fail(ErrorKind::data, "'", manifest_path, "': ", what...); };
        try {
            const uint64_t dataset_vocab = check_manifest(m, manifest_path);
            if (dataset_vocab > vocab) bad("the dataset's vocabulary of ", dataset_vocab, " tokens exceeds model.vocab_size = ", vocab);
            starts_.push_back(0);
            for (const ManifestShard& shard : manifest_shards(m, manifest_path, split.c_str())) {
                std::error_code ec;
                const uint64_t size = fs::file_size(shard.path, ec);
                if (ec) bad("shard '", shard.path, "': ", ec.message());
                if (size != shard.bytes) bad("shard '", shard.path, "' has ", size, " bytes, the manifest says ", shard.bytes, ": truncated or replaced");
                shards_.push_back(std::make_unique<ShardReader>(shard.path));
                paths_.push_back(shard.path);
                if (shards_.back()->token_count() != shard.tokens) bad("shard '", shard.path, "' holds ", shards_.back()->token_count(), " tokens, the manifest says ", shard.tokens);
                starts_.push_back(starts_.back() + shards_.back()->token_count());
            }
        } catch (const nlohmann::json::exception& e) {
            bad("malformed manifest: ", e.what());
        }
    }
    uint64_t token_count() const override { return starts_.back(); }
    std::string describe() const override { return cat("shards of '", manifest_, "' (", split_, ")"); }
    void read(uint64_t start, uint64_t count, int32_t* out) override {
        while (count > 0) {
            const size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin() - 1);
            const uint64_t n = std::min<uint64_t>(count, starts_[s + 1] - start);
            try {
                shards_[s]->read(start - starts_[s], n, out);
            } catch (CorruptBlockError& e) {
                e.shard_index = s;
                throw;
            }
            out += n;
            start += n;
            count -= n;
        }
    }

    // "'train-00000.ltshard' documents 12-14": the documents the first and the last token
    // belong to (the file of the first token).
    std::string locate(uint64_t start, uint64_t count) const override {
        const size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin() - 1);
        const std::vector<uint64_t>& docs = shards_[s]->document_starts();
        const uint64_t first = start - starts_[s], last = std::min(start + count, starts_[s + 1]) - 1 - starts_[s];
        const auto document_of = [&](uint64_t token) { return std::upper_bound(docs.begin(), docs.end(), token) - docs.begin() - 1; };
        return cat("'", paths_[s], "' documents ", document_of(first), "-", document_of(last));
    }

    BlockOrigin block_origin(size_t shard, uint32_t block) const override {
        if (shard >= shards_.size() || block >= shards_[shard]->block_count())
            fail(ErrorKind::runtime, describe(), " has no shard ", shard, " block ", block);
        const ShardReader& r = *shards_[shard];
        return {paths_[shard], block, r.block_first_token(block), r.block_token_count(block)};
    }

private:
    std::string manifest_, split_;
    std::vector<std::string> paths_;
    std::vector<std::unique_ptr<ShardReader>> shards_;
    std::vector<uint64_t> starts_;
};

}  // namespace

std::unique_ptr<TokenStreamWriter> make_megatron_writer(const std::string& prefix, uint64_t vocab_size) { return std::make_unique<MegatronWriter>(prefix, vocab_size); }
std::unique_ptr<TokenStreamWriter> make_llmc_writer(const std::string& path, uint64_t vocab_size) { return std::make_unique<FlatWriter>(path, vocab_size, true); }
std::unique_ptr<TokenStreamWriter> make_nanogpt_writer(const std::string& path, uint64_t vocab_size) { return std::make_unique<FlatWriter>(path, vocab_size, false); }

std::unique_ptr<TokenSource> open_megatron(const std::string& prefix, uint64_t vocab_size) { return std::make_unique<MegatronSource>(megatron_prefix(prefix), vocab_size); }
std::unique_ptr<TokenSource> open_llmc(const std::string& path, uint64_t vocab_size) { return std::make_unique<LlmcSource>(path, vocab_size); }
std::unique_ptr<TokenSource> open_nanogpt(const std::string& path, uint64_t vocab_size) { return std::make_unique<NanoGptSource>(path, vocab_size); }
std::unique_ptr<TokenSource> open_shard_dataset(const std::string& manifest_path, const std::string& split, uint64_t vocab_size) {
    return std::make_unique<ShardDatasetSource>(manifest_path, split, vocab_size);
}

std::vector<uint64_t> megatron_document_starts(const std::string& prefix, uint64_t vocab_size) {
    const MegatronSource source(megatron_prefix(prefix), vocab_size);
    std::vector<uint64_t> starts;
    for (int64_t first_sequence : source.index().document_indices) starts.push_back(source.starts()[static_cast<size_t>(first_sequence)]);
    return starts;
}

std::vector<ManifestShard> dataset_shards(const std::string& manifest_path) {
    const nlohmann::json m = parse_manifest(manifest_path);
    try {
        check_manifest(m, manifest_path);
        std::vector<ManifestShard> shards = manifest_shards(m, manifest_path, "train");
        for (ManifestShard& shard : manifest_shards(m, manifest_path, "val")) shards.push_back(std::move(shard));
        return shards;
    } catch (const nlohmann::json::exception& e) {
        fail(ErrorKind::data, "'", manifest_path, "': malformed manifest: ", e.what());
    }
}

void check_dataset_tokenizer(const std::string& manifest_path, uint64_t tokenizer_hash, const std::string& tokenizer_path) {
    const nlohmann::json m = parse_manifest(manifest_path);
    std::string recorded;
    try {
        recorded = m.at("tokenizer").at("xxh3").get<std::string>();
    } catch (const nlohmann::json::exception& e) {
        fail(ErrorKind::data, "'", manifest_path, "': malformed manifest: ", e.what());
    }
    char actual[17];
    std::snprintf(actual, sizeof actual, "%016llx", static_cast<unsigned long long>(tokenizer_hash));
    if (recorded != actual)
        fail(ErrorKind::data, "tokenizer '", tokenizer_path, "' (xxh3 ", actual, ") is not the one '", manifest_path, "' was prepared with (xxh3 ", recorded,
             "): its ids would decode to other text; point data.tokenizer at the dataset's tokenizer or prepare the dataset again");
}

void check_megatron_index(const std::string& name, const std::string& idx_bytes, uint64_t bin_bytes) { parse_megatron_index(name, idx_bytes, bin_bytes); }

}  // namespace llmtrain
