#include "data/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "data/byte_level.h"

namespace llmtrain {

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// \s and \S become explicit classes of Unicode White_Space, the set Oniguruma uses.
// PCRE2's own \s differs by version (10.42 lacks U+0085 and holds U+180E).
constexpr const char* kWhiteSpace = R"(\t\n\x{0b}\f\r \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";

std::string widen_whitespace(std::string_view p) {
    std::string out;
    bool in_class = false;
    for (size_t i = 0; i < p.size(); ++i) {
        const char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            const char d = p[++i];
            if (d == 's') out += in_class ? std::string(kWhiteSpace) : cat("[", kWhiteSpace, "]");
            else if (d == 'S' && !in_class) out += cat("[^", kWhiteSpace, "]");
            else { out += c; out += d; }
            continue;
        }
        out += c;
        if (c == '[' && !in_class) {
            in_class = true;
            if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
            if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is literal
        } else if (c == ']' && in_class) {
            in_class = false;
        }
    }
    return out;
}

// PCRE2 match state, one per thread: creating it (the JIT stack above all) costs more than
// matching a short document. One ovector pair suffices: only the whole match is used, and
// pcre2_match fills it even when the pattern has more groups (it then returns 0).
struct MatchState {
    pcre2_match_data* match;
    pcre2_match_context* context;
    pcre2_jit_stack* stack;
    MatchState()
        : match(pcre2_match_data_create(1, nullptr)), context(pcre2_match_context_create(nullptr)),
          stack(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
        if (!match || !context || !stack) fail(ErrorKind::runtime, "pre-tokenizer: out of memory for PCRE2 match state");
        pcre2_jit_stack_assign(context, nullptr, stack);
    }
    ~MatchState() {
        pcre2_jit_stack_free(stack);
        pcre2_match_context_free(context);
        pcre2_match_data_free(match);
    }
    MatchState(const MatchState&) = delete;
    MatchState& operator=(const MatchState&) = delete;
};

}  // namespace

struct Pretokenizer::Compiled {
    pcre2_code* code = nullptr;
    ~Compiled() { pcre2_code_free(code); }
};

Pretokenizer::Pretokenizer(std::string pattern, SplitEngine engine) : pattern_(std::move(pattern)), compiled_(std::make_unique<Compiled>()) {
    if (engine == SplitEngine::fastest) matcher_ = specialised_matcher(pattern_);
    const std::string widened = widen_whitespace(pattern_);
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(widened.data()), widened.size(), PCRE2_UTF | PCRE2_UCP, &error_code,
                                    &error_offset, nullptr);
    if (!compiled_->code) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(error_code, message, sizeof message);
        fail(ErrorKind::data, "pre-tokenizer pattern '", pattern_, "': ", reinterpret_cast<const char*>(message), " at offset ", error_offset);
    }
    // Without JIT (a platform PCRE2 lacks) matching still works, only slower.
    pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);
}

Pretokenizer::~Pretokenizer() = default;

const char* Pretokenizer::engine_name() const { return matcher_ ? specialised_matcher_name(pattern_) : "pcre2"; }

void Pretokenizer::split(std::string_view text, const std::function<void(std::string_view)>& piece) const {
    if (matcher_) return for_each_piece(text, piece);
    size_t run_start = 0, pos = 0;
    while (pos < text.size()) {
        const size_t length = utf8_sequence_length(text, pos);
        if (length > 0) { pos += length; continue; }
        split_valid_utf8(text.substr(run_start, pos - run_start), piece);
        piece(text.substr(pos, 1));
        run_start = ++pos;
    }
    split_valid_utf8(text.substr(run_start), piece);
}

// Matches in order; text between matches (which the shipped patterns never leave) becomes a
// piece too, as in Hugging Face's Split with behavior "Isolated".
void Pretokenizer::split_valid_utf8(std::string_view text, const std::function<void(std::string_view)>& piece) const {
    if (text.empty()) return;
    thread_local const MatchState state;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t emitted = 0, search = 0;
    while (search < text.size()) {
        const int rc = pcre2_match(compiled_->code, subject, text.size(), search, PCRE2_NO_UTF_CHECK, state.match, state.context);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0)
            fail(ErrorKind::runtime, "pre-tokenizer pattern failed (PCRE2 error ", rc, ") at byte ", search, " of a ", text.size(), "-byte text");
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match);
        const size_t begin = ovector[0], end = ovector[1];
        if (begin > emitted) piece(text.substr(emitted, begin - emitted));
        if (end > begin) {
            piece(text.substr(begin, end - begin));
            emitted = search = end;
        } else {
            emitted = begin;
            search = begin + utf8_sequence_length(text, begin);  // an empty match: step over one character
        }
    }
    if (emitted < text.size()) piece(text.substr(emitted));
}

}  // namespace llmtrain
