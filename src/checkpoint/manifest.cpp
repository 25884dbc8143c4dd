#include "checkpoint/manifest.h"

#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace llmtrain {

namespace {
// 2: rank files of pieces by placement ("llmtrain-checkpoint-2"), the mesh's zero_stage.
// 1 (read too): rank files of tp parts, the mesh's zero1.
constexpr int kFormatVersion = 2;
constexpr int kOldestVersionRead = 1;

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
}  // namespace

std::string manifest_to_json(const Manifest& m) {
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    for (const CheckpointFile& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", hex64(f.xxh64)}});
    nlohmann::ordered_json j = {
        {"format", "llmtrain-checkpoint"}, {"version", kFormatVersion}, {"step", m.step}, {"tokens_seen", m.tokens_seen},
        {"resumes", m.resumes},        {"optimizer_steps", m.optimizer_steps}, {"loss_scale", m.loss_scale}, {"loss_scale_good_steps", m.loss_scale_good_steps},
        {"seed", m.seed}, {"mesh", {{"world_size", m.world_size}, {"tp", m.tp}, {"dp", m.dp}, {"pp", m.pp}, {"zero_stage", m.zero_stage}}},
        {"created", m.created}};
    j["data"] = m.data ? nlohmann::ordered_json{{"step", m.data->step}, {"cursor", m.data->cursor}, {"seed", m.data->seed}} : nlohmann::ordered_json();
    if (!m.monitor_state.empty()) j["monitor"] = nlohmann::ordered_json::parse(m.monitor_state);
    j["files"] = files;
    j["config"] = m.config_toml;
    return j.dump(2) + "\n";
}

Manifest manifest_from_json(const std::string& text, const std::string& path) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) fail(ErrorKind::data, "'", path, "' is not valid JSON");
    std::string key;
    try {
        const auto get = [&](const char* name) -> const nlohmann::json& {
            key = name;
            return j.at(name);
        };
        if (get("format") != "llmtrain-checkpoint") fail(ErrorKind::data, "'", path, "': format is not \"llmtrain-checkpoint\"");
        const nlohmann::json& version = get("version");
        if (!version.is_number_integer() || version.get<int>() < kOldestVersionRead || version.get<int>() > kFormatVersion)
            fail(ErrorKind::data, "'", path, "': version ", version.dump(), " (this llmtrain reads versions ", kOldestVersionRead, " to ", kFormatVersion, ")");
        Manifest m;
        m.step = get("step").get<int64_t>();
        m.tokens_seen = get("tokens_seen").get<int64_t>();
        m.optimizer_steps = get("optimizer_steps").get<int64_t>();
        m.resumes = j.value("resumes", int64_t{0});  // absent from checkpoints of earlier versions
        m.loss_scale = get("loss_scale").get<double>();
        m.loss_scale_good_steps = get("loss_scale_good_steps").get<int64_t>();
        m.seed = get("seed").get<uint64_t>();
        const nlohmann::json& mesh = get("mesh");
        m.world_size = mesh.at("world_size").get<int>();
        m.tp = mesh.at("tp").get<int>(), m.dp = mesh.at("dp").get<int>(), m.pp = mesh.at("pp").get<int>();
        // Earlier versions record ZeRO-1 alone (zero1: true or false).
        m.zero_stage = mesh.contains("zero_stage") ? mesh.at("zero_stage").get<int>() : mesh.at("zero1").get<bool>() ? 1 : 0;
        m.created = get("created").get<std::string>();
        const nlohmann::json& data = get("data");
        if (!data.is_null()) m.data = LoaderState{data.at("step").get<uint64_t>(), data.at("cursor").get<uint64_t>(), data.at("seed").get<uint64_t>()};
        for (const nlohmann::json& f : get("files"))
            m.files.push_back({f.at("name").get<std::string>(), f.at("bytes").get<uint64_t>(), parse_hex64(f.at("xxh64").get<std::string>())});
        m.config_toml = upgraded_config(get("config").get<std::string>());
        if (j.contains("monitor")) m.monitor_state = get("monitor").dump();
        if (m.step < 0 || m.world_size < 1 || static_cast<int>(m.files.size()) != m.world_size)
            fail(ErrorKind::data, "'", path, "': ", m.files.size(), " files listed for a world of ", m.world_size, " ranks");
        return m;
    } catch (const Error&) {
        throw;
    } catch (const std::exception& e) {
        fail(ErrorKind::data, "'", path, "': key '", key, "' is missing or malformed (", e.what(), ")");
    }
}

}  // namespace llmtrain
