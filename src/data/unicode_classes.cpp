#include "data/unicode_classes.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "data/byte_level.h"

namespace llmtrain {

namespace {

constexpr uint32_t kCodePoints = 0x110000;
constexpr uint32_t kBlockBits = 8;
using Block = std::array<CharClass, size_t{1} << kBlockBits>;

// Classes by block, filled on first use. A block is computed under a mutex and then
// published with release order; readers load it with acquire order and take no lock.
class ClassTable {
public:
    ClassTable() {
        int error = 0;
        PCRE2_SIZE offset = 0;
        const char* pattern = R"(^(?:(\p{L})|(\p{N})))";
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
        match_ = pcre2_match_data_create(3, nullptr);
        if (!code_ || !match_) fail(ErrorKind::runtime, "unicode classes: cannot set up PCRE2");
        for (auto& block : blocks_) block.store(nullptr, std::memory_order_relaxed);
    }
    ~ClassTable() {
        for (auto& block : blocks_) delete block.load(std::memory_order_relaxed);
        pcre2_match_data_free(match_);
        pcre2_code_free(code_);
    }
    ClassTable(const ClassTable&) = delete;
    ClassTable& operator=(const ClassTable&) = delete;

    CharClass of(uint32_t cp) {
        const Block* block = blocks_[cp >> kBlockBits].load(std::memory_order_acquire);
        if (!block) block = fill(cp >> kBlockBits);
        return (*block)[cp & ((1u << kBlockBits) - 1)];
    }

private:
    const Block* fill(uint32_t index) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (const Block* done = blocks_[index].load(std::memory_order_acquire)) return done;
        auto block = std::make_unique<Block>();
        for (uint32_t i = 0; i < block->size(); ++i) (*block)[i] = classify((index << kBlockBits) | i);
        blocks_[index].store(block.get(), std::memory_order_release);
        return block.release();
    }
    // Called with the mutex held: match_ is shared.
    CharClass classify(uint32_t cp) {
        if (is_unicode_white_space(cp)) return CharClass::space;
        if (cp >= 0xD800 && cp <= 0xDFFF) return CharClass::other;  // never in valid UTF-8
        std::string utf8;
        append_utf8(utf8, cp);
        const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(utf8.data()), utf8.size(), 0, 0, match_, nullptr);
        if (rc < 0) return CharClass::other;
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_);
        if (rc >= 2 && ovector[2] != PCRE2_UNSET) return CharClass::letter;
        return CharClass::number;
    }

    pcre2_code* code_ = nullptr;
    pcre2_match_data* match_ = nullptr;
    std::mutex mutex_;
    std::array<std::atomic<const Block*>, (kCodePoints >> kBlockBits)> blocks_;
};

ClassTable& class_table() {
    static ClassTable table;
    return table;
}

}  // namespace

bool is_unicode_white_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

CharClass char_class(uint32_t cp) { return class_table().of(cp); }

}  // namespace llmtrain
