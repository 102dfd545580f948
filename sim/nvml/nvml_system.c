/* Library lifetime, error strings, system queries and device handle lookups. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "gqsim_internal.h"

static pthread_mutex_t gq_init_lock = PTHREAD_MUTEX_INITIALIZER;
static ino_t gq_mapped_ino;
static dev_t gq_mapped_dev;

GQ_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&gq_init_lock);
    nvmlReturn_t rc = NVML_SUCCESS;
    {
        /* (Re)map when GPUQUOTA_SIM_STATE names another file (or the file was re-created,
         * a new inode) than the one mapped: in one test process, each test's node wins.
         * Handles are indices, so they stay valid. An old mapping is never unmapped: a
         * thread still waiting for events on it must not touch unmapped memory. */
        const char *path = getenv("GPUQUOTA_SIM_STATE");
        struct stat sb;
        if (path == NULL || path[0] == '\0') {
            fprintf(stderr, "gqsim: GPUQUOTA_SIM_STATE is not set; no simulated GPUs\n");
            rc = NVML_ERROR_DRIVER_NOT_LOADED;
        } else if (stat(path, &sb) != 0) {
            fprintf(stderr, "gqsim: cannot use state file %s: %s\n", path, strerror(errno));
            rc = NVML_ERROR_DRIVER_NOT_LOADED;
        } else if (gq_nvml_state == NULL || sb.st_ino != gq_mapped_ino ||
                   sb.st_dev != gq_mapped_dev) {
            int err;
            gq_state *st = gq_map(path, 0, &err);
            if (st == NULL) {
                fprintf(stderr, "gqsim: cannot use state file %s: %s\n", path,
                        err == EPROTO ? "not a state file of this version" : strerror(err));
                rc = NVML_ERROR_DRIVER_NOT_LOADED;
            } else {
                gq_nvml_state = st;
                gq_mapped_ino = sb.st_ino;
                gq_mapped_dev = sb.st_dev;
            }
        }
    }
    /* A session already open keeps its node when the file has gone meanwhile. */
    if (rc != NVML_SUCCESS && gq_init_count > 0 && gq_nvml_state != NULL) rc = NVML_SUCCESS;
    if (rc == NVML_SUCCESS) {
        int code = gq_fail_code(gq_nvml_state->system_fails, "nvmlInit");
        if (code != 0) rc = (nvmlReturn_t)code;
        else gq_init_count++;
    }
    pthread_mutex_unlock(&gq_init_lock);
    return rc;
}

GQ_EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
GQ_EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

GQ_EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&gq_init_lock);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (gq_init_count <= 0) rc = NVML_ERROR_UNINITIALIZED;
    else gq_init_count--;
    pthread_mutex_unlock(&gq_init_lock);
    return rc;
}

GQ_EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "vGPU ECC Not Supported";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient Resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency Not Supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU Not Found";
    case NVML_ERROR_INVALID_STATE: return "Invalid State";
    default: return "Unknown Error";
    }
}

GQ_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t rc = gq_enter_system(__func__);
    if (rc != NVML_SUCCESS) return rc;
    return gq_copy_str(version, length, gq_nvml_state->driver_version);
}

GQ_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t rc = gq_enter_system(__func__);
    if (rc != NVML_SUCCESS) return rc;
    return gq_copy_str(version, length, gq_nvml_state->nvml_version);
}

GQ_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    nvmlReturn_t rc = gq_enter_system(__func__);
    if (rc != NVML_SUCCESS) return rc;
    if (cudaDriverVersion == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = gq_nvml_state->cuda_driver_version;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    nvmlReturn_t rc = gq_enter_system(__func__);
    if (rc != NVML_SUCCESS) return rc;
    if (deviceCount == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = __atomic_load_n(&gq_nvml_state->gpu_count, __ATOMIC_ACQUIRE);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) {
    return nvmlDeviceGetCount_v2(deviceCount);
}

/* Handles of lost GPUs are still handed out (as when the GPU fell off the bus after the
 * driver enumerated it): every call on them then says GPU_IS_LOST, which is how an agent
 * learns which index is gone. fail_call(i, "nvmlDeviceGetHandleByIndex", ...) simulates a
 * driver that refuses the handle itself. */
GQ_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t rc = gq_enter_system(__func__);
    if (rc != NVML_SUCCESS) return rc;
    if (device == NULL || index >= gq_nvml_state->gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    /* A per-GPU forced code applies here too, e.g. GPU_IS_LOST as some drivers answer. */
    int code = gq_fail_code(gq_nvml_state->gpus[index].fails, __func__);
    if (code != 0) return (nvmlReturn_t)code;
    *device = &gq_dev_handles[index];
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    nvmlReturn_t rc = gq_enter_system(__func__);
    if (rc != NVML_SUCCESS) return rc;
    if (uuid == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    gq_state *st = gq_nvml_state;
    for (uint32_t i = 0; i < st->gpu_count; i++) {
        gq_gpu *g = &st->gpus[i];
        if (strcmp(g->str[GQ_F_uuid], uuid) == 0) {
            if (GQ_HAS(g, lost)) return NVML_ERROR_GPU_IS_LOST;
            *device = &gq_dev_handles[i];
            return NVML_SUCCESS;
        }
        for (uint32_t m = 0; m < g->mig_count; m++) {
            if (strcmp(g->mig[m].uuid, uuid) == 0) {
                if (GQ_HAS(g, lost)) return NVML_ERROR_GPU_IS_LOST;
                *device = &gq_mig_handles[i][m];
                return NVML_SUCCESS;
            }
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

static void gq_bus_id(const gq_gpu *g, char *out, size_t len) {
    snprintf(out, len, NVML_DEVICE_PCI_BUS_ID_FMT, (unsigned)GQ_NUM(g, pci_domain),
             (unsigned)GQ_NUM(g, pci_bus), (unsigned)GQ_NUM(g, pci_device));
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId,
                                                        nvmlDevice_t *device) {
    nvmlReturn_t rc = gq_enter_system(__func__);
    if (rc != NVML_SUCCESS) return rc;
    if (pciBusId == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    gq_state *st = gq_nvml_state;
    for (uint32_t i = 0; i < st->gpu_count; i++) {
        char bus[32];
        gq_bus_id(&st->gpus[i], bus, sizeof(bus));
        /* NVML accepts the short "0000:3b:00.0" spelling too, in any case. */
        if (strcasecmp(bus, pciBusId) == 0 || strcasecmp(bus + 4, pciBusId) == 0) {
            if (GQ_HAS(&st->gpus[i], lost)) return NVML_ERROR_GPU_IS_LOST;
            *device = &gq_dev_handles[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

static void gq_fill_pci(const gq_gpu *g, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof(*pci));
    gq_bus_id(g, pci->busId, sizeof(pci->busId));
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT,
             (unsigned)GQ_NUM(g, pci_domain), (unsigned)GQ_NUM(g, pci_bus),
             (unsigned)GQ_NUM(g, pci_device));
    pci->domain = (unsigned)GQ_NUM(g, pci_domain);
    pci->bus = (unsigned)GQ_NUM(g, pci_bus);
    pci->device = (unsigned)GQ_NUM(g, pci_device);
    pci->pciDeviceId = (unsigned)GQ_NUM(g, pci_device_id);
    pci->pciSubSystemId = (unsigned)GQ_NUM(g, pci_subsystem_id);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    GQ_ENTER(device, 1, 0);
    if (pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    gq_fill_pci(g, pci);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    GQ_ENTER(device, 1, 0);
    if (index == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)device->gpu;
    return NVML_SUCCESS;
}
