/* Field values that count with wall time: the PCIe byte counters (NVML_FI_DEV_PCIE_COUNT_TX/
 * RX_BYTES, 197/198), energy (83 and 191) and the nanoseconds spent throttled per clock event
 * reason (74-79, 269-271). Each runs from a base the control side folds whenever the rate
 * that drives it changes (pcie_*_bytes_per_second, clock_event_reasons), like energy does
 * with power_watts, so counters stay continuous and monotonic. */
#include <string.h>

#include "gqsim_internal.h"

/* Field id, clock event reason bits that make it count, control-side name. */
static const struct {
    unsigned field;
    unsigned long long bits;
    const char *name;
} gq_reason_counters[GQ_REASON_COUNTERS] = {
    {NVML_FI_DEV_PERF_POLICY_POWER, nvmlClocksEventReasonSwPowerCap, "sw_power_cap"},
    {NVML_FI_DEV_PERF_POLICY_THERMAL,
     nvmlClocksEventReasonSwThermalSlowdown | nvmlClocksThrottleReasonHwThermalSlowdown, "thermal"},
    {NVML_FI_DEV_PERF_POLICY_SYNC_BOOST, nvmlClocksEventReasonSyncBoost, "sync_boost"},
    {NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT, nvmlClocksEventReasonBoardLimit, "board_limit"},
    {NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION, nvmlClocksEventReasonGpuIdle, "low_utilization"},
    {NVML_FI_DEV_PERF_POLICY_RELIABILITY, nvmlClocksEventReasonReliability, "reliability"},
    {269, nvmlClocksEventReasonSwThermalSlowdown, "sw_thermal_slowdown"},
    {270, nvmlClocksThrottleReasonHwThermalSlowdown, "hw_thermal_slowdown"},
    {271, nvmlClocksThrottleReasonHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
};

static int gq_gpu_index(const gq_state *st, const gq_gpu *g) { return (int)(g - st->gpus); }

static double gq_elapsed_ns(double since_ns) {
    if (since_ns <= 0) return 0.0;
    double d = (double)gq_now_ns() - since_ns;
    return d < 0 ? 0.0 : d;
}

static double gq_pcie_bytes(const gq_gpu *g, const gq_counters *c, int rx) {
    double rate = rx ? g->num[GQ_F_pcie_rx_bytes_per_second] : g->num[GQ_F_pcie_tx_bytes_per_second];
    return c->pcie_base_bytes[rx] + rate * gq_elapsed_ns(c->pcie_base_ns) / 1e9;
}

static double gq_reason_ns(const gq_gpu *g, const gq_counters *c, int r) {
    unsigned long long mask = (unsigned long long)g->num[GQ_F_clock_event_reasons];
    double active = (mask & gq_reason_counters[r].bits) ? gq_elapsed_ns(c->reason_at_ns) : 0.0;
    return c->reason_base_ns[r] + active;
}

/* Folds what the counters of `gpu` gathered so far into their bases (writer lock held). */
void gq_counters_fold(gq_state *st, int gpu) {
    gq_gpu *g = &st->gpus[gpu];
    gq_counters *c = &st->costs.counters[gpu];
    double now = (double)gq_now_ns();
    for (int rx = 0; rx < 2; rx++) c->pcie_base_bytes[rx] = gq_pcie_bytes(g, c, rx);
    c->pcie_base_ns = now;
    for (int r = 0; r < GQ_REASON_COUNTERS; r++) c->reason_base_ns[r] = gq_reason_ns(g, c, r);
    c->reason_at_ns = now;
}

nvmlReturn_t gq_counter_field(const gq_gpu *g, nvmlFieldValue_t *v) {
    const gq_state *st = gq_nvml_state;
    const gq_counters *c = &st->costs.counters[gq_gpu_index(st, g)];
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    switch (v->fieldId) {
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
    case NVML_FI_DEV_ENERGY: v->value.ullVal = (unsigned long long)gq_energy_mj(g); return NVML_SUCCESS;
    case NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
    case NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
        v->value.ullVal =
            (unsigned long long)gq_pcie_bytes(g, c, v->fieldId == NVML_FI_DEV_PCIE_COUNT_RX_BYTES);
        return NVML_SUCCESS;
    default: break;
    }
    for (int r = 0; r < GQ_REASON_COUNTERS; r++)
        if (gq_reason_counters[r].field == v->fieldId) {
            v->value.ullVal = (unsigned long long)gq_reason_ns(g, c, r);
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_SUPPORTED;
}

/* --- control side ------------------------------------------------------------------------ */

/* The value of counter `name` (pcie_tx_bytes, pcie_rx_bytes or a reason name) on `gpu`. */
GQ_EXPORT double gqsim_counter(void *vst, int gpu, const char *name) {
    gq_state *st = vst;
    if (st == NULL || gpu < 0 || gpu >= GQ_MAX_GPUS) return -1.0;
    const gq_gpu *g = &st->gpus[gpu];
    const gq_counters *c = &st->costs.counters[gpu];
    if (strcmp(name, "pcie_tx_bytes") == 0) return gq_pcie_bytes(g, c, 0);
    if (strcmp(name, "pcie_rx_bytes") == 0) return gq_pcie_bytes(g, c, 1);
    for (int r = 0; r < GQ_REASON_COUNTERS; r++)
        if (strcmp(name, gq_reason_counters[r].name) == 0) return gq_reason_ns(g, c, r);
    return -1.0;
}

/* Restarts counter `name` at `value` from now; -1 for an unknown name. */
GQ_EXPORT int gqsim_set_counter(void *vst, int gpu, const char *name, double value) {
    gq_state *st = vst;
    if (st == NULL || gpu < 0 || gpu >= GQ_MAX_GPUS || value < 0) return -1;
    int rc = -1;
    gq_lock(st);
    gq_counters_fold(st, gpu);
    gq_counters *c = &st->costs.counters[gpu];
    if (strcmp(name, "pcie_tx_bytes") == 0) c->pcie_base_bytes[0] = value, rc = 0;
    else if (strcmp(name, "pcie_rx_bytes") == 0) c->pcie_base_bytes[1] = value, rc = 0;
    for (int r = 0; r < GQ_REASON_COUNTERS && rc != 0; r++)
        if (strcmp(name, gq_reason_counters[r].name) == 0) c->reason_base_ns[r] = value, rc = 0;
    gq_unlock(st);
    return rc;
}

/* The control-side names of the reason counters, in order; NULL past the last. */
GQ_EXPORT const char *gqsim_reason_counter_name(int i) {
    return (i >= 0 && i < GQ_REASON_COUNTERS) ? gq_reason_counters[i].name : NULL;
}

GQ_EXPORT int gqsim_reason_counter_field(int i) {
    return (i >= 0 && i < GQ_REASON_COUNTERS) ? (int)gq_reason_counters[i].field : -1;
}
