#include "data/bpe_trainer.h"

#include <algorithm>
#include <queue>
#include <unordered_set>

#include "core/error.h"

namespace llmtrain {

namespace {

uint64_t pair_key(int32_t left, int32_t right) { return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right); }
int32_t left_of(uint64_t key) { return static_cast<int32_t>(key >> 32); }
int32_t right_of(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

struct Word {
    std::vector<int32_t> symbols;
    int64_t count;
};

struct Candidate {
    int64_t count;
    uint64_t pair;
};
// Most frequent first; among equals the lower (left, right) ids, so training is deterministic.
struct FewerFirst {
    bool operator()(const Candidate& a, const Candidate& b) const { return a.count != b.count ? a.count < b.count : a.pair > b.pair; }
};

// The pair counts of all words and, for each pair, the words it occurs in.
struct PairIndex {
    std::unordered_map<uint64_t, int64_t> counts;
    std::unordered_map<uint64_t, std::vector<int32_t>> words;
    std::unordered_set<uint64_t> changed;

    void add_word(const Word& w, int32_t index, int64_t sign) {
        for (size_t i = 0; i + 1 < w.symbols.size(); ++i) {
            const uint64_t key = pair_key(w.symbols[i], w.symbols[i + 1]);
            counts[key] += sign * w.count;
            if (sign > 0) words[key].push_back(index);
            changed.insert(key);
        }
    }
};

// Replaces each (left, right) in the word by merged, leftmost first.
void merge_in_word(Word& w, int32_t left, int32_t right, int32_t merged) {
    std::vector<int32_t> out;
    out.reserve(w.symbols.size());
    for (size_t i = 0; i < w.symbols.size(); ++i) {
        if (i + 1 < w.symbols.size() && w.symbols[i] == left && w.symbols[i + 1] == right) {
            out.push_back(merged);
            ++i;
        } else {
            out.push_back(w.symbols[i]);
        }
    }
    w.symbols = std::move(out);
}

}  // namespace

BpeTrainer::BpeTrainer(BpeTrainOptions options) : options_(std::move(options)), pretokenizer_(options_.pattern) {
    const auto minimum = static_cast<int64_t>(256 + options_.special_tokens.size());
    if (options_.vocab_size < minimum)
        fail(ErrorKind::config, "tokenizer vocab size ", options_.vocab_size, " is below ", minimum, " (256 bytes + ", options_.special_tokens.size(), " special tokens)");
}

void BpeTrainer::add_text(std::string_view text) {
    const auto count_pieces = [&](std::string_view part) { pretokenizer_.split(part, [&](std::string_view piece) { ++piece_counts_[std::string(piece)]; }); };
    size_t start = 0;
    for (size_t pos = 0; pos < text.size(); ++pos) {
        for (const std::string& special : options_.special_tokens) {
            if (special.empty() || text.compare(pos, special.size(), special) != 0) continue;
            count_pieces(text.substr(start, pos - start));
            start = pos + special.size();
            pos = start - 1;
            break;
        }
    }
    count_pieces(text.substr(start));
}

Tokenizer BpeTrainer::train(const std::string& source_name) const {
    TokenizerSpec spec;
    spec.pattern = options_.pattern;
    for (int b = 0; b < 256; ++b) spec.token_bytes.emplace_back(1, static_cast<char>(b));
    std::vector<std::pair<std::string, int64_t>> sorted(piece_counts_.begin(), piece_counts_.end());
    std::sort(sorted.begin(), sorted.end());
    std::vector<Word> words;
    words.reserve(sorted.size());
    for (const auto& [piece, count] : sorted) {
        Word w{{}, count};
        for (char c : piece) w.symbols.push_back(static_cast<uint8_t>(c));
        words.push_back(std::move(w));
    }
    PairIndex index;
    for (size_t i = 0; i < words.size(); ++i) index.add_word(words[i], static_cast<int32_t>(i), +1);
    std::priority_queue<Candidate, std::vector<Candidate>, FewerFirst> heap;
    const auto push_changed = [&] {
        for (uint64_t key : index.changed)
            if (const int64_t c = index.counts[key]; c > 0) heap.push({c, key});
        index.changed.clear();
    };
    push_changed();
    const auto target = static_cast<size_t>(options_.vocab_size) - options_.special_tokens.size();
    std::vector<int32_t> last_merge_of_word(words.size(), -1);
    while (spec.token_bytes.size() < target && !heap.empty()) {
        const Candidate top = heap.top();
        heap.pop();
        const int64_t current = index.counts[top.pair];
        if (current != top.count) continue;  // stale; the current count was pushed when it changed
        if (current < options_.min_frequency) break;
        const int32_t left = left_of(top.pair), right = right_of(top.pair);
        const auto merged = static_cast<int32_t>(spec.token_bytes.size());
        spec.token_bytes.push_back(spec.token_bytes[static_cast<size_t>(left)] + spec.token_bytes[static_cast<size_t>(right)]);
        spec.merges.emplace_back(left, right);
        const std::vector<int32_t> affected = std::move(index.words[top.pair]);
        index.words.erase(top.pair);
        for (int32_t w : affected) {
            if (last_merge_of_word[static_cast<size_t>(w)] == merged) continue;  // listed twice
            last_merge_of_word[static_cast<size_t>(w)] = merged;
            index.add_word(words[static_cast<size_t>(w)], w, -1);
            merge_in_word(words[static_cast<size_t>(w)], left, right, merged);
            index.add_word(words[static_cast<size_t>(w)], w, +1);
        }
        push_changed();
    }
    for (const std::string& special : options_.special_tokens) {
        spec.added.push_back({special, static_cast<int32_t>(spec.token_bytes.size()), true});
        spec.token_bytes.push_back(special);
    }
    return Tokenizer(std::move(spec), source_name);
}

}  // namespace llmtrain
