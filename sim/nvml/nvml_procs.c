/* Running processes, per GPU or per MIG instance. */
#include <string.h>

#include "gqsim_internal.h"

/* Copies the matching processes under the writer's sequence counter, so a reader never mixes
 * two versions of the list. Returns how many matched (maybe more than `cap`). */
static unsigned gq_snapshot(const gq_gpu *g, unsigned kind, int mig_gi, gq_process *out,
                            unsigned cap) {
    for (;;) {
        uint32_t before = __atomic_load_n(&g->proc_seq, __ATOMIC_ACQUIRE);
        if (before & 1u) continue;
        unsigned n = 0;
        uint32_t count = g->proc_count;
        for (uint32_t i = 0; i < count && i < GQ_MAX_PROCS; i++) {
            gq_process p = g->procs[i];
            if (p.kind != kind) continue;
            if (mig_gi >= 0 && p.gpu_instance_id != (uint32_t)mig_gi) continue;
            if (n < cap) out[n] = p;
            n++;
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&g->proc_seq, __ATOMIC_RELAXED) == before) return n;
    }
}

/* NVML's two-call protocol: with too small a buffer (or none), report the count needed and
 * INSUFFICIENT_SIZE; with none needed, SUCCESS and 0. `v1` selects the old 16-byte struct. */
static nvmlReturn_t gq_processes(nvmlDevice_t device, const gq_gpu *g, unsigned kind,
                                 unsigned int *infoCount, void *infos, int v1) {
    if (infoCount == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    gq_process procs[GQ_MAX_PROCS];
    int gi = GQ_IS_MIG(device) ? (int)g->mig[device->mig].gpu_instance_id : -1;
    unsigned n = gq_snapshot(g, kind, gi, procs, GQ_MAX_PROCS);
    if (n == 0) {
        *infoCount = 0;
        return NVML_SUCCESS;
    }
    if (infos == NULL || *infoCount < n) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        if (v1) {
            nvmlProcessInfo_v1_t *o = &((nvmlProcessInfo_v1_t *)infos)[i];
            o->pid = procs[i].pid;
            o->usedGpuMemory = procs[i].used_memory_bytes;
        } else {
            nvmlProcessInfo_t *o = &((nvmlProcessInfo_t *)infos)[i];
            o->pid = procs[i].pid;
            o->usedGpuMemory = procs[i].used_memory_bytes;
            o->gpuInstanceId = procs[i].gpu_instance_id;
            o->computeInstanceId = procs[i].compute_instance_id;
        }
    }
    *infoCount = n;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                               unsigned int *infoCount,
                                                               nvmlProcessInfo_t *infos) {
    GQ_ENTER(device, 0, 1);
    return gq_processes(device, g, 0, infoCount, infos, 0);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                               unsigned int *infoCount,
                                                               nvmlProcessInfo_t *infos) {
    GQ_ENTER(device, 0, 1);
    return gq_processes(device, g, 0, infoCount, infos, 0);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_v1_t *infos) {
    GQ_ENTER(device, 0, 1);
    return gq_processes(device, g, 0, infoCount, infos, 1);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                                unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos) {
    GQ_ENTER(device, 0, 1);
    return gq_processes(device, g, 1, infoCount, infos, 0);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                                unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos) {
    GQ_ENTER(device, 0, 1);
    return gq_processes(device, g, 1, infoCount, infos, 0);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device,
                                                             unsigned int *infoCount,
                                                             nvmlProcessInfo_v1_t *infos) {
    GQ_ENTER(device, 0, 1);
    return gq_processes(device, g, 1, infoCount, infos, 1);
}

/* No MPS server runs on a simulated node. */
GQ_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                  unsigned int *infoCount,
                                                                  nvmlProcessInfo_t *infos) {
    GQ_ENTER(device, 0, 1);
    (void)g;
    (void)infos;
    if (infoCount == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *infoCount = 0;
    return NVML_SUCCESS;
}
