/*
 * What NVML calls cost, and the counters that run with wall time (PCIe bytes, time spent per
 * clock event reason), kept in their own struct at the end of the state so they stay apart
 * from the per-GPU value layout. Written by the control side (sim/nvml/costs.py through
 * gqsim_set_cost* in gqsim_costs.c), read by every NVML entry point through GQ_COST.
 */
#ifndef GQSIM_COSTS_H
#define GQSIM_COSTS_H

#include <stdint.h>

#define GQ_MAX_COSTS 128     /* per-call table entries (default + per-GPU overrides) */
#define GQ_MAX_FIELD_ID 320  /* > NVML_FI_MAX; field ids at or above it cost the default */
#define GQ_REASON_COUNTERS 9 /* clock-event-reason time counters (fields 74-79, 269-271) */

/* How a simulated call spends its cost. QUEUE: callers wait in line (one at a time per GPU,
 * or per library with GQ_SCOPE_LIBRARY), as nvmlDeviceGetTotalEnergyConsumption does on an
 * H100. OVERLAP: callers sleep side by side, as nvmlDeviceGetPcieThroughput's 20 ms sample. */
enum gq_cost_kind { GQ_COST_QUEUE = 0, GQ_COST_OVERLAP = 1 };
/* Whether calls on different GPUs queue on one lock (library) or one lock per GPU. */
enum gq_cost_scope { GQ_SCOPE_GPU = 0, GQ_SCOPE_LIBRARY = 1 };
/* Modelled unless the spec or $GPUQUOTA_SIM_NVML_COSTS=instant says otherwise. */
enum gq_cost_mode { GQ_COSTS_DEFAULT = 0, GQ_COSTS_INSTANT = 1, GQ_COSTS_MODELLED = 2 };

typedef struct {
    char function[80]; /* base name, e.g. "nvmlDeviceGetMemoryInfo" (also matches _v2) */
    int32_t gpu;       /* -1: every GPU (and the system calls) */
    uint32_t kind;     /* gq_cost_kind */
    double cost_us;
    uint64_t calls; /* calls this entry costed, every process together (benchmarks count) */
} gq_cost_entry;

typedef struct {
    double pcie_base_bytes[2];                 /* TX, RX at pcie_base_ns */
    double pcie_base_ns;                       /* 0: not started (rates were never set) */
    double reason_base_ns[GQ_REASON_COUNTERS]; /* ns throttled per reason at reason_base_ns */
    double reason_at_ns;
} gq_counters;

typedef struct {
    uint32_t mode;  /* gq_cost_mode */
    uint32_t scope; /* gq_cost_scope */
    uint32_t count; /* entries in use */
    uint32_t generation; /* bumped on every change (lets readers cache look-ups) */
    double default_us;   /* calls and fields the tables do not name */
    gq_cost_entry entries[GQ_MAX_COSTS];
    double field_us[GQ_MAX_FIELD_ID]; /* per field id, in nvmlDeviceGetFieldValues; <0 unset */
    gq_counters counters[16];         /* per GPU (GQ_MAX_GPUS) */
    /* Modelled ns charged so far per GPU (GQ_MAX_GPUS), the last slot for calls on no GPU:
     * the cost table's time of every costed call, whatever the wall clock did (benchmarks
     * report a round's NVML work with it, independent of how busy the machine is). */
    uint64_t charged_ns[17];
} gq_costs;

#endif
