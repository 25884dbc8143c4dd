#include "checkpoint/safetensors.h"

#include <bit>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/hf_moe.h"
#include "checkpoint/tensor_assembly.h"
#include "core/dtype.h"
#include "core/error.h"

namespace llmtrain {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; this build reads and writes it as such");

namespace {
constexpr const char* kWeightsFile = "model.safetensors";
// The metadata key under which `checkpoint export` records the XXH64 of the file's data (every
// tensor's bytes, back to back): init_from verifies it before it reads a value.
constexpr const char* kDataChecksumKey = "llmtrain_data_xxh64";
constexpr const char* kUnwrittenChecksum = "................";  // replaced once the data is written

std::string hex64(uint64_t value) {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
    return text;
}

// GPT-2's Conv1D weights: [in, out] in Hugging Face, [out, in] here.
bool is_conv1d_weight(const std::string& name) {
    if (!name.starts_with("transformer.h.")) return false;
    for (const char* suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
        if (name.ends_with(suffix)) return true;
    return false;
}

// Tensors with one row per vocabulary entry (padded beyond model.vocab_size).
bool is_vocab_tensor(const std::string& name) {
    return name == "transformer.wte.weight" || name == "model.embed_tokens.weight" || name == "lm_head.weight";
}

size_t element_bytes(const std::string& dtype) {
    if (dtype == "F32") return 4;
    if (dtype == "F64") return 8;
    if (dtype == "F16" || dtype == "BF16") return 2;
    return 0;
}

double element_value(const std::string& dtype, const char* p) {
    if (dtype == "F32") {
        float v;
        std::memcpy(&v, p, 4);
        return v;
    }
    if (dtype == "F64") {
        double v;
        std::memcpy(&v, p, 8);
        return v;
    }
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return dtype == "BF16" ? bf16_to_float(bits) : f16_to_float(bits);
}

Shape shape_from_json(const nlohmann::json& dims) {
    if (!dims.is_array() || dims.size() > static_cast<size_t>(Shape::max_rank)) throw std::invalid_argument("shape is not an array of at most 4 sizes");
    Shape shape;
    shape.rank = static_cast<int>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) {
        if (!dims[i].is_number_unsigned()) throw std::invalid_argument("shape holds a value that is not a size");
        shape.dims[i] = dims[i].get<int64_t>();
    }
    return shape;
}

nlohmann::ordered_json shape_to_json(const Shape& shape) {
    nlohmann::ordered_json dims = nlohmann::ordered_json::array();
    for (int i = 0; i < shape.rank; ++i) dims.push_back(shape[i]);
    return dims;
}

// GPT-2 files saved from GPT2Model (the original openai-community/gpt2) lack "transformer.";
// a MoE layer's tensors are ours (Qwen2-MoE's names) or Mixtral's.
const SafetensorsEntry* find_hf_entry(const SafetensorsFile& file, const std::string& name) {
    if (const SafetensorsEntry* e = file.find(name)) return e;
    if (const SafetensorsEntry* e = file.find(mixtral_name(name))) return e;
    if (name.starts_with("transformer.")) return file.find(name.substr(std::strlen("transformer.")));
    return nullptr;
}

nlohmann::ordered_json gpt2_config(const ModelConfig& m) {
    return {{"architectures", nlohmann::ordered_json::array({"GPT2LMHeadModel"})}, {"model_type", "gpt2"}, {"vocab_size", m.vocab_size}, {"n_positions", m.max_seq_len},
            {"n_ctx", m.max_seq_len}, {"n_embd", m.d_model}, {"n_layer", m.n_layers}, {"n_head", m.n_heads}, {"n_inner", m.d_ff},
            // GELU in its tanh form (backend/cpu/cpu_elementwise.cpp), which transformers calls gelu_new.
            {"activation_function", "gelu_new"}, {"layer_norm_epsilon", m.norm_eps}, {"initializer_range", m.init_std},
            {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0}, {"scale_attn_weights", true},
            {"tie_word_embeddings", m.tied_embeddings}, {"torch_dtype", "float32"}};
}

// Llama, or Qwen2 when q, k and v have biases (Llama's attention_bias would add one to o_proj too).
nlohmann::ordered_json llama_config(const ModelConfig& m) {
    const bool qwen2 = m.qkv_bias;
    nlohmann::ordered_json j = {{"architectures", nlohmann::ordered_json::array({qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"})}, {"model_type", qwen2 ? "qwen2" : "llama"},
                                {"vocab_size", m.vocab_size}, {"hidden_size", m.d_model}, {"intermediate_size", m.d_ff},
                                {"num_hidden_layers", m.n_layers}, {"num_attention_heads", m.n_heads}, {"num_key_value_heads", m.n_kv_heads},
                                {"head_dim", m.head_dim()}, {"hidden_act", "silu"}, {"max_position_embeddings", m.max_seq_len},
                                {"rms_norm_eps", m.norm_eps}, {"rope_theta", m.rope_theta}, {"initializer_range", m.init_std},
                                {"attention_dropout", 0.0}, {"tie_word_embeddings", m.tied_embeddings}, {"torch_dtype", "float32"}};
    if (qwen2) j["use_sliding_window"] = false, j["max_window_layers"] = m.n_layers;
    else j["attention_bias"] = false, j["mlp_bias"] = false;
    return j;
}

void write_text_file(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) fail(ErrorKind::io, "cannot write '", path, "'");
}
}  // namespace

Shape hf_shape(const std::string& name, const Shape& global_shape, int64_t vocab_size) {
    Shape shape = global_shape;
    if (is_vocab_tensor(name) && shape.rank == 2) shape.dims[0] = vocab_size;
    if (is_conv1d_weight(name) && shape.rank == 2) std::swap(shape.dims[0], shape.dims[1]);
    return shape;
}

int64_t hf_index(const std::string& name, const Shape& global_shape, int64_t vocab_size, int64_t g) {
    if (global_shape.rank != 2) return g;
    const int64_t cols = global_shape.cols(), row = g / cols, col = g % cols;
    if (is_vocab_tensor(name) && row >= vocab_size) return -1;
    if (is_conv1d_weight(name)) return col * global_shape[0] + row;
    return g;
}

std::string hf_config_json(const ModelConfig& model) {
    if (model.family == ModelFamily::gpt2) return gpt2_config(model).dump(2) + "\n";
    if (!model.moe.enabled()) return llama_config(model).dump(2) + "\n";
    if (const std::optional<std::string> problem = moe_export_problem(model))
        fail(ErrorKind::unsupported, "no Hugging Face class computes this mixture-of-experts model: ", *problem);
    return moe_hf_config(llama_config(model), model).dump(2) + "\n";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) fail(ErrorKind::data, "cannot read '", path, "'");
    std::error_code ec;
    const uint64_t file_bytes = fs::file_size(path, ec);
    uint64_t header_bytes = 0;
    if (ec || file_bytes < 8 || !in_.read(reinterpret_cast<char*>(&header_bytes), 8) || header_bytes > file_bytes - 8)
        fail(ErrorKind::data, "'", path, "' is not a safetensors file (no header of a plausible length)");
    std::string header(header_bytes, '\0');
    in_.read(header.data(), static_cast<std::streamsize>(header_bytes));
    const nlohmann::json j = nlohmann::json::parse(header, nullptr, false);
    if (!in_ || j.is_discarded() || !j.is_object()) fail(ErrorKind::data, "'", path, "': the safetensors header is not a JSON object");
    data_start_ = 8 + header_bytes;
    data_bytes_ = file_bytes - data_start_;
    const uint64_t data_bytes = data_bytes_;
    for (const auto& [name, value] : j.items()) {
        if (name == "__metadata__") {
            if (value.is_object() && value.contains(kDataChecksumKey) && value.at(kDataChecksumKey).is_string())
                recorded_data_xxh64_ = value.at(kDataChecksumKey).get<std::string>();
            continue;
        }
        try {
            SafetensorsEntry e;
            e.name = name;
            e.dtype = value.at("dtype").get<std::string>();
            e.shape = shape_from_json(value.at("shape"));
            const nlohmann::json& offsets = value.at("data_offsets");
            if (!offsets.is_array() || offsets.size() != 2) throw std::invalid_argument("data_offsets is not [begin, end]");
            e.begin = offsets[0].get<uint64_t>(), e.end = offsets[1].get<uint64_t>();
            const size_t size = element_bytes(e.dtype);
            if (size == 0) throw std::invalid_argument("dtype " + e.dtype + " is not a float type this reads (F32, F64, F16, BF16)");
            if (e.begin > e.end || e.end > data_bytes || e.end - e.begin != static_cast<uint64_t>(e.shape.numel()) * size)
                throw std::invalid_argument("data_offsets do not hold " + e.shape.str() + " " + e.dtype + " values within the file");
            by_name_[name] = entries_.size();
            entries_.push_back(std::move(e));
        } catch (const std::exception& error) {
            fail(ErrorKind::data, "'", path, "': tensor '", name, "': ", error.what());
        }
    }
}

std::optional<std::string> SafetensorsFile::data_problem() const {
    if (recorded_data_xxh64_.empty()) return std::nullopt;
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(data_start_));
    XXH64_state_t* state = XXH64_createState();
    XXH64_reset(state, 0);
    std::vector<char> buffer(1 << 20);
    uint64_t left = data_bytes_;
    while (left > 0 && in_.read(buffer.data(), static_cast<std::streamsize>(std::min<uint64_t>(left, buffer.size())))) {
        XXH64_update(state, buffer.data(), static_cast<size_t>(in_.gcount()));
        left -= static_cast<uint64_t>(in_.gcount());
    }
    const std::string actual = hex64(XXH64_digest(state));
    XXH64_freeState(state);
    if (left > 0) return cat("'", path_, "': cannot read its data");
    if (actual != recorded_data_xxh64_)
        return cat("'", path_, "' fails its data checksum (", kDataChecksumKey, " ", recorded_data_xxh64_, ", the data gives ", actual,
                   "): damaged since it was exported");
    return std::nullopt;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
    const auto found = by_name_.find(name);
    return found == by_name_.end() ? nullptr : &entries_[found->second];
}

std::vector<double> SafetensorsFile::read(const SafetensorsEntry& entry) const {
    std::vector<char> bytes(entry.end - entry.begin);
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(data_start_ + entry.begin));
    if (!in_.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) fail(ErrorKind::data, "'", path_, "': cannot read tensor '", entry.name, "'");
    const size_t size = element_bytes(entry.dtype);
    std::vector<double> values(bytes.size() / size);
    for (size_t i = 0; i < values.size(); ++i) values[i] = element_value(entry.dtype, bytes.data() + i * size);
    return values;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsOutput>& tensors) {
    nlohmann::ordered_json header;
    uint64_t offset = 0;
    for (const SafetensorsOutput& t : tensors) {
        const uint64_t bytes = static_cast<uint64_t>(t.shape.numel()) * sizeof(float);
        header[t.name] = {{"dtype", "F32"}, {"shape", shape_to_json(t.shape)}, {"data_offsets", nlohmann::ordered_json::array({offset, offset + bytes})}};
        offset += bytes;
    }
    header["__metadata__"] = {{"format", "pt"}, {kDataChecksumKey, kUnwrittenChecksum}};
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const uint64_t length = text.size();
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << text;
    XXH64_state_t* state = XXH64_createState();
    XXH64_reset(state, 0);
    for (const SafetensorsOutput& t : tensors) {
        const std::vector<float> values = t.values();
        if (static_cast<int64_t>(values.size()) != t.shape.numel()) {
            XXH64_freeState(state);
            fail(ErrorKind::runtime, "safetensors: tensor '", t.name, "' has ", values.size(), " values for shape ", t.shape.str());
        }
        const auto bytes = static_cast<std::streamsize>(values.size() * sizeof(float));
        out.write(reinterpret_cast<const char*>(values.data()), bytes);
        XXH64_update(state, values.data(), static_cast<size_t>(bytes));
    }
    // The data's checksum takes the place kept for it in the header (same length).
    const std::string checksum = hex64(XXH64_digest(state));
    XXH64_freeState(state);
    out.seekp(static_cast<std::streamoff>(8 + text.find(kUnwrittenChecksum)));
    out << checksum;
    if (!out.flush()) fail(ErrorKind::io, "cannot write '", path, "'");
}

namespace {
// tokenizer_config.json: transformers' AutoTokenizer takes tokenizer.json through its fast
// tokenizer class; the end-of-text token, where there is one, is the document separator.
std::string hf_tokenizer_config_json(const Tokenizer& tokenizer, const ModelConfig& model) {
    nlohmann::ordered_json j = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"model_max_length", model.max_seq_len},
                                {"clean_up_tokenization_spaces", false}, {"add_prefix_space", false}};
    if (const std::optional<int32_t> eos = tokenizer.end_of_text_id()) {
        const std::string text = tokenizer.decode(&*eos, 1);
        j["bos_token"] = text, j["eos_token"] = text, j["unk_token"] = text;
    }
    return j.dump(2) + "\n";
}

// config.json, with the end-of-text token as transformers' bos / eos where the tokenizer has one.
std::string export_config_json(const ModelConfig& model, const std::optional<Tokenizer>& tokenizer) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(hf_config_json(model));
    if (tokenizer && tokenizer->end_of_text_id()) j["bos_token_id"] = *tokenizer->end_of_text_id(), j["eos_token_id"] = *tokenizer->end_of_text_id();
    return j.dump(2) + "\n";
}
}  // namespace

ExportSummary export_checkpoint_to_hf(const std::string& checkpoint_path, const std::string& out_dir, const std::optional<Tokenizer>& tokenizer) {
    const Manifest manifest = read_checkpoint_manifest(checkpoint_path);
    const Config config = parse_config(manifest.config_toml, (fs::path(checkpoint_path) / "manifest.json").string() + " (config)", {}, DataFiles::unchecked);
    const int64_t vocab = config.model.vocab_size;
    if (tokenizer && tokenizer->vocab_size() > vocab)
        fail(ErrorKind::config, "tokenizer '", tokenizer->source(), "' has ", tokenizer->vocab_size(), " tokens, more than the model's model.vocab_size = ", vocab);
    const std::string config_json = export_config_json(config.model, tokenizer);  // refuses a model no Hugging Face class computes
    const CheckpointTensors checkpoint(checkpoint_path, manifest);
    std::vector<SafetensorsOutput> outputs;
    for (const std::string& name : checkpoint.names(TensorRole::weights)) {
        const Shape saved = checkpoint.saved_shape(TensorRole::weights, name);
        const Shape shape = hf_shape(name, saved, vocab);
        outputs.push_back({config.model.moe.enabled() ? moe_hf_name(config.model, name) : name, shape, [&checkpoint, name, saved, shape, vocab] {
            const std::vector<double> global = assemble_global_tensor(checkpoint, TensorRole::weights, name, saved);
            std::vector<float> values(static_cast<size_t>(shape.numel()));
            for (int64_t g = 0; g < saved.numel(); ++g) {
                const int64_t i = hf_index(name, saved, vocab, g);
                if (i >= 0) values[static_cast<size_t>(i)] = static_cast<float>(global[static_cast<size_t>(g)]);
            }
            return values;
        }});
    }
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec) fail(ErrorKind::io, "cannot create '", out_dir, "': ", ec.message());
    const std::string weights_path = (fs::path(out_dir) / kWeightsFile).string();
    write_safetensors(weights_path, outputs);
    write_text_file((fs::path(out_dir) / "config.json").string(), config_json);
    if (tokenizer) {
        write_text_file((fs::path(out_dir) / "tokenizer.json").string(), tokenizer->to_hf_json());
        write_text_file((fs::path(out_dir) / "tokenizer_config.json").string(), hf_tokenizer_config_json(*tokenizer, config.model));
    }
    const nlohmann::json written = nlohmann::json::parse(config_json);
    return {written.at("architectures").at(0).get<std::string>(), outputs.size(), fs::file_size(weights_path)};
}

std::string safetensors_file_of(const std::string& path) {
    return fs::is_directory(path) ? (fs::path(path) / kWeightsFile).string() : path;
}

HfWeights::HfWeights(const std::string& path, int64_t vocab_size, const std::vector<TensorPlace>& tensors)
    : file_(safetensors_file_of(path)), vocab_size_(vocab_size) {
    if (const std::optional<std::string> problem = file_.data_problem()) fail(ErrorKind::data, "train.init_from: ", *problem);
    for (const TensorPlace& t : tensors) {
        const SafetensorsEntry* entry = find_hf_entry(file_, t.name);
        if (!entry) fail(ErrorKind::config, "train.init_from: '", file_.path(), "' holds no tensor '", t.name, "' (weights of another model?)");
        const Shape wanted = hf_shape(t.name, t.global_shape, vocab_size_);
        if (entry->shape != wanted)
            fail(ErrorKind::config, "train.init_from: '", file_.path(), "': tensor ", t.name, ": checkpoint ", entry->shape.str(), ", model ", wanted.str());
    }
}

namespace {
template <class T>
void place_hf_values(const TensorPlace& t, FlatRange local, const std::vector<double>& values, int64_t vocab_size, T* out) {
    for (int64_t i = local.begin; i < local.end; ++i) {
        const int64_t g = tp_global_index(t.local_shape, t.global_shape, t.split, t.tp_rank, t.tp_size, i);
        const int64_t k = hf_index(t.name, t.global_shape, vocab_size, g);
        out[i - local.begin] = k < 0 ? T(0) : static_cast<T>(values[static_cast<size_t>(k)]);
    }
}
}  // namespace

void HfWeights::read(const TensorPlace& t, FlatRange local, void* out, DType as) const {
    if (cached_name_ != t.name) {
        cached_ = file_.read(*find_hf_entry(file_, t.name));
        cached_name_ = t.name;
    }
    if (as == DType::f64) place_hf_values(t, local, cached_, vocab_size_, static_cast<double*>(out));
    else if (as == DType::f32) place_hf_values(t, local, cached_, vocab_size_, static_cast<float*>(out));
    else fail(ErrorKind::unsupported, "train.init_from: master weights in ", dtype_name(as), " (expected f32 or f64)");
}

}  // namespace llmtrain
