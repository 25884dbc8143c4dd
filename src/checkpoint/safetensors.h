// Hugging Face weights: export of a checkpoint as model.safetensors + config.json that
// transformers loads as GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM (llama with
// model.qkv_bias), MixtralForCausalLM or Qwen2MoeForCausalLM (llama with model.moe, without
// or with shared experts: checkpoint/hf_moe.h), and
// import of such weights into a fresh run (train.init_from).
//
// safetensors: 8 bytes, little-endian, the header's length N; N bytes of JSON
//   {"<name>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end)}, ...,
//    "__metadata__": {"format": "pt"}}
// padded with spaces so that the data starts 8-byte aligned; then the tensors' bytes,
// row-major, little-endian, offsets counted from the end of the header.
//
// Parameter names are Hugging Face's already (model/parameters.h); the layouts differ in two
// places, mapped here one element at a time:
//  - GPT-2's attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj weights are Conv1D [in, out]
//    in Hugging Face; ours are [out, in] like torch.nn.Linear: transposed.
//  - Vocabulary rows (embedding, head) beyond model.vocab_size are padding (zeros): cut on
//    export, zero-filled on import.
// Tied embeddings: transformers ties lm_head to the embedding itself; no lm_head.weight is
// written (and one in an imported file is ignored when this model ties them).
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "core/tensor.h"
#include "data/tokenizer.h"
#include "model/parameters.h"

namespace llmtrain {

// The shape of tensor `name` in Hugging Face's layout, given ours (its global shape, padding
// rows included) and the model's vocabulary size.
Shape hf_shape(const std::string& name, const Shape& global_shape, int64_t vocab_size);
// The flat index in Hugging Face's layout of element g of our global tensor; -1 for an
// element of a padding row.
int64_t hf_index(const std::string& name, const Shape& global_shape, int64_t vocab_size, int64_t g);

// config.json for transformers: architectures, model_type and the model's dimensions.
// Throws Error(unsupported) naming the key for a mixture-of-experts model that no class
// computes (moe_export_problem).
std::string hf_config_json(const ModelConfig& model);

// One tensor of a safetensors file.
struct SafetensorsEntry {
    std::string name;
    std::string dtype;  // "F32", "F64", "F16", "BF16"
    Shape shape;
    uint64_t begin = 0, end = 0;  // bytes, from the start of the data
};

// Reads a safetensors file: the header at once, each tensor on demand. Throws Error(data)
// naming the file when it is not a well-formed safetensors file.
class SafetensorsFile {
public:
    explicit SafetensorsFile(const std::string& path);
    const std::string& path() const { return path_; }
    const std::vector<SafetensorsEntry>& entries() const { return entries_; }
    // The entry of this name, or null.
    const SafetensorsEntry* find(const std::string& name) const;
    // Its values as doubles, whatever the stored float dtype.
    std::vector<double> read(const SafetensorsEntry& entry) const;
    // Why the data cannot be trusted: a file `checkpoint export` wrote records the XXH64 of
    // its data, which must match (one pass over the file); other files (Hugging Face's own)
    // have their layout checked only, when opened. Nothing: the data checks.
    std::optional<std::string> data_problem() const;

private:
    std::string path_;
    mutable std::ifstream in_;
    uint64_t data_start_ = 0, data_bytes_ = 0;
    std::string recorded_data_xxh64_;  // "" when the file records none
    std::vector<SafetensorsEntry> entries_;
    std::map<std::string, size_t> by_name_;
};

// A tensor to write: its name, shape, and a function filling its values (row-major).
struct SafetensorsOutput {
    std::string name;
    Shape shape;
    std::function<std::vector<float>()> values;
};
// Writes an F32 safetensors file, one tensor in memory at a time, with the XXH64 of its data
// in the header's metadata (data_problem). Throws Error(io).
void write_safetensors(const std::string& path, const std::vector<SafetensorsOutput>& tensors);

struct ExportSummary {
    std::string architecture;   // "GPT2LMHeadModel", ...
    size_t tensors = 0;
    uint64_t bytes = 0;         // of model.safetensors
};
// Writes out_dir/model.safetensors (every weight of the checkpoint at checkpoint_path,
// assembled from all its rank files) and out_dir/config.json; with the run's tokenizer also
// tokenizer.json and tokenizer_config.json (and the end-of-text token as bos / eos in
// config.json), so that transformers' AutoModelForCausalLM and AutoTokenizer load the
// directory alone.
ExportSummary export_checkpoint_to_hf(const std::string& checkpoint_path, const std::string& out_dir, const std::optional<Tokenizer>& tokenizer = std::nullopt);

// The model.safetensors that path names: the file itself, or a directory holding it.
std::string safetensors_file_of(const std::string& path);

// Hugging Face weights at path (a .safetensors file or a directory holding model.safetensors)
// as this run's tensors: a rank's part of each, for any layout. vocab_size is the model's
// (the file has that many vocabulary rows; padding rows become zeros).
class HfWeights {
public:
    // Throws Error(data) when the file fails its recorded XXH64, Error(config) naming the
    // tensor that is missing or of another shape, before anything is read into the run.
    HfWeights(const std::string& path, int64_t vocab_size, const std::vector<TensorPlace>& tensors);
    // Local elements `local` of tensor t (as this rank holds it) into host memory `out` of
    // dtype `as` (f32 or f64). One tensor of the file is in memory at a time.
    void read(const TensorPlace& t, FlatRange local, void* out, DType as) const;

private:
    SafetensorsFile file_;
    int64_t vocab_size_;
    mutable std::string cached_name_;
    mutable std::vector<double> cached_;
};

}  // namespace llmtrain
