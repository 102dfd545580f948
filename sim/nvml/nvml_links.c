/* NVLink state, error counters and peers, and the PCIe/NVLink topology between GPUs.
 * GPUs in the same NVLink group (spec "nvlink") reach each other over NVLink: through
 * NVSwitches when the group has more than two GPUs (HGX boards), directly otherwise. The
 * PCIe tree pairs GPUs under one switch and splits the node into two NUMA nodes. */
#include <stdio.h>
#include <string.h>

#include "gqsim_internal.h"

static int gq_group_size(int group) {
    if (group < 0) return 0;
    int n = 0;
    for (uint32_t i = 0; i < gq_nvml_state->gpu_count; i++)
        if ((int)GQ_NUM(&gq_nvml_state->gpus[i], nvlink_group) == group) n++;
    return n;
}

static nvmlReturn_t gq_link_ok(const gq_gpu *g, unsigned int link) {
    if (GQ_NUM(g, nvlink_count) <= 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)GQ_NUM(g, nvlink_count)) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

#define GQ_LINK(g, link)                                   \
    do {                                                   \
        nvmlReturn_t lr_ = gq_link_ok((g), (link));        \
        if (lr_ != NVML_SUCCESS) return lr_;               \
    } while (0)

GQ_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                                nvmlEnableState_t *isActive) {
    GQ_ENTER(device, 0, 0);
    if (isActive == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    GQ_LINK(g, link);
    *isActive = g->nvlink_active[link] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link,
                                                  unsigned int *version) {
    GQ_ENTER(device, 0, 0);
    if (version == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    GQ_LINK(g, link);
    /* NVLink 2 on Volta, 3 on Ampere, 4 on Hopper. */
    int cc = (int)GQ_NUM(g, cc_major);
    *version = cc >= 9 ? 4 : cc == 8 ? 3 : 2;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                       nvmlNvLinkErrorCounter_t counter,
                                                       unsigned long long *counterValue) {
    GQ_ENTER(device, 0, 0);
    if (counterValue == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    GQ_LINK(g, link);
    if (counter == NVML_NVLINK_ERROR_DL_ECC_DATA) {
        *counterValue = 0;
        return NVML_SUCCESS;
    }
    if ((unsigned)counter > NVML_NVLINK_ERROR_DL_CRC_DATA) return NVML_ERROR_INVALID_ARGUMENT;
    *counterValue = g->nvlink_errors[link][counter];
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                           nvmlIntNvLinkDeviceType_t *type) {
    GQ_ENTER(device, 0, 0);
    if (type == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    GQ_LINK(g, link);
    if (!g->nvlink_active[link]) *type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    else if (gq_group_size((int)GQ_NUM(g, nvlink_group)) > 2) *type = NVML_NVLINK_DEVICE_TYPE_SWITCH;
    else *type = NVML_NVLINK_DEVICE_TYPE_GPU;
    return NVML_SUCCESS;
}

/* The PCI identity of the far end: the peer GPU, or one of the board's NVSwitches. */
GQ_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                           nvmlPciInfo_t *pci) {
    GQ_ENTER(device, 0, 0);
    if (pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    GQ_LINK(g, link);
    if (!g->nvlink_active[link]) return NVML_ERROR_NOT_FOUND;
    int group = (int)GQ_NUM(g, nvlink_group);
    memset(pci, 0, sizeof(*pci));
    unsigned bus;
    if (gq_group_size(group) > 2) {
        unsigned switches = GQ_NUM(g, cc_major) >= 9 ? 4 : 6;
        bus = 0x05 + link % switches;
        pci->pciDeviceId = GQ_NUM(g, cc_major) >= 9 ? 0x22A310DE : 0x1AF110DE;
    } else {
        const gq_gpu *peer = NULL;
        for (uint32_t i = 0; i < gq_nvml_state->gpu_count; i++) {
            const gq_gpu *o = &gq_nvml_state->gpus[i];
            if ((int)i != device->gpu && (int)GQ_NUM(o, nvlink_group) == group) peer = o;
        }
        if (peer == NULL) return NVML_ERROR_NOT_FOUND;
        bus = (unsigned)GQ_NUM(peer, pci_bus);
        pci->pciDeviceId = (unsigned)GQ_NUM(peer, pci_device_id);
        pci->pciSubSystemId = (unsigned)GQ_NUM(peer, pci_subsystem_id);
    }
    pci->bus = bus;
    snprintf(pci->busId, sizeof(pci->busId), NVML_DEVICE_PCI_BUS_ID_FMT, 0u, bus, 0u);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, 0u,
             bus, 0u);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link,
                                                        nvmlPciInfo_t *pci) {
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

static nvmlGpuTopologyLevel_t gq_common_ancestor(int a, int b) {
    if (a == b) return NVML_TOPOLOGY_INTERNAL;
    const gq_gpu *ga = &gq_nvml_state->gpus[a], *gb = &gq_nvml_state->gpus[b];
    if (a / 2 == b / 2) return NVML_TOPOLOGY_SINGLE;
    if (GQ_NUM(ga, numa_node) == GQ_NUM(gb, numa_node)) return NVML_TOPOLOGY_NODE;
    return NVML_TOPOLOGY_SYSTEM;
}

static int gq_nvlinked(int a, int b) {
    const gq_gpu *ga = &gq_nvml_state->gpus[a], *gb = &gq_nvml_state->gpus[b];
    int group = (int)GQ_NUM(ga, nvlink_group);
    return a != b && group >= 0 && group == (int)GQ_NUM(gb, nvlink_group);
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1,
                                                           nvmlDevice_t device2,
                                                           nvmlGpuTopologyLevel_t *pathInfo) {
    gq_gpu *g2;
    nvmlReturn_t r = gq_enter(device2, __func__, 0, 0, &g2);
    if (r != NVML_SUCCESS) return r;
    GQ_ENTER(device1, 0, 0);
    (void)g;
    if (pathInfo == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *pathInfo = gq_common_ancestor(device1->gpu, device2->gpu);
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
                                              nvmlGpuP2PCapsIndex_t p2pIndex,
                                              nvmlGpuP2PStatus_t *p2pStatus) {
    gq_gpu *g2;
    nvmlReturn_t r = gq_enter(device2, __func__, 0, 0, &g2);
    if (r != NVML_SUCCESS) return r;
    GQ_ENTER(device1, 0, 0);
    (void)g;
    if (p2pStatus == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    int a = device1->gpu, b = device2->gpu;
    int nvlink = gq_nvlinked(a, b);
    switch (p2pIndex) {
    case NVML_P2P_CAPS_INDEX_NVLINK:
        *p2pStatus = nvlink ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
        break;
    case NVML_P2P_CAPS_INDEX_READ:
    case NVML_P2P_CAPS_INDEX_WRITE:
    case NVML_P2P_CAPS_INDEX_ATOMICS:
        /* Without NVLink, peer access needs a common PCIe switch. */
        *p2pStatus = (nvlink || gq_common_ancestor(a, b) <= NVML_TOPOLOGY_MULTIPLE)
                         ? NVML_P2P_STATUS_OK
                         : NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED;
        break;
    case NVML_P2P_CAPS_INDEX_PROP: *p2pStatus = NVML_P2P_STATUS_OK; break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device,
                                                        nvmlGpuTopologyLevel_t level,
                                                        unsigned int *count,
                                                        nvmlDevice_t *deviceArray) {
    GQ_ENTER(device, 0, 0);
    (void)g;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    for (uint32_t i = 0; i < gq_nvml_state->gpu_count; i++) {
        if ((int)i == device->gpu || gq_common_ancestor(device->gpu, (int)i) > level) continue;
        if (deviceArray != NULL && n < *count) deviceArray[n] = &gq_dev_handles[i];
        n++;
    }
    if (deviceArray == NULL || n > *count) {
        *count = n;
        return deviceArray == NULL && n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    return NVML_SUCCESS;
}

GQ_EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    GQ_ENTER(device, 0, 0);
    if (node == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *node = (unsigned)GQ_NUM(g, numa_node);
    return NVML_SUCCESS;
}
