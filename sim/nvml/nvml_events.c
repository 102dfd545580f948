/* Event sets: XID critical errors injected by the control API in any process.
 *
 * Events live in a ring in the shared state, each stamped with a sequence number written
 * last (see gqsim_inject_xid); an event set remembers the last number it consumed. A waiter
 * sleeps on a futex on the shared mapping, which the injector wakes, so delivery takes
 * microseconds and an idle waiter costs nothing. */
#include <errno.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "gqsim_internal.h"

static unsigned long long gq_supported_events(const gq_gpu *g) {
    unsigned long long types = nvmlEventTypeXidCriticalError | nvmlEventTypePState;
    if (GQ_HAS(g, has_ecc)) types |= nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError;
    return types;
}

GQ_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t r = gq_enter_system(__func__);
    if (r != NVML_SUCCESS) return r;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlEventSet_st *s = calloc(1, sizeof(*s));
    if (s == NULL) return NVML_ERROR_MEMORY;
    s->last_seq = __atomic_load_n(&gq_nvml_state->xid_head, __ATOMIC_ACQUIRE);
    *set = s;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    nvmlReturn_t r = gq_enter_system(__func__);
    if (r != NVML_SUCCESS) return r;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                        unsigned long long *eventTypes) {
    GQ_ENTER(device, 0, 0);
    if (eventTypes == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *eventTypes = gq_supported_events(g);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                                nvmlEventSet_t set) {
    GQ_ENTER(device, 0, 0);
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (eventTypes & ~gq_supported_events(g)) return NVML_ERROR_NOT_SUPPORTED;
    set->types[device->gpu] |= eventTypes;
    return NVML_SUCCESS;
}

/* The next event for `set`, or 0. Events overwritten before being read are skipped. */
static int gq_next_event(nvmlEventSet_t set, gq_xid *out) {
    gq_state *st = gq_nvml_state;
    uint64_t head = __atomic_load_n(&st->xid_head, __ATOMIC_ACQUIRE);
    if (head > set->last_seq + GQ_XID_RING) set->last_seq = head - GQ_XID_RING;
    while (set->last_seq < head) {
        uint64_t seq = ++set->last_seq;
        gq_xid *e = &st->xids[seq % GQ_XID_RING];
        if (__atomic_load_n(&e->seq, __ATOMIC_ACQUIRE) != seq) continue;
        gq_xid copy;
        copy.gpu = __atomic_load_n(&e->gpu, __ATOMIC_RELAXED);
        copy.xid = __atomic_load_n(&e->xid, __ATOMIC_RELAXED);
        copy.gpu_instance_id = __atomic_load_n(&e->gpu_instance_id, __ATOMIC_RELAXED);
        copy.compute_instance_id = __atomic_load_n(&e->compute_instance_id, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&e->seq, __ATOMIC_RELAXED) != seq) continue; /* overwritten */
        if (copy.gpu < 0 || copy.gpu >= GQ_MAX_GPUS) continue;
        if (!(set->types[copy.gpu] & nvmlEventTypeXidCriticalError)) continue;
        *out = copy;
        return 1;
    }
    return 0;
}

static int64_t gq_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static nvmlReturn_t gq_wait(nvmlEventSet_t set, gq_xid *event, unsigned int timeoutms,
                            const char *fn) {
    nvmlReturn_t r = gq_enter_system(fn);
    if (r != NVML_SUCCESS) return r;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    gq_state *st = gq_nvml_state;
    int64_t deadline = gq_mono_ns() + (int64_t)timeoutms * 1000000LL;
    for (;;) {
        uint32_t seen = __atomic_load_n(&st->xid_futex, __ATOMIC_ACQUIRE);
        if (gq_next_event(set, event)) return NVML_SUCCESS;
        int64_t left = deadline - gq_mono_ns();
        if (left <= 0) return NVML_ERROR_TIMEOUT;
        struct timespec ts = {(time_t)(left / 1000000000LL), (long)(left % 1000000000LL)};
        /* Not FUTEX_PRIVATE: the word is in a shared file mapping, woken from other
         * processes. A wake between the check above and this call changes the word, so
         * the wait returns at once (EAGAIN) instead of missing it. */
        syscall(SYS_futex, &st->xid_futex, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
}

GQ_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                           unsigned int timeoutms) {
    if (data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    gq_xid e;
    nvmlReturn_t r = gq_wait(set, &e, timeoutms, __func__);
    if (r != NVML_SUCCESS) return r;
    memset(data, 0, sizeof(*data));
    /* As NVML does, the event names the physical GPU; MIG events carry the instance ids. */
    data->device = &gq_dev_handles[e.gpu];
    data->eventType = nvmlEventTypeXidCriticalError;
    data->eventData = e.xid;
    data->gpuInstanceId = e.gpu_instance_id;
    data->computeInstanceId = e.compute_instance_id;
    return NVML_SUCCESS;
}

/* The original struct had no MIG instance ids. */
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
} gq_event_data_v1;

GQ_EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, gq_event_data_v1 *data,
                                        unsigned int timeoutms) {
    if (data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    gq_xid e;
    nvmlReturn_t r = gq_wait(set, &e, timeoutms, __func__);
    if (r != NVML_SUCCESS) return r;
    data->device = &gq_dev_handles[e.gpu];
    data->eventType = nvmlEventTypeXidCriticalError;
    data->eventData = e.xid;
    return NVML_SUCCESS;
}
