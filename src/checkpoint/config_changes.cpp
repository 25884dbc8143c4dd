#include "checkpoint/config_changes.h"

#include <map>
#include <sstream>

namespace llmtrain {

namespace {
// "section.key" -> value, from lines "[section]" and "key = value   # description".
std::map<std::string, std::string> keyed_values(const std::string& toml) {
    std::map<std::string, std::string> values;
    std::istringstream in(toml);
    std::string line, section;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        if (line[0] == '[') {
            section = line.substr(1, line.find(']') - 1);
            continue;
        }
        const size_t equals = line.find(" = ");
        if (equals == std::string::npos) continue;
        std::string value = line.substr(equals + 3);
        const size_t comment = value.rfind("  # ");
        if (comment != std::string::npos) value.resize(comment);
        while (!value.empty() && value.back() == ' ') value.pop_back();
        values[section + "." + line.substr(0, equals)] = value;
    }
    return values;
}

// Model keys that do not decide a tensor's shape.
bool shapes_nothing(const std::string& key) {
    // pad_vocab_to pads the vocabulary rows only, which loading adjusts (checkpoint/restore.h);
    // attention picks the kernel that computes attention (absent from checkpoints of earlier
    // llmtrains), not what it computes on.
    return key == "model.init_std" || key == "model.norm_eps" || key == "model.rope_theta" || key == "model.pad_vocab_to" || key == "model.attention";
}
}  // namespace

ConfigChanges config_changes(const std::string& saved_toml, const std::string& current_toml) {
    const std::map<std::string, std::string> saved = keyed_values(saved_toml), now = keyed_values(current_toml);
    ConfigChanges changes;
    std::map<std::string, std::string> keys;
    for (const auto& [key, value] : saved) keys[key];
    for (const auto& [key, value] : now) keys[key];
    for (const auto& [key, unused] : keys) {
        const auto s = saved.find(key), n = now.find(key);
        const std::string before = s == saved.end() ? "(absent)" : s->second, after = n == now.end() ? "(absent)" : n->second;
        if (before == after) continue;
        const ConfigChange change{key, before, after};
        if (key.starts_with("model.") && !shapes_nothing(key)) changes.model_shape.push_back(change);
        else if (key.starts_with("parallel.")) changes.layout.push_back(change);
        else changes.other.push_back(change);
    }
    return changes;
}

}  // namespace llmtrain
