/* Internals shared by the stand-in's C files: the handle types NVML leaves opaque, the
 * process-wide view of the state file, and the checks every device call starts with. */
#ifndef GQSIM_INTERNAL_H
#define GQSIM_INTERNAL_H

#define __NVML_API_VERSION_INTERNAL 1 /* lets us define the legacy unversioned symbols too */
#include <nvml.h>
#include <stddef.h>
#include "gqsim_state.h"

#define GQ_EXPORT __attribute__((visibility("default")))
#define GQ_NONE 0xFFFFFFFFu

struct nvmlDevice_st {
    int gpu;
    int mig; /* -1 for the physical GPU, else index into gq_gpu.mig */
};

struct nvmlGpuInstance_st {
    int gpu;
    int mig;
};

struct nvmlComputeInstance_st {
    int gpu;
    int mig;
};

struct nvmlEventSet_st {
    uint64_t last_seq;
    unsigned long long types[GQ_MAX_GPUS];
};

extern gq_state *gq_nvml_state; /* the mapping nvmlInit made; NULL before */
extern int gq_init_count;
extern struct nvmlDevice_st gq_dev_handles[GQ_MAX_GPUS];
extern struct nvmlDevice_st gq_mig_handles[GQ_MAX_GPUS][GQ_MAX_MIG];
extern struct nvmlGpuInstance_st gq_gi_handles[GQ_MAX_GPUS][GQ_MAX_MIG];
extern struct nvmlComputeInstance_st gq_ci_handles[GQ_MAX_GPUS][GQ_MAX_MIG];

/* Shared helpers (gqsim_state.c). */
gq_state *gq_map(const char *path, int create, int *err);
int64_t gq_now_ns(void);
double gq_energy_mj(const gq_gpu *g);
void gq_lock(gq_state *st);
void gq_unlock(gq_state *st);
int gq_fail_code(const gq_fail *fails, const char *function);

/* The checks a device call starts with: initialised, valid handle, lost, forced failure,
 * reset required. `identity` calls (name, UUID, PCI info...) still work when a reset is
 * required, as on a real GPU; `allow_mig` says whether a MIG device handle is accepted. */
nvmlReturn_t gq_enter(nvmlDevice_t dev, const char *function, int identity, int allow_mig,
                      gq_gpu **gpu);
nvmlReturn_t gq_enter_system(const char *function);
/* gq_enter_system's checks without its cost: for a call without a device handle that
 * nonetheless runs on one GPU (nvmlGpmMetricsGet), which then calls GQ_COST(__func__, gpu)
 * with that GPU once it knows which. */
nvmlReturn_t gq_check_system(const char *function);

/* THE COST HOOK. Every NVML entry point runs it once it knows the call will be answered:
 * it waits the wall time the cost table (sim/nvml/costs.py) gives `function` on `gpu` (-1:
 * system calls), plus `extra_us`, queueing or overlapping as the table says. gq_enter and
 * gq_enter_system run it, so every function using GQ_ENTER is costed; an entry point that
 * does not (e.g. one taking a GPM sample rather than a device) calls GQ_COST(__func__, gpu)
 * itself and gets a row in costs.py. */
void gq_nvml_cost(const char *function, int gpu, double extra_us);
#define GQ_COST(function, gpu) gq_nvml_cost((function), (gpu), 0.0)
/* nvmlDeviceGetFieldValues' own share per field id (its latencyUsec); 0 when instant. */
double gq_field_cost_us(int field_id);
/* gq_enter with `extra_us` added to the call's cost (field values). */
nvmlReturn_t gq_enter_costed(nvmlDevice_t dev, const char *function, int identity, int allow_mig,
                             gq_gpu **gpu, double extra_us);
/* Wall-time counters (nvml_counters.c): field values 83/191, 197/198, 74-79, 269-271
 * (NOT_SUPPORTED for any other id), and folding them before a rate changes. */
nvmlReturn_t gq_counter_field(const gq_gpu *g, nvmlFieldValue_t *v);
void gq_counters_fold(gq_state *st, int gpu);

#define GQ_ENTER(dev, identity, allow_mig)                                           \
    gq_gpu *g;                                                                       \
    do {                                                                             \
        nvmlReturn_t r_ = gq_enter((dev), __func__, (identity), (allow_mig), &g);    \
        if (r_ != NVML_SUCCESS) return r_;                                           \
    } while (0)

#define GQ_NUM(g, field) ((g)->num[GQ_F_##field])
#define GQ_HAS(g, field) (GQ_NUM(g, field) != 0.0)
#define GQ_IS_MIG(dev) ((dev)->mig >= 0)

/* The profile of MIG instance `mig` of `g` (NULL if the table lacks it). */
const gq_profile *gq_mig_profile(const gq_gpu *g, int mig);

/* Copies a string into a caller buffer the way NVML does: INSUFFICIENT_SIZE when it does
 * not fit with its terminator. */
/* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml_recovery.c) */
nvmlReturn_t gq_recovery_action_field(const gq_gpu *g, nvmlFieldValue_t *v);
nvmlReturn_t gq_copy_str(char *out, unsigned int length, const char *value);

#endif
