// Arbitrary bytes as a Parquet input of `llmtrain prepare`, read as prepare reads it
// (data/parquet_reader.h): the footer, the "text" column found, then every row group's pages,
// each row's text checked as UTF-8, and each row group again from its second data page on (as
// a piece of a large row group is read). Never a crash, a hang or an allocation beyond the limits
// (lowered here: a 1 MiB footer, 8 MiB pages, 65,536 rows a page); every refusal names the
// file, and a row group that reads has exactly the rows its footer promised. The seeds
// (scripts/fuzz-seeds.sh) are small files of both writers the tests use, in every codec and
// encoding, so mutations reach past the footer into the pages.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "data/parquet_input.h"
#include "data/parquet_reader.h"

namespace {

constexpr uint64_t kMaxRows = uint64_t{1} << 20;  // a few bytes can stand for billions of null rows
struct TooManyRows {};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace llmtrain;
    const std::string name = "fuzz.parquet";
    parquet::ReaderLimits limits;
    limits.max_footer_bytes = 1 << 20;
    limits.max_page_bytes = 8 << 20;
    limits.max_page_values = 1 << 16;
    uint64_t rows = 0;
    try {
        const parquet::TextColumnReader reader(parquet::memory_source(std::string_view(reinterpret_cast<const char*>(data), size)), name, "text", limits);
        for (size_t g = 0; g < reader.row_groups(); ++g) {
            uint64_t in_group = 0;
            reader.read_row_group(g, [&](uint64_t row, const std::string_view* text) {
                if (row != in_group++) std::abort();  // rows are visited in order
                if (text) static_cast<void>(first_invalid_utf8(*text));
                if (++rows > kMaxRows) throw TooManyRows{};
            });
            if (in_group != reader.rows(g)) std::abort();  // a row group that reads holds what its footer says
            const std::vector<parquet::TextColumnReader::PageStart> pages = reader.data_pages(g);
            if (pages.size() < 2) continue;
            uint64_t expected = pages[1].rows_before;
            reader.read_pages(g, pages[1], UINT64_MAX, [&](uint64_t row, const std::string_view*) {
                if (row != expected++) std::abort();  // the piece's rows are numbered from the rows before it
                if (++rows > kMaxRows) throw TooManyRows{};
            });
            if (expected != reader.rows(g)) std::abort();
        }
    } catch (const Error& e) {
        if (std::string_view(e.what()).find("input '" + name + "'") == std::string_view::npos) std::abort();  // a refusal must name the file
    } catch (const TooManyRows&) {
    }
    return 0;
}
