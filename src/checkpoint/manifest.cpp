#include "checkpoint/manifest.h"

#include <chrono>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <xxhash.h>

#include "core/checksum_policy.h"
#include "core/error.h"

namespace llmtrain {

namespace {
// 3: rank files of pieces by placement ("llmtrain-checkpoint-2"), the mesh's zero_stage.
// 2 (read too): the run id, the chain's sequence, the global batch and the manifest's own
//    checksum; rank files of tp parts ("llmtrain-checkpoint-1"), the mesh's zero1.
// 1 (read too): neither.
constexpr int kFormatVersion = 3;
constexpr int kOldestReadable = 1;
constexpr const char* kChecksumKey = "manifest_xxh64";

std::string hex64(uint64_t value) {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
    return text;
}

// The saved config as this version reads it: parallel.zero1 (retired) becomes the
// parallel.zero_stage it meant, unless the config names the stage itself.
std::string upgraded_config(const std::string& toml) {
    std::istringstream in(toml);
    std::string line, section, out, zero1;
    bool has_stage = false;
    while (std::getline(in, line)) {
        if (line.starts_with("[")) section = line.substr(0, line.find(']') + 1);
        if (section == "[parallel]" && line.starts_with("zero_stage = ")) has_stage = true;
        if (section == "[parallel]" && line.starts_with("zero1 = ")) {
            zero1 = line.substr(8, line.find_first_of(" #", 8) - 8);
            continue;
        }
        out += line + "\n";
    }
    if (zero1.empty() || has_stage) return out;
    const std::string stage = cat("zero_stage = ", zero1 == "true" ? 1 : 0, "\n");
    const size_t at = out.find("[parallel]\n");
    return at == std::string::npos ? out + "[parallel]\n" + stage : out.insert(at + 11, stage);
}

uint64_t parse_hex64(const std::string& text) {
    if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos) throw std::invalid_argument("expected 16 hex digits");
    return std::stoull(text, nullptr, 16);
}

// The checksum covers the document without its own key, in compact JSON: parsing and dumping
// again gives the same text (keys in order, numbers round-tripped), whatever the indentation.
uint64_t document_xxh64(const nlohmann::ordered_json& without_checksum) {
    const std::string text = without_checksum.dump();
    return XXH64(text.data(), text.size(), 0);
}
}  // namespace

std::string manifest_to_json(const Manifest& m) {
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    for (const CheckpointFile& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", hex64(f.xxh64)}});
    nlohmann::ordered_json j = {
        {"format", "llmtrain-checkpoint"}, {"version", kFormatVersion}, {"run_id", m.run_id}, {"sequence", m.sequence},
        {"run_directory", m.run_directory}, {"step", m.step}, {"tokens_seen", m.tokens_seen},
        {"resumes", m.resumes},        {"optimizer_steps", m.optimizer_steps}, {"loss_scale", m.loss_scale}, {"loss_scale_good_steps", m.loss_scale_good_steps},
        {"seed", m.seed}, {"global_batch", m.global_batch}, {"mesh", {{"world_size", m.world_size}, {"tp", m.tp}, {"dp", m.dp}, {"pp", m.pp}, {"cp", m.cp}, {"zero_stage", m.zero_stage}}},
        {"created", m.created}};
    j["data"] = m.data ? nlohmann::ordered_json{{"step", m.data->step}, {"cursor", m.data->cursor}, {"seed", m.data->seed}} : nlohmann::ordered_json();
    if (!m.monitor_state.empty()) j["monitor"] = nlohmann::ordered_json::parse(m.monitor_state);
    if (!m.moe_state.empty()) j["moe"] = nlohmann::ordered_json::parse(m.moe_state);
    if (!m.fp8_state.empty()) j["fp8"] = nlohmann::ordered_json::parse(m.fp8_state);
    j["files"] = files;
    j["config"] = m.config_toml;
    j[kChecksumKey] = hex64(document_xxh64(j));
    return j.dump(2) + "\n";
}

namespace {
// Format 2 carries its own checksum, which must match; format 1 had none.
void check_own_checksum(nlohmann::ordered_json document, int version, const std::string& path) {
    if (version < 2) return;
    if (!document.contains(kChecksumKey) || !document.at(kChecksumKey).is_string())
        fail(ErrorKind::data, "'", path, "': key '", kChecksumKey, "' is missing (a manifest of format ", version, " checks itself)");
    const std::string recorded = document.at(kChecksumKey).get<std::string>();
    document.erase(kChecksumKey);
    const std::string actual = hex64(document_xxh64(document));
    if (checksum_mismatch(recorded, actual))
        fail(ErrorKind::data, "'", path, "' fails its own checksum (", kChecksumKey, " ", recorded, ", the content gives ", actual,
             "): edited or damaged since it was written");
}

// An integer key within T: nlohmann's get<T>() of a float (JSON reads an integer beyond 64 bits
// as one) is a cast that is undefined out of T's range, and of a wider integer it wraps.
template <class T>
T integer_of(const nlohmann::ordered_json& node, const char* name) {
    using Limits = std::numeric_limits<T>;
    if (node.is_number_unsigned()) {
        if (node.get<uint64_t>() <= static_cast<uint64_t>(Limits::max())) return static_cast<T>(node.get<uint64_t>());
    } else if (node.is_number_integer()) {
        const int64_t value = node.get<int64_t>();
        const bool fits = value >= 0 ? static_cast<uint64_t>(value) <= static_cast<uint64_t>(Limits::max())
                                     : Limits::is_signed && value >= static_cast<int64_t>(Limits::min());
        if (fits) return static_cast<T>(value);
    }
    throw std::out_of_range(std::string(name) + " is " + node.dump() + ", not an integer from " + std::to_string(Limits::min()) + " to " +
                            std::to_string(Limits::max()));
}
}  // namespace

Manifest manifest_from_json(const std::string& text, const std::string& path) {
    const nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) fail(ErrorKind::data, "'", path, "' is not valid JSON");
    std::string key;
    try {
        const auto get = [&](const char* name) -> const nlohmann::ordered_json& {
            key = name;
            return j.at(name);
        };
        if (get("format") != "llmtrain-checkpoint") fail(ErrorKind::data, "'", path, "': format is not \"llmtrain-checkpoint\"");
        const nlohmann::ordered_json& version_value = get("version");
        const int version = version_value.is_number_integer() ? integer_of<int>(version_value, "version") : -1;
        if (version < kOldestReadable || version > kFormatVersion)
            fail(ErrorKind::data, "'", path, "': version ", version_value.dump(), " (this llmtrain reads ", kOldestReadable, " to ", kFormatVersion, ")");
        check_own_checksum(j, version, path);
        Manifest m;
        if (version >= 2) {
            m.run_id = get("run_id").get<std::string>();
            m.sequence = integer_of<int64_t>(get("sequence"), "sequence");
            m.run_directory = get("run_directory").get<std::string>();
            m.global_batch = integer_of<int64_t>(get("global_batch"), "global_batch");
        }
        m.step = integer_of<int64_t>(get("step"), "step");
        m.tokens_seen = integer_of<int64_t>(get("tokens_seen"), "tokens_seen");
        m.optimizer_steps = integer_of<int64_t>(get("optimizer_steps"), "optimizer_steps");
        m.resumes = j.contains("resumes") ? integer_of<int64_t>(get("resumes"), "resumes") : 0;  // absent from checkpoints of earlier versions
        m.loss_scale = get("loss_scale").get<double>();
        m.loss_scale_good_steps = integer_of<int64_t>(get("loss_scale_good_steps"), "loss_scale_good_steps");
        m.seed = integer_of<uint64_t>(get("seed"), "seed");
        const nlohmann::ordered_json& mesh = get("mesh");
        m.world_size = integer_of<int>(mesh.at("world_size"), "world_size");
        m.tp = integer_of<int>(mesh.at("tp"), "tp"), m.dp = integer_of<int>(mesh.at("dp"), "dp"), m.pp = integer_of<int>(mesh.at("pp"), "pp");
        m.cp = mesh.contains("cp") ? integer_of<int>(mesh.at("cp"), "cp") : 1;
        // Earlier versions record ZeRO-1 alone (zero1: true or false).
        m.zero_stage = mesh.contains("zero_stage") ? integer_of<int>(mesh.at("zero_stage"), "zero_stage") : mesh.at("zero1").get<bool>() ? 1 : 0;
        m.created = get("created").get<std::string>();
        const nlohmann::ordered_json& data = get("data");
        if (!data.is_null()) m.data = LoaderState{integer_of<uint64_t>(data.at("step"), "step"), integer_of<uint64_t>(data.at("cursor"), "cursor"),
                                 integer_of<uint64_t>(data.at("seed"), "seed")};
        for (const nlohmann::ordered_json& f : get("files"))
            m.files.push_back({f.at("name").get<std::string>(), integer_of<uint64_t>(f.at("bytes"), "bytes"), parse_hex64(f.at("xxh64").get<std::string>())});
        m.config_toml = upgraded_config(get("config").get<std::string>());
        if (j.contains("monitor")) m.monitor_state = get("monitor").dump();
        if (j.contains("moe")) m.moe_state = get("moe").dump();
        if (j.contains("fp8")) m.fp8_state = get("fp8").dump();
        if (m.step < 0 || m.world_size < 1 || static_cast<int>(m.files.size()) != m.world_size)
            fail(ErrorKind::data, "'", path, "': ", m.files.size(), " files listed for a world of ", m.world_size, " ranks");
        return m;
    } catch (const Error&) {
        throw;
    } catch (const std::exception& e) {
        fail(ErrorKind::data, "'", path, "': key '", key, "' is missing or malformed (", e.what(), ")");
    }
}

std::string new_run_id() {
    std::random_device entropy;
    const auto now = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    const uint64_t bits = (static_cast<uint64_t>(entropy()) << 32 | entropy()) ^ XXH64(&now, sizeof now, 0);
    return hex64(bits);
}

std::string describe_run(const std::string& run_id) {
    return run_id.empty() ? std::string("a run of an earlier llmtrain (no run id)") : "run " + run_id;
}

}  // namespace llmtrain
