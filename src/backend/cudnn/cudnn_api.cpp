#include "backend/cudnn/cudnn_api.h"

#include <dlfcn.h>

#include <cstdlib>

#include "core/error.h"

namespace llmtrain::cudnn {

namespace {

template <class F>
void bind(void* handle, F& fn, const char* name) { fn = reinterpret_cast<F>(dlsym(handle, name)); }

// The names of the entry points missing from the library ("" when none is).
std::string bind_all(void* h, Api& a) {
    bind(h, a.get_version, "cudnnGetVersion");
    bind(h, a.get_error_string, "cudnnGetErrorString");
    bind(h, a.get_last_error_string, "cudnnGetLastErrorString");
    bind(h, a.create, "cudnnCreate");
    bind(h, a.destroy, "cudnnDestroy");
    bind(h, a.set_stream, "cudnnSetStream");
    bind(h, a.create_descriptor, "cudnnBackendCreateDescriptor");
    bind(h, a.destroy_descriptor, "cudnnBackendDestroyDescriptor");
    bind(h, a.finalize, "cudnnBackendFinalize");
    bind(h, a.set_attribute, "cudnnBackendSetAttribute");
    bind(h, a.get_attribute, "cudnnBackendGetAttribute");
    bind(h, a.execute, "cudnnBackendExecute");
    std::string missing;
    const auto need = [&missing](const void* fn, const char* name) {
        if (!fn) missing += cat(missing.empty() ? "" : ", ", name);
    };
    need(reinterpret_cast<const void*>(a.get_version), "cudnnGetVersion");
    need(reinterpret_cast<const void*>(a.get_error_string), "cudnnGetErrorString");
    need(reinterpret_cast<const void*>(a.get_last_error_string), "cudnnGetLastErrorString");
    need(reinterpret_cast<const void*>(a.create), "cudnnCreate");
    need(reinterpret_cast<const void*>(a.destroy), "cudnnDestroy");
    need(reinterpret_cast<const void*>(a.set_stream), "cudnnSetStream");
    need(reinterpret_cast<const void*>(a.create_descriptor), "cudnnBackendCreateDescriptor");
    need(reinterpret_cast<const void*>(a.destroy_descriptor), "cudnnBackendDestroyDescriptor");
    need(reinterpret_cast<const void*>(a.finalize), "cudnnBackendFinalize");
    need(reinterpret_cast<const void*>(a.set_attribute), "cudnnBackendSetAttribute");
    need(reinterpret_cast<const void*>(a.get_attribute), "cudnnBackendGetAttribute");
    need(reinterpret_cast<const void*>(a.execute), "cudnnBackendExecute");
    return missing;
}

}  // namespace

std::string library_name() {
    const char* chosen = std::getenv("LLMTRAIN_CUDNN_LIBRARY");
    return chosen && *chosen ? chosen : "libcudnn.so.9";
}

std::unique_ptr<Library> Library::load(std::string& why_not) {
    const std::string name = library_name();
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char* error = dlerror();
        why_not = cat(name, " (cuDNN) cannot be loaded: ", error ? error : "not found",
                      "; set LD_LIBRARY_PATH to its directory or LLMTRAIN_CUDNN_LIBRARY to its path");
        return nullptr;
    }
    std::unique_ptr<Library> library(new Library);
    library->handle_ = handle;
    library->path_ = name;
    if (const std::string missing = bind_all(handle, library->api_); !missing.empty()) {
        why_not = cat(name, " lacks ", missing, ": it is no cuDNN 9");
        return nullptr;
    }
    if (library->api_.get_version() < 90000) {
        why_not = cat(name, " is cuDNN ", library->version(), "; the fused attention graphs need cuDNN 9");
        return nullptr;
    }
    return library;
}

Library::~Library() {
    if (handle_) dlclose(handle_);
}

std::string Library::version() const {
    const size_t v = api_.get_version();
    return cat(v / 10000, ".", v % 10000 / 100, ".", v % 100);
}

std::string Library::last_error() const {
    char message[1024] = {};
    api_.get_last_error_string(message, sizeof message);
    return message;
}

std::string Library::describe(Status status) const {
    const char* name = api_.get_error_string(status);
    const std::string last = last_error();
    return cat(name ? name : "cuDNN status", " (", status, ")", last.empty() ? "" : cat(": ", last));
}

}  // namespace llmtrain::cudnn
