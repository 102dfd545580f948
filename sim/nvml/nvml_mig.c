/* MIG: mode, instance handles and ids, GPU/compute instance info, and the profile table a
 * client needs to name an instance ("1g.5gb"). Each simulated GPU instance holds exactly
 * one compute instance spanning it, the common partitioning. */
#include <stdio.h>
#include <string.h>

#include "gqsim_internal.h"

static const gq_profile *gq_profile_by_index(const gq_gpu *g, unsigned index) {
    for (uint32_t i = 0; i < g->profile_count; i++)
        if (g->profiles[i].profile_index == index) return &g->profiles[i];
    return NULL;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                            unsigned int *pendingMode) {
    GQ_ENTER(device, 0, 0);
    if (currentMode == NULL || pendingMode == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_mig)) return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = GQ_HAS(g, mig_mode_enabled) ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *pendingMode = *currentMode;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    GQ_ENTER(device, 0, 0);
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_mig)) return NVML_ERROR_NOT_SUPPORTED;
    *count = GQ_MAX_MIG;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                           nvmlDevice_t *migDevice) {
    GQ_ENTER(device, 0, 0);
    if (migDevice == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_mig)) return NVML_ERROR_NOT_SUPPORTED;
    if (!GQ_HAS(g, mig_mode_enabled) || index >= g->mig_count) return NVML_ERROR_NOT_FOUND;
    *migDevice = &gq_mig_handles[device->gpu][index];
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    GQ_ENTER(device, 1, 1);
    (void)g;
    if (isMigDevice == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = GQ_IS_MIG(device) ? 1 : 0;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    GQ_ENTER(device, 1, 1);
    if (id == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_IS_MIG(device)) return NVML_ERROR_NOT_SUPPORTED;
    *id = g->mig[device->mig].gpu_instance_id;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    GQ_ENTER(device, 1, 1);
    if (id == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_IS_MIG(device)) return NVML_ERROR_NOT_SUPPORTED;
    *id = g->mig[device->mig].compute_instance_id;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                                    nvmlDevice_t *device) {
    GQ_ENTER(migDevice, 1, 1);
    (void)g;
    if (device == NULL || !GQ_IS_MIG(migDevice)) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gq_dev_handles[migDevice->gpu];
    return NVML_SUCCESS;
}

static void gq_fill_profile_v1(const gq_profile *p, nvmlGpuInstanceProfileInfo_t *info) {
    memset(info, 0, sizeof(*info));
    info->id = p->profile_id;
    info->isP2pSupported = 0;
    info->sliceCount = p->slice_count;
    info->instanceCount = p->instance_count;
    info->multiprocessorCount = p->multiprocessor_count;
    info->copyEngineCount = p->copy_engine_count;
    info->decoderCount = p->decoder_count;
    info->encoderCount = p->encoder_count;
    info->memorySizeMB = p->memory_mb;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device,
                                                           unsigned int profile,
                                                           nvmlGpuInstanceProfileInfo_t *info) {
    GQ_ENTER(device, 0, 0);
    if (info == NULL || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    const gq_profile *p = GQ_HAS(g, has_mig) ? gq_profile_by_index(g, profile) : NULL;
    if (p == NULL) return NVML_ERROR_NOT_SUPPORTED;
    gq_fill_profile_v1(p, info);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device,
                                                            unsigned int profile,
                                                            nvmlGpuInstanceProfileInfo_v2_t *info) {
    GQ_ENTER(device, 0, 0);
    if (info == NULL || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlGpuInstanceProfileInfo_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const gq_profile *p = GQ_HAS(g, has_mig) ? gq_profile_by_index(g, profile) : NULL;
    if (p == NULL) return NVML_ERROR_NOT_SUPPORTED;
    nvmlGpuInstanceProfileInfo_t v1;
    gq_fill_profile_v1(p, &v1);
    unsigned version = info->version;
    memset(info, 0, sizeof(*info));
    info->version = version;
    info->id = v1.id;
    info->sliceCount = v1.sliceCount;
    info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->copyEngineCount = v1.copyEngineCount;
    info->decoderCount = v1.decoderCount;
    info->encoderCount = v1.encoderCount;
    info->memorySizeMB = v1.memorySizeMB;
    snprintf(info->name, sizeof(info->name), "MIG %s", p->name);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                                 nvmlGpuInstance_t *gpuInstances,
                                                 unsigned int *count) {
    GQ_ENTER(device, 0, 0);
    if (count == NULL || gpuInstances == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_mig)) return NVML_ERROR_NOT_SUPPORTED;
    unsigned n = 0;
    for (uint32_t m = 0; m < g->mig_count; m++) {
        const gq_profile *p = gq_mig_profile(g, (int)m);
        if (p != NULL && p->profile_id == profileId)
            gpuInstances[n++] = &gq_gi_handles[device->gpu][m];
    }
    *count = n;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                    nvmlGpuInstance_t *gpuInstance) {
    GQ_ENTER(device, 0, 0);
    if (gpuInstance == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GQ_HAS(g, has_mig)) return NVML_ERROR_NOT_SUPPORTED;
    for (uint32_t m = 0; m < g->mig_count; m++) {
        if (g->mig[m].gpu_instance_id == id) {
            *gpuInstance = &gq_gi_handles[device->gpu][m];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* A GPU/compute instance handle enters like the MIG device it belongs to. */
static nvmlReturn_t gq_enter_instance(int gpu, int mig, const char *fn, gq_gpu **g) {
    if (gpu < 0 || gpu >= GQ_MAX_GPUS || mig < 0 || mig >= GQ_MAX_MIG)
        return NVML_ERROR_INVALID_ARGUMENT;
    return gq_enter(&gq_mig_handles[gpu][mig], fn, 0, 1, g);
}

GQ_EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance,
                                              nvmlGpuInstanceInfo_t *info) {
    if (gpuInstance == NULL || info == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    gq_gpu *g;
    nvmlReturn_t r = gq_enter_instance(gpuInstance->gpu, gpuInstance->mig, __func__, &g);
    if (r != NVML_SUCCESS) return r;
    const gq_mig *m = &g->mig[gpuInstance->mig];
    const gq_profile *p = gq_mig_profile(g, gpuInstance->mig);
    memset(info, 0, sizeof(*info));
    info->device = &gq_dev_handles[gpuInstance->gpu];
    info->id = m->gpu_instance_id;
    info->profileId = p ? p->profile_id : 0;
    info->placement.start = m->placement_start;
    info->placement.size = p ? p->slice_count : 0;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance,
                                                             unsigned int id,
                                                             nvmlComputeInstance_t *computeInstance) {
    if (gpuInstance == NULL || computeInstance == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    gq_gpu *g;
    nvmlReturn_t r = gq_enter_instance(gpuInstance->gpu, gpuInstance->mig, __func__, &g);
    if (r != NVML_SUCCESS) return r;
    if (g->mig[gpuInstance->mig].compute_instance_id != id) return NVML_ERROR_NOT_FOUND;
    *computeInstance = &gq_ci_handles[gpuInstance->gpu][gpuInstance->mig];
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                     nvmlComputeInstanceInfo_t *info) {
    if (computeInstance == NULL || info == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    gq_gpu *g;
    int gpu = computeInstance->gpu, mig = computeInstance->mig;
    nvmlReturn_t r = gq_enter_instance(gpu, mig, __func__, &g);
    if (r != NVML_SUCCESS) return r;
    const gq_profile *p = gq_mig_profile(g, mig);
    unsigned slices = p ? p->slice_count : 1;
    memset(info, 0, sizeof(*info));
    info->device = &gq_dev_handles[gpu];
    info->gpuInstance = &gq_gi_handles[gpu][mig];
    info->id = g->mig[mig].compute_instance_id;
    /* NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE for a CI spanning its GI. */
    info->profileId = slices >= 7 ? 4 : slices - 1;
    info->placement.start = 0;
    info->placement.size = slices;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                                  nvmlComputeInstanceInfo_t *info) {
    return nvmlComputeInstanceGetInfo_v2(computeInstance, info);
}
