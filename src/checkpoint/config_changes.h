// How the config of a resumed run differs from the one that saved its checkpoint, key by
// key, from the two effective configs (dump_config's canonical text).
#pragma once

#include <string>
#include <vector>

namespace llmtrain {

struct ConfigChange {
    std::string key;        // "optimizer.lr"
    std::string saved, now; // the values as TOML writes them
    std::string describe() const { return key + ": " + saved + " -> " + now; }
};

struct ConfigChanges {
    std::vector<ConfigChange> model_shape;  // refused: the tensors would not fit
    std::vector<ConfigChange> layout;       // parallel.*: loading on another layout is supported
    std::vector<ConfigChange> other;        // allowed, and listed in a warning
};

ConfigChanges config_changes(const std::string& saved_toml, const std::string& current_toml);

}  // namespace llmtrain
