/* Mapping the state file, the wall clock, the writers' lock, and the checks every NVML call
 * starts with. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gqsim_internal.h"

gq_state *gq_nvml_state = NULL;
int gq_init_count = 0;
struct nvmlDevice_st gq_dev_handles[GQ_MAX_GPUS];
struct nvmlDevice_st gq_mig_handles[GQ_MAX_GPUS][GQ_MAX_MIG];
struct nvmlGpuInstance_st gq_gi_handles[GQ_MAX_GPUS][GQ_MAX_MIG];
struct nvmlComputeInstance_st gq_ci_handles[GQ_MAX_GPUS][GQ_MAX_MIG];

__attribute__((constructor)) static void gq_init_handles(void) {
    for (int i = 0; i < GQ_MAX_GPUS; i++) {
        gq_dev_handles[i].gpu = i;
        gq_dev_handles[i].mig = -1;
        for (int m = 0; m < GQ_MAX_MIG; m++) {
            gq_mig_handles[i][m].gpu = i;
            gq_mig_handles[i][m].mig = m;
            gq_gi_handles[i][m].gpu = i;
            gq_gi_handles[i][m].mig = m;
            gq_ci_handles[i][m].gpu = i;
            gq_ci_handles[i][m].mig = m;
        }
    }
}

/* Maps the state file read-write. `err` gets an errno value, or EPROTO when the file is not
 * a state file of this layout version. */
gq_state *gq_map(const char *path, int create, int *err) {
    *err = 0;
    int fd = open(path, create ? (O_RDWR | O_CREAT | O_TRUNC) : O_RDWR, 0644);
    if (fd < 0) {
        *err = errno;
        return NULL;
    }
    if (create && ftruncate(fd, (off_t)sizeof(gq_state)) != 0) {
        *err = errno;
        close(fd);
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size < sizeof(gq_state)) {
        *err = EPROTO;
        close(fd);
        return NULL;
    }
    void *mem = mmap(NULL, sizeof(gq_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mem == MAP_FAILED) {
        *err = errno;
        return NULL;
    }
    gq_state *st = mem;
    if (create) {
        memset(st, 0, sizeof(*st));
        st->version = GQ_VERSION;
        st->state_size = (uint32_t)sizeof(gq_state);
        __atomic_store_n(&st->magic, GQ_MAGIC, __ATOMIC_RELEASE);
    } else if (__atomic_load_n(&st->magic, __ATOMIC_ACQUIRE) != GQ_MAGIC ||
               st->version != GQ_VERSION || st->state_size != sizeof(gq_state)) {
        munmap(mem, sizeof(gq_state));
        *err = EPROTO;
        return NULL;
    }
    return st;
}

/* Wall clock, so that every process computes the same energy counter from the state. */
int64_t gq_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Energy since "driver load" in millijoules: the stored base plus power x elapsed time. */
double gq_energy_mj(const gq_gpu *g) {
    double base_mj = g->num[GQ_F_energy_base_mj];
    if (g->num[GQ_F_energy_base_ns] <= 0) return base_mj; /* counter not started yet */
    double elapsed_ns = (double)(gq_now_ns() - (int64_t)g->num[GQ_F_energy_base_ns]);
    if (elapsed_ns < 0) elapsed_ns = 0;
    return base_mj + g->num[GQ_F_power_watts] * elapsed_ns / 1e6;
}

/* A spin lock between writers (control calls are rare and short). A writer that died while
 * holding it is presumed after a second, so one crash cannot wedge the simulation. */
void gq_lock(gq_state *st) {
    int64_t start = 0;
    for (;;) {
        uint32_t expected = 0;
        if (__atomic_compare_exchange_n(&st->writer_lock, &expected, 1, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
            return;
        if (start == 0) start = gq_now_ns();
        if (gq_now_ns() - start > 1000000000LL) {
            __atomic_store_n(&st->writer_lock, 1, __ATOMIC_SEQ_CST);
            return;
        }
        sched_yield();
    }
}

void gq_unlock(gq_state *st) { __atomic_store_n(&st->writer_lock, 0, __ATOMIC_RELEASE); }

/* The forced return code for `function`, or 0. "nvmlDeviceGetPciInfo" also matches the
 * versioned symbol nvmlDeviceGetPciInfo_v3 and so on. */
int gq_fail_code(const gq_fail *fails, const char *function) {
    size_t flen = strlen(function);
    size_t base = flen;
    const char *v = strrchr(function, '_');
    if (v && v[1] == 'v' && v[2] >= '0' && v[2] <= '9') base = (size_t)(v - function);
    for (int i = 0; i < GQ_MAX_FAILS; i++) {
        const gq_fail *f = &fails[i];
        if (!__atomic_load_n(&f->active, __ATOMIC_ACQUIRE)) continue;
        size_t n = strnlen(f->function, GQ_FN_LEN);
        if ((n == flen || n == base) && strncmp(f->function, function, n) == 0) return f->code;
    }
    return 0;
}

nvmlReturn_t gq_check_system(const char *function) {
    if (gq_nvml_state == NULL || gq_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    return (nvmlReturn_t)gq_fail_code(gq_nvml_state->system_fails, function);
}

nvmlReturn_t gq_enter_system(const char *function) {
    nvmlReturn_t code = gq_check_system(function);
    if (code == NVML_SUCCESS) GQ_COST(function, -1);
    return code;
}

static int gq_is_handle(nvmlDevice_t dev) {
    const char *p = (const char *)dev;
    const char *a = (const char *)gq_dev_handles;
    const char *b = (const char *)gq_mig_handles;
    if (p >= a && p < a + sizeof(gq_dev_handles))
        return (size_t)(p - a) % sizeof(struct nvmlDevice_st) == 0;
    if (p >= b && p < b + sizeof(gq_mig_handles))
        return (size_t)(p - b) % sizeof(struct nvmlDevice_st) == 0;
    return 0;
}

nvmlReturn_t gq_enter(nvmlDevice_t dev, const char *function, int identity, int allow_mig,
                      gq_gpu **gpu) {
    return gq_enter_costed(dev, function, identity, allow_mig, gpu, 0.0);
}

nvmlReturn_t gq_enter_costed(nvmlDevice_t dev, const char *function, int identity, int allow_mig,
                             gq_gpu **gpu, double extra_us) {
    gq_state *st = gq_nvml_state;
    if (st == NULL || gq_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (dev == NULL || !gq_is_handle(dev) || (uint32_t)dev->gpu >= st->gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    gq_gpu *g = &st->gpus[dev->gpu];
    if (dev->mig >= 0 && (uint32_t)dev->mig >= g->mig_count) return NVML_ERROR_INVALID_ARGUMENT;
    if (GQ_HAS(g, lost)) return NVML_ERROR_GPU_IS_LOST;
    int code = gq_fail_code(g->fails, function);
    if (code != 0) return (nvmlReturn_t)code;
    if (!identity && GQ_HAS(g, reset_required)) return NVML_ERROR_RESET_REQUIRED;
    if (dev->mig >= 0 && !allow_mig) return NVML_ERROR_NOT_SUPPORTED;
    gq_nvml_cost(function, dev->gpu, extra_us);
    *gpu = g;
    return NVML_SUCCESS;
}

nvmlReturn_t gq_copy_str(char *out, unsigned int length, const char *value) {
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strnlen(value, GQ_STR_LEN);
    if (n + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, n);
    out[n] = '\0';
    return NVML_SUCCESS;
}
