#include "data/dataset_verify.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/external_formats.h"
#include "data/token_shard.h"

namespace llmtrain {

namespace {

namespace fs = std::filesystem;

// A shard opened for its blocks (null reader: it could not be opened; rank 0 says why).
struct OpenedShard {
    ManifestShard listed;
    std::unique_ptr<ShardReader> reader;
    uint64_t first_block = 0;  // the dataset's number of its block 0
};

// Checks the shard against the manifest and opens its header and index; a problem becomes
// a CorruptPart of the whole shard.
OpenedShard open_shard(const ManifestShard& listed, uint64_t order, std::vector<CorruptPart>& problems) {
    OpenedShard opened{listed, nullptr, 0};
    const auto problem = [&](const std::string& message) { problems.push_back({order, listed.path, -1, 0, 0, message}); };
    std::error_code ec;
    const uint64_t size = fs::file_size(listed.path, ec);
    if (ec) {
        problem(cat("shard '", listed.path, "': ", ec.message()));
        return opened;
    }
    if (size != listed.bytes) {
        problem(cat("shard '", listed.path, "' has ", size, " bytes, the manifest says ", listed.bytes, ": truncated or replaced"));
        return opened;
    }
    try {
        opened.reader = std::make_unique<ShardReader>(listed.path);
    } catch (const Error& e) {
        problem(e.what());
        return opened;
    }
    if (opened.reader->token_count() != listed.tokens) {
        problem(cat("shard '", listed.path, "' holds ", opened.reader->token_count(), " tokens, the manifest says ", listed.tokens));
        opened.reader.reset();
    }
    return opened;
}

// Checks blocks [begin, end) of the dataset's numbering on `threads` threads.
void check_blocks(const std::vector<OpenedShard>& shards, uint64_t begin, uint64_t end, int threads, VerifyReport& report) {
    std::atomic<uint64_t> next{begin};
    std::mutex merge_mutex;
    const auto work = [&] {
        VerifyReport mine;
        std::vector<int32_t> tokens;
        for (uint64_t n = next++; n < end; n = next++) {
            // The shard holding block n: the last whose first block is <= n (a shard without
            // a reader holds no blocks and shares its first block with the next one).
            const auto after = std::upper_bound(shards.begin(), shards.end(), n, [](uint64_t v, const OpenedShard& s) { return v < s.first_block; });
            const auto s = static_cast<size_t>(after - shards.begin() - 1);
            const ShardReader& reader = *shards[s].reader;
            const auto block = static_cast<uint32_t>(n - shards[s].first_block);
            try {
                reader.decode_block(block, tokens);
            } catch (const CorruptBlockError& e) {
                mine.corrupt.push_back({s, reader.path(), block, e.first_token(), e.tokens(), e.what()});
            } catch (const Error& e) {
                mine.corrupt.push_back({s, reader.path(), block, reader.block_first_token(block), reader.block_token_count(block), e.what()});
            }
            ++mine.blocks;
            mine.bytes += reader.block_bytes(block);
            mine.tokens += reader.block_token_count(block);
        }
        std::lock_guard<std::mutex> lock(merge_mutex);
        report.merge(mine);
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
}

}  // namespace

void VerifyReport::merge(const VerifyReport& other) {
    shards += other.shards;
    blocks += other.blocks;
    bytes += other.bytes;
    tokens += other.tokens;
    seconds = std::max(seconds, other.seconds);
    corrupt.insert(corrupt.end(), other.corrupt.begin(), other.corrupt.end());
    std::sort(corrupt.begin(), corrupt.end(), [](const CorruptPart& a, const CorruptPart& b) { return std::tie(a.shard_order, a.block) < std::tie(b.shard_order, b.block); });
}

std::string VerifyReport::to_json() const {
    nlohmann::json parts = nlohmann::json::array();
    for (const CorruptPart& p : corrupt)
        parts.push_back({{"shard_order", p.shard_order}, {"shard", p.shard}, {"block", p.block}, {"first_token", p.first_token}, {"tokens", p.tokens}, {"message", p.message}});
    return nlohmann::json{{"shards", shards}, {"blocks", blocks}, {"bytes", bytes}, {"tokens", tokens}, {"seconds", seconds}, {"corrupt", parts}}.dump();
}

VerifyReport VerifyReport::from_json(const std::string& text) {
    const nlohmann::json j = nlohmann::json::parse(text);
    VerifyReport r;
    r.shards = j.at("shards");
    r.blocks = j.at("blocks");
    r.bytes = j.at("bytes");
    r.tokens = j.at("tokens");
    r.seconds = j.at("seconds");
    for (const auto& p : j.at("corrupt"))
        r.corrupt.push_back({p.at("shard_order"), p.at("shard"), p.at("block"), p.at("first_token"), p.at("tokens"), p.at("message")});
    return r;
}

std::string dataset_manifest_path(const std::string& dataset) {
    return fs::is_directory(dataset) ? (fs::path(dataset) / "dataset.json").string() : dataset;
}

VerifyReport verify_dataset(const std::string& dataset, const VerifyShare& share) {
    Stopwatch clock;
    const std::vector<ManifestShard> listed = dataset_shards(dataset_manifest_path(dataset));
    VerifyReport report;
    std::vector<CorruptPart> problems;
    std::vector<OpenedShard> shards;
    uint64_t blocks = 0;
    for (size_t i = 0; i < listed.size(); ++i) {
        shards.push_back(open_shard(listed[i], i, problems));
        shards.back().first_block = blocks;
        if (shards.back().reader) blocks += shards.back().reader->block_count();
    }
    if (share.rank == 0) {
        report.shards = listed.size();
        report.corrupt = std::move(problems);
    }
    const auto ranks = static_cast<uint64_t>(share.ranks), rank = static_cast<uint64_t>(share.rank);
    check_blocks(shards, blocks * rank / ranks, blocks * (rank + 1) / ranks, std::max(1, share.threads), report);
    report.seconds = clock.seconds();
    return report;
}

std::string describe_verified(const VerifyReport& r) {
    const double mb = static_cast<double>(r.bytes) / 1e6;
    return cat(r.shards, " shard(s), ", r.blocks, " block(s), ", fixed(mb, 2), " MB (", r.tokens, " tokens) in ", fixed(r.seconds, 3), " s (",
               fixed(r.seconds > 0 ? mb / r.seconds : 0, 1), " MB/s)");
}

}  // namespace llmtrain
