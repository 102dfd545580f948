/*
 * The shared state of a simulated GPU node: one fixed-layout struct, mmapped from a file by
 * every process that loads the stand-in library (the NVML side reads it, the control side
 * writes it). This header is its only definition; Python never re-declares it but goes
 * through the gqsim_* control functions exported by the same library.
 */
#ifndef GQSIM_STATE_H
#define GQSIM_STATE_H

#include <stdint.h>

#include "gqsim_prof.h"
#include "gqsim_costs.h"

#define GQ_MAGIC 0x4751534d4e564d4cULL /* "GQSMNVML" */
#define GQ_VERSION 4
#define GQ_MAX_GPUS 16
#define GQ_MAX_MIG 7
#define GQ_MAX_PROCS 64
#define GQ_MAX_LINKS 18
#define GQ_MAX_FAILS 32
#define GQ_XID_RING 256
#define GQ_STR_LEN 96
#define GQ_FN_LEN 80
#define GQ_MAX_PROFILES 8

/* Numeric per-GPU fields, all stored as doubles (integers up to 2^53 are exact).
 * The names double as the Python keyword names of SimNode.set(). */
#define GQ_NUM_FIELDS(X)                                                                    \
    X(gpu_utilization_ratio) X(memory_utilization_ratio) X(encoder_utilization_ratio)      \
    X(decoder_utilization_ratio) X(memory_total_bytes) X(memory_used_bytes)                 \
    X(memory_reserved_bytes) X(gpu_temperature_celsius) X(memory_temperature_celsius)       \
    X(power_watts) X(power_limit_watts) X(sm_clock_hertz) X(memory_clock_hertz)             \
    X(graphics_clock_hertz) X(video_clock_hertz) X(max_sm_clock_hertz)                      \
    X(max_memory_clock_hertz) X(pcie_tx_bytes_per_second) X(pcie_rx_bytes_per_second)       \
    X(pcie_replay_total) X(pcie_link_gen) X(pcie_link_width) X(fan_speed_ratio)             \
    X(performance_state) X(clock_event_reasons) X(ecc_mode_enabled)                         \
    X(ecc_corrected_volatile) X(ecc_uncorrected_volatile) X(ecc_corrected_aggregate)        \
    X(ecc_uncorrected_aggregate) X(remapped_rows_correctable) X(remapped_rows_uncorrectable) \
    X(remap_pending) X(remap_failure) X(retired_pages_single_bit)                           \
    X(retired_pages_double_bit) X(retired_pages_pending) X(minor_number) X(cc_major)        \
    X(cc_minor) X(pci_domain) X(pci_bus) X(pci_device) X(pci_device_id)                     \
    X(pci_subsystem_id) X(numa_node) X(has_ecc) X(has_fan) X(has_encoder)                   \
    X(has_memory_temperature) X(has_remapping) X(has_page_retirement) X(has_mig)            \
    X(nvlink_count) X(nvlink_group) X(mig_mode_enabled) X(lost) X(reset_required)           \
    X(energy_base_mj) X(energy_base_ns) X(multiprocessor_count)       \
    X(bar1_total_bytes) X(bar1_used_bytes) X(temp_shutdown_celsius) X(temp_slowdown_celsius)   \
    X(temp_memory_max_celsius) X(temp_gpu_max_celsius) X(persistence_mode) X(compute_mode)     \
    X(power_min_watts) X(brand)                                                              \
    X(recovery_action) /* nvmlDeviceGpuRecoveryAction_t, field 230 (nvml_recovery.c) */

#define GQ_STR_FIELDS(X) X(name) X(uuid) X(serial) X(vbios_version) X(board_part_number)

#define GQ_ENUM_ENTRY(n) GQ_F_##n,
enum gq_num_field { GQ_NUM_FIELDS(GQ_ENUM_ENTRY) GQ_NUM_COUNT };
enum gq_str_field { GQ_STR_FIELDS(GQ_ENUM_ENTRY) GQ_STR_COUNT };
#undef GQ_ENUM_ENTRY

typedef struct {
    uint32_t pid;
    uint32_t kind; /* 0 compute, 1 graphics */
    uint64_t used_memory_bytes;
    uint32_t gpu_instance_id; /* 0xFFFFFFFF when not on a MIG instance */
    uint32_t compute_instance_id;
} gq_process;

typedef struct {
    char uuid[GQ_STR_LEN];
    uint32_t profile_index; /* NVML_GPU_INSTANCE_PROFILE_* */
    uint32_t gpu_instance_id;
    uint32_t compute_instance_id;
    uint32_t placement_start;
    double memory_used_bytes;
} gq_mig;

typedef struct {
    char name[32]; /* "1g.5gb" */
    uint32_t profile_index;
    uint32_t profile_id;
    uint32_t slice_count;
    uint32_t instance_count;
    uint32_t multiprocessor_count;
    uint32_t copy_engine_count;
    uint32_t decoder_count;
    uint32_t encoder_count;
    uint64_t memory_mb;
} gq_profile;

typedef struct {
    char function[GQ_FN_LEN];
    int32_t code;
    int32_t active;
} gq_fail;

typedef struct {
    double num[GQ_NUM_COUNT];
    char str[GQ_STR_COUNT][GQ_STR_LEN];
    uint32_t mig_count;
    uint32_t profile_count;
    gq_mig mig[GQ_MAX_MIG];
    gq_profile profiles[GQ_MAX_PROFILES];
    uint32_t proc_seq; /* odd while the process list is being rewritten */
    uint32_t proc_count;
    gq_process procs[GQ_MAX_PROCS];
    uint32_t nvlink_active[GQ_MAX_LINKS];
    uint64_t nvlink_errors[GQ_MAX_LINKS][4]; /* replay, recovery, crc_flit, crc_data */
    gq_fail fails[GQ_MAX_FAILS];
} gq_gpu;

typedef struct {
    uint64_t seq; /* equals the event's sequence number once complete, 0 while written */
    int32_t gpu;
    uint32_t gpu_instance_id;
    uint32_t compute_instance_id;
    uint32_t pad;
    uint64_t xid;
} gq_xid;

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t state_size;
    uint32_t gpu_count;
    int32_t cuda_driver_version; /* 12040 for 12.4 */
    char driver_version[GQ_STR_LEN];
    char nvml_version[GQ_STR_LEN];
    uint32_t writer_lock;  /* spin lock between control-side writers */
    uint32_t xid_futex;    /* low 32 bits of xid_head; waiters sleep on it */
    uint64_t xid_head;     /* sequence number of the newest event; 0 = none yet */
    gq_xid xids[GQ_XID_RING];
    gq_fail system_fails[GQ_MAX_FAILS];
    gq_gpu gpus[GQ_MAX_GPUS];
    gq_prof prof[GQ_MAX_GPUS]; /* GPM and per-process utilisation (gqsim_prof.h) */
    gq_costs costs; /* NVML call costs and wall-time counters (gqsim_costs.h) */
} gq_state;

#endif
