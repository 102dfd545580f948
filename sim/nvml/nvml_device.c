/* Per-device queries: identity, utilisation, memory, thermals, power, clocks, PCIe, fans,
 * performance state and clock event reasons. Features a model lacks (the has_* fields the
 * Python model table writes) answer NVML_ERROR_NOT_SUPPORTED, as the real driver does. */
#include <stdio.h>
#include <string.h>

#include "gqsim_internal.h"

#define MIB (1024.0 * 1024.0)

static unsigned gq_pct(double ratio) {
    double p = ratio * 100.0 + 0.5;
    if (p < 0) p = 0;
    if (p > 100) p = 100;
    return (unsigned)p;
}

static const gq_profile *gq_profile_of(const gq_gpu *g, uint32_t profile_index) {
    for (uint32_t i = 0; i < g->profile_count; i++)
        if (g->profiles[i].profile_index == profile_index) return &g->profiles[i];
    return NULL;
}

const gq_profile *gq_mig_profile(const gq_gpu *g, int mig) {
    return gq_profile_of(g, g->mig[mig].profile_index);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    GQ_ENTER(device, 1, 1);
    if (!GQ_IS_MIG(device)) return gq_copy_str(name, length, g->str[GQ_F_name]);
    const gq_profile *p = gq_mig_profile(g, device->mig);
    char buf[GQ_STR_LEN * 2];
    snprintf(buf, sizeof(buf), "%s MIG %s", g->str[GQ_F_name], p ? p->name : "unknown");
    return gq_copy_str(name, length, buf);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    GQ_ENTER(device, 1, 1);
    if (GQ_IS_MIG(device)) return gq_copy_str(uuid, length, g->mig[device->mig].uuid);
    return gq_copy_str(uuid, length, g->str[GQ_F_uuid]);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    GQ_ENTER(device, 1, 0);
    if (minor == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = (unsigned)GQ_NUM(g, minor_number);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    GQ_ENTER(device, 1, 0);
    return gq_copy_str(serial, length, g->str[GQ_F_serial]);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version,
                                                 unsigned int length) {
    GQ_ENTER(device, 1, 0);
    return gq_copy_str(version, length, g->str[GQ_F_vbios_version]);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char *partNumber,
                                                    unsigned int length) {
    GQ_ENTER(device, 1, 0);
    return gq_copy_str(partNumber, length, g->str[GQ_F_board_part_number]);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major,
                                                          int *minor) {
    GQ_ENTER(device, 1, 1);
    if (major == NULL || minor == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *major = (int)GQ_NUM(g, cc_major);
    *minor = (int)GQ_NUM(g, cc_minor);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                     nvmlUtilization_t *utilization) {
    GQ_ENTER(device, 0, 0);
    if (utilization == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    utilization->gpu = gq_pct(GQ_NUM(g, gpu_utilization_ratio));
    utilization->memory = gq_pct(GQ_NUM(g, memory_utilization_ratio));
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device,
                                                       unsigned int *utilization,
                                                       unsigned int *samplingPeriodUs) {
    GQ_ENTER(device, 0, 0);
    if (utilization == NULL || samplingPeriodUs == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_encoder)) return NVML_ERROR_NOT_SUPPORTED;
    *utilization = gq_pct(GQ_NUM(g, encoder_utilization_ratio));
    *samplingPeriodUs = 167000;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device,
                                                       unsigned int *utilization,
                                                       unsigned int *samplingPeriodUs) {
    GQ_ENTER(device, 0, 0);
    if (utilization == NULL || samplingPeriodUs == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *utilization = gq_pct(GQ_NUM(g, decoder_utilization_ratio));
    *samplingPeriodUs = 167000;
    return NVML_SUCCESS;
}

/* The memory of a device or MIG instance: used as NVML reports it (it includes the reserved
 * part), reserved, and total. */
static void gq_memory(const gq_gpu *g, nvmlDevice_t device, double *total, double *used,
                      double *reserved) {
    if (GQ_IS_MIG(device)) {
        const gq_profile *p = gq_mig_profile(g, device->mig);
        *total = p ? (double)p->memory_mb * MIB : 0.0;
        *used = g->mig[device->mig].memory_used_bytes;
        *reserved = 0.0;
    } else {
        *total = GQ_NUM(g, memory_total_bytes);
        *used = GQ_NUM(g, memory_used_bytes);
        *reserved = GQ_NUM(g, memory_reserved_bytes);
    }
    if (*used > *total) *used = *total;
    if (*reserved > *used) *reserved = *used;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    GQ_ENTER(device, 0, 1);
    if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    double total, used, reserved;
    gq_memory(g, device, &total, &used, &reserved);
    memory->total = (unsigned long long)total;
    memory->used = (unsigned long long)used;
    memory->free = (unsigned long long)(total - used);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    GQ_ENTER(device, 0, 1);
    if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    double total, used, reserved;
    gq_memory(g, device, &total, &used, &reserved);
    memory->total = (unsigned long long)total;
    memory->reserved = (unsigned long long)reserved;
    memory->used = (unsigned long long)used;
    memory->free = (unsigned long long)(total - used);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1) {
    GQ_ENTER(device, 0, 1);
    if (bar1 == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    double total = GQ_NUM(g, bar1_total_bytes), used = GQ_NUM(g, bar1_used_bytes);
    if (used > total) used = total;
    bar1->bar1Total = (unsigned long long)total;
    bar1->bar1Used = (unsigned long long)used;
    bar1->bar1Free = (unsigned long long)(total - used);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                                nvmlTemperatureSensors_t sensorType,
                                                unsigned int *temp) {
    GQ_ENTER(device, 0, 0);
    if (temp == NULL || sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = (unsigned)(GQ_NUM(g, gpu_temperature_celsius) + 0.5);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device,
                                                 nvmlTemperature_t *temperature) {
    GQ_ENTER(device, 0, 0);
    if (temperature == NULL || temperature->sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (temperature->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    temperature->temperature = (int)(GQ_NUM(g, gpu_temperature_celsius) + 0.5);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device,
                                                         nvmlTemperatureThresholds_t thresholdType,
                                                         unsigned int *temp) {
    GQ_ENTER(device, 0, 0);
    if (temp == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    double v;
    switch (thresholdType) {
    case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: v = GQ_NUM(g, temp_shutdown_celsius); break;
    case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: v = GQ_NUM(g, temp_slowdown_celsius); break;
    case NVML_TEMPERATURE_THRESHOLD_GPU_MAX: v = GQ_NUM(g, temp_gpu_max_celsius); break;
    case NVML_TEMPERATURE_THRESHOLD_MEM_MAX:
        if (!GQ_HAS(g, has_memory_temperature)) return NVML_ERROR_NOT_SUPPORTED;
        v = GQ_NUM(g, temp_memory_max_celsius);
        break;
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
    *temp = (unsigned)v;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device,
                                                                    unsigned int *minLimit,
                                                                    unsigned int *maxLimit) {
    GQ_ENTER(device, 0, 0);
    if (minLimit == NULL || maxLimit == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *minLimit = (unsigned)(GQ_NUM(g, power_min_watts) * 1000.0 + 0.5);
    *maxLimit = (unsigned)(GQ_NUM(g, power_limit_watts) * 1000.0 + 0.5);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode) {
    GQ_ENTER(device, 0, 0);
    if (mode == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = GQ_HAS(g, persistence_mode) ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode) {
    GQ_ENTER(device, 0, 0);
    if (mode == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = (nvmlComputeMode_t)(int)GQ_NUM(g, compute_mode);
    return NVML_SUCCESS;
}

/* Data-centre boards drive no display. */
GQ_EXPORT nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t *display) {
    GQ_ENTER(device, 0, 0);
    (void)g;
    if (display == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *display = NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, nvmlEnableState_t *isActive) {
    GQ_ENTER(device, 0, 0);
    (void)g;
    if (isActive == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type) {
    GQ_ENTER(device, 1, 0);
    if (type == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *type = (nvmlBrandType_t)(int)GQ_NUM(g, brand);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    GQ_ENTER(device, 0, 0);
    if (power == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *power = (unsigned)(GQ_NUM(g, power_watts) * 1000.0 + 0.5);
    return NVML_SUCCESS;
}

static nvmlReturn_t gq_power_limit(nvmlDevice_t device, unsigned int *limit, const char *fn) {
    gq_gpu *g;
    nvmlReturn_t r = gq_enter(device, fn, 0, 0, &g);
    if (r != NVML_SUCCESS) return r;
    if (limit == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *limit = (unsigned)(GQ_NUM(g, power_limit_watts) * 1000.0 + 0.5);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    return gq_power_limit(device, limit, __func__);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device,
                                                         unsigned int *limit) {
    return gq_power_limit(device, limit, __func__);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device,
                                                                unsigned int *limit) {
    return gq_power_limit(device, limit, __func__);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                                           unsigned long long *energy) {
    GQ_ENTER(device, 0, 0);
    if (energy == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *energy = (unsigned long long)gq_energy_mj(g);
    return NVML_SUCCESS;
}

static nvmlReturn_t gq_clock(const gq_gpu *g, nvmlClockType_t type, int max, unsigned *out) {
    double hz;
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
        hz = max ? GQ_NUM(g, max_sm_clock_hertz) : GQ_NUM(g, graphics_clock_hertz);
        break;
    case NVML_CLOCK_SM: hz = max ? GQ_NUM(g, max_sm_clock_hertz) : GQ_NUM(g, sm_clock_hertz); break;
    case NVML_CLOCK_MEM:
        hz = max ? GQ_NUM(g, max_memory_clock_hertz) : GQ_NUM(g, memory_clock_hertz);
        break;
    case NVML_CLOCK_VIDEO: hz = GQ_NUM(g, video_clock_hertz); break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    *out = (unsigned)(hz / 1e6 + 0.5);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                              unsigned int *clock) {
    GQ_ENTER(device, 0, 0);
    if (clock == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    return gq_clock(g, type, 0, clock);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                                 unsigned int *clock) {
    GQ_ENTER(device, 0, 0);
    if (clock == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    return gq_clock(g, type, 1, clock);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device,
                                                   nvmlPcieUtilCounter_t counter,
                                                   unsigned int *value) {
    GQ_ENTER(device, 0, 0);
    if (value == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    double bps;
    if (counter == NVML_PCIE_UTIL_TX_BYTES) bps = GQ_NUM(g, pcie_tx_bytes_per_second);
    else if (counter == NVML_PCIE_UTIL_RX_BYTES) bps = GQ_NUM(g, pcie_rx_bytes_per_second);
    else return NVML_ERROR_INVALID_ARGUMENT;
    *value = (unsigned)(bps / 1024.0 + 0.5); /* NVML reports KB/s */
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value) {
    GQ_ENTER(device, 0, 0);
    if (value == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *value = (unsigned)GQ_NUM(g, pcie_replay_total);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device,
                                                           unsigned int *currLinkGen) {
    GQ_ENTER(device, 0, 0);
    if (currLinkGen == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *currLinkGen = (unsigned)GQ_NUM(g, pcie_link_gen);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device,
                                                          unsigned int *maxLinkGen) {
    GQ_ENTER(device, 0, 0);
    if (maxLinkGen == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *maxLinkGen = (unsigned)GQ_NUM(g, pcie_link_gen);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device,
                                                      unsigned int *currLinkWidth) {
    GQ_ENTER(device, 0, 0);
    if (currLinkWidth == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *currLinkWidth = (unsigned)GQ_NUM(g, pcie_link_width);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device,
                                                     unsigned int *maxLinkWidth) {
    GQ_ENTER(device, 0, 0);
    if (maxLinkWidth == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *maxLinkWidth = (unsigned)GQ_NUM(g, pcie_link_width);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *numFans) {
    GQ_ENTER(device, 0, 0);
    if (numFans == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_fan)) return NVML_ERROR_NOT_SUPPORTED;
    *numFans = 1;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    GQ_ENTER(device, 0, 0);
    if (speed == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_fan)) return NVML_ERROR_NOT_SUPPORTED;
    *speed = gq_pct(GQ_NUM(g, fan_speed_ratio));
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan,
                                                unsigned int *speed) {
    GQ_ENTER(device, 0, 0);
    if (speed == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_fan)) return NVML_ERROR_NOT_SUPPORTED;
    if (fan != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *speed = gq_pct(GQ_NUM(g, fan_speed_ratio));
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *pState) {
    GQ_ENTER(device, 0, 0);
    if (pState == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *pState = (nvmlPstates_t)(int)GQ_NUM(g, performance_state);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t *pState) {
    GQ_ENTER(device, 0, 0);
    if (pState == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *pState = (nvmlPstates_t)(int)GQ_NUM(g, performance_state);
    return NVML_SUCCESS;
}

static nvmlReturn_t gq_event_reasons(nvmlDevice_t device, unsigned long long *reasons,
                                     const char *fn, int supported) {
    gq_gpu *g;
    nvmlReturn_t r = gq_enter(device, fn, 0, 0, &g);
    if (r != NVML_SUCCESS) return r;
    if (reasons == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *reasons = supported ? (unsigned long long)nvmlClocksEventReasonAll
                         : (unsigned long long)GQ_NUM(g, clock_event_reasons);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                              unsigned long long *reasons) {
    return gq_event_reasons(device, reasons, __func__, 0);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                                 unsigned long long *reasons) {
    return gq_event_reasons(device, reasons, __func__, 0);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device,
                                                                unsigned long long *reasons) {
    return gq_event_reasons(device, reasons, __func__, 1);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device,
                                                                   unsigned long long *reasons) {
    return gq_event_reasons(device, reasons, __func__, 1);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                                  nvmlDeviceAttributes_t *attributes) {
    GQ_ENTER(device, 0, 1);
    if (attributes == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memset(attributes, 0, sizeof(*attributes));
    if (GQ_IS_MIG(device)) {
        const gq_profile *p = gq_mig_profile(g, device->mig);
        if (p == NULL) return NVML_ERROR_UNKNOWN;
        attributes->multiprocessorCount = p->multiprocessor_count;
        attributes->sharedCopyEngineCount = p->copy_engine_count;
        attributes->sharedDecoderCount = p->decoder_count;
        attributes->sharedEncoderCount = p->encoder_count;
        attributes->gpuInstanceSliceCount = p->slice_count;
        attributes->computeInstanceSliceCount = p->slice_count;
        attributes->memorySizeMB = p->memory_mb;
    } else {
        attributes->multiprocessorCount = (unsigned)GQ_NUM(g, multiprocessor_count);
        attributes->gpuInstanceSliceCount = GQ_HAS(g, has_mig) ? 7 : 0;
        attributes->computeInstanceSliceCount = GQ_HAS(g, has_mig) ? 7 : 0;
        attributes->memorySizeMB = (unsigned long long)(GQ_NUM(g, memory_total_bytes) / MIB);
    }
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device,
                                               nvmlDeviceAttributes_t *attributes) {
    return nvmlDeviceGetAttributes_v2(device, attributes);
}
