#include "plan/cluster.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "backend/cpu/core_peak.h"
#include "core/error.h"

namespace llmtrain {

namespace {

toml::table read_toml(const std::string& path, const char* what) {
    std::ifstream in(path);
    if (!in) fail(ErrorKind::config, what, " '", path, "': cannot be read");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
        return toml::parse(std::string_view(text), std::string_view(path));
    } catch (const toml::parse_error& e) {
        fail(ErrorKind::config, path, ":", e.source().begin.line, ": ", e.description());
    }
}

// One file's keys, each read once: a missing or mistyped key names the file and the key path.
class Keys {
public:
    Keys(const toml::table& root, std::string path) : root_(root), path_(std::move(path)) {}

    const toml::node* find(const std::string& key) const { return root_.at_path(key).node(); }
    const std::string& path() const { return path_; }

    double number(const std::string& key, const char* meaning, double lo, double hi) const {
        const toml::node* node = find(key);
        if (!node) fail(ErrorKind::config, path_, ": ", key, ": missing (", meaning, ")");
        const std::optional<double> value = node->value<double>();
        if (!value || node->is_boolean()) fail(ErrorKind::config, path_, ": ", key, ": expected a number (", meaning, ")");
        if (!(*value > lo && *value <= hi)) fail(ErrorKind::config, path_, ": ", key, ": ", *value, " is out of range (", meaning, ": more than ", lo, ", at most ", hi, ")");
        return *value;
    }
    double optional_number(const std::string& key, const char* meaning, double lo, double hi, double fallback) const {
        return find(key) ? number(key, meaning, lo, hi) : fallback;
    }
    int integer(const std::string& key, const char* meaning, int64_t hi) const {
        const toml::node* node = find(key);
        if (!node) fail(ErrorKind::config, path_, ": ", key, ": missing (", meaning, ")");
        const std::optional<int64_t> value = node->is_integer() ? node->value<int64_t>() : std::nullopt;
        if (!value) fail(ErrorKind::config, path_, ": ", key, ": expected an integer (", meaning, ")");
        if (*value < 1 || *value > hi) fail(ErrorKind::config, path_, ": ", key, ": ", *value, " is out of range (", meaning, ": 1 to ", hi, ")");
        return static_cast<int>(*value);
    }
    std::string text(const std::string& key, const char* meaning) const {
        const toml::node* node = find(key);
        if (!node) fail(ErrorKind::config, path_, ": ", key, ": missing (", meaning, ")");
        if (!node->is_string()) fail(ErrorKind::config, path_, ": ", key, ": expected a string (", meaning, ")");
        return **node->as_string();
    }

private:
    const toml::table& root_;
    std::string path_;
};

constexpr Collective kCollectives[] = {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather};
constexpr GemmClass kGemmClasses[] = {GemmClass::small, GemmClass::medium, GemmClass::large};

// `key` = [[bytes, GB/s], ...] with bytes ascending, every figure positive.
BusbwCurve read_curve(const Keys& keys, const std::string& key) {
    const toml::array* points = keys.find(key)->as_array();
    const auto bad = [&](const std::string& why) {
        fail(ErrorKind::config, keys.path(), ": ", key, ": ", why, " (expected [[bytes, GB/s], ...] with bytes ascending, as bench comm writes)");
    };
    if (!points || points->empty()) bad("not a list of points");
    BusbwCurve curve;
    for (const toml::node& point : *points) {
        const toml::array* pair = point.as_array();
        if (!pair || pair->size() != 2) bad("a point is not a pair");
        const std::optional<double> bytes = (*pair)[0].value<double>(), gbps = (*pair)[1].value<double>();
        if (!bytes || !gbps || !(*bytes > 0) || !(*gbps > 0) || !std::isfinite(*bytes) || !std::isfinite(*gbps)) bad("a point is not two positive numbers");
        if (!curve.empty() && *bytes <= curve.back().first) bad("sizes do not ascend");
        curve.emplace_back(*bytes, *gbps);
    }
    return curve;
}

void read_measurement(const Keys& keys, const std::string& table, LinkMeasurement& m) {
    for (Collective op : kCollectives) {
        const std::string key = cat(table, ".", collective_key(op), "_busbw_gbps");
        if (keys.find(key)) m.busbw_gbps[op] = keys.number(key, "measured bus bandwidth, GB/s", 0, 1e6);
        const std::string by_size = cat(table, ".", collective_key(op), "_busbw_by_size");
        if (keys.find(by_size)) m.busbw_by_size[op] = read_curve(keys, by_size);
    }
    double& latency_us = m.latency_us;
    const std::string latency = table + ".latency_us";
    if (keys.find(latency)) latency_us = keys.number(latency, "measured latency of one ring step, microseconds", 0, 1e6);
}

constexpr std::string_view kRanksPrefix = "ranks_";

void read_link_calibration(const Keys& keys, const std::string& table, Link& link) {
    LinkMeasurement general{.busbw_gbps = link.measured_busbw_gbps, .latency_us = link.latency_us, .busbw_by_size = link.measured_busbw_by_size};
    read_measurement(keys, table, general);
    link.measured_busbw_gbps = general.busbw_gbps;
    link.measured_busbw_by_size = general.busbw_by_size;
    link.latency_us = general.latency_us;
    const toml::node* node = keys.find(table);
    if (!node || !node->is_table()) return;
    for (const auto& [name, value] : *node->as_table()) {
        const std::string_view key = name.str();
        if (!value.is_table() || !key.starts_with(kRanksPrefix)) continue;
        const std::string digits(key.substr(kRanksPrefix.size()));
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 6 || std::stoi(digits) < 2)
            fail(ErrorKind::config, keys.path(), ": ", table, ".", key, ": expected ranks_N with N >= 2, the ranks that measured the figures in it");
        LinkMeasurement& m = link.measured_by_ranks[std::stoi(digits)];
        read_measurement(keys, cat(table, ".", key), m);
    }
}

toml::table read_or_empty(const std::string& path) {
    if (!std::filesystem::exists(path)) return {};
    return read_toml(path, "calibration file");
}

void write_toml(const std::string& path, const toml::table& root) {
    std::ofstream out(path, std::ios::trunc);
    out << "# Measured on this machine by `llmtrain bench --calibration-out` and `llmtrain bench comm --calibration-out`;\n"
           "# read by `llmtrain plan` through a cluster file's `calibration` key or --calibration.\n"
        << root << "\n";
    if (!out) fail(ErrorKind::io, "cannot write the calibration file '", path, "'");
}

toml::table& subtable(toml::table& parent, const std::string& name) {
    if (!parent.get_as<toml::table>(name)) parent.insert_or_assign(name, toml::table{});
    return *parent.get_as<toml::table>(name);
}

}  // namespace

const char* collective_key(Collective op) {
    switch (op) {
        case Collective::all_reduce: return "all_reduce";
        case Collective::reduce_scatter: return "reduce_scatter";
        case Collective::all_gather: return "all_gather";
    }
    return "?";
}

double Link::busbw_gbps(Collective op) const {
    const auto found = measured_busbw_gbps.find(op);
    return found != measured_busbw_gbps.end() ? found->second : gbps;
}

double Link::busbw_gbps(Collective op, double bytes) const {
    const auto found = measured_busbw_by_size.find(op);
    if (found == measured_busbw_by_size.end() || found->second.empty()) return busbw_gbps(op);
    const BusbwCurve& curve = found->second;
    if (bytes <= curve.front().first) return curve.front().second;
    if (bytes >= curve.back().first) return curve.back().second;
    const auto above = std::upper_bound(curve.begin(), curve.end(), bytes, [](double b, const auto& point) { return b < point.first; });
    const auto below = std::prev(above);
    const double at = std::log(bytes / below->first) / std::log(above->first / below->first);
    return below->second + at * (above->second - below->second);
}

std::optional<Link> Link::as_measured_by(int ranks) const {
    const auto found = measured_by_ranks.find(ranks);
    if (found == measured_by_ranks.end()) return std::nullopt;
    Link measured = *this;
    measured.measured_busbw_gbps = found->second.busbw_gbps;
    measured.measured_busbw_by_size = found->second.busbw_by_size;
    if (found->second.latency_us > 0) measured.latency_us = found->second.latency_us;
    return measured;
}

GemmClass gemm_class(double m, double n, double k) {
    const double smallest = std::min({m, n, k});
    return smallest < 256 ? GemmClass::small : smallest < 1024 ? GemmClass::medium : GemmClass::large;
}

const char* gemm_class_name(GemmClass c) {
    switch (c) {
        case GemmClass::small: return "small";
        case GemmClass::medium: return "medium";
        case GemmClass::large: return "large";
    }
    return "?";
}

// A class nobody measured takes the measured class nearest in size: efficiency changes
// gradually with the shape, and any measurement on this machine beats the assumed figure.
double ComputeEfficiency::gemm_for(GemmClass c) const {
    if (gemm.empty()) return gemm_default;
    int best = -1, best_distance = 99;
    for (const auto& [measured, value] : gemm) {
        const int distance = std::abs(static_cast<int>(measured) - static_cast<int>(c));
        if (distance < best_distance) best = static_cast<int>(measured), best_distance = distance;
    }
    return gemm.at(static_cast<GemmClass>(best));
}

void apply_calibration(Cluster& cluster, const std::string& path) {
    const toml::table root = read_toml(path, "calibration file");
    const Keys keys(root, path);
    for (GemmClass c : kGemmClasses) {
        const std::string key = cat("compute.gemm_efficiency.", gemm_class_name(c));
        if (keys.find(key)) cluster.efficiency.gemm[c] = keys.number(key, "measured share of peak", 0, 1);
    }
    cluster.efficiency.attention = keys.optional_number("compute.attention_efficiency", "measured share of peak", 0, 1, cluster.efficiency.attention);
    cluster.efficiency.ring_attention = keys.optional_number("compute.ring_attention_efficiency", "measured share of peak", 0, 1, cluster.efficiency.ring_attention);
    cluster.efficiency.memory = keys.optional_number("compute.memory_efficiency", "measured share of the memory bandwidth", 0, 2, cluster.efficiency.memory);
    cluster.efficiency.optimizer = keys.optional_number("compute.optimizer_efficiency", "measured share of the memory bandwidth AdamW's update reaches", 0, 2,
                                                        cluster.efficiency.optimizer);
    cluster.efficiency.gradient_pass = keys.optional_number("compute.gradient_pass_efficiency",
                                                            "measured share of the memory bandwidth zeroing the gradients and reading their norm reach", 0, 4,
                                                            cluster.efficiency.gradient_pass);
    if (keys.find("compute.fp8_gemm_efficiency")) {
        if (cluster.fp8_peak_tflops <= 0)
            fail(ErrorKind::config, path, ": compute.fp8_gemm_efficiency: the cluster (", cluster.source_path, ") has no device.fp8_peak_tflops to take a share of");
        cluster.efficiency.fp8_gemm = keys.number("compute.fp8_gemm_efficiency", "measured share of device.fp8_peak_tflops", 0, 1);
    }
    read_link_calibration(keys, "collectives.intra_node", cluster.intra_node);
    read_link_calibration(keys, "collectives.inter_node", cluster.inter_node);
    cluster.calibration_path = path;
}

namespace {

// device.peak_tflops: a figure, or on a CPU cluster "auto": one core of this machine, measured
// (its vector width differs between machines, and a share of the wrong peak misleads).
double device_peak_tflops(const Keys& keys, ClusterKind kind) {
    const char* meaning = "dense peak per device in the compute dtype, TFLOP/s";
    const toml::node* node = keys.find("device.peak_tflops");
    if (!node || !node->is_string()) return keys.number("device.peak_tflops", meaning, 0, 1e6);
    const std::string text = **node->as_string();
    if (text != "auto" || kind != ClusterKind::cpu)
        fail(ErrorKind::config, keys.path(), ": device.peak_tflops: \"", text, "\" (expected a number (", meaning, "), or \"auto\" on a kind = \"cpu\" cluster)");
    return measured_core_fp32_peak_tflops();
}

// device.fp8_peak_tflops and efficiency.fp8_gemm, both or neither: a GPU with FP8 tensor
// cores. A CPU cluster has neither (the reference emulates FP8: no faster than f32).
void read_fp8(const Keys& keys, Cluster& c) {
    const bool peak = keys.find("device.fp8_peak_tflops") != nullptr, efficiency = keys.find("efficiency.fp8_gemm") != nullptr;
    if (!peak && !efficiency) return;
    if (c.kind == ClusterKind::cpu)
        fail(ErrorKind::config, keys.path(), ": ", peak ? "device.fp8_peak_tflops" : "efficiency.fp8_gemm",
             ": not on a kind = \"cpu\" cluster (the CPU emulates FP8: decode, then f32 GEMMs at device.peak_tflops)");
    if (!efficiency) fail(ErrorKind::config, keys.path(), ": efficiency.fp8_gemm: missing (share of device.fp8_peak_tflops the FP8 GEMMs reach; device.fp8_peak_tflops is given)");
    c.fp8_peak_tflops = keys.number("device.fp8_peak_tflops", "dense FP8 tensor-core peak per device, TFLOP/s", 0, 1e6);
    c.efficiency.fp8_gemm = keys.number("efficiency.fp8_gemm", "share of device.fp8_peak_tflops the FP8 GEMMs reach", 0, 1);
}

}  // namespace

Cluster load_cluster(const std::string& path) {
    const toml::table root = read_toml(path, "cluster file");
    const Keys keys(root, path);
    Cluster c;
    c.source_path = path;
    c.name = keys.text("name", "what the cluster is");
    const std::string kind = keys.text("kind", "\"gpu\" or \"cpu\"");
    if (kind != "gpu" && kind != "cpu") fail(ErrorKind::config, path, ": kind: \"", kind, "\" (allowed: gpu, cpu)");
    c.kind = kind == "gpu" ? ClusterKind::gpu : ClusterKind::cpu;
    c.devices_per_node = keys.integer("node.devices", "devices per node: GPUs, or cores for kind = \"cpu\"", 1 << 16);
    c.nodes = keys.integer("node.count", "number of nodes", 1 << 20);
    c.node_mtbf_hours = keys.optional_number("node.mtbf_hours", "mean time between failures of one node, hours", 0, 1e9, 0);
    c.launch_seconds = keys.optional_number("node.launch_seconds", "a restart's relaunch of every rank and communicator set-up, seconds", 0, 1e6, 0);
    c.host_memory_gb = keys.optional_number("node.host_memory_gb", "host memory per node, GB", 0, 1e9, 0);
    c.device_name = keys.text("device.name", "the device's name");
    c.peak_tflops = device_peak_tflops(keys, c.kind);
    read_fp8(keys, c);
    c.memory_gb = keys.number("device.memory_gb", "memory per device, GB", 0, 1e6);
    c.memory_bandwidth_gbps = keys.number("device.memory_bandwidth_gbps", "memory bandwidth per device, GB/s", 0, 1e7);
    c.reserved_gb = keys.number("device.reserved_gb", "memory the runtime and communication buffers take per device, GB", -1, 1e6);
    c.intra_node.gbps = keys.number("network.intra_node_gbps", "bus bandwidth per device inside a node, GB/s", 0, 1e6);
    c.intra_node.latency_us = keys.number("network.intra_node_latency_us", "latency per ring step inside a node, microseconds", 0, 1e6);
    c.inter_node.gbps = keys.number("network.inter_node_gbps", "bus bandwidth per device between nodes, GB/s", 0, 1e6);
    c.inter_node.latency_us = keys.number("network.inter_node_latency_us", "latency per ring step between nodes, microseconds", 0, 1e6);
    c.efficiency.gemm_default = keys.number("efficiency.gemm", "share of peak a GEMM reaches", 0, 1);
    c.efficiency.attention = keys.number("efficiency.attention", "share of peak attention reaches", 0, 1);
    c.efficiency.memory = keys.number("efficiency.memory", "share of the memory bandwidth memory-bound ops reach", 0, 1);
    c.efficiency.ring_attention = keys.optional_number("efficiency.ring_attention",
                                                       "share of peak context parallelism's attention blocks reach (default: efficiency.attention)", 0, 1, 0);
    c.efficiency.optimizer = keys.optional_number("efficiency.optimizer", "share of the memory bandwidth AdamW's update reaches (default: efficiency.memory)", 0, 1, 0);
    if (keys.find("storage")) {
        Storage& st = c.storage.emplace();
        st.write_gbps = keys.number("storage.write_gbps", "aggregate write bandwidth of the shared storage, GB/s", 0, 1e7);
        st.read_gbps = keys.number("storage.read_gbps", "aggregate read bandwidth of the shared storage, GB/s", 0, 1e7);
        st.node_write_gbps = keys.number("storage.node_write_gbps", "one node's write bandwidth to the shared storage, GB/s", 0, 1e6);
        st.node_read_gbps = keys.number("storage.node_read_gbps", "one node's read bandwidth from the shared storage, GB/s", 0, 1e6);
        st.host_copy_gbps = keys.number("storage.host_copy_gbps", "per device, the copy of its state into host memory, GB/s", 0, 1e6);
        st.checksum_gbps = keys.optional_number("storage.checksum_gbps", "per rank, one thread's Fletcher32 and XXH64 passes over its file, GB/s", 0, 1e6,
                                                Storage::kMeasuredChecksumGbps);
    }
    if (keys.find("calibration")) {
        const std::filesystem::path relative = keys.text("calibration", "a calibration file, relative to this one");
        apply_calibration(c, (std::filesystem::path(path).parent_path() / relative).string());
    }
    return c;
}

void write_calibration(const std::string& path, const ComputeCalibration& compute) {
    toml::table root = read_or_empty(path);
    toml::table& section = subtable(root, "compute");
    subtable(section, "gemm_efficiency").insert_or_assign(gemm_class_name(compute.gemm_class), compute.gemm_efficiency);
    section.insert_or_assign("attention_efficiency", compute.attention_efficiency);
    section.insert_or_assign("memory_efficiency", compute.memory_efficiency);
    if (compute.optimizer_efficiency > 0) section.insert_or_assign("optimizer_efficiency", compute.optimizer_efficiency);
    if (compute.gradient_pass_efficiency > 0) section.insert_or_assign("gradient_pass_efficiency", compute.gradient_pass_efficiency);
    if (compute.fp8_gemm_efficiency > 0) section.insert_or_assign("fp8_gemm_efficiency", compute.fp8_gemm_efficiency);
    write_toml(path, root);
}

// The measurement goes under its number of ranks; the link's general figures (used for any
// group without a measurement of its own) are those of the fewest ranks measured: on a CPU
// node, the measurement least slowed by ranks crowding the cores, which the plan scales by
// each layout's share of a core.
void write_calibration(const std::string& path, const CollectiveCalibration& collectives) {
    toml::table root = read_or_empty(path);
    toml::table& link = subtable(subtable(root, "collectives"), collectives.inter_node ? "inter_node" : "intra_node");
    const auto write_figures = [&](toml::table& table) {
        for (const auto& [op, gbps] : collectives.busbw_gbps) table.insert_or_assign(cat(collective_key(op), "_busbw_gbps"), gbps);
        for (const auto& [op, curve] : collectives.busbw_by_size) {
            toml::array points;
            for (const auto& [bytes, gbps] : curve) points.push_back(toml::array{bytes, gbps});
            table.insert_or_assign(cat(collective_key(op), "_busbw_by_size"), std::move(points));
        }
        table.insert_or_assign("latency_us", collectives.latency_us);
    };
    write_figures(subtable(link, cat(kRanksPrefix, collectives.ranks)));
    const std::optional<int64_t> general_ranks = link.get_as<int64_t>("ranks") ? std::optional<int64_t>(**link.get_as<int64_t>("ranks")) : std::nullopt;
    if (!general_ranks || *general_ranks >= collectives.ranks) {
        write_figures(link);
        link.insert_or_assign("ranks", collectives.ranks);
    }
    write_toml(path, root);
}

}  // namespace llmtrain
