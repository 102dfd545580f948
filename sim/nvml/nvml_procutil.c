/* Per-process utilisation: nvmlDeviceGetProcessUtilization and
 * nvmlDeviceGetProcessesUtilizationInfo. The driver keeps one sample per second per process
 * with non-zero utilisation; the stand-in stamps the values set from the control side with
 * the latest whole second, so a caller asking for samples newer than that gets NOT_FOUND,
 * as on a GPU. Not supported on MIG-enabled GPUs (as NVML documents). */
#include <string.h>

#include "gqsim_internal.h"

/* The processes with some utilisation, stamped `*stamp_us`; returns how many. */
static unsigned gq_util_snapshot(const gq_prof *p, gq_proc_util *out, unsigned long long *stamp_us) {
    *stamp_us = (unsigned long long)(gq_now_ns() / 1000000000LL) * 1000000ULL;
    for (;;) {
        uint32_t before = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE);
        if (before & 1u) continue;
        unsigned n = 0;
        uint32_t count = p->proc_util_count;
        for (uint32_t i = 0; i < count && i < GQ_MAX_PROC_UTIL; i++) {
            gq_proc_util u = p->proc_util[i];
            if (u.sm_percent || u.memory_percent || u.encoder_percent || u.decoder_percent)
                out[n++] = u;
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&p->seq, __ATOMIC_RELAXED) == before) return n;
    }
}

/* Shared checks and the sample list newer than `last_seen`; NOT_FOUND when there is none. */
static nvmlReturn_t gq_util_samples(nvmlDevice_t device, const gq_gpu *g,
                                    unsigned long long last_seen, gq_proc_util *out,
                                    unsigned *n, unsigned long long *stamp) {
    if (GQ_HAS(g, mig_mode_enabled)) return NVML_ERROR_NOT_SUPPORTED;
    *n = gq_util_snapshot(&gq_nvml_state->prof[device->gpu], out, stamp);
    if (*n == 0 || *stamp <= last_seen) return NVML_ERROR_NOT_FOUND;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                       nvmlProcessUtilizationSample_t *utilization,
                                                       unsigned int *processSamplesCount,
                                                       unsigned long long lastSeenTimeStamp) {
    GQ_ENTER(device, 0, 0);
    if (processSamplesCount == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    gq_proc_util found[GQ_MAX_PROC_UTIL];
    unsigned n;
    unsigned long long stamp;
    nvmlReturn_t r = gq_util_samples(device, g, lastSeenTimeStamp, found, &n, &stamp);
    if (r != NVML_SUCCESS) {
        *processSamplesCount = 0;
        return r;
    }
    if (utilization == NULL || *processSamplesCount < n) {
        *processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        nvmlProcessUtilizationSample_t *o = &utilization[i];
        memset(o, 0, sizeof(*o));
        o->pid = found[i].pid;
        o->timeStamp = stamp;
        o->smUtil = found[i].sm_percent;
        o->memUtil = found[i].memory_percent;
        o->encUtil = found[i].encoder_percent;
        o->decUtil = found[i].decoder_percent;
    }
    *processSamplesCount = n;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device,
                                                             nvmlProcessesUtilizationInfo_t *info) {
    GQ_ENTER(device, 0, 0);
    if (info == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlProcessesUtilizationInfo_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    gq_proc_util found[GQ_MAX_PROC_UTIL];
    unsigned n;
    unsigned long long stamp;
    nvmlReturn_t r = gq_util_samples(device, g, info->lastSeenTimeStamp, found, &n, &stamp);
    if (r != NVML_SUCCESS) {
        info->processSamplesCount = 0;
        return r;
    }
    if (info->procUtilArray == NULL || info->processSamplesCount < n) {
        info->processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        nvmlProcessUtilizationInfo_v1_t *o = &info->procUtilArray[i];
        memset(o, 0, sizeof(*o));
        o->timeStamp = stamp;
        o->pid = found[i].pid;
        o->smUtil = found[i].sm_percent;
        o->memUtil = found[i].memory_percent;
        o->encUtil = found[i].encoder_percent;
        o->decUtil = found[i].decoder_percent;
    }
    info->processSamplesCount = n;
    return NVML_SUCCESS;
}
