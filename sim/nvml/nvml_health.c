/* Memory health: ECC mode and counters, row remapping, page retirement, and the field-value
 * API through which clients read several of these (and memory temperature) at once. */
#include <string.h>
#include <sys/time.h>

#include "gqsim_internal.h"

GQ_EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                            nvmlEnableState_t *pending) {
    GQ_ENTER(device, 0, 0);
    if (current == NULL || pending == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_ecc)) return NVML_ERROR_NOT_SUPPORTED;
    *current = GQ_HAS(g, ecc_mode_enabled) ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    *pending = *current;
    return NVML_SUCCESS;
}

/* The counter NVML would report, or NOT_SUPPORTED without ECC (absent or switched off). */
static nvmlReturn_t gq_ecc_count(const gq_gpu *g, nvmlMemoryErrorType_t type,
                                 nvmlEccCounterType_t counter, unsigned long long *count) {
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_ecc) || !GQ_HAS(g, ecc_mode_enabled)) return NVML_ERROR_NOT_SUPPORTED;
    int corrected = type == NVML_MEMORY_ERROR_TYPE_CORRECTED;
    if (!corrected && type != NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        return NVML_ERROR_INVALID_ARGUMENT;
    double v;
    if (counter == NVML_VOLATILE_ECC)
        v = corrected ? GQ_NUM(g, ecc_corrected_volatile) : GQ_NUM(g, ecc_uncorrected_volatile);
    else if (counter == NVML_AGGREGATE_ECC)
        v = corrected ? GQ_NUM(g, ecc_corrected_aggregate) : GQ_NUM(g, ecc_uncorrected_aggregate);
    else
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned long long)v;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device,
                                                   nvmlMemoryErrorType_t errorType,
                                                   nvmlEccCounterType_t counterType,
                                                   unsigned long long *eccCounts) {
    GQ_ENTER(device, 0, 0);
    return gq_ecc_count(g, errorType, counterType, eccCounts);
}

/* All simulated errors sit in device memory (DRAM); the other locations count none. */
GQ_EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device,
                                                       nvmlMemoryErrorType_t errorType,
                                                       nvmlEccCounterType_t counterType,
                                                       nvmlMemoryLocation_t locationType,
                                                       unsigned long long *count) {
    GQ_ENTER(device, 0, 0);
    nvmlReturn_t r = gq_ecc_count(g, errorType, counterType, count);
    if (r == NVML_SUCCESS && locationType != NVML_MEMORY_LOCATION_DEVICE_MEMORY) *count = 0;
    return r;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                                 unsigned int *uncRows, unsigned int *isPending,
                                                 unsigned int *failureOccurred) {
    GQ_ENTER(device, 0, 0);
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_remapping)) return NVML_ERROR_NOT_SUPPORTED;
    *corrRows = (unsigned)GQ_NUM(g, remapped_rows_correctable);
    *uncRows = (unsigned)GQ_NUM(g, remapped_rows_uncorrectable);
    *isPending = GQ_HAS(g, remap_pending);
    *failureOccurred = GQ_HAS(g, remap_failure);
    return NVML_SUCCESS;
}

/* Retired pages get synthetic, distinct addresses: one 4 KiB page each, by cause. */
static nvmlReturn_t gq_retired(const gq_gpu *g, nvmlPageRetirementCause_t cause,
                               unsigned int *count, unsigned long long *addresses,
                               unsigned long long *timestamps) {
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_page_retirement)) return NVML_ERROR_NOT_SUPPORTED;
    unsigned n;
    unsigned long long base;
    if (cause == NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS) {
        n = (unsigned)GQ_NUM(g, retired_pages_single_bit);
        base = 0x1000000ULL;
    } else if (cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR) {
        n = (unsigned)GQ_NUM(g, retired_pages_double_bit);
        base = 0x8000000ULL;
    } else {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (*count < n || (n > 0 && addresses == NULL)) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        addresses[i] = base + (unsigned long long)i * 0x1000ULL;
        if (timestamps) timestamps[i] = 1700000000ULL + i;
    }
    *count = n;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device,
                                                 nvmlPageRetirementCause_t cause,
                                                 unsigned int *pageCount,
                                                 unsigned long long *addresses) {
    GQ_ENTER(device, 0, 0);
    return gq_retired(g, cause, pageCount, addresses, NULL);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device,
                                                    nvmlPageRetirementCause_t cause,
                                                    unsigned int *pageCount,
                                                    unsigned long long *addresses,
                                                    unsigned long long *timestamps) {
    GQ_ENTER(device, 0, 0);
    return gq_retired(g, cause, pageCount, addresses, timestamps);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device,
                                                              nvmlEnableState_t *isPending) {
    GQ_ENTER(device, 0, 0);
    if (isPending == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_page_retirement)) return NVML_ERROR_NOT_SUPPORTED;
    *isPending = GQ_HAS(g, retired_pages_pending) ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

static unsigned long long gq_nvlink_total(const gq_gpu *g, int counter) {
    unsigned long long sum = 0;
    for (int l = 0; l < (int)GQ_NUM(g, nvlink_count) && l < GQ_MAX_LINKS; l++)
        sum += g->nvlink_errors[l][counter];
    return sum;
}

/* One field value. Each field needs the feature its dedicated function needs. */
static nvmlReturn_t gq_field(const gq_gpu *g, nvmlFieldValue_t *v) {
    unsigned long long ull = 0;
    nvmlReturn_t r = NVML_SUCCESS;
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    switch (v->fieldId) {
    case NVML_FI_DEV_MEMORY_TEMP:
        if (!GQ_HAS(g, has_memory_temperature)) return NVML_ERROR_NOT_SUPPORTED;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = (unsigned)(GQ_NUM(g, memory_temperature_celsius) + 0.5);
        return NVML_SUCCESS;
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: ull = (unsigned long long)gq_energy_mj(g); break;
    case NVML_FI_DEV_POWER_INSTANT:
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = (unsigned)(GQ_NUM(g, power_watts) * 1000.0 + 0.5);
        return NVML_SUCCESS;
    case NVML_FI_DEV_ECC_CURRENT:
    case NVML_FI_DEV_ECC_PENDING:
        if (!GQ_HAS(g, has_ecc)) return NVML_ERROR_NOT_SUPPORTED;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = GQ_HAS(g, ecc_mode_enabled);
        return NVML_SUCCESS;
    case NVML_FI_DEV_ECC_SBE_VOL_TOTAL:
        r = gq_ecc_count(g, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, &ull);
        break;
    case NVML_FI_DEV_ECC_DBE_VOL_TOTAL:
        r = gq_ecc_count(g, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &ull);
        break;
    case NVML_FI_DEV_ECC_SBE_AGG_TOTAL:
        r = gq_ecc_count(g, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC, &ull);
        break;
    case NVML_FI_DEV_ECC_DBE_AGG_TOTAL:
        r = gq_ecc_count(g, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC, &ull);
        break;
    case NVML_FI_DEV_RETIRED_SBE:
    case NVML_FI_DEV_RETIRED_DBE:
    case NVML_FI_DEV_RETIRED_PENDING:
        if (!GQ_HAS(g, has_page_retirement)) return NVML_ERROR_NOT_SUPPORTED;
        ull = (unsigned long long)(v->fieldId == NVML_FI_DEV_RETIRED_SBE
                                       ? GQ_NUM(g, retired_pages_single_bit)
                                   : v->fieldId == NVML_FI_DEV_RETIRED_DBE
                                       ? GQ_NUM(g, retired_pages_double_bit)
                                       : GQ_NUM(g, retired_pages_pending));
        break;
    case NVML_FI_DEV_REMAPPED_COR:
    case NVML_FI_DEV_REMAPPED_UNC:
    case NVML_FI_DEV_REMAPPED_PENDING:
    case NVML_FI_DEV_REMAPPED_FAILURE:
        if (!GQ_HAS(g, has_remapping)) return NVML_ERROR_NOT_SUPPORTED;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = (unsigned)(v->fieldId == NVML_FI_DEV_REMAPPED_COR
                                        ? GQ_NUM(g, remapped_rows_correctable)
                                    : v->fieldId == NVML_FI_DEV_REMAPPED_UNC
                                        ? GQ_NUM(g, remapped_rows_uncorrectable)
                                    : v->fieldId == NVML_FI_DEV_REMAPPED_PENDING
                                        ? GQ_NUM(g, remap_pending)
                                        : GQ_NUM(g, remap_failure));
        return NVML_SUCCESS;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER: ull = (unsigned long long)GQ_NUM(g, pcie_replay_total); break;
    case NVML_FI_DEV_NVLINK_LINK_COUNT:
        if (GQ_NUM(g, nvlink_count) <= 0) return NVML_ERROR_NOT_SUPPORTED;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = (unsigned)GQ_NUM(g, nvlink_count);
        return NVML_SUCCESS;
    case NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL:
    case NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL:
    case NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL:
    case NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL:
        if (GQ_NUM(g, nvlink_count) <= 0) return NVML_ERROR_NOT_SUPPORTED;
        ull = gq_nvlink_total(g, v->fieldId == NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL     ? 0
                                 : v->fieldId == NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL ? 1
                                 : v->fieldId == NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL ? 2
                                                                                              : 3);
        break;
    case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: return gq_recovery_action_field(g, v);
    default: return gq_counter_field(g, v);
    }
    if (r == NVML_SUCCESS) v->value.ullVal = ull;
    return r;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                                nvmlFieldValue_t *values) {
    double extra_us = 0.0; /* each field has its own latency on a real GPU */
    for (int i = 0; values != NULL && i < valuesCount; i++)
        extra_us += gq_field_cost_us((int)values[i].fieldId);
    gq_gpu *g;
    nvmlReturn_t entered = gq_enter_costed(device, __func__, 0, 0, &g, extra_us);
    if (entered != NVML_SUCCESS) return entered;
    if (values == NULL || valuesCount < 0) return NVML_ERROR_INVALID_ARGUMENT;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    long long now_us = (long long)tv.tv_sec * 1000000LL + tv.tv_usec;
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        memset(&v->value, 0, sizeof(v->value));
        v->timestamp = now_us;
        v->latencyUsec = (long long)gq_field_cost_us((int)v->fieldId);
        v->nvmlReturn = gq_field(g, v);
    }
    return NVML_SUCCESS;
}
