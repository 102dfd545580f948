/* GPM (GPU performance monitoring): samples of running totals and the metrics between two
 * of them. Supported from Hopper (compute capability 9) on, per GPU and per MIG instance;
 * older GPUs answer NOT_SUPPORTED. Samples taken less than 100 ms apart give every metric
 * as 0 with NVML_SUCCESS, as an H100 does (docs/sim.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gqsim_internal.h"

#define GQ_GPM_SAMPLE_MAGIC 0x47504d53u /* "GPMS" */

struct nvmlGpmSample_st {
    uint32_t magic;
    int filled;
    int gpu;
    int unit;
    int64_t t_ns;
    double total[GQ_GPM_COUNT];
};

#define GQ_GPM_ID_ENTRY(n, id) id,
static const unsigned gq_gpm_ids[GQ_GPM_COUNT] = {GQ_GPM_METRICS(GQ_GPM_ID_ENTRY)};
#undef GQ_GPM_ID_ENTRY
#define GQ_GPM_NAME_ENTRY(n, id) #n,
static const char *const gq_gpm_names[GQ_GPM_COUNT] = {GQ_GPM_METRICS(GQ_GPM_NAME_ENTRY)};
#undef GQ_GPM_NAME_ENTRY

static int gq_gpm_supported(const gq_gpu *g) { return GQ_NUM(g, cc_major) >= 9; }

static int gq_gpm_is_bandwidth(int k) { return strstr(gq_gpm_names[k], "bytes_per_second") != NULL; }

/* Reads a unit's running totals at `now` under the struct's sequence counter. */
static void gq_gpm_totals(const gq_prof *p, int unit, int64_t now, double *out) {
    for (;;) {
        uint32_t before = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE);
        if (before & 1u) continue;
        const gq_gpm_unit *u = &p->gpm[unit];
        double elapsed = u->base_ns > 0 ? (double)(now - u->base_ns) / 1e9 : 0.0;
        if (elapsed < 0) elapsed = 0;
        for (int k = 0; k < GQ_GPM_COUNT; k++) out[k] = u->total[k] + u->rate[k] * elapsed;
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&p->seq, __ATOMIC_RELAXED) == before) return;
    }
}

GQ_EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport) {
    GQ_ENTER(device, 0, 0);
    if (gpmSupport == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    gpmSupport->isSupportedDevice = (unsigned)gq_gpm_supported(g);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlGpmQueryIfStreamingEnabled(nvmlDevice_t device, unsigned int *state) {
    GQ_ENTER(device, 0, 0);
    if (state == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!gq_gpm_supported(g)) return NVML_ERROR_NOT_SUPPORTED;
    *state = 0; /* the stand-in samples on demand only */
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample) {
    nvmlReturn_t r = gq_enter_system(__func__);
    if (r != NVML_SUCCESS) return r;
    if (gpmSample == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlGpmSample_st *s = calloc(1, sizeof(*s));
    if (s == NULL) return NVML_ERROR_MEMORY;
    s->magic = GQ_GPM_SAMPLE_MAGIC;
    *gpmSample = s;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample) {
    nvmlReturn_t r = gq_enter_system(__func__);
    if (r != NVML_SUCCESS) return r;
    if (gpmSample == NULL || gpmSample->magic != GQ_GPM_SAMPLE_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    gpmSample->magic = 0;
    free(gpmSample);
    return NVML_SUCCESS;
}

static nvmlReturn_t gq_gpm_take(nvmlDevice_t device, const gq_gpu *g, int unit,
                                nvmlGpmSample_t sample) {
    if (sample == NULL || sample->magic != GQ_GPM_SAMPLE_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    if (!gq_gpm_supported(g)) return NVML_ERROR_NOT_SUPPORTED;
    int64_t now = gq_now_ns();
    gq_gpm_totals(&gq_nvml_state->prof[device->gpu], unit, now, sample->total);
    sample->gpu = device->gpu;
    sample->unit = unit;
    sample->t_ns = now;
    sample->filled = 1;
    return NVML_SUCCESS;
}

/* nvmlGpmSampleGet and nvmlGpmMigSampleGet take the GPU's handle: GQ_ENTER costs them on it. */
GQ_EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample) {
    GQ_ENTER(device, 0, 0);
    return gq_gpm_take(device, g, 0, gpmSample);
}

/* `device` is the physical GPU; the instance is named by its GPU instance id. */
GQ_EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId,
                                           nvmlGpmSample_t gpmSample) {
    GQ_ENTER(device, 0, 0);
    if (!gq_gpm_supported(g)) return NVML_ERROR_NOT_SUPPORTED;
    if (!GQ_HAS(g, mig_mode_enabled)) return NVML_ERROR_NOT_SUPPORTED;
    uint32_t n = __atomic_load_n(&g->mig_count, __ATOMIC_ACQUIRE);
    for (uint32_t m = 0; m < n && m < GQ_MAX_MIG; m++)
        if (g->mig[m].gpu_instance_id == gpuInstanceId)
            return gq_gpm_take(device, g, 1 + (int)m, gpmSample);
    return NVML_ERROR_NOT_FOUND;
}

GQ_EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet) {
    nvmlReturn_t r = gq_check_system(__func__); /* costed below, on the samples' GPU */
    if (r != NVML_SUCCESS) return r;
    if (metricsGet == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const struct nvmlGpmSample_st *a = metricsGet->sample1, *b = metricsGet->sample2;
    if (metricsGet->numMetrics > NVML_GPM_METRIC_MAX || a == NULL || b == NULL ||
        a->magic != GQ_GPM_SAMPLE_MAGIC || b->magic != GQ_GPM_SAMPLE_MAGIC || !a->filled ||
        !b->filled || a->gpu != b->gpu || a->unit != b->unit)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* The driver computes the metrics of the samples' GPU: the call queues with that GPU's
     * other calls (per-GPU queueing), not on the library-wide line of system calls. */
    GQ_COST(__func__, a->gpu);
    int64_t dt_ns = llabs(b->t_ns - a->t_ns);
    double seconds = (double)dt_ns / 1e9;
    for (unsigned i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        m->value = 0.0;
        m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        m->metricInfo.shortName = NULL;
        m->metricInfo.longName = NULL;
        m->metricInfo.unit = NULL;
        for (int k = 0; k < GQ_GPM_COUNT; k++) {
            if (gq_gpm_ids[k] != m->metricId) continue;
            int bw = gq_gpm_is_bandwidth(k);
            m->nvmlReturn = NVML_SUCCESS;
            m->metricInfo.shortName = (char *)gq_gpm_names[k];
            m->metricInfo.longName = (char *)gq_gpm_names[k];
            m->metricInfo.unit = bw ? (char *)"MiB/sec" : (char *)"%";
            if (dt_ns < GQ_GPM_MIN_INTERVAL_NS) break; /* silent zeros, as the hardware */
            double mean = fabs(b->total[k] - a->total[k]) / seconds;
            m->value = bw ? mean / 1048576.0 : mean * 100.0;
            break;
        }
    }
    return NVML_SUCCESS;
}
