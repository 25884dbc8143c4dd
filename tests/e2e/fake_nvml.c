/* A stand-in for libnvidia-ml.so.1 with one GPU of known readings, for the test of the GPU
 * series: the entry points llmtrain's sampler calls, with NVML's C signatures. */
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
static struct nvmlEventSet_st { int xid_pending; } events = {1};

nvmlReturn_t nvmlInit_v2(void) { return SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { return SUCCESS; }
const char* nvmlErrorString(nvmlReturn_t r) { return r == NOT_FOUND ? "Not Found" : "fake NVML error"; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned* count) { *count = 1; return SUCCESS; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t* device) {
    if (index != 0) return NOT_FOUND;
    *device = &gpu0;
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
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int error_type, int counter_type, unsigned long long* count) {
    (void)d;
    if (counter_type != 0) return INVALID_ARGUMENT;
    *count = error_type == 0 ? 3 : 0;
    return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned link, int* active) {
    (void)d;
    if (link > 1) return NOT_SUPPORTED;
    *active = link == 0;
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
