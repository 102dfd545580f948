/*
 * Profiling state of a simulated GPU, kept apart from gq_gpu: GPM (GPU performance
 * monitoring, Hopper and later) and per-process utilisation. Included by gqsim_state.h,
 * which appends one gq_prof per GPU to the shared state.
 *
 * GPM is modelled the way the hardware counts: each metric is a rate (set from the control
 * side) integrated over wall time, so a GPM sample holds running totals and nvmlGpmMetricsGet
 * returns the average rate between two samples, like the real counters do.
 */
#ifndef GQSIM_PROF_H
#define GQSIM_PROF_H

#include <stdint.h>

/* The GPM metrics the stand-in models: control-side name (snapshot units: ratios 0-1,
 * bytes per second) and NVML_GPM_METRIC_* id. NVML reports ratios in percent and bandwidth
 * in MiB/s; nvml_gpm.c converts. Every other metric id answers NOT_SUPPORTED in its slot. */
#define GQ_GPM_METRICS(X)                                                                    \
    X(graphics_activity, 1) X(sm_activity, 2) X(sm_occupancy, 3) X(integer_activity, 4)      \
    X(tensor_activity, 5) X(dfma_tensor_activity, 6) X(hmma_tensor_activity, 7)              \
    X(dmma_tensor_activity, 8) X(imma_tensor_activity, 9) X(dram_activity, 10)               \
    X(fp64_activity, 11) X(fp32_activity, 12) X(fp16_activity, 13)                           \
    X(pcie_tx_bytes_per_second, 20) X(pcie_rx_bytes_per_second, 21)                          \
    X(nvlink_rx_bytes_per_second, 60) X(nvlink_tx_bytes_per_second, 61)

#define GQ_GPM_ENUM_ENTRY(n, id) GQ_GPM_##n,
enum gq_gpm_metric { GQ_GPM_METRICS(GQ_GPM_ENUM_ENTRY) GQ_GPM_COUNT };
#undef GQ_GPM_ENUM_ENTRY

#define GQ_GPM_UNITS 8 /* unit 0: the whole GPU; unit 1 + m: MIG instance m (GQ_MAX_MIG) */
#define GQ_MAX_PROC_UTIL 64
/* Seconds of per-process samples the stand-in's driver keeps: an average asked for since an
 * older lastSeenTimeStamp covers only the last GQ_PROC_UTIL_HISTORY_S seconds. */
#define GQ_PROC_UTIL_HISTORY_S 30
#define GQ_GPM_MIN_INTERVAL_NS 100000000LL /* closer samples read all zeros, as on an H100 */

typedef struct {
    double rate[GQ_GPM_COUNT];  /* current value, snapshot units */
    double total[GQ_GPM_COUNT]; /* integral of rate up to base_ns (unit x seconds) */
    int64_t base_ns;            /* wall clock the totals were folded at */
} gq_gpm_unit;

/* One process's utilisation in percent (sm, memory, encoder, decoder), as set now and as it
 * was before the latest change (at changed_ns): enough to average any span of the last
 * GQ_PROC_UTIL_HISTORY_S seconds that holds at most one change, which is how the tests and the
 * demo drive it (a change, then seconds of steady work). Earlier changes are approximated by
 * the value before the latest one. */
typedef struct {
    uint32_t pid;
    uint32_t now[4];
    uint32_t before[4];
    uint32_t pad;
    int64_t changed_ns;
} gq_proc_util;

typedef struct {
    uint32_t seq; /* odd while a writer changes this struct (readers retry) */
    uint32_t proc_util_count;
    gq_gpm_unit gpm[GQ_GPM_UNITS];
    gq_proc_util proc_util[GQ_MAX_PROC_UTIL];
} gq_prof;

#endif
