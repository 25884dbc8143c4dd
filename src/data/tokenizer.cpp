#include "data/tokenizer.h"

#include <xxhash.h>

#include <algorithm>
#include <queue>

#include "core/error.h"

namespace llmtrain {

namespace {

uint64_t pair_key(int32_t left, int32_t right) { return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right); }

// Pieces longer than this are not memoized: they rarely repeat and would bloat the cache.
constexpr size_t kMaxCachedPieceBytes = 64;
constexpr size_t kMaxCacheEntries = size_t{1} << 20;

}  // namespace

const std::vector<int32_t>* EncodeCache::find(std::string_view piece) const {
    const auto it = entries_.find(piece);
    return it == entries_.end() ? nullptr : &it->second;
}

void EncodeCache::insert(std::string_view piece, const std::vector<int32_t>& ids) {
    if (piece.size() > kMaxCachedPieceBytes) return;
    if (entries_.size() >= kMaxCacheEntries) entries_.clear();
    entries_.emplace(std::string(piece), ids);
}

Tokenizer::Tokenizer(TokenizerSpec spec, std::string source) : spec_(std::move(spec)), source_(std::move(source)) {
    index_spec();
    pretokenizer_ = std::make_shared<Pretokenizer>(spec_.pattern);
}

// Builds the lookup tables and checks the spec: every byte has a token, merges join known
// tokens into known tokens, added tokens are non-empty and inside the id range.
void Tokenizer::index_spec() {
    const auto vocab = static_cast<int32_t>(spec_.token_bytes.size());
    is_added_.assign(spec_.token_bytes.size(), false);
    for (size_t i = 0; i < spec_.added.size(); ++i) {
        const AddedToken& t = spec_.added[i];
        if (t.content.empty() || t.id < 0 || t.id >= vocab)
            fail(ErrorKind::data, source_, ": added token #", i, " (id ", t.id, ") is empty or outside the id range [0, ", vocab, ")");
        is_added_[static_cast<size_t>(t.id)] = true;
        added_by_first_byte_[static_cast<uint8_t>(t.content[0])].push_back(i);
    }
    for (auto& list : added_by_first_byte_)
        std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) { return spec_.added[a].content.size() > spec_.added[b].content.size(); });
    for (int32_t id = 0; id < vocab; ++id) {
        const std::string& bytes = spec_.token_bytes[static_cast<size_t>(id)];
        if (bytes.empty() || is_added_[static_cast<size_t>(id)]) continue;
        if (!id_of_bytes_.emplace(bytes, id).second)
            fail(ErrorKind::data, source_, ": tokens ", id_of_bytes_[bytes], " and ", id, " stand for the same bytes");
    }
    for (int b = 0; b < 256; ++b) {
        const auto it = id_of_bytes_.find(std::string(1, static_cast<char>(b)));
        if (it == id_of_bytes_.end()) fail(ErrorKind::data, source_, ": the vocabulary has no token for byte 0x", std::hex, b, std::dec, "; byte-level BPE needs all 256");
        byte_id_[static_cast<size_t>(b)] = it->second;
    }
    for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
        const auto [left, right] = spec_.merges[rank];
        if (left < 0 || left >= vocab || right < 0 || right >= vocab)
            fail(ErrorKind::data, source_, ": merge #", rank, " names token ids (", left, ", ", right, ") outside [0, ", vocab, ")");
        const std::string joined = spec_.token_bytes[static_cast<size_t>(left)] + spec_.token_bytes[static_cast<size_t>(right)];
        const auto it = id_of_bytes_.find(joined);
        if (it == id_of_bytes_.end()) fail(ErrorKind::data, source_, ": merge #", rank, " (", left, ", ", right, ") makes a token that is not in the vocabulary");
        // A repeated pair takes its last rank, as Hugging Face's map does.
        merges_[pair_key(left, right)] = Merge{static_cast<int32_t>(rank), it->second};
    }
}

std::optional<int32_t> Tokenizer::end_of_text_id() const {
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>"}) {
        for (const AddedToken& t : spec_.added)
            if (t.content == name) return t.id;
        if (const auto it = id_of_bytes_.find(name); it != id_of_bytes_.end()) return it->second;
    }
    return std::nullopt;
}

uint64_t Tokenizer::hash() const {
    const std::string json = to_hf_json();
    return XXH3_64bits(json.data(), json.size());
}

std::optional<size_t> Tokenizer::added_token_at(std::string_view text, size_t pos) const {
    for (size_t index : added_by_first_byte_[static_cast<uint8_t>(text[pos])])
        if (text.compare(pos, spec_.added[index].content.size(), spec_.added[index].content) == 0) return index;
    return std::nullopt;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, EncodeCache* cache) const {
    std::vector<int32_t> out;
    encode_append(text, out, cache);
    return out;
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out, EncodeCache* cache) const {
    if (spec_.added.empty()) return encode_ordinary(text, out, cache);
    size_t start = 0;
    for (size_t pos = 0; pos < text.size();) {
        const auto added = added_token_at(text, pos);
        if (!added) { ++pos; continue; }
        encode_ordinary(text.substr(start, pos - start), out, cache);
        out.push_back(spec_.added[*added].id);
        pos += spec_.added[*added].content.size();
        start = pos;
    }
    encode_ordinary(text.substr(start), out, cache);
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out, EncodeCache* cache) const {
    std::vector<int32_t> ids;
    pretokenizer_->split(text, [&](std::string_view piece) {
        if (piece.size() == 1) { out.push_back(byte_id_[static_cast<uint8_t>(piece[0])]); return; }
        if (cache) {
            if (const auto* hit = cache->find(piece)) { out.insert(out.end(), hit->begin(), hit->end()); return; }
        }
        ids.clear();
        encode_piece(piece, ids);
        if (cache) cache->insert(piece, ids);
        out.insert(out.end(), ids.begin(), ids.end());
    });
}

// BPE on one piece in O(n log n): a heap of candidate merges ordered by (rank, position);
// a popped candidate is stale when either side has merged since, which is detected by
// checking that the pair at its position still merges into the same token.
void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (spec_.ignore_merges) {
        if (const auto it = id_of_bytes_.find(std::string(piece)); it != id_of_bytes_.end()) { out.push_back(it->second); return; }
    }
    struct Symbol { int32_t id, prev, next; bool alive; };
    struct Candidate { int32_t rank, pos, merged; };
    const auto later = [](const Candidate& a, const Candidate& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
    std::vector<Symbol> symbols(piece.size());
    for (size_t i = 0; i < piece.size(); ++i)
        symbols[i] = {byte_id_[static_cast<uint8_t>(piece[i])], static_cast<int32_t>(i) - 1, i + 1 < piece.size() ? static_cast<int32_t>(i + 1) : -1, true};
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> heap(later);
    const auto push_pair = [&](int32_t pos) {
        const int32_t next = symbols[static_cast<size_t>(pos)].next;
        if (next < 0) return;
        const auto it = merges_.find(pair_key(symbols[static_cast<size_t>(pos)].id, symbols[static_cast<size_t>(next)].id));
        if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.merged});
    };
    for (size_t i = 0; i + 1 < piece.size(); ++i) push_pair(static_cast<int32_t>(i));
    while (!heap.empty()) {
        const Candidate top = heap.top();
        heap.pop();
        Symbol& left = symbols[static_cast<size_t>(top.pos)];
        if (!left.alive || left.next < 0) continue;
        Symbol& right = symbols[static_cast<size_t>(left.next)];
        const auto it = merges_.find(pair_key(left.id, right.id));
        if (it == merges_.end() || it->second.merged != top.merged) continue;
        left.id = top.merged;
        right.alive = false;
        left.next = right.next;
        if (left.next >= 0) symbols[static_cast<size_t>(left.next)].prev = top.pos;
        if (left.prev >= 0) push_pair(left.prev);
        push_pair(top.pos);
    }
    for (int32_t pos = 0; pos >= 0; pos = symbols[static_cast<size_t>(pos)].next) out.push_back(symbols[static_cast<size_t>(pos)].id);
}

std::string Tokenizer::decode(const int32_t* ids, size_t count) const {
    std::string out;
    for (size_t i = 0; i < count; ++i) {
        const int32_t id = ids[i];
        if (id < 0 || id >= vocab_size() || spec_.token_bytes[static_cast<size_t>(id)].empty())
            fail(ErrorKind::data, source_, ": cannot decode token id ", id, " at position ", i, ": not in the vocabulary of ", vocab_size(), " ids");
        out += spec_.token_bytes[static_cast<size_t>(id)];
    }
    return out;
}

}  // namespace llmtrain
