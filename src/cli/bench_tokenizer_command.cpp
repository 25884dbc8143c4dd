// `llmtrain bench tokenizer --tokenizer T --input FILES`: how fast the tokenizer turns text
// into ids on one thread, as `prepare` runs it (a fresh piece cache per run), and where the
// time goes. The phases are timed in separate passes over the same text: reading (and
// decompressing) the input, pre-tokenization alone, BPE of each piece the cache misses
// (timed piece by piece), the rest of encoding (cache lookups, copying ids, the added-token
// scan) as the full encode's time less those two, and compressing the ids into a shard.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "data/input_files.h"
#include "data/text_input.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace llmtrain {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct BenchTokenizerArgs {
    std::string tokenizer;
    std::vector<std::string> inputs;
    int repeat = 3;
    std::string split_engine = "fastest";
    std::string ids_out;
};

struct Phases {
    double read = 0, split = 0, bpe = 0, rest = 0, compress = 0;
    size_t pieces = 0, misses = 0;
};

// Pre-tokenization alone, then the encode loop with each cache miss's BPE timed.
void time_split_and_bpe(const Tokenizer& tokenizer, const std::string& text, Phases& p) {
    auto start = Clock::now();
    size_t pieces = 0;
    tokenizer.pretokenizer().for_each_piece(text, [&](std::string_view) { ++pieces; });
    p.split = seconds_since(start);
    p.pieces = pieces;
    EncodeCache cache;
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 2);
    double bpe = 0;
    tokenizer.pretokenizer().for_each_piece(text, [&](std::string_view piece) {
        size_t count = 0;
        if (piece.size() == 1 || cache.find(piece, count)) return;
        const size_t before = ids.size();
        const auto miss_start = Clock::now();
        tokenizer.encode_piece(piece, ids);
        bpe += seconds_since(miss_start);
        cache.insert(piece, ids.data() + before, ids.size() - before);
        ++p.misses;
    });
    p.bpe = bpe;
}

void print_phase(const char* name, double seconds, double total) {
    std::printf("  %-44s %8.3f s %6.1f%%\n", name, seconds, total > 0 ? 100.0 * seconds / total : 0.0);
}

void write_ids(const std::string& path, const std::vector<int32_t>& ids) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) fail(ErrorKind::io, "cannot write --ids-out '", path, "'");
    std::string line;
    line.reserve(ids.size() * 6);
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) line += ' ';
        line += std::to_string(ids[i]);
    }
    line += '\n';
    out << line;
    if (!out.flush()) fail(ErrorKind::io, "write error on --ids-out '", path, "'");
}

int run_bench_tokenizer(const BenchTokenizerArgs& args) {
    if (args.split_engine != "fastest" && args.split_engine != "pcre2") fail(ErrorKind::config, "--split-engine \"", args.split_engine, "\" (allowed: fastest, pcre2)");
    Tokenizer tokenizer = Tokenizer::load(args.tokenizer);
    if (args.split_engine == "pcre2") tokenizer.use_split_engine(SplitEngine::pcre2);
    Phases phases;
    auto start = Clock::now();
    const std::vector<std::string> files = expand_inputs(args.inputs);
    std::string text;
    for (const std::string& file : files) text += read_input_text(file);
    phases.read = seconds_since(start);
    if (text.empty()) fail(ErrorKind::data, "bench tokenizer: the input (", files.size(), " file(s)) is empty");
    const double mb = static_cast<double>(text.size()) / 1e6;
    std::printf("bench tokenizer: %s (%lld ids, split by %s), %zu file(s), %.2f MB, 1 thread\n", args.tokenizer.c_str(),
                static_cast<long long>(tokenizer.vocab_size()), tokenizer.pretokenizer().engine_name(), files.size(), mb);

    std::vector<int32_t> ids;
    std::vector<double> runs;
    for (int r = 0; r < args.repeat; ++r) {
        ids.clear();
        EncodeCache cache;  // fresh each run, as each prepare worker starts
        start = Clock::now();
        tokenizer.encode_append(text, ids, &cache);
        runs.push_back(seconds_since(start));
        std::printf("encode run %d: %zu tokens in %.3f s: %.2f MB/s, %.2fM tokens/s\n", r + 1, ids.size(), runs.back(), mb / runs.back(),
                    static_cast<double>(ids.size()) / 1e6 / runs.back());
    }
    std::vector<double> sorted = runs;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    std::printf("encode: %.2f MB/s, %.2fM tokens/s (median of %d; best %.2f MB/s)\n", mb / median, static_cast<double>(ids.size()) / 1e6 / median,
                args.repeat, mb / sorted.front());

    time_split_and_bpe(tokenizer, text, phases);
    phases.rest = std::max(0.0, median - phases.split - phases.bpe);
    ShardContents shard;
    shard.tokens = ids;
    shard.document_starts.push_back(ids.size());
    start = Clock::now();
    const std::string compressed = encode_shard(shard, ShardWriteOptions{tokenizer.vocab_size() <= 65536 ? 2u : 4u, static_cast<uint64_t>(tokenizer.vocab_size())});
    phases.compress = seconds_since(start);
    const double total = phases.read + phases.split + phases.bpe + phases.rest + phases.compress;
    std::printf("phases (separate passes; the encode's share is its median run):\n");
    print_phase("read + decompress input", phases.read, total);
    print_phase("pre-tokenize (split into pieces)", phases.split, total);
    print_phase("BPE merges (pieces the cache misses)", phases.bpe, total);
    print_phase("piece cache lookups, id copies, added tokens", phases.rest, total);
    print_phase("shard compression (zstd level 3)", phases.compress, total);
    std::printf("pieces: %zu (single bytes and cache hits need no BPE; %zu BPE runs, %.1f%% of the pieces); shard: %.2f bytes per token\n", phases.pieces,
                phases.misses, phases.pieces ? 100.0 * static_cast<double>(phases.misses) / static_cast<double>(phases.pieces) : 0.0,
                static_cast<double>(compressed.size()) / static_cast<double>(std::max<size_t>(1, ids.size())));
    if (!args.ids_out.empty()) write_ids(args.ids_out, ids);
    return 0;
}

}  // namespace

void register_bench_tokenizer(CLI::App& bench, CommandAction& action) {
    auto args = std::make_shared<BenchTokenizerArgs>();
    CLI::App* cmd = bench.add_subcommand("tokenizer", "Tokenizer throughput on one thread (MB/s, tokens/s) and the share of time in each phase");
    cmd->add_option("--tokenizer", args->tokenizer, "tokenizer.json, or a directory with it or with encoder.json + vocab.bpe")->required();
    cmd->add_option("--input", args->inputs, "Text files or glob patterns (gzip / zstd read by their magic bytes), encoded as one text")->required();
    cmd->add_option("--repeat", args->repeat, "Timed encodes of the whole text (the median is reported)")->check(CLI::Range(1, 1000))->capture_default_str();
    cmd->add_option("--split-engine", args->split_engine, "fastest (the specialised matcher of a known pattern) or pcre2")->capture_default_str();
    cmd->add_option("--ids-out", args->ids_out, "Write the ids (space-separated, one line) to this file");
    cmd->callback([args, &action] { action = [args] { return run_bench_tokenizer(*args); }; });
}

}  // namespace llmtrain
