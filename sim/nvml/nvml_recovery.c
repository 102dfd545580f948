/* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (field 230): what the driver says a GPU needs before it
 * can be trusted again (nvmlDeviceGpuRecoveryAction_t: 0 none, 1 GPU reset, 2 node reboot,
 * 3 drain peer-to-peer, 4 drain and reset, ...). On an H100 with driver R550+ it reads 0
 * (NONE) when all is well (docs shared/nvml-h100.md); tests set it with
 * SimNode.set(i, recovery_action=N). Kept apart from the other field values on purpose. */
#include "gqsim_internal.h"

nvmlReturn_t gq_recovery_action_field(const gq_gpu *g, nvmlFieldValue_t *v) {
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    v->value.uiVal = (unsigned)GQ_NUM(g, recovery_action);
    return NVML_SUCCESS;
}
