/* A stand-in for libnvidia-ml.so.1 with one GPU of known readings, for the tests of the GPU
 * series and of doctor's GPU health checks: the entry points llmtrain calls, with NVML's C
 * signatures. FAKE_NVML_FAULTS, a comma-separated list, chooses the faults it shows:
 *   xid              one critical XID 79 (GPU fallen off the bus) waiting in the event set
 *   link_down        NVLink link 1 inactive (link 0 active)
 *   ecc_volatile     2 uncorrected ECC errors since the driver loaded (7 in the GPU's life)
 *   ecc_aggregate    no uncorrected ECC error since the driver loaded, 4 in the GPU's life
 *   remap_pending    a row remapping waiting for a GPU reset
 *   remap_failed     a row remapping that failed (no spare rows left)
 * Unset, it shows "xid,link_down" (what the metrics test expects); set to "", none. */
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct nvmlEventSet_st* nvmlEventSet_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

enum { SUCCESS = 0, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6, TIMEOUT = 10 };
static struct nvmlDevice_st { int index; } gpu0 = {0};
static struct nvmlEventSet_st { int xid_pending; } events = {0};

static int has_fault(const char* fault) {
    const char* faults = getenv("FAKE_NVML_FAULTS");
    if (!faults) faults = "xid,link_down";
    const size_t n = strlen(fault);
    for (const char* p = faults; (p = strstr(p, fault)) != NULL; p += n)
        if ((p == faults || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}

nvmlReturn_t nvmlInit_v2(void) {
    events.xid_pending = has_fault("xid");
    return SUCCESS;
}
nvmlReturn_t nvmlShutdown(void) { return SUCCESS; }
const char* nvmlErrorString(nvmlReturn_t r) { return r == NOT_FOUND ? "Not Found" : "fake NVML error"; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned* count) { *count = 1; return SUCCESS; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t* device) {
    if (index != 0) return NOT_FOUND;
    *device = &gpu0;
    return SUCCESS;
}
nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned length) {
    strncpy(version, "550.54.15", length);
    return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char* name, unsigned length) {
    (void)d;
    strncpy(name, "Fake GPU (NVML stand-in)", length);
    return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned* index) { *index = (unsigned)device->index; return SUCCESS; }
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t* u) { (void)d; u->gpu = 42; u->memory = 17; return SUCCESS; }
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) {
    (void)d;
    m->total = 80000000000ULL, m->used = 30000000000ULL, m->free = m->total - m->used;
    return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned* milliwatts) { (void)d; *milliwatts = 312500; return SUCCESS; }
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long* millijoules) { (void)d; *millijoules = 123456789ULL; return SUCCESS; }
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned* celsius) {
    (void)d;
    if (sensor != 0) return INVALID_ARGUMENT;
    *celsius = 61;
    return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned* mhz) {
    (void)d;
    if (type != 1) return INVALID_ARGUMENT;
    *mhz = 1980;
    return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long* reasons) { (void)d; *reasons = 0x4; return SUCCESS; }
/* Corrected: 3 since the driver loaded, 9 in the GPU's life. */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int error_type, int counter_type, unsigned long long* count) {
    (void)d;
    if (counter_type != 0 && counter_type != 1) return INVALID_ARGUMENT;
    const int aggregate = counter_type == 1;
    if (error_type == 0) *count = aggregate ? 9 : 3;
    else if (has_fault("ecc_volatile")) *count = aggregate ? 7 : 2;
    else *count = aggregate && has_fault("ecc_aggregate") ? 4 : 0;
    return SUCCESS;
}
/* Row remapping (A100 and later) rather than page retirement. */
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned* corrected, unsigned* uncorrected, unsigned* pending, unsigned* failed) {
    (void)d;
    *corrected = 1;
    *uncorrected = has_fault("remap_pending") || has_fault("remap_failed") ? 1 : 0;
    *pending = (unsigned)has_fault("remap_pending");
    *failed = (unsigned)has_fault("remap_failed");
    return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, int cause, unsigned* count, unsigned long long* addresses) {
    (void)d, (void)cause, (void)count, (void)addresses;
    return NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned link, int* active) {
    (void)d;
    if (link > 1) return NOT_SUPPORTED;
    *active = link == 0 || !has_fault("link_down");
    return SUCCESS;
}
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) { *set = &events; return SUCCESS; }
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) { (void)d, (void)set; return types == 0x8 ? SUCCESS : NOT_SUPPORTED; }
/* One XID 79 (GPU fallen off the bus), then nothing. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data, unsigned timeout_ms) {
    (void)timeout_ms;
    if (!set->xid_pending) return TIMEOUT;
    set->xid_pending = 0;
    memset(data, 0, sizeof *data);
    data->device = &gpu0, data->eventType = 0x8, data->eventData = 79;
    return SUCCESS;
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { (void)set; return SUCCESS; }
