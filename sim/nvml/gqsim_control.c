/* The control API: what gpuquota.sim.nvml.control (Python, through ctypes) calls to create a state
 * file and change it while other processes read it through NVML. Field ids come from the
 * tables in gqsim_state.h by name, so Python never repeats the struct layout. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gqsim_internal.h"

#define GQ_NAME_ENTRY(n) #n,
static const char *const gq_num_names[] = {GQ_NUM_FIELDS(GQ_NAME_ENTRY)};
static const char *const gq_str_names[] = {GQ_STR_FIELDS(GQ_NAME_ENTRY)};
#undef GQ_NAME_ENTRY

static gq_gpu *gq_gpu_at(gq_state *st, int gpu) {
    if (st == NULL || gpu < 0 || gpu >= GQ_MAX_GPUS) return NULL;
    return &st->gpus[gpu];
}

/* Creates (or truncates) a state file; returns the mapping, or NULL with errno set. */
GQ_EXPORT void *gqsim_create(const char *path) {
    int err;
    gq_state *st = gq_map(path, 1, &err);
    if (st == NULL) errno = err;
    return st;
}

/* Maps an existing state file; NULL with errno set (EPROTO: not a state file). */
GQ_EXPORT void *gqsim_attach(const char *path) {
    int err;
    gq_state *st = gq_map(path, 0, &err);
    if (st == NULL) errno = err;
    return st;
}

GQ_EXPORT void gqsim_detach(void *st) {
    if (st != NULL) munmap(st, sizeof(gq_state));
}

GQ_EXPORT int gqsim_max_gpus(void) { return GQ_MAX_GPUS; }
GQ_EXPORT int gqsim_max_mig(void) { return GQ_MAX_MIG; }
GQ_EXPORT int gqsim_max_processes(void) { return GQ_MAX_PROCS; }
GQ_EXPORT int gqsim_max_links(void) { return GQ_MAX_LINKS; }

GQ_EXPORT int gqsim_num_field(const char *name) {
    for (int i = 0; i < GQ_NUM_COUNT; i++)
        if (strcmp(gq_num_names[i], name) == 0) return i;
    return -1;
}

GQ_EXPORT int gqsim_str_field(const char *name) {
    for (int i = 0; i < GQ_STR_COUNT; i++)
        if (strcmp(gq_str_names[i], name) == 0) return i;
    return -1;
}

/* Name of numeric field `id`, or NULL past the end (lets Python list them). */
GQ_EXPORT const char *gqsim_num_field_name(int id) {
    return (id >= 0 && id < GQ_NUM_COUNT) ? gq_num_names[id] : NULL;
}

GQ_EXPORT int gqsim_set_system(void *vst, const char *driver, const char *nvml, int cuda) {
    gq_state *st = vst;
    if (st == NULL) return -1;
    gq_lock(st);
    strncpy(st->driver_version, driver, GQ_STR_LEN - 1);
    strncpy(st->nvml_version, nvml, GQ_STR_LEN - 1);
    st->cuda_driver_version = cuda;
    gq_unlock(st);
    return 0;
}

GQ_EXPORT int gqsim_set_gpu_count(void *vst, int count) {
    gq_state *st = vst;
    if (st == NULL || count < 0 || count > GQ_MAX_GPUS) return -1;
    __atomic_store_n(&st->gpu_count, (uint32_t)count, __ATOMIC_RELEASE);
    return 0;
}

GQ_EXPORT int gqsim_gpu_count(void *vst) {
    gq_state *st = vst;
    return st == NULL ? -1 : (int)__atomic_load_n(&st->gpu_count, __ATOMIC_ACQUIRE);
}

/* Sets one numeric field. Changing the power first folds the energy used so far at the old
 * power into the base, so the energy counter stays continuous and monotonic. */
GQ_EXPORT int gqsim_set_num(void *vst, int gpu, int field, double value) {
    gq_state *st = vst;
    gq_gpu *g = gq_gpu_at(st, gpu);
    if (g == NULL || field < 0 || field >= GQ_NUM_COUNT) return -1;
    gq_lock(st);
    if (field == GQ_F_power_watts) {
        int64_t now = gq_now_ns();
        double mj = gq_energy_mj(g);
        g->num[GQ_F_energy_base_mj] = mj;
        g->num[GQ_F_energy_base_ns] = (double)now;
    }
    if (field == GQ_F_pcie_tx_bytes_per_second || field == GQ_F_pcie_rx_bytes_per_second ||
        field == GQ_F_clock_event_reasons)
        gq_counters_fold(st, gpu); /* counters stay continuous across a rate change */
    g->num[field] = value;
    gq_unlock(st);
    return 0;
}

GQ_EXPORT double gqsim_get_num(void *vst, int gpu, int field) {
    gq_gpu *g = gq_gpu_at(vst, gpu);
    if (g == NULL || field < 0 || field >= GQ_NUM_COUNT) return 0.0;
    return g->num[field];
}

/* Restarts the energy counter at `joules` from now. */
GQ_EXPORT int gqsim_set_energy(void *vst, int gpu, double joules) {
    gq_state *st = vst;
    gq_gpu *g = gq_gpu_at(st, gpu);
    if (g == NULL) return -1;
    gq_lock(st);
    g->num[GQ_F_energy_base_mj] = joules * 1000.0;
    g->num[GQ_F_energy_base_ns] = (double)gq_now_ns();
    gq_unlock(st);
    return 0;
}

GQ_EXPORT double gqsim_energy_mj(void *vst, int gpu) {
    gq_gpu *g = gq_gpu_at(vst, gpu);
    return g == NULL ? -1.0 : gq_energy_mj(g);
}

GQ_EXPORT int gqsim_set_str(void *vst, int gpu, int field, const char *value) {
    gq_state *st = vst;
    gq_gpu *g = gq_gpu_at(st, gpu);
    if (g == NULL || field < 0 || field >= GQ_STR_COUNT || strlen(value) >= GQ_STR_LEN)
        return -1;
    gq_lock(st);
    memset(g->str[field], 0, GQ_STR_LEN);
    memcpy(g->str[field], value, strlen(value));
    gq_unlock(st);
    return 0;
}

GQ_EXPORT const char *gqsim_get_str(void *vst, int gpu, int field) {
    gq_gpu *g = gq_gpu_at(vst, gpu);
    if (g == NULL || field < 0 || field >= GQ_STR_COUNT) return NULL;
    return g->str[field];
}

GQ_EXPORT int gqsim_add_profile(void *vst, int gpu, const char *name, unsigned index,
                                unsigned id, unsigned slices, unsigned instances, unsigned sms,
                                unsigned copy_engines, unsigned decoders, unsigned encoders,
                                unsigned long long memory_mb) {
    gq_state *st = vst;
    gq_gpu *g = gq_gpu_at(st, gpu);
    if (g == NULL || g->profile_count >= GQ_MAX_PROFILES || strlen(name) >= 32) return -1;
    gq_lock(st);
    gq_profile *p = &g->profiles[g->profile_count];
    memset(p, 0, sizeof(*p));
    memcpy(p->name, name, strlen(name));
    p->profile_index = index;
    p->profile_id = id;
    p->slice_count = slices;
    p->instance_count = instances;
    p->multiprocessor_count = sms;
    p->copy_engine_count = copy_engines;
    p->decoder_count = decoders;
    p->encoder_count = encoders;
    p->memory_mb = memory_mb;
    g->profile_count++;
    gq_unlock(st);
    return 0;
}

/* Adds a MIG instance (GPU instance + one compute instance); returns its index or -1. */
GQ_EXPORT int gqsim_add_mig(void *vst, int gpu, const char *uuid, unsigned profile_index,
                            unsigned gi, unsigned ci, unsigned placement_start) {
    gq_state *st = vst;
    gq_gpu *g = gq_gpu_at(st, gpu);
    if (g == NULL || g->mig_count >= GQ_MAX_MIG || strlen(uuid) >= GQ_STR_LEN) return -1;
    gq_lock(st);
    int idx = (int)g->mig_count;
    gq_mig *m = &g->mig[idx];
    memset(m, 0, sizeof(*m));
    memcpy(m->uuid, uuid, strlen(uuid));
    m->profile_index = profile_index;
    m->gpu_instance_id = gi;
    m->compute_instance_id = ci;
    m->placement_start = placement_start;
    __atomic_store_n(&g->mig_count, (uint32_t)idx + 1, __ATOMIC_RELEASE);
    gq_unlock(st);
    return idx;
}

GQ_EXPORT int gqsim_set_mig_memory_used(void *vst, int gpu, int mig, double bytes) {
    gq_gpu *g = gq_gpu_at(vst, gpu);
    if (g == NULL || mig < 0 || (uint32_t)mig >= g->mig_count) return -1;
    g->mig[mig].memory_used_bytes = bytes;
    return 0;
}

GQ_EXPORT int gqsim_mig_count(void *vst, int gpu) {
    gq_gpu *g = gq_gpu_at(vst, gpu);
    return g == NULL ? -1 : (int)g->mig_count;
}

GQ_EXPORT const char *gqsim_mig_uuid(void *vst, int gpu, int mig) {
    gq_gpu *g = gq_gpu_at(vst, gpu);
    if (g == NULL || mig < 0 || (uint32_t)mig >= g->mig_count) return NULL;
    return g->mig[mig].uuid;
}

static void gq_proc_begin(gq_gpu *g) { __atomic_add_fetch(&g->proc_seq, 1, __ATOMIC_ACQ_REL); }
static void gq_proc_end(gq_gpu *g) { __atomic_add_fetch(&g->proc_seq, 1, __ATOMIC_RELEASE); }

/* Adds or replaces (same pid and kind) a process; -1 when the table is full. */
GQ_EXPORT int gqsim_add_process(void *vst, int gpu, unsigned pid, unsigned long long used,
                                unsigned kind, unsigned gi, unsigned ci) {
    gq_state *st = vst;
    gq_gpu *g = gq_gpu_at(st, gpu);
    if (g == NULL) return -1;
    gq_lock(st);
    uint32_t n = g->proc_count;
    uint32_t slot = n;
    for (uint32_t i = 0; i < n; i++)
        if (g->procs[i].pid == pid && g->procs[i].kind == kind) slot = i;
    if (slot >= GQ_MAX_PROCS) {
        gq_unlock(st);
        return -1;
    }
    gq_proc_begin(g);
    g->procs[slot] = (gq_process){pid, kind, used, gi, ci};
    if (slot == n) g->proc_count = n + 1;
    gq_proc_end(g);
    gq_unlock(st);
    return 0;
}

GQ_EXPORT int gqsim_clear_processes(void *vst, int gpu) {
    gq_state *st = vst;
    gq_gpu *g = gq_gpu_at(st, gpu);
    if (g == NULL) return -1;
    gq_lock(st);
    gq_proc_begin(g);
    g->proc_count = 0;
    gq_proc_end(g);
    gq_unlock(st);
    return 0;
}

GQ_EXPORT int gqsim_set_nvlink(void *vst, int gpu, int link, int active,
                               unsigned long long replay, unsigned long long recovery,
                               unsigned long long crc_flit, unsigned long long crc_data) {
    gq_state *st = vst;
    gq_gpu *g = gq_gpu_at(st, gpu);
    if (g == NULL || link < 0 || link >= GQ_MAX_LINKS) return -1;
    gq_lock(st);
    g->nvlink_active[link] = (uint32_t)active;
    g->nvlink_errors[link][0] = replay;
    g->nvlink_errors[link][1] = recovery;
    g->nvlink_errors[link][2] = crc_flit;
    g->nvlink_errors[link][3] = crc_data;
    gq_unlock(st);
    return 0;
}

/* Forces `function` to return `code` on `gpu` (-1: the system-level functions); code 0
 * clears it. -1 when the table is full or the name too long. */
GQ_EXPORT int gqsim_fail_call(void *vst, int gpu, const char *function, int code) {
    gq_state *st = vst;
    if (st == NULL || strlen(function) >= GQ_FN_LEN) return -1;
    gq_fail *fails;
    if (gpu == -1) {
        fails = st->system_fails;
    } else {
        gq_gpu *g = gq_gpu_at(st, gpu);
        if (g == NULL) return -1;
        fails = g->fails;
    }
    gq_lock(st);
    gq_fail *slot = NULL;
    for (int i = 0; i < GQ_MAX_FAILS; i++) {
        gq_fail *f = &fails[i];
        if (f->active && strcmp(f->function, function) == 0) slot = f;
    }
    if (slot == NULL && code != 0) {
        for (int i = 0; i < GQ_MAX_FAILS && slot == NULL; i++)
            if (!fails[i].active) slot = &fails[i];
    }
    int rc = 0;
    if (slot == NULL) {
        rc = code == 0 ? 0 : -1;
    } else if (code == 0) {
        __atomic_store_n(&slot->active, 0, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n(&slot->active, 0, __ATOMIC_RELEASE);
        memset(slot->function, 0, GQ_FN_LEN);
        memcpy(slot->function, function, strlen(function));
        slot->code = code;
        __atomic_store_n(&slot->active, 1, __ATOMIC_RELEASE);
    }
    gq_unlock(st);
    return rc;
}

/* Appends an XID event to the ring and wakes every waiter in every process. The entry's own
 * sequence number is written last, so a reader that sees it also sees the whole event.
 * Returns the event's sequence number. */
GQ_EXPORT long long gqsim_inject_xid(void *vst, int gpu, unsigned long long xid, unsigned gi,
                                     unsigned ci) {
    gq_state *st = vst;
    if (gq_gpu_at(st, gpu) == NULL) return -1;
    gq_lock(st);
    uint64_t seq = st->xid_head + 1;
    gq_xid *e = &st->xids[seq % GQ_XID_RING];
    __atomic_store_n(&e->seq, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&e->gpu, gpu, __ATOMIC_RELAXED);
    __atomic_store_n(&e->xid, xid, __ATOMIC_RELAXED);
    __atomic_store_n(&e->gpu_instance_id, gi, __ATOMIC_RELAXED);
    __atomic_store_n(&e->compute_instance_id, ci, __ATOMIC_RELAXED);
    __atomic_store_n(&e->seq, seq, __ATOMIC_RELEASE);
    __atomic_store_n(&st->xid_head, seq, __ATOMIC_RELEASE);
    __atomic_store_n(&st->xid_futex, (uint32_t)seq, __ATOMIC_RELEASE);
    gq_unlock(st);
    syscall(SYS_futex, &st->xid_futex, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    return (long long)seq;
}
