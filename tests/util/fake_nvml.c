/* A stand-in libnvidia-ml for tests/unit/test_nvml.c: the five calls
 * gpu/nvml.c makes, with NVML's C types and return codes, and one device
 * at PCI bus "00000000:17:00.0" whose utilisation the environment sets
 * (FAKE_NVML_UTIL, percent; FAKE_NVML_INIT_FAILS makes nvmlInit fail as
 * a machine without the driver does). Never linked: dlopened by path. */
#include <stdlib.h>
#include <string.h>

typedef struct {
    unsigned gpu, memory;
} fake_utilization;

static int fake_device; /* the handle's target */
static int fake_inits;  /* nvmlInit minus nvmlShutdown: 0 when balanced */

int nvmlInit_v2(void) {
    if (getenv("FAKE_NVML_INIT_FAILS")) return 9; /* NVML_ERROR_DRIVER_NOT_LOADED */
    fake_inits++;
    return 0;
}

int nvmlShutdown(void) {
    if (fake_inits <= 0) return 1; /* NVML_ERROR_UNINITIALIZED */
    fake_inits--;
    return 0;
}

int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **dev) {
    if (!fake_inits) return 1;
    if (strcmp(bus, "00000000:17:00.0")) return 6; /* NVML_ERROR_NOT_FOUND */
    *dev = &fake_device;
    return 0;
}

int nvmlDeviceGetUtilizationRates(void *dev, fake_utilization *u) {
    if (dev != &fake_device || !fake_inits) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    const char *v = getenv("FAKE_NVML_UTIL");
    if (!v) return 3; /* NVML_ERROR_NOT_SUPPORTED, as on a MIG instance */
    u->gpu = (unsigned)atoi(v);
    u->memory = 0;
    return 0;
}

const char *nvmlErrorString(int rc) {
    switch (rc) {
    case 6: return "Not Found";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

/* For the test: whether every nvmlInit was matched by a shutdown. */
int fake_nvml_open_count(void) { return fake_inits; }
