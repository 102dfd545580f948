/* The cost hook: every simulated NVML call waits the wall time the real call takes (the
 * table in sim/nvml/costs.py, written into gq_state.costs). QUEUE calls wait in line on one
 * lock per GPU (or one per library, GQ_SCOPE_LIBRARY); OVERLAP calls wait side by side.
 * Short calls (up to GQ_SPIN_US, the ioctl-like ones) spin, keeping the CPU busy as the
 * driver call would; longer ones (sampling windows, firmware queries) sleep. Locks are per
 * process, as NVML's own are. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <string.h>
#include <time.h>

#include "gqsim_internal.h"

static pthread_mutex_t gq_gpu_queue[GQ_MAX_GPUS + 1]; /* the last: system calls */
static pthread_mutex_t gq_library_queue = PTHREAD_MUTEX_INITIALIZER;
static int gq_env_instant = -1;
#define GQ_SPIN_US 100.0
_Static_assert(sizeof(((gq_costs *)0)->charged_ns) == (GQ_MAX_GPUS + 1) * sizeof(uint64_t),
               "charged_ns: one slot per GPU and one for calls on no GPU");

__attribute__((constructor)) static void gq_init_queues(void) {
    for (int i = 0; i <= GQ_MAX_GPUS; i++) pthread_mutex_init(&gq_gpu_queue[i], NULL);
    const char *env = getenv("GPUQUOTA_SIM_NVML_COSTS");
    gq_env_instant = env != NULL && strcmp(env, "instant") == 0;
}

static int64_t gq_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Waits `us` microseconds of wall time: spins through a short wait, sleeps a long one. */
static void gq_wait_us(double us) {
    if (us <= 0) return;
    int64_t deadline = gq_mono_ns() + (int64_t)(us * 1000.0);
    if (us > GQ_SPIN_US) {
        /* Linux wakes a sleeper up to 50 us late by default (timer slack): the calling
         * thread's slack is cut to 1 us so a sleep costs what the table says, not more. */
        static __thread int slack_set = 0;
        if (!slack_set) {
            prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
            slack_set = 1;
        }
        struct timespec ts = {(time_t)(deadline / 1000000000LL), (long)(deadline % 1000000000LL)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
        }
        return;
    }
    while (gq_mono_ns() < deadline) {
    }
}

/* Does table name `entry` cover `function` ("nvmlDeviceGetPciInfo" covers _v3 too)? */
static int gq_name_matches(const char *entry, const char *function) {
    size_t n = strnlen(entry, sizeof(((gq_cost_entry *)0)->function));
    if (strncmp(entry, function, n) != 0) return 0;
    const char *rest = function + n;
    return rest[0] == '\0' || (rest[0] == '_' && rest[1] == 'v' && rest[2] >= '0' && rest[2] <= '9');
}

static int gq_costs_on(const gq_costs *c) {
    uint32_t mode = __atomic_load_n(&c->mode, __ATOMIC_ACQUIRE);
    if (mode == GQ_COSTS_DEFAULT) return !gq_env_instant;
    return mode == GQ_COSTS_MODELLED;
}

/* The cost of `function` on `gpu`: a per-GPU entry wins over an every-GPU one. */
static const gq_cost_entry *gq_cost_of(const gq_costs *c, const char *function, int gpu) {
    const gq_cost_entry *any = NULL;
    uint32_t count = __atomic_load_n(&c->count, __ATOMIC_ACQUIRE);
    if (count > GQ_MAX_COSTS) count = GQ_MAX_COSTS;
    for (uint32_t i = 0; i < count; i++) {
        const gq_cost_entry *e = &c->entries[i];
        if (e->gpu != gpu && e->gpu != -1) continue;
        if (!gq_name_matches(e->function, function)) continue;
        if (e->gpu == gpu) return e;
        if (any == NULL) any = e;
    }
    return any;
}

double gq_field_cost_us(int field_id) {
    gq_state *st = gq_nvml_state;
    if (st == NULL || !gq_costs_on(&st->costs)) return 0.0;
    if (field_id >= 0 && field_id < GQ_MAX_FIELD_ID && st->costs.field_us[field_id] >= 0)
        return st->costs.field_us[field_id];
    return st->costs.default_us;
}

void gq_nvml_cost(const char *function, int gpu, double extra_us) {
    gq_state *st = gq_nvml_state;
    if (st == NULL || !gq_costs_on(&st->costs)) return;
    const gq_costs *c = &st->costs;
    const gq_cost_entry *e = gq_cost_of(c, function, gpu);
    if (e != NULL) __atomic_fetch_add(&((gq_cost_entry *)e)->calls, 1, __ATOMIC_RELAXED);
    double us = (e ? e->cost_us : c->default_us) + extra_us;
    if (us <= 0) return;
    int slot = (gpu >= 0 && gpu < GQ_MAX_GPUS) ? gpu : GQ_MAX_GPUS;
    __atomic_fetch_add(&((gq_costs *)c)->charged_ns[slot], (uint64_t)(us * 1000.0 + 0.5),
                       __ATOMIC_RELAXED);
    if (e != NULL && e->kind == GQ_COST_OVERLAP) {
        gq_wait_us(us);
        return;
    }
    pthread_mutex_t *queue = &gq_library_queue;
    if (__atomic_load_n(&c->scope, __ATOMIC_ACQUIRE) == GQ_SCOPE_GPU)
        queue = &gq_gpu_queue[(gpu >= 0 && gpu < GQ_MAX_GPUS) ? gpu : GQ_MAX_GPUS];
    pthread_mutex_lock(queue);
    gq_wait_us(us);
    pthread_mutex_unlock(queue);
}

/* --- control side (sim/nvml/costs.py) ---------------------------------------------------- */

GQ_EXPORT int gqsim_costs_reset(void *vst, unsigned mode, unsigned scope, double default_us) {
    gq_state *st = vst;
    if (st == NULL) return -1;
    gq_lock(st);
    gq_costs *c = &st->costs;
    __atomic_store_n(&c->count, 0, __ATOMIC_RELEASE);
    memset(c->entries, 0, sizeof(c->entries));
    for (int i = 0; i < GQ_MAX_FIELD_ID; i++) c->field_us[i] = -1.0;
    c->default_us = default_us;
    c->scope = scope;
    c->generation++;
    __atomic_store_n(&c->mode, mode, __ATOMIC_RELEASE);
    gq_unlock(st);
    return 0;
}

/* Switches the mode and/or the queueing; GQ_NONE (0xFFFFFFFF) keeps the current one. */
GQ_EXPORT int gqsim_costs_mode(void *vst, unsigned mode, unsigned scope) {
    gq_state *st = vst;
    if (st == NULL) return -1;
    if (scope != GQ_NONE) __atomic_store_n(&st->costs.scope, scope, __ATOMIC_RELEASE);
    if (mode != GQ_NONE) __atomic_store_n(&st->costs.mode, mode, __ATOMIC_RELEASE);
    return 0;
}

/* Sets (or replaces) the cost of `function` on `gpu` (-1: every GPU). -1 when full. */
GQ_EXPORT int gqsim_set_cost(void *vst, int gpu, const char *function, double cost_us,
                             unsigned kind) {
    gq_state *st = vst;
    if (st == NULL || strlen(function) >= sizeof(((gq_cost_entry *)0)->function)) return -1;
    gq_lock(st);
    gq_costs *c = &st->costs;
    gq_cost_entry *slot = NULL;
    for (uint32_t i = 0; i < c->count && slot == NULL; i++)
        if (c->entries[i].gpu == gpu && strcmp(c->entries[i].function, function) == 0)
            slot = &c->entries[i];
    int rc = 0;
    if (slot == NULL && c->count < GQ_MAX_COSTS) {
        slot = &c->entries[c->count];
        memset(slot, 0, sizeof(*slot));
        memcpy(slot->function, function, strlen(function));
        slot->gpu = gpu;
        slot->cost_us = cost_us;
        slot->kind = kind;
        __atomic_store_n(&c->count, c->count + 1, __ATOMIC_RELEASE);
    } else if (slot != NULL) {
        slot->cost_us = cost_us;
        slot->kind = kind;
    } else {
        rc = -1;
    }
    c->generation++;
    gq_unlock(st);
    return rc;
}

/* Calls of `function` costed so far (with modelled costs on), all GPUs and processes. */
GQ_EXPORT unsigned long long gqsim_call_count(void *vst, const char *function) {
    gq_state *st = vst;
    if (st == NULL) return 0;
    unsigned long long total = 0;
    for (uint32_t i = 0; i < st->costs.count && i < GQ_MAX_COSTS; i++)
        if (strcmp(st->costs.entries[i].function, function) == 0)
            total += __atomic_load_n(&st->costs.entries[i].calls, __ATOMIC_RELAXED);
    return total;
}

/* Modelled ns charged to GPU `gpu` so far (-1: every GPU and the system calls together),
 * every process on this node: the cost table's sum, not the wall time it took. */
GQ_EXPORT unsigned long long gqsim_charged_ns(void *vst, int gpu) {
    gq_state *st = vst;
    if (st == NULL || gpu < -1 || gpu > GQ_MAX_GPUS) return 0;
    unsigned long long total = 0;
    for (int i = 0; i <= GQ_MAX_GPUS; i++)
        if (gpu == -1 || gpu == i)
            total += __atomic_load_n(&st->costs.charged_ns[i], __ATOMIC_RELAXED);
    return total;
}

GQ_EXPORT int gqsim_set_field_cost(void *vst, int field_id, double cost_us) {
    gq_state *st = vst;
    if (st == NULL || field_id < 0 || field_id >= GQ_MAX_FIELD_ID) return -1;
    st->costs.field_us[field_id] = cost_us;
    return 0;
}
