#include "data/tokenizer.h"

#include <xxhash.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <queue>

#include "core/error.h"

namespace llmtrain {

namespace {

// Pieces up to this many bytes merge over small arrays on the stack, scanning for the
// lowest-ranked pair each round (O(n^2), but n is a word); longer ones (runs of symbols,
// base64) use a heap, O(n log n).
constexpr size_t kShortPieceBytes = 96;

uint64_t piece_hash(std::string_view piece) { return XXH3_64bits(piece.data(), piece.size()); }

}  // namespace

EncodeCache::EncodeCache() : slots_(4096) {}

size_t EncodeCache::probe(std::string_view piece, uint64_t hash) const {
    const size_t mask = slots_.size() - 1;
    for (size_t i = static_cast<size_t>(hash) & mask;; i = (i + 1) & mask) {
        const Slot& s = slots_[i];
        if (s.key_length == 0) return i;
        if (s.hash == hash && s.key_length == piece.size() && std::memcmp(keys_.data() + s.key_offset, piece.data(), piece.size()) == 0) return i;
    }
}

const int32_t* EncodeCache::find(std::string_view piece, size_t& count) const {
    if (piece.size() > kMaxPieceBytes) return nullptr;
    const Slot& s = slots_[probe(piece, piece_hash(piece))];
    if (s.key_length == 0) return nullptr;
    count = s.id_count;
    return ids_.data() + s.ids_offset;
}

void EncodeCache::insert(std::string_view piece, const int32_t* ids, size_t count) {
    if (piece.empty() || piece.size() > kMaxPieceBytes) return;
    if (entries_ >= kMaxEntries) {
        *this = EncodeCache();
    } else if (2 * (entries_ + 1) > slots_.size()) {
        grow();
    }
    const uint64_t hash = piece_hash(piece);
    Slot& s = slots_[probe(piece, hash)];
    if (s.key_length != 0) return;
    s = Slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()), static_cast<uint16_t>(piece.size()), static_cast<uint16_t>(count)};
    keys_.append(piece);
    ids_.insert(ids_.end(), ids, ids + count);
    ++entries_;
}

void EncodeCache::grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    const size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
        if (s.key_length == 0) continue;
        size_t i = static_cast<size_t>(s.hash) & mask;
        while (slots_[i].key_length != 0) i = (i + 1) & mask;
        slots_[i] = s;
    }
}

void MergeTable::reserve(size_t merges) {
    size_t capacity = 2;
    shift_ = 63;
    while (capacity < 2 * merges) { capacity *= 2; --shift_; }
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
}

void MergeTable::insert(int32_t left, int32_t right, Merge merge) {
    const uint64_t key = pair_key(left, right);
    size_t i = slot_of(key);
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    slots_[i] = Slot{key, merge};
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
        starts_added_[static_cast<uint8_t>(t.content[0])] = true;
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
    merges_.reserve(spec_.merges.size());
    for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
        const auto [left, right] = spec_.merges[rank];
        if (left < 0 || left >= vocab || right < 0 || right >= vocab)
            fail(ErrorKind::data, source_, ": merge #", rank, " names token ids (", left, ", ", right, ") outside [0, ", vocab, ")");
        const std::string joined = spec_.token_bytes[static_cast<size_t>(left)] + spec_.token_bytes[static_cast<size_t>(right)];
        const auto it = id_of_bytes_.find(joined);
        if (it == id_of_bytes_.end()) fail(ErrorKind::data, source_, ": merge #", rank, " (", left, ", ", right, ") makes a token that is not in the vocabulary");
        // A repeated pair takes its last rank, as Hugging Face's map does.
        merges_.insert(left, right, {static_cast<int32_t>(rank), it->second});
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
        if (!starts_added_[static_cast<uint8_t>(text[pos])]) { ++pos; continue; }
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
    pretokenizer_->for_each_piece(text, [&](std::string_view piece) {
        if (piece.size() == 1) return out.push_back(byte_id_[static_cast<uint8_t>(piece[0])]);
        size_t count = 0;
        if (const int32_t* ids = cache ? cache->find(piece, count) : nullptr) {
            out.insert(out.end(), ids, ids + count);
            return;
        }
        const size_t before = out.size();
        encode_piece(piece, out);
        if (cache) cache->insert(piece, out.data() + before, out.size() - before);
    });
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (spec_.ignore_merges) {
        if (const auto it = id_of_bytes_.find(piece); it != id_of_bytes_.end()) return out.push_back(it->second);
    }
    if (piece.size() <= kShortPieceBytes) return merge_short_piece(piece, out);
    merge_long_piece(piece, out);
}

// BPE as tiktoken does it: the piece's tokens and the merge of each adjacent pair sit in
// small arrays; each round merges the lowest-ranked pair (the leftmost among equals), closes
// the gap, and looks up the two pairs that changed. No allocation.
void Tokenizer::merge_short_piece(std::string_view piece, std::vector<int32_t>& out) const {
    constexpr int32_t kNoMerge = INT32_MAX;
    std::array<int32_t, kShortPieceBytes> ids, rank, merged;  // rank[i], merged[i]: the pair (ids[i], ids[i + 1])
    size_t count = piece.size();
    for (size_t i = 0; i < count; ++i) ids[i] = byte_id_[static_cast<uint8_t>(piece[i])];
    const auto look_up = [&](size_t i) {
        const MergeTable::Merge* m = i + 1 < count ? merges_.find(ids[i], ids[i + 1]) : nullptr;
        rank[i] = m ? m->rank : kNoMerge;
        merged[i] = m ? m->merged : 0;
    };
    for (size_t i = 0; i < count; ++i) look_up(i);
    for (;;) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < count; ++i)
            if (rank[i] < rank[best]) best = i;
        if (count < 2 || rank[best] == kNoMerge) break;
        ids[best] = merged[best];
        --count;
        for (size_t i = best + 1; i < count; ++i) {
            ids[i] = ids[i + 1];
            rank[i] = rank[i + 1];
            merged[i] = merged[i + 1];
        }
        look_up(best);
        if (best > 0) look_up(best - 1);
    }
    out.insert(out.end(), ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(count));
}

// BPE on a long piece in O(n log n): a heap of candidate merges ordered by (rank, position);
// a popped candidate is stale when either side has merged since, which is detected by
// checking that the pair at its position still merges into the same token.
void Tokenizer::merge_long_piece(std::string_view piece, std::vector<int32_t>& out) const {
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
        if (const MergeTable::Merge* m = merges_.find(symbols[static_cast<size_t>(pos)].id, symbols[static_cast<size_t>(next)].id)) heap.push({m->rank, pos, m->merged});
    };
    for (size_t i = 0; i + 1 < piece.size(); ++i) push_pair(static_cast<int32_t>(i));
    while (!heap.empty()) {
        const Candidate top = heap.top();
        heap.pop();
        Symbol& left = symbols[static_cast<size_t>(top.pos)];
        if (!left.alive || left.next < 0) continue;
        Symbol& right = symbols[static_cast<size_t>(left.next)];
        const MergeTable::Merge* m = merges_.find(left.id, right.id);
        if (!m || m->merged != top.merged) continue;
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
