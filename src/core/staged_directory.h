// A directory that is replaced whole or not at all. Its new contents are written into a
// sibling, PATH.llmtrain-staging (same parent, hence the same filesystem, which rename
// needs), and swapped in by rename only once every file is written and fsynced. A reader of
// PATH sees the old contents or the new, never a mix, and a failure at any point before the
// swap leaves the old contents as they were.
//
// One process owns the directory (rank 0 of a job): it calls begin(), then commit() or
// abandon(); other processes may write files into staging_path() between the two.
#pragma once

#include <string>

namespace llmtrain {

class StagedDirectory {
public:
    // Names only; touches nothing.
    explicit StagedDirectory(const std::string& path);

    const std::string& path() const { return path_; }
    const std::string& staging_path() const { return staging_; }

    // Refuses (ErrorKind::config) a PATH that is a non-empty directory unless `replace`, or
    // that is not a directory; clears what a killed run left; creates the staging directory.
    void begin(bool replace);
    // fsyncs the staging directory, puts it at PATH, removes the old contents and fsyncs the
    // parent. On failure PATH keeps its old contents and the staging directory is left for
    // abandon().
    void commit();
    // Removes the staging directory and everything in it; never throws.
    void abandon() noexcept;

private:
    void clear_leftovers();
    void swap_into_place();

    std::string path_;     // as given, for messages
    std::string target_;   // absolute, without a trailing separator
    std::string staging_;
    std::string aside_;    // the old contents while a two-step swap runs
};

}  // namespace llmtrain
