#include "core/error.h"

namespace llmtrain {

const char* error_kind_name(ErrorKind kind) {
    switch (kind) {
        case ErrorKind::config: return "config error";
        case ErrorKind::data: return "data error";
        case ErrorKind::shape: return "shape error";
        case ErrorKind::io: return "I/O error";
        case ErrorKind::unsupported: return "unsupported";
        case ErrorKind::runtime: return "error";
    }
    return "error";
}

}  // namespace llmtrain
