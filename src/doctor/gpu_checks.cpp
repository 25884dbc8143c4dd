#include "doctor/gpu_checks.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "backend/cuda_host_rules.h"
#include "core/error.h"
#include "core/nvml.h"

namespace llmtrain {

namespace {

constexpr nvmlReturn_t kNvmlInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE: a count is returned
// nvmlClocksThrottleReason bits that mean the hardware itself slowed the clocks down.
constexpr std::array<std::pair<uint64_t, const char*>, 3> kHardwareSlowdowns = {
    {{0x8, "hardware slowdown"}, {0x40, "hardware thermal slowdown"}, {0x80, "hardware power brake"}}};

CheckResult result(const std::string& name, CheckStatus status, std::string detail, std::string hint = "") {
    return {name, status, std::move(detail), std::move(hint)};
}

std::string gbps(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f GB/s", value);
    return text;
}

// "GPU 0, GPU 3" of the GPUs for which `bad` holds.
template <class Pred>
std::string gpus_where(const std::vector<GpuHealth>& gpus, Pred bad) {
    std::string out;
    for (const GpuHealth& g : gpus)
        if (bad(g)) out += cat(out.empty() ? "" : ", ", "GPU ", g.index);
    return out;
}

// Compares dotted release numbers ("535.104.05" < "550.54.15") field by field.
bool release_older(const std::string& a, const std::string& b) {
    unsigned x[3] = {}, y[3] = {};
    std::sscanf(a.c_str(), "%u.%u.%u", &x[0], &x[1], &x[2]);
    std::sscanf(b.c_str(), "%u.%u.%u", &y[0], &y[1], &y[2]);
    return std::lexicographical_compare(x, x + 3, y, y + 3);
}

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

// What an XID code usually means (NVIDIA's XID catalogue), for the hint.
std::string xid_meaning(uint64_t xid) {
    switch (xid) {
        case 48: return "double-bit ECC error";
        case 63: case 64: return "ECC page retirement or row remapping event";
        case 74: return "NVLink error";
        case 79: return "GPU has fallen off the bus";
        case 92: return "high single-bit ECC error rate";
        case 94: return "contained ECC error";
        case 95: return "uncontained ECC error";
        case 119: case 120: return "GSP firmware error";
        default: return "see NVIDIA's XID catalogue";
    }
}

}  // namespace

std::string minimum_driver_for_runtime(int runtime_version) {
    switch (runtime_version / 1000) {
        case 11: return "450.80.02";
        case 12: return "525.60.13";
        case 13: return "580.65.06";
        default: return "";
    }
}

CheckResult judge_gpu_driver(int runtime_version, int driver_cuda_version, const std::string& driver_release) {
    if (runtime_version == 0) return result("gpu.driver", CheckStatus::skip, "this llmtrain was built without CUDA", "GPU checks need a CUDA build");
    const std::string minimum = minimum_driver_for_runtime(runtime_version);
    const std::string detail = cat("driver ", driver_release.empty() ? "release unknown" : driver_release, " (CUDA ",
                                   driver_cuda_version ? cuda_version_text(driver_cuda_version) : "none", "), runtime CUDA ", cuda_version_text(runtime_version),
                                   minimum.empty() ? "" : cat("; the toolkit needs driver ", minimum, " or newer"));
    // No CUDA driver (libcuda) answers: no GPU here, as gpu.devices says too; NVML alone (a
    // release without libcuda) cannot run kernels either.
    if (driver_cuda_version == 0)
        return result("gpu.driver", CheckStatus::skip, cat("no CUDA driver on this node", driver_release.empty() ? "" : cat(" (NVML reports release ", driver_release, ")")),
                      "GPU checks need a GPU and its driver");
    if (const std::string problem = cuda_driver_problem(driver_cuda_version, runtime_version); !problem.empty())
        return result("gpu.driver", CheckStatus::fail, detail, problem);
    if (!driver_release.empty() && !minimum.empty() && release_older(driver_release, minimum))
        return result("gpu.driver", CheckStatus::fail, detail, cat("update the NVIDIA driver to ", minimum, " or newer"));
    return result("gpu.driver", CheckStatus::pass, detail);
}

std::string node_gpus_to_text(const NodeGpus& node) {
    return nlohmann::json{{"host", node.host}, {"ranks", node.ranks}, {"models", node.models}, {"why_not", node.why_not}}.dump();
}

NodeGpus node_gpus_from_text(const std::string& text) {
    const nlohmann::json j = nlohmann::json::parse(text);
    return {j.at("host").get<std::string>(), j.at("ranks").get<int>(), j.at("models").get<std::vector<std::string>>(), j.at("why_not").get<std::string>()};
}

std::vector<CheckResult> judge_node_gpus(const std::vector<NodeGpus>& nodes) {
    std::vector<CheckResult> checks;
    const std::vector<std::string>* reference = nullptr;
    for (const NodeGpus& node : nodes) {
        const std::string name = cat("gpu.node.", node.host);
        if (!node.why_not.empty()) {
            // The reason itself is gpu.ecc's detail, reported by the node's first rank: said once.
            checks.push_back(result(name, CheckStatus::skip, "needs NVML, which is not loaded on this node (gpu.ecc says why)",
                                    "GPU checks need a GPU and its driver"));
            continue;
        }
        if (node.models.empty()) {
            checks.push_back(result(name, CheckStatus::fail, cat("the driver sees no GPU; ", node.ranks, " rank(s) here"), "check the GPUs with nvidia-smi; drain the node"));
            continue;
        }
        std::map<std::string, int> counts;
        for (const std::string& m : node.models) ++counts[m];
        std::string detail;
        for (const auto& [model, count] : counts) detail += cat(detail.empty() ? "" : ", ", count, " x ", model);
        detail += cat("; ", node.ranks, " rank(s) here");
        if (!reference) reference = &node.models;
        if (counts.size() > 1)
            checks.push_back(result(name, CheckStatus::warn, detail, "mixed GPU models on one node: the slowest sets the pace"));
        else if (static_cast<int>(node.models.size()) < node.ranks)
            checks.push_back(result(name, CheckStatus::warn, detail, "more ranks than GPUs: launch one rank per GPU"));
        else if (node.models.front() != reference->front())
            checks.push_back(result(name, CheckStatus::warn, detail, cat("other GPUs than the first node's (", reference->front(), "): the slowest sets the pace")));
        else
            checks.push_back(result(name, CheckStatus::pass, detail));
    }
    return checks;
}

std::vector<GpuHealth> read_gpu_health(const Nvml& nvml) {
    const NvmlApi& api = nvml.api();
    std::vector<GpuHealth> gpus;
    for (unsigned i = 0; i < nvml.device_count(); ++i) {
        const std::optional<nvmlDevice_t> device = nvml.device(i);
        if (!device) continue;
        const nvmlDevice_t d = *device;
        GpuHealth g;
        g.index = i;
        unsigned long long count = 0;
        if (api.ecc && api.ecc(d, kNvmlUncorrectedEcc, kNvmlVolatileEcc, &count) == NVML_SUCCESS) g.ecc_volatile_uncorrected = count;
        if (api.ecc && api.ecc(d, kNvmlUncorrectedEcc, kNvmlAggregateEcc, &count) == NVML_SUCCESS) g.ecc_aggregate_uncorrected = count;
        if (api.ecc && api.ecc(d, kNvmlCorrectedEcc, kNvmlVolatileEcc, &count) == NVML_SUCCESS) g.ecc_volatile_corrected = count;
        RowRemapping rows;
        unsigned pending = 0, failed = 0;
        if (api.remapped_rows && api.remapped_rows(d, &rows.corrected, &rows.uncorrected, &pending, &failed) == NVML_SUCCESS) {
            rows.pending = pending != 0;
            rows.failed = failed != 0;
            g.remapping = rows;
        }
        RetiredPages pages;
        unsigned single = 0, dbl = 0;
        const auto counted = [](nvmlReturn_t r) { return r == NVML_SUCCESS || r == kNvmlInsufficientSize; };
        if (api.retired_pages && counted(api.retired_pages(d, kNvmlRetiredMultipleSingleBit, &single, nullptr)) &&
            counted(api.retired_pages(d, kNvmlRetiredDoubleBit, &dbl, nullptr))) {
            int page_pending = 0;
            pages = {single, dbl, api.retired_pages_pending && api.retired_pages_pending(d, &page_pending) == NVML_SUCCESS && page_pending != 0};
            g.retired = pages;
        }
        for (unsigned link = 0; api.nvlink && link < kNvLinkMaxLinks; ++link) {
            int active = 0;
            if (api.nvlink(d, link, &active) == NVML_SUCCESS) g.nvlinks.emplace_back(link, active != 0);
        }
        unsigned long long reasons = 0;
        if (api.throttle && api.throttle(d, &reasons) == NVML_SUCCESS) g.throttle_reasons = reasons;
        gpus.push_back(std::move(g));
    }
    return gpus;
}

CheckResult judge_ecc(const std::vector<GpuHealth>& gpus) {
    uint64_t volatile_unc = 0, aggregate_unc = 0, corrected = 0;
    bool any = false;
    for (const GpuHealth& g : gpus) {
        any = any || g.ecc_volatile_uncorrected.has_value();
        volatile_unc += g.ecc_volatile_uncorrected.value_or(0);
        aggregate_unc += g.ecc_aggregate_uncorrected.value_or(0);
        corrected += g.ecc_volatile_corrected.value_or(0);
    }
    if (!any) return result("gpu.ecc", CheckStatus::skip, cat(gpus.size(), " GPU(s): ECC counters not offered (ECC off or not supported)"), "enable ECC (nvidia-smi -e 1) on datacenter GPUs");
    const std::string detail = cat(gpus.size(), " GPU(s): uncorrected ECC errors ", volatile_unc, " since the driver loaded, ", aggregate_unc, " in their lifetime; ",
                                   corrected, " corrected since the driver loaded");
    if (volatile_unc > 0)
        return result("gpu.ecc", CheckStatus::fail, detail + cat(" (", gpus_where(gpus, [](const GpuHealth& g) { return g.ecc_volatile_uncorrected.value_or(0) > 0; }), ")"),
                      "uncorrectable memory errors corrupt training: drain the node, reset the GPU (nvidia-smi -r) and check retired pages / row remapping");
    if (aggregate_unc > 0)
        return result("gpu.ecc", CheckStatus::warn, detail + cat(" (", gpus_where(gpus, [](const GpuHealth& g) { return g.ecc_aggregate_uncorrected.value_or(0) > 0; }), ")"),
                      "uncorrectable errors in the past: watch this GPU; more of them mean a replacement");
    return result("gpu.ecc", CheckStatus::pass, detail);
}

CheckResult judge_retired_memory(const std::vector<GpuHealth>& gpus) {
    unsigned remapped = 0, retired = 0;
    bool any = false;
    for (const GpuHealth& g : gpus) {
        any = any || g.remapping || g.retired;
        if (g.remapping) remapped += g.remapping->corrected + g.remapping->uncorrected;
        if (g.retired) retired += g.retired->single_bit + g.retired->double_bit;
    }
    if (!any) return result("gpu.retired_memory", CheckStatus::skip, cat(gpus.size(), " GPU(s): neither row remapping nor page retirement offered"), "");
    const std::string detail = cat(gpus.size(), " GPU(s): ", remapped, " row(s) remapped, ", retired, " page(s) retired");
    const std::string failed = gpus_where(gpus, [](const GpuHealth& g) { return g.remapping && g.remapping->failed; });
    if (!failed.empty())
        return result("gpu.retired_memory", CheckStatus::fail, cat(detail, "; row remapping FAILED on ", failed),
                      "the GPU has no spare memory rows left: drain the node and replace the GPU");
    const std::string pending = gpus_where(gpus, [](const GpuHealth& g) { return (g.remapping && g.remapping->pending) || (g.retired && g.retired->pending); });
    if (!pending.empty())
        return result("gpu.retired_memory", CheckStatus::warn, cat(detail, "; remapping / retirement pending on ", pending),
                      "reset the GPU (nvidia-smi -r, or reboot) so the bad memory is taken out of use");
    return result("gpu.retired_memory", CheckStatus::pass, detail);
}

CheckResult judge_nvlink(const std::vector<GpuHealth>& gpus) {
    int links = 0;
    std::string down;
    for (const GpuHealth& g : gpus) {
        for (const auto& [link, active] : g.nvlinks) {
            ++links;
            if (!active) down += cat(down.empty() ? "" : ", ", "GPU ", g.index, " link ", link);
        }
    }
    if (links == 0) return result("gpu.nvlink", CheckStatus::skip, cat(gpus.size(), " GPU(s) without NVLink (PCIe)"), "");
    if (!down.empty())
        return result("gpu.nvlink", CheckStatus::warn, cat(links, " NVLink link(s); down: ", down),
                      "collectives fall back to slower paths: check nvidia-smi nvlink -s and the fabric manager, reset the GPU or drain the node");
    return result("gpu.nvlink", CheckStatus::pass, cat(links, " NVLink link(s) on ", gpus.size(), " GPU(s), all active"));
}

CheckResult judge_gpu_health(const std::vector<GpuHealth>& gpus, const std::vector<XidEvent>& xids) {
    if (!xids.empty()) {
        std::string list;
        for (const XidEvent& x : xids) list += cat(list.empty() ? "" : ", ", "XID ", x.xid, " on GPU ", x.gpu, " (", xid_meaning(x.xid), ")");
        return result("gpu.health", CheckStatus::fail, cat("critical XID event(s) while doctor ran: ", list),
                      "the driver reported a GPU fault: drain the node and look at the kernel log (dmesg | grep -i xid)");
    }
    std::string slow;
    for (const GpuHealth& g : gpus)
        for (const auto& [bit, what] : kHardwareSlowdowns)
            if (g.throttle_reasons && (*g.throttle_reasons & bit)) slow += cat(slow.empty() ? "" : ", ", "GPU ", g.index, " ", what);
    if (!slow.empty())
        return result("gpu.health", CheckStatus::warn, cat("clocks lowered by the hardware: ", slow), "check cooling and power of the node; it will straggle");
    return result("gpu.health", CheckStatus::pass, cat(gpus.size(), " GPU(s): no critical XID event while doctor ran, no hardware slowdown"));
}

XidWatch::XidWatch(const Nvml& nvml) : nvml_(nvml) {
    const NvmlApi& api = nvml.api();
    if (!api.event_set_create || !api.register_events || !api.event_wait || api.event_set_create(&set_) != NVML_SUCCESS) {
        set_ = nullptr;
        return;
    }
    bool registered = false;
    for (unsigned i = 0; i < nvml.device_count(); ++i)
        if (const auto d = nvml.device(i)) registered = api.register_events(*d, kNvmlXidCriticalError, set_) == NVML_SUCCESS || registered;
    if (!registered) {
        if (api.event_set_free) api.event_set_free(set_);
        set_ = nullptr;
    }
}

XidWatch::~XidWatch() {
    if (set_ && nvml_.api().event_set_free) nvml_.api().event_set_free(set_);
}

std::vector<XidEvent> XidWatch::events() {
    std::vector<XidEvent> out;
    nvmlEventData_t event{};
    while (set_ && nvml_.api().event_wait(set_, &event, 0) == NVML_SUCCESS) {
        unsigned index = 0;
        if (nvml_.api().index_of) nvml_.api().index_of(event.device, &index);
        out.push_back({index, event.eventData});
    }
    return out;
}

// nccl-tests' all-reduce bus bandwidth on 8 GPUs of one node over NVLink (NVSwitch), which
// healthy systems reach: H100 / H200 SXM (NVLink 4, 900 GB/s per GPU) about 450 GB/s,
// A100 SXM (NVLink 3, 600 GB/s) about 230 GB/s. PCIe cards and NVL pairs are not in it.
std::optional<double> reference_allreduce_busbw_gbps(const std::string& model) {
    if ((contains(model, "H100") || contains(model, "H200")) && !contains(model, "PCIe") && !contains(model, "NVL")) return 450;
    if (contains(model, "A100") && contains(model, "SXM")) return 230;
    return std::nullopt;
}

// Copy bandwidth between two GPUs, both directions at once: a common bar of 800 GB/s over
// NVLink 4 (H100 / H200: 900 GB/s of links per GPU), and 400 GB/s over NVLink 3 (A100).
std::optional<double> reference_peer_copy_gbps(const std::string& model) {
    if ((contains(model, "H100") || contains(model, "H200")) && !contains(model, "PCIe") && !contains(model, "NVL")) return 800;
    if (contains(model, "A100") && contains(model, "SXM")) return 400;
    return std::nullopt;
}

CheckResult judge_allreduce(double busbw_gbps, size_t bytes, int ranks, int nodes, const std::string& model) {
    const std::string measured = cat("all_reduce bus bandwidth ", gbps(busbw_gbps), " at ", bytes >> 20, " MB over ", ranks, " GPU(s) on ", nodes, " node(s) (", model, ")");
    const std::optional<double> reference = reference_allreduce_busbw_gbps(model);
    if (!reference) return result("gpu.nccl_allreduce", CheckStatus::pass, cat(measured, "; no reference figure for this GPU model: not judged"));
    if (nodes > 1)
        return result("gpu.nccl_allreduce", CheckStatus::pass,
                      cat(measured, "; across nodes the network bounds it: not judged against the one-node NVLink figure (", gbps(*reference), ")"));
    if (ranks != 8)
        return result("gpu.nccl_allreduce", CheckStatus::pass, cat(measured, "; the reference (", gbps(*reference), ") is for 8 GPUs: not judged with ", ranks));
    if (busbw_gbps < 0.8 * *reference)
        return result("gpu.nccl_allreduce", CheckStatus::warn, cat(measured, "; below 80% of the ", gbps(*reference), " this model reaches"),
                      "check gpu.nvlink, NCCL_* overrides and the topology (nvidia-smi topo -m); the run's gradient reduction will be slower");
    return result("gpu.nccl_allreduce", CheckStatus::pass, cat(measured, "; ", gbps(*reference), " expected"));
}

CheckResult judge_peer_copies(const std::vector<PeerCopyResult>& pairs, const std::string& model, bool nvlink) {
    if (pairs.empty()) return result("gpu.p2p_copy", CheckStatus::skip, "this process sees fewer than two GPUs", "run doctor alone on the node (it sees every GPU)");
    const PeerCopyResult& slowest = *std::min_element(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) { return a.bidirectional_gbps < b.bidirectional_gbps; });
    const bool all_peer = std::all_of(pairs.begin(), pairs.end(), [](const PeerCopyResult& p) { return p.peer_access; });
    const std::string measured = cat(pairs.size(), " pair(s), both directions at once: slowest GPU ", slowest.from, " <-> GPU ", slowest.to, " ",
                                     gbps(slowest.bidirectional_gbps), all_peer ? "" : " (some pairs without peer access: staged through the host)");
    const std::optional<double> bar = reference_peer_copy_gbps(model);
    if (!bar || !nvlink) return result("gpu.p2p_copy", CheckStatus::pass, cat(measured, "; no NVLink bar for ", model, nvlink ? "" : " without active NVLink", ": not judged"));
    if (!all_peer || slowest.bidirectional_gbps < *bar)
        return result("gpu.p2p_copy", CheckStatus::warn, cat(measured, "; below the ", gbps(*bar), " bar of NVLink on ", model),
                      "check gpu.nvlink and nvidia-smi topo -m; a slow pair slows every collective through it");
    return result("gpu.p2p_copy", CheckStatus::pass, cat(measured, "; bar ", gbps(*bar)));
}

double measure_p2p_gbps(Comm& world, int from, int to, size_t bytes, int iterations) {
    const int me = world.rank();
    if (me != from && me != to) return 0;
    std::vector<float> buffer(bytes / sizeof(float));
    const Tensor message(buffer.data(), DType::f32, {static_cast<int64_t>(buffer.size())});
    float done = 0;
    const Tensor ack(&done, DType::f32, {1});
    // One untimed message first: the transport's connection and registration.
    if (me == from) world.send(message, to);
    else world.recv(message, from);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) {
        if (me == from) world.send(message, to);
        else world.recv(message, from);
    }
    if (me == to) world.send(ack, from);
    else world.recv(ack, to);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return static_cast<double>(buffer.size() * sizeof(float)) * iterations / seconds / 1e9;
}

CheckResult judge_internode(const std::vector<std::pair<std::string, double>>& pairs, double net_gbps) {
    const auto slowest = std::min_element(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    const std::string measured = cat("MPI point-to-point, slowest pair of nodes ", slowest->first, ": ", gbps(slowest->second), " (", static_cast<int64_t>(slowest->second * 8),
                                     " Gbit/s) over ", pairs.size(), " pair(s)");
    if (net_gbps <= 0) return result("mpi.internode_bandwidth", CheckStatus::pass, cat(measured, "; not compared (give --net-gbps)"));
    if (slowest->second * 8 < 0.8 * net_gbps)
        return result("mpi.internode_bandwidth", CheckStatus::warn, cat(measured, "; below 80% of the network's ", net_gbps, " Gbit/s"),
                      "check the NICs (ibstat: rate, state), the MPI transport (UCX_NET_DEVICES) and the cabling of the slow pair");
    return result("mpi.internode_bandwidth", CheckStatus::pass, cat(measured, "; at least 80% of ", net_gbps, " Gbit/s"));
}

}  // namespace llmtrain
