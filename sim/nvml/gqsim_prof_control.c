/* Control side of the profiling state (gqsim_prof.h): GPM rates per GPU or MIG instance and
 * per-process utilisation, set by gpuquota.sim.nvml.control through ctypes. */
#include <string.h>

#include "gqsim_internal.h"

#define GQ_GPM_NAME_ENTRY(n, id) #n,
static const char *const gq_gpm_names[GQ_GPM_COUNT] = {GQ_GPM_METRICS(GQ_GPM_NAME_ENTRY)};
#undef GQ_GPM_NAME_ENTRY

static gq_prof *gq_prof_at(gq_state *st, int gpu) {
    if (st == NULL || gpu < 0 || gpu >= GQ_MAX_GPUS) return NULL;
    return &st->prof[gpu];
}

static void gq_prof_begin(gq_prof *p) { __atomic_add_fetch(&p->seq, 1, __ATOMIC_ACQ_REL); }
static void gq_prof_end(gq_prof *p) { __atomic_add_fetch(&p->seq, 1, __ATOMIC_RELEASE); }

GQ_EXPORT int gqsim_gpm_metric(const char *name) {
    for (int k = 0; k < GQ_GPM_COUNT; k++)
        if (strcmp(gq_gpm_names[k], name) == 0) return k;
    return -1;
}

/* Name of GPM metric `k`, or NULL past the end (lets Python list them). */
GQ_EXPORT const char *gqsim_gpm_metric_name(int k) {
    return (k >= 0 && k < GQ_GPM_COUNT) ? gq_gpm_names[k] : NULL;
}

/* Sets the rate of one GPM metric of `unit` (0: the GPU, 1 + m: MIG instance m). The total
 * so far is folded in at the old rate first, so samples on either side average correctly. */
GQ_EXPORT int gqsim_set_gpm(void *vst, int gpu, int unit, int metric, double value) {
    gq_state *st = vst;
    gq_prof *p = gq_prof_at(st, gpu);
    if (p == NULL || unit < 0 || unit >= GQ_GPM_UNITS || metric < 0 || metric >= GQ_GPM_COUNT)
        return -1;
    gq_lock(st);
    gq_prof_begin(p);
    gq_gpm_unit *u = &p->gpm[unit];
    int64_t now = gq_now_ns();
    if (u->base_ns > 0) {
        double elapsed = (double)(now - u->base_ns) / 1e9;
        if (elapsed < 0) elapsed = 0;
        for (int k = 0; k < GQ_GPM_COUNT; k++) u->total[k] += u->rate[k] * elapsed;
    }
    u->base_ns = now;
    u->rate[metric] = value;
    gq_prof_end(p);
    gq_unlock(st);
    return 0;
}

GQ_EXPORT double gqsim_get_gpm(void *vst, int gpu, int unit, int metric) {
    gq_prof *p = gq_prof_at(vst, gpu);
    if (p == NULL || unit < 0 || unit >= GQ_GPM_UNITS || metric < 0 || metric >= GQ_GPM_COUNT)
        return -1.0;
    return p->gpm[unit].rate[metric];
}

/* Adds or changes (same pid) one process's utilisation from now on, in percent; -1 when
 * full. */
GQ_EXPORT int gqsim_set_process_utilization(void *vst, int gpu, unsigned pid, unsigned sm,
                                            unsigned memory, unsigned encoder, unsigned decoder) {
    gq_state *st = vst;
    gq_prof *p = gq_prof_at(st, gpu);
    if (p == NULL || sm > 100 || memory > 100 || encoder > 100 || decoder > 100) return -1;
    gq_lock(st);
    uint32_t n = p->proc_util_count;
    uint32_t slot = n;
    for (uint32_t i = 0; i < n; i++)
        if (p->proc_util[i].pid == pid) slot = i;
    if (slot >= GQ_MAX_PROC_UTIL) {
        gq_unlock(st);
        return -1;
    }
    gq_prof_begin(p);
    gq_proc_util *u = &p->proc_util[slot];
    if (slot == n) memset(u, 0, sizeof(*u)); /* a new process was idle until now */
    else memcpy(u->before, u->now, sizeof(u->before));
    u->pid = pid;
    u->now[0] = sm;
    u->now[1] = memory;
    u->now[2] = encoder;
    u->now[3] = decoder;
    u->changed_ns = gq_now_ns();
    if (slot == n) p->proc_util_count = n + 1;
    gq_prof_end(p);
    gq_unlock(st);
    return 0;
}

GQ_EXPORT int gqsim_clear_process_utilization(void *vst, int gpu) {
    gq_state *st = vst;
    gq_prof *p = gq_prof_at(st, gpu);
    if (p == NULL) return -1;
    gq_lock(st);
    gq_prof_begin(p);
    p->proc_util_count = 0;
    gq_prof_end(p);
    gq_unlock(st);
    return 0;
}
