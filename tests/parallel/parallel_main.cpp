// The parallel tests run under `mpirun -np N`: MPI is initialized once around the whole
// GoogleTest run, and every rank runs, in lock step, the selected tests that need N ranks
// (PARALLEL_TEST, support/parallel_test.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/mpi_comm.h"
#include "support/parallel_test.h"

namespace {

// GoogleTest's glob: '*' any run of characters, '?' any one.
bool glob_matches(std::string_view pattern, std::string_view name) {
    if (pattern.empty()) return name.empty();
    if (pattern.front() == '*') return glob_matches(pattern.substr(1), name) || (!name.empty() && glob_matches(pattern, name.substr(1)));
    return !name.empty() && (pattern.front() == '?' || pattern.front() == name.front()) && glob_matches(pattern.substr(1), name.substr(1));
}

bool any_pattern_matches(std::string_view patterns, std::string_view name) {
    while (true) {
        const size_t colon = patterns.find(':');
        if (glob_matches(patterns.substr(0, colon), name)) return true;
        if (colon == std::string_view::npos) return false;
        patterns.remove_prefix(colon + 1);
    }
}

// --gtest_filter's meaning: "POSITIVE[-NEGATIVE]", each a ':'-separated list of globs.
bool filter_selects(std::string_view filter, std::string_view name) {
    const size_t dash = filter.find('-');
    const std::string_view positive = dash == std::string_view::npos ? filter : filter.substr(0, dash);
    const bool selected = positive.empty() || any_pattern_matches(positive, name);
    return selected && (dash == std::string_view::npos || !any_pattern_matches(filter.substr(dash + 1), name));
}

// The world sizes CTest runs the binary at, from --world-sizes=2,3,4,8 (empty: not given).
std::vector<int> world_sizes_of(int argc, char** argv) {
    constexpr std::string_view flag = "--world-sizes=";
    std::vector<int> sizes;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg.substr(0, flag.size()) != flag) continue;
        for (std::string_view list = arg.substr(flag.size()); !list.empty();) {
            const size_t comma = list.find(',');
            sizes.push_back(std::stoi(std::string(list.substr(0, comma))));
            list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
        }
    }
    return sizes;
}

// The filter naming every test of the user's filter that runs on `world` ranks; empty when
// none does. A test declared without its number of ranks, or with one CTest never runs
// (world_sizes, when known), is an error.
std::string tests_for_world(int world, const std::vector<int>& world_sizes, const std::string& user_filter, std::string& error) {
    const auto& ranks = llmtrain::test::ranks_of_tests();
    const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
    std::string selected;
    for (int i = 0; i < unit.total_test_suite_count(); ++i) {
        const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
        for (int j = 0; j < suite.total_test_count(); ++j) {
            const std::string name = std::string(suite.name()) + "." + suite.GetTestInfo(j)->name();
            const auto it = ranks.find(name);
            if (it == ranks.end()) {
                error += "tests/parallel: " + name + " does not say how many ranks it runs on (declare it with PARALLEL_TEST)\n";
                continue;
            }
            if (!world_sizes.empty() && std::find(world_sizes.begin(), world_sizes.end(), it->second) == world_sizes.end()) {
                error += "tests/parallel: " + name + " runs on " + std::to_string(it->second) +
                         " ranks, a world size tests/CMakeLists.txt does not start (parallel_world_sizes)\n";
                continue;
            }
            if (it->second == world && filter_selects(user_filter, name)) selected += (selected.empty() ? "" : ":") + name;
        }
    }
    return selected;
}

}  // namespace

int main(int argc, char** argv) {
    llmtrain::MpiSession mpi;
    ::testing::InitGoogleTest(&argc, argv);
    const bool rank0 = mpi.world_rank() == 0;
    std::string error;
    const std::string user_filter = GTEST_FLAG_GET(filter);
    const std::string selected = tests_for_world(mpi.world_size(), world_sizes_of(argc, argv), user_filter, error);
    if (!error.empty()) {
        if (rank0) std::fputs(error.c_str(), stderr);
        return 2;
    }
    if (selected.empty()) {
        if (rank0) std::fprintf(stderr, "tests/parallel: no test of --gtest_filter=%s runs on %d ranks\n", user_filter.c_str(), mpi.world_size());
        return 1;
    }
    GTEST_FLAG_SET(filter, selected);
    // Only rank 0 prints the results: the ranks run the same tests in lock step.
    if (!rank0) {
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
    }
    return RUN_ALL_TESTS();
}
