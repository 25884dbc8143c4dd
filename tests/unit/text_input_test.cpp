// Reading input text: gzip and zstd told apart by their magic bytes whatever the name,
// concatenated members and frames, corrupt or cut-short data and formats that cannot be read
// refused naming the file, and the sniffer that refuses bytes that are not text.
#include <gtest/gtest.h>

#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/text_input.h"
#include "test_paths.h"
#include "support/error_text.h"

using namespace llmtrain;

namespace {

std::string gzip_of(const std::string& bytes) {
    z_stream z{};
    EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    std::string out(deflateBound(&z, bytes.size()) + 64, '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
    z.avail_in = static_cast<uInt>(bytes.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
    out.resize(z.total_out);
    deflateEnd(&z);
    return out;
}

std::string zstd_of(const std::string& bytes) {
    std::string out(ZSTD_compressBound(bytes.size()), '\0');
    out.resize(ZSTD_compress(out.data(), out.size(), bytes.data(), bytes.size(), 3));
    return out;
}

std::string write_temp(const std::string& name, const std::string& bytes) {
    const std::string dir = llmtrain::test::process_temp_path("text_input");
    std::filesystem::create_directories(dir);
    const std::string path = dir + "/" + name;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return path;
}

std::string text_of(int lines) {
    std::string text;
    for (int i = 0; i < lines; ++i) text += "line " + std::to_string(i) + " of some text, with ünïcödé and 🙂\n";
    return text;
}

}  // namespace

TEST(TextInput, GzipAndZstdAreReadByTheirMagicBytesWhateverTheName) {
    const std::string text = text_of(20000);  // > 1 MB: several reads of the file and of the decoder
    EXPECT_EQ(read_input_text(write_temp("plain.txt", text)), text);
    EXPECT_EQ(read_input_text(write_temp("a.txt.gz", gzip_of(text))), text);
    EXPECT_EQ(read_input_text(write_temp("gzip-named.txt", gzip_of(text))), text);
    EXPECT_EQ(read_input_text(write_temp("a.jsonl.zst", zstd_of(text))), text);
    EXPECT_EQ(read_input_text(write_temp("zstd-named.dat", zstd_of(text))), text);
    EXPECT_EQ(TextReader(write_temp("b.gz", gzip_of(text))).compression(), Compression::gzip);
}

TEST(TextInput, ConcatenatedGzipMembersAndZstdFramesReadAsOneText) {
    const std::string a = text_of(10), b = text_of(3000);
    EXPECT_EQ(read_input_text(write_temp("two.gz", gzip_of(a) + gzip_of(b))), a + b);
    EXPECT_EQ(read_input_text(write_temp("two.zst", zstd_of(a) + zstd_of(b))), a + b);
    EXPECT_EQ(decompress(Compression::gzip, gzip_of(a) + gzip_of(b), "mem", 1 << 30), a + b);
}

TEST(TextInput, CutShortOrCorruptCompressedDataIsAnErrorNamingTheFile) {
    const std::string text = text_of(3000);
    const std::string gz = gzip_of(text), zst = zstd_of(text);
    for (const auto& [name, bytes] : std::vector<std::pair<std::string, std::string>>{{"cut.gz", gz.substr(0, gz.size() / 2)}, {"cut.zst", zst.substr(0, zst.size() / 2)}}) {
        const std::string error = error_of([&] { read_input_text(write_temp(name, bytes)); });
        EXPECT_NE(error.find(name + "'"), std::string::npos) << error;
        EXPECT_NE(error.find("ends early"), std::string::npos) << error;
    }
    std::string corrupt = zst;
    corrupt[corrupt.size() / 2] ^= 0x55;
    EXPECT_NE(error_of([&] { read_input_text(write_temp("corrupt.zst", corrupt)); }).find("corrupt.zst': corrupt zstd data"), std::string::npos);
    EXPECT_NE(error_of([&] { read_input_text(write_temp("trailing.gz", gz + "garbage after it")); }).find("are not another gzip member"), std::string::npos);
}

TEST(TextInput, ANameThatPromisesCompressionTheBytesLackIsRefused) {
    const std::string error = error_of([&] { TextReader reader(write_temp("plain.gz", text_of(5))); });
    EXPECT_NE(error.find("plain.gz' is named as gzip but its bytes are not gzip data"), std::string::npos) << error;
}

TEST(TextInput, UnreadableCompressionFormatsAreRefusedByName) {
    const std::string xz("\xFD" "7zXZ\0\0\0", 8);
    EXPECT_NE(error_of([&] { TextReader reader(write_temp("x.txt", xz)); }).find("x.txt' is xz-compressed"), std::string::npos);
    EXPECT_NE(error_of([&] { TextReader reader(write_temp("y.txt", std::string("BZh91AY&SY", 10) + "rest")); }).find("is bzip2-compressed"), std::string::npos);
    EXPECT_NE(error_of([&] { TextReader reader(write_temp("z.zip", std::string("PK\x03\x04", 4) + "rest")); }).find("is zip-compressed"), std::string::npos);
    EXPECT_EQ(TextReader(write_temp("bzh.txt", "BZh is how this text begins")).compression(), Compression::none);
}

TEST(TextInput, SniffRefusesBinaryAndUtf16ButNotTextWithAFewStrayBytes) {
    std::string binary;
    for (int i = 0; i < 4096; ++i) binary += static_cast<char>((i * 37 + 11) % 256);
    EXPECT_FALSE(sniff_text(binary).looks_like_text());
    std::string utf16;
    for (char c : text_of(50)) utf16 += std::string{c, '\0'};
    EXPECT_FALSE(sniff_text(utf16).looks_like_text());
    std::string latin1_quote = text_of(200);
    latin1_quote += "caf\xE9 na\xEFve \xFF\xFE";
    EXPECT_TRUE(sniff_text(latin1_quote).looks_like_text());
    EXPECT_TRUE(sniff_text("tabs\tand\r\nnewlines and \x1b[1mANSI\x1b[0m").looks_like_text());
    const std::string cut = text_of(10) + "\xE2\x82";  // a sample that ends inside a sequence
    EXPECT_EQ(sniff_text(cut, true).non_text, 0u);
    const std::string error = error_of([&] { read_input_text(write_temp("program.txt", binary)); });
    EXPECT_NE(error.find("input '"), std::string::npos);
    EXPECT_NE(error.find("program.txt' does not look like text"), std::string::npos) << error;
}

// A few hundred bytes that decode to megabytes: the decoders hold what does not fit a read
// and must be asked again after their input is spent.
TEST(TextInput, HighlyCompressedTextIsReadWhole) {
    const std::string text(5 << 20, 'a');
    EXPECT_EQ(read_input_text(write_temp("runs.zst", zstd_of(text))), text);
    EXPECT_EQ(read_input_text(write_temp("runs.gz", gzip_of(text))), text);
    EXPECT_EQ(read_input_text(write_temp("padded.gz", gzip_of(text) + std::string(512, '\0'))), text);
    EXPECT_EQ(decompress(Compression::zstd, zstd_of(text), "mem", text.size()), text);
}

TEST(TextInput, DecompressStopsAtItsLimit) {
    const std::string zeros(4 << 20, 'a');
    EXPECT_NE(error_of([&] { decompress(Compression::zstd, zstd_of(zeros), "bomb", 1 << 20); }).find("bomb': decompresses to more than 1048576 bytes"), std::string::npos);
}
