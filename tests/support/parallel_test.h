// A parallel test names its suite by what it proves and states the number of ranks it runs
// on: PARALLEL_TEST(Layouts, Gpt2TensorParallel_MatchesSingleProcess, 2). tests/CMakeLists.txt
// starts the binary under `mpirun -np N` once for each N in use, and tests/parallel/parallel_main.cpp runs
// the tests that need N ranks (every rank the same tests, in the same order).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace llmtrain::test {

// "Suite.Name" -> the number of ranks the test runs on.
inline std::map<std::string, int>& ranks_of_tests() {
    static std::map<std::string, int> ranks;
    return ranks;
}

inline bool runs_on_ranks(const char* test, int ranks) {
    ranks_of_tests()[test] = ranks;
    return true;
}

}  // namespace llmtrain::test

#define PARALLEL_TEST(suite, name, ranks)                                                                   \
    [[maybe_unused]] static const bool suite##_##name##_ranks = ::llmtrain::test::runs_on_ranks(#suite "." #name, ranks); \
    TEST(suite, name)
