#include "data/token_source.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace llmtrain {

namespace {

std::string read_file_bytes(const std::string& path, const char* key) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorKind::data, key, ": cannot open '", path, "'");
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) fail(ErrorKind::data, key, ": read error on '", path, "'");
    return bytes;
}

template <class Id>
std::vector<int32_t> decode_ids(const std::string& bytes, const std::string& path, const char* key) {
    if (bytes.size() % sizeof(Id) != 0)
        fail(ErrorKind::data, key, ": '", path, "' has ", bytes.size(), " bytes, not a multiple of the ", sizeof(Id), "-byte token size");
    std::vector<int32_t> ids(bytes.size() / sizeof(Id));
    for (size_t i = 0; i < ids.size(); ++i) {
        Id id;
        std::memcpy(&id, bytes.data() + i * sizeof(Id), sizeof(Id));
        ids[i] = static_cast<int32_t>(id);
    }
    return ids;
}

std::vector<int32_t> load_tokens(const DataConfig& data, const std::string& path, const char* key, int64_t vocab_size) {
    const std::string bytes = read_file_bytes(path, key);
    if (bytes.empty()) fail(ErrorKind::data, key, ": '", path, "' is empty");
    std::vector<int32_t> ids;
    if (data.format == DataFormat::text) ids = bytes_to_tokens(bytes, data.document_separator);
    else if (data.token_dtype == "u16") ids = decode_ids<uint16_t>(bytes, path, key);
    else ids = decode_ids<int32_t>(bytes, path, key);
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0 || ids[i] >= vocab_size)
            fail(ErrorKind::data, key, ": '", path, "': token id ", ids[i], " at token offset ", i, " is outside the vocabulary [0, ", vocab_size, ") of model.vocab_size");
    return ids;
}

void require_tokens(const std::vector<int32_t>& ids, int64_t seq_len, const char* what) {
    if (static_cast<int64_t>(ids.size()) < seq_len + 1)
        fail(ErrorKind::data, what, " holds ", ids.size(), " tokens; one sequence needs train.seq_len + 1 = ", seq_len + 1);
}

}  // namespace

std::vector<int32_t> bytes_to_tokens(const std::string& text, const std::string& separator) {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    size_t i = 0;
    while (i < text.size()) {
        if (!separator.empty() && text.compare(i, separator.size(), separator) == 0) {
            ids.push_back(byte_eos_token);
            i += separator.size();
        } else {
            ids.push_back(static_cast<unsigned char>(text[i++]));
        }
    }
    return ids;
}

TokenSplits load_token_splits(const DataConfig& data, int64_t vocab_size, int64_t seq_len) {
    TokenSplits splits;
    splits.train = load_tokens(data, data.train_path, "data.train_path", vocab_size);
    if (!data.val_path.empty()) {
        splits.val = load_tokens(data, data.val_path, "data.val_path", vocab_size);
    } else {
        const auto held_out = static_cast<size_t>(static_cast<double>(splits.train.size()) * data.val_fraction);
        splits.val.assign(splits.train.end() - static_cast<std::ptrdiff_t>(held_out), splits.train.end());
        splits.train.resize(splits.train.size() - held_out);
    }
    require_tokens(splits.train, seq_len, cat("the training split of '", data.train_path, "'").c_str());
    require_tokens(splits.val, seq_len, data.val_path.empty() ? cat("the validation split (data.val_fraction = ", data.val_fraction, ") of '", data.train_path, "'").c_str()
                                                            : cat("data.val_path '", data.val_path, "'").c_str());
    return splits;
}

}  // namespace llmtrain
