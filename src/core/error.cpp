#include "core/error.h"

#include "core/exit_code.h"

namespace llmtrain {

const char* error_kind_name(ErrorKind kind) {
    switch (kind) {
        case ErrorKind::config: return "config error";
        case ErrorKind::data: return "data error";
        case ErrorKind::shape: return "shape error";
        case ErrorKind::io: return "I/O error";
        case ErrorKind::unsupported: return "unsupported";
        case ErrorKind::runtime: return "error";
        case ErrorKind::diverged: return "training diverged";
        case ErrorKind::hardware: return "hardware fault";
        case ErrorKind::storage: return "storage error";
    }
    return "error";
}

ExitCode exit_code_for(ErrorKind kind) {
    switch (kind) {
        // Nothing ran, or a request this build or machine cannot serve: the input must change.
        case ErrorKind::config:
        case ErrorKind::data:
        case ErrorKind::unsupported: return exit_bad_input;
        case ErrorKind::diverged: return exit_diverged;
        case ErrorKind::hardware: return exit_exclude_node;
        case ErrorKind::storage: return exit_storage;
        case ErrorKind::shape:
        case ErrorKind::io:
        case ErrorKind::runtime: return exit_failure;
    }
    return exit_failure;
}

}  // namespace llmtrain
