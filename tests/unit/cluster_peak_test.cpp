// A cluster file's device peak: a figure, or on a CPU cluster "auto", measured on the machine
// reading the file, so that shares of peak measured here (bench's calibration) stay at most 1
// whatever the core's vector width.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "backend/cpu/core_peak.h"
#include "core/error.h"
#include "plan/cluster.h"

using namespace llmtrain;

namespace {

// this-cpu.toml with its kind and device peak replaced.
std::string cluster_file(const std::string& name, const std::string& kind, const std::string& peak) {
    std::ifstream in("configs/clusters/this-cpu.toml");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), out;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("kind =", 0) == 0) line = "kind = \"" + kind + "\"";
        if (line.rfind("peak_tflops =", 0) == 0) line = "peak_tflops = " + peak;
        out += line + "\n";
    }
    const std::string path = testing::TempDir() + name;
    std::ofstream(path) << out;
    return path;
}

}  // namespace

TEST(ClusterPeak, AutoOnACpuCluster_IsTheMeasuredCorePeak) {
    const Cluster c = load_cluster(cluster_file("auto_cpu.toml", "cpu", "\"auto\""));
    // Any core of the last fifteen years: between 1 GFLOP/s (scalar) and 1 TFLOP/s.
    EXPECT_GT(c.peak_tflops, 0.001);
    EXPECT_LT(c.peak_tflops, 1.0);
    EXPECT_DOUBLE_EQ(c.peak_tflops, measured_core_fp32_peak_tflops()) << "measured once per process";
}

TEST(ClusterPeak, AFigure_IsTakenAsWritten) {
    EXPECT_DOUBLE_EQ(load_cluster(cluster_file("figure_cpu.toml", "cpu", "0.25")).peak_tflops, 0.25);
}

TEST(ClusterPeak, AutoOnAGpuCluster_IsRefusedNamingTheKey) {
    try {
        load_cluster(cluster_file("auto_gpu.toml", "gpu", "\"auto\""));
        FAIL() << "expected a config error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("auto_gpu.toml: device.peak_tflops: \"auto\""), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("kind = \"cpu\""), std::string::npos) << e.what();
    }
}

TEST(ClusterPeak, AnotherWord_IsRefusedNamingTheKey) {
    try {
        load_cluster(cluster_file("fast_cpu.toml", "cpu", "\"fast\""));
        FAIL() << "expected a config error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("fast_cpu.toml: device.peak_tflops: \"fast\""), std::string::npos) << e.what();
    }
}
