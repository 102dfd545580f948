/* Per-process utilisation: nvmlDeviceGetProcessUtilization and
 * nvmlDeviceGetProcessesUtilizationInfo. Not supported on MIG-enabled GPUs (as NVML documents).
 *
 * NVML documents one structure per process that had some utilisation, "based on all the
 * samples maintained by the driver's internal sample buffer" since lastSeenTimeStamp, stamped
 * with the CPU time in microseconds; on an H100, asked once a second, it gave one new sample
 * per second per process (../shared/nvml-h100.md). The stand-in stamps answers with the latest
 * whole second and, for a lastSeenTimeStamp > 0, reports each process's average over
 * (lastSeenTimeStamp, stamp] (at most GQ_PROC_UTIL_HISTORY_S seconds back; idle time counts as
 * zero), so a caller that asks late loses nothing; with 0 it reports the values set now. A
 * caller asking for samples newer than the stamp gets NOT_FOUND, as on a GPU. */
#include <string.h>

#include "gqsim_internal.h"

/* The whole-second stamp, and the processes' averages over (since_us, stamp] (the values
 * set now when since_us is 0) that are not all zero; returns how many. */
static unsigned gq_util_snapshot(const gq_prof *p, unsigned long long since_us,
                                 gq_proc_util *out, unsigned long long *stamp_us) {
    *stamp_us = (unsigned long long)(gq_now_ns() / 1000000000LL) * 1000000ULL;
    long long end = (long long)*stamp_us * 1000LL;
    long long start = end - GQ_PROC_UTIL_HISTORY_S * 1000000000LL;
    if (since_us > 0 && (long long)since_us * 1000LL > start) start = (long long)since_us * 1000LL;
    for (;;) {
        uint32_t before = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE);
        if (before & 1u) continue;
        unsigned n = 0;
        uint32_t count = p->proc_util_count;
        for (uint32_t i = 0; i < count && i < GQ_MAX_PROC_UTIL; i++) {
            gq_proc_util u = p->proc_util[i];
            unsigned any = 0;
            for (int k = 0; k < 4; k++) {
                if (since_us > 0 && end > start) {
                    /* the value before the change up to changed_ns, the value now after it */
                    long long cut = u.changed_ns < start ? start : u.changed_ns > end ? end : u.changed_ns;
                    double sum = (double)u.before[k] * (double)(cut - start) +
                                 (double)u.now[k] * (double)(end - cut);
                    u.now[k] = (uint32_t)(sum / (double)(end - start) + 0.5);
                }
                any |= u.now[k];
            }
            if (any) out[n++] = u;
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&p->seq, __ATOMIC_RELAXED) == before) return n;
    }
}

/* Shared checks and the answer for samples newer than `last_seen`; NOT_FOUND when there is
 * none. */
static nvmlReturn_t gq_util_samples(nvmlDevice_t device, const gq_gpu *g,
                                    unsigned long long last_seen, gq_proc_util *out,
                                    unsigned *n, unsigned long long *stamp) {
    if (GQ_HAS(g, mig_mode_enabled)) return NVML_ERROR_NOT_SUPPORTED;
    *n = gq_util_snapshot(&gq_nvml_state->prof[device->gpu], last_seen, out, stamp);
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
        o->smUtil = found[i].now[0];
        o->memUtil = found[i].now[1];
        o->encUtil = found[i].now[2];
        o->decUtil = found[i].now[3];
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
        o->smUtil = found[i].now[0];
        o->memUtil = found[i].now[1];
        o->encUtil = found[i].now[2];
        o->decUtil = found[i].now[3];
    }
    info->processSamplesCount = n;
    return NVML_SUCCESS;
}
