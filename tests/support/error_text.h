// The message of the llmtrain::Error a call throws, "" when it throws none: for tests that
// check what a refusal says (the file, the key, what was expected).
#pragma once

#include <functional>
#include <string>

#include "core/error.h"

namespace llmtrain {

inline std::string error_of(const std::function<void()>& work) {
    try {
        work();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace llmtrain
