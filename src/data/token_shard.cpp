#include "data/token_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#ifdef LLMTRAIN_FUZZ_SKIP_CHECKSUMS
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_d_forceIgnoreChecksum (core/checksum_policy.h)
#endif
#include <zstd.h>

#include <bit>
#include <cstring>

#include "core/checksum_policy.h"
#include "core/error.h"

namespace llmtrain {

static_assert(std::endian::native == std::endian::little, "shards are little-endian; this host is not");

namespace {

constexpr char kMagic[8] = {'L', 'T', 'S', 'H', 'A', 'R', 'D', '\0'};
constexpr size_t kHeaderBytes = 64;
constexpr size_t kHashedHeaderBytes = 56;  // all but the hash itself

struct Header {
    char magic[8];
    uint32_t version;
    uint32_t token_bytes;
    uint64_t vocab_size;
    uint64_t token_count;
    uint64_t document_count;
    uint32_t block_tokens;
    uint32_t block_count;
    uint64_t payload_bytes;
    uint64_t metadata_xxh3;
};
static_assert(sizeof(Header) == kHeaderBytes);

template <class T>
void append_pod(std::string& out, const T& value) {
    out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

void append_u64s(std::string& out, const std::vector<uint64_t>& values) {
    out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(uint64_t));
}

std::string pack_block(const int32_t* tokens, size_t count, uint32_t token_bytes) {
    std::string raw(count * token_bytes, '\0');
    for (size_t i = 0; i < count; ++i) {
        if (token_bytes == 2) {
            const auto v = static_cast<uint16_t>(tokens[i]);
            std::memcpy(raw.data() + 2 * i, &v, 2);
        } else {
            std::memcpy(raw.data() + 4 * i, &tokens[i], 4);
        }
    }
    return raw;
}

std::string compress_block(const std::string& raw, int level) {
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    std::string out(ZSTD_compressBound(raw.size()), '\0');
    const size_t size = ZSTD_compress2(cctx, out.data(), out.size(), raw.data(), raw.size());
    ZSTD_freeCCtx(cctx);
    if (ZSTD_isError(size)) fail(ErrorKind::runtime, "zstd compression failed: ", ZSTD_getErrorName(size));
    out.resize(size);
    return out;
}

void check_contents(const ShardContents& c, const ShardWriteOptions& o) {
    const uint64_t limit = o.token_bytes == 2 ? std::min<uint64_t>(o.vocab_size, 65536) : o.vocab_size;
    for (size_t i = 0; i < c.tokens.size(); ++i)
        if (c.tokens[i] < 0 || static_cast<uint64_t>(c.tokens[i]) >= limit)
            fail(ErrorKind::data, "token id ", c.tokens[i], " at offset ", i, " does not fit a shard of vocabulary ", o.vocab_size, " and ", o.token_bytes, "-byte ids");
    if (c.document_starts.empty() || c.document_starts.front() != 0 || c.document_starts.back() != c.tokens.size())
        fail(ErrorKind::runtime, "shard document starts must run from 0 to the token count");
}

// Decompresses one zstd frame into `raw`, checking the frame's content checksum (which the
// fuzzing build computes but ignores: core/checksum_policy.h). Returns zstd's size or error code.
size_t decompress_frame(std::string& raw, const std::string& frame) {
    ZSTD_DCtx* dctx = ZSTD_createDCtx();
#ifdef LLMTRAIN_FUZZ_SKIP_CHECKSUMS
    ZSTD_DCtx_setParameter(dctx, ZSTD_d_forceIgnoreChecksum, ZSTD_d_ignoreChecksum);
#endif
    const size_t got = ZSTD_decompressDCtx(dctx, raw.data(), raw.size(), frame.data(), frame.size());
    ZSTD_freeDCtx(dctx);
    return got;
}

}  // namespace

std::string encode_shard(const ShardContents& contents, const ShardWriteOptions& options) {
    check_contents(contents, options);
    const uint64_t tokens = contents.tokens.size();
    std::vector<uint64_t> block_offsets{0};
    std::string payload;
    for (uint64_t start = 0; start < tokens; start += options.block_tokens) {
        const size_t count = static_cast<size_t>(std::min<uint64_t>(options.block_tokens, tokens - start));
        payload += compress_block(pack_block(contents.tokens.data() + start, count, options.token_bytes), options.zstd_level);
        block_offsets.push_back(payload.size());
    }
    Header h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version = kShardVersion;
    h.token_bytes = options.token_bytes;
    h.vocab_size = options.vocab_size;
    h.token_count = tokens;
    h.document_count = contents.document_starts.size() - 1;
    h.block_tokens = options.block_tokens;
    h.block_count = static_cast<uint32_t>(block_offsets.size() - 1);
    h.payload_bytes = payload.size();
    std::string metadata(reinterpret_cast<const char*>(&h), kHashedHeaderBytes);
    append_u64s(metadata, block_offsets);
    append_u64s(metadata, contents.document_starts);
    h.metadata_xxh3 = XXH3_64bits(metadata.data(), metadata.size());
    std::string out;
    out.reserve(kHeaderBytes + metadata.size() + payload.size());
    append_pod(out, h);
    out.append(metadata, kHashedHeaderBytes, std::string::npos);
    out += payload;
    return out;
}

ShardReader::ShardReader(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(ErrorKind::data, "cannot open shard '", path_, "': ", std::strerror(errno));
    struct stat st{};
    if (::fstat(fd_, &st) != 0) fail(ErrorKind::io, "cannot stat shard '", path_, "'");
    const auto size = static_cast<uint64_t>(st.st_size);
    parse_metadata(read_bytes(0, std::min<uint64_t>(size, kHeaderBytes)), size);
}

ShardReader::ShardReader(std::string name, std::string bytes) : path_(std::move(name)), memory_(std::move(bytes)) {
    parse_metadata(memory_.substr(0, kHeaderBytes), memory_.size());
}

ShardReader::~ShardReader() {
    if (fd_ >= 0) ::close(fd_);
}

std::string ShardReader::read_bytes(uint64_t offset, uint64_t count) const {
    if (fd_ < 0) return memory_.substr(static_cast<size_t>(offset), static_cast<size_t>(count));
    std::string out(static_cast<size_t>(count), '\0');
    uint64_t done = 0;
    while (done < count) {
        const ssize_t n = ::pread(fd_, out.data() + done, count - done, static_cast<off_t>(offset + done));
        if (n <= 0) fail(ErrorKind::data, "shard '", path_, "': cannot read ", count, " bytes at offset ", offset, n == 0 ? ": file ends early" : "");
        done += static_cast<uint64_t>(n);
    }
    return out;
}

// Checks everything the header promises against the file before any block is touched;
// each count is bounded by the file size first, so no product can overflow.
void ShardReader::parse_metadata(const std::string& head, uint64_t file_size) {
    const auto bad = [&](auto&&... what) { fail(ErrorKind::data, "shard '", path_, "': ", what...); };
    if (head.size() < kHeaderBytes) bad("truncated: ", file_size, " bytes, the header alone needs ", kHeaderBytes);
    Header h{};
    std::memcpy(&h, head.data(), kHeaderBytes);
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) bad("not a token shard (wrong magic at offset 0)");
    if (h.version != kShardVersion) bad("version ", h.version, " (this build reads version ", kShardVersion, ")");
    if (h.token_bytes != 2 && h.token_bytes != 4) bad("token width ", h.token_bytes, " bytes at offset 12 (allowed: 2, 4)");
    if (h.block_tokens == 0) bad("block size of 0 tokens at offset 40");
    const uint64_t blocks_needed = h.token_count / h.block_tokens + (h.token_count % h.block_tokens != 0);
    if (h.block_count != blocks_needed) bad("block count ", h.block_count, " at offset 44, but ", h.token_count, " tokens in blocks of ", h.block_tokens, " need ", blocks_needed);
    if (h.document_count > file_size / 8 || h.payload_bytes > file_size) bad("document count or payload size exceeds the file size (", file_size, " bytes): truncated or corrupt");
    const uint64_t metadata_bytes = (uint64_t{h.block_count} + 1 + h.document_count + 1) * 8;
    const uint64_t expected = kHeaderBytes + metadata_bytes + h.payload_bytes;
    if (expected != file_size) bad(file_size, " bytes but the header describes ", expected, ": truncated or trailing bytes");
    std::string metadata(head.data(), kHashedHeaderBytes);
    metadata += read_bytes(kHeaderBytes, metadata_bytes);
    if (checksum_mismatch(h.metadata_xxh3, XXH3_64bits(metadata.data(), metadata.size()))) bad("header or index checksum mismatch (bytes 0 to ", kHeaderBytes + metadata_bytes, "): corrupt");
    block_offsets_.resize(h.block_count + 1);
    document_starts_.resize(h.document_count + 1);
    std::memcpy(block_offsets_.data(), metadata.data() + kHashedHeaderBytes, block_offsets_.size() * 8);
    std::memcpy(document_starts_.data(), metadata.data() + kHashedHeaderBytes + block_offsets_.size() * 8, document_starts_.size() * 8);
    for (size_t i = 0; i + 1 < block_offsets_.size(); ++i)
        if (block_offsets_[i] >= block_offsets_[i + 1]) bad("block ", i, " has offset ", block_offsets_[i], " >= the next block's ", block_offsets_[i + 1]);
    if (block_offsets_.front() != 0 || block_offsets_.back() != h.payload_bytes) bad("block offsets do not span the payload of ", h.payload_bytes, " bytes");
    for (size_t i = 0; i + 1 < document_starts_.size(); ++i)
        if (document_starts_[i] > document_starts_[i + 1]) bad("document ", i, " starts at token ", document_starts_[i], ", after the next one");
    if (document_starts_.front() != 0 || document_starts_.back() != h.token_count) bad("document starts do not span the ", h.token_count, " tokens");
    token_bytes_ = h.token_bytes;
    block_tokens_ = h.block_tokens;
    vocab_size_ = h.vocab_size;
    token_count_ = h.token_count;
    payload_offset_ = kHeaderBytes + metadata_bytes;
}

CorruptBlockError::CorruptBlockError(std::string shard, uint32_t block, uint64_t byte_offset, uint64_t first_token, uint64_t tokens, std::string reason)
    : Error(ErrorKind::data, cat("shard '", shard, "': block ", block, " at byte offset ", byte_offset, " (tokens [", first_token, ", ", first_token + tokens, ")): ", reason)),
      shard_(std::move(shard)), reason_(std::move(reason)), block_(block), first_token_(first_token), tokens_(tokens) {}

uint64_t ShardReader::block_token_count(uint32_t index) const { return std::min<uint64_t>(block_tokens_, token_count_ - block_first_token(index)); }

// Checks the frame's sizes and zstd checksum, then every id.
void ShardReader::decode_block(uint32_t index, std::vector<int32_t>& out) const {
    const uint64_t first_token = block_first_token(index);
    const uint64_t count = block_token_count(index);
    const uint64_t offset = payload_offset_ + block_offsets_[index];
    const std::string frame = read_bytes(offset, block_bytes(index));
    const auto bad = [&](auto&&... what) { throw CorruptBlockError(path_, index, offset, first_token, count, cat(what...)); };
    std::string raw(count * token_bytes_, '\0');
    if (ZSTD_getFrameContentSize(frame.data(), frame.size()) != raw.size()) bad("frame header does not announce ", raw.size(), " bytes: corrupt");
    if (ZSTD_findFrameCompressedSize(frame.data(), frame.size()) != frame.size()) bad("frame does not fill its ", frame.size(), " bytes: corrupt");
    const size_t got = decompress_frame(raw, frame);
    if (ZSTD_isError(got)) bad("zstd: ", ZSTD_getErrorName(got));
    if (got != raw.size()) bad("decompressed to ", got, " bytes instead of ", raw.size());
    out.resize(count);
    for (uint64_t i = 0; i < count; ++i) {
        uint32_t id = 0;
        std::memcpy(&id, raw.data() + i * token_bytes_, token_bytes_);
        if (id >= vocab_size_) bad("token id ", id, " at token offset ", first_token + i, " is not below the vocabulary size ", vocab_size_);
        out[i] = static_cast<int32_t>(id);
    }
}

const std::vector<int32_t>& ShardReader::block(uint32_t index) {
    if (index == cached_block_) return cached_tokens_;
    cached_block_ = UINT32_MAX;
    decode_block(index, cached_tokens_);
    cached_block_ = index;
    return cached_tokens_;
}

void ShardReader::read(uint64_t start, uint64_t count, int32_t* out) {
    if (start > token_count_ || count > token_count_ - start)
        fail(ErrorKind::runtime, "shard '", path_, "': tokens [", start, ", ", start + count, ") lie outside its ", token_count_, " tokens");
    while (count > 0) {
        const auto index = static_cast<uint32_t>(start / block_tokens_);
        const std::vector<int32_t>& tokens = block(index);
        const uint64_t within = start - uint64_t{index} * block_tokens_;
        const uint64_t n = std::min<uint64_t>(count, tokens.size() - within);
        std::memcpy(out, tokens.data() + within, n * sizeof(int32_t));
        out += n;
        start += n;
        count -= n;
    }
}

std::vector<int32_t> ShardReader::read_all() {
    std::vector<int32_t> tokens(token_count_);
    read(0, token_count_, tokens.data());
    return tokens;
}

}  // namespace llmtrain
