#include "core/staged_directory.h"

#include <fcntl.h>
#include <stdio.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/durable_file.h"
#include "core/error.h"
#include "core/log.h"

namespace llmtrain {

namespace fs = std::filesystem;

namespace {

// "data/corpus/" and "data/corpus" name the same directory; a sibling needs the second form.
fs::path without_trailing_separator(const std::string& path) {
    fs::path p = fs::absolute(path).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    return p;
}

bool is_empty_directory(const fs::path& p) {
    std::error_code ec;
    return fs::is_empty(p, ec) && !ec;
}

void rename_or_fail(const std::string& from, const std::string& to) {
    if (::rename(from.c_str(), to.c_str()) != 0) fail(ErrorKind::io, "cannot rename '", from, "' to '", to, "': ", std::strerror(errno));
}

}  // namespace

StagedDirectory::StagedDirectory(const std::string& path) : path_(path) {
    const fs::path target = without_trailing_separator(path);
    target_ = target.string();
    staging_ = target_ + ".llmtrain-staging";
    aside_ = target_ + ".llmtrain-old";
}

void StagedDirectory::begin(bool replace) {
    std::error_code ec;
    const fs::file_status status = fs::status(target_, ec);
    if (fs::exists(status) && !fs::is_directory(status)) fail(ErrorKind::config, "output '", path_, "' exists and is not a directory");
    if (fs::is_directory(status) && !replace && !is_empty_directory(target_)) {
        const std::string first = fs::directory_iterator(target_)->path().filename().string();
        fail(ErrorKind::config, "output directory '", path_, "' is not empty (it holds '", first, "'); pass --force to replace it");
    }
    clear_leftovers();
    fs::create_directories(fs::path(target_).parent_path(), ec);
    if (ec) fail(ErrorKind::io, "cannot create directory '", fs::path(target_).parent_path().string(), "': ", ec.message());
    if (!fs::create_directory(staging_, ec) || ec) fail(ErrorKind::io, "cannot create directory '", staging_, "': ", ec ? ec.message() : "it exists");
}

// A staging directory can only be left by a run that was killed; it is never the only copy
// of anything. The aside directory is the only copy of the old contents when the kill came
// between the two renames of a two-step swap: then it is the user's to restore.
void StagedDirectory::clear_leftovers() {
    std::error_code ec;
    if (fs::exists(aside_, ec)) {
        if (!fs::exists(target_, ec))
            fail(ErrorKind::data, "'", aside_, "' holds the contents of '", path_, "' that an interrupted run was replacing; move it back to '", path_, "' or delete it");
        log_warn("removing '", aside_, "', the old contents of '", path_, "' that an interrupted run had replaced");
        fs::remove_all(aside_, ec);
        if (ec) fail(ErrorKind::io, "cannot remove '", aside_, "': ", ec.message());
    }
    if (fs::exists(staging_, ec)) {
        log_warn("removing '", staging_, "', left by an interrupted run");
        fs::remove_all(staging_, ec);
        if (ec) fail(ErrorKind::io, "cannot remove '", staging_, "': ", ec.message());
    }
}

void StagedDirectory::commit() {
    fsync_directory(staging_);
    swap_into_place();
    fsync_directory(fs::path(target_).parent_path().string());
}

// An empty or missing PATH is replaced by one rename. Otherwise the two directories trade
// places in one atomic step (renameat2 RENAME_EXCHANGE) and the old contents, now under the
// staging name, are removed; where the filesystem cannot exchange, the old directory moves
// aside, the new one moves in (the old one moves back if that fails), and the old one goes.
void StagedDirectory::swap_into_place() {
    std::error_code ec;
    if (!fs::exists(target_, ec) || is_empty_directory(target_)) {
        rename_or_fail(staging_, target_);
        return;
    }
    if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
        abandon();
        return;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
        fail(ErrorKind::io, "cannot swap '", staging_, "' into '", target_, "': ", std::strerror(errno));
    rename_or_fail(target_, aside_);
    try {
        rename_or_fail(staging_, target_);
    } catch (...) {
        ::rename(aside_.c_str(), target_.c_str());
        throw;
    }
    fs::remove_all(aside_, ec);
    if (ec) log_warn("'", path_, "' is replaced, but its old contents in '", aside_, "' could not be removed: ", ec.message());
}

void StagedDirectory::abandon() noexcept {
    std::error_code ec;
    fs::remove_all(staging_, ec);
    if (ec) log_warn("cannot remove '", staging_, "': ", ec.message());
}

}  // namespace llmtrain
