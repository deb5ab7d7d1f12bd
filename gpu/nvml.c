/* NVML by dlopen: the four calls the utilisation gauge needs, declared
 * here with NVML's documented C types (the toolkit here ships no nvml.h). */
#include "gpu/nvml.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int nvml_return;        /* nvmlReturn_t: 0 is NVML_SUCCESS */
typedef struct nvml_dev *nvml_device; /* nvmlDevice_t: an opaque handle */
typedef struct {
    unsigned gpu, memory; /* nvmlUtilization_t, in percent */
} nvml_utilization;

struct ls_nvml {
    void *lib;
    nvml_device dev;
    nvml_return (*shutdown)(void);
    nvml_return (*utilization)(nvml_device, nvml_utilization *);
};

/* NVML's words for rc when the library has nvmlErrorString. */
static const char *ls_nvml_words(void *lib, nvml_return rc) {
    const char *(*str)(nvml_return) = (const char *(*)(nvml_return))dlsym(lib, "nvmlErrorString");
    const char *s = str ? str(rc) : NULL;
    return s ? s : "no description";
}

/* The symbol name of lib, or NULL with why. */
static void *ls_nvml_sym(void *lib, const char *name, char *why, size_t why_len) {
    void *p = dlsym(lib, name);
    if (!p) snprintf(why, why_len, "NVML has no %s (a driver older than NVML 5?)", name);
    return p;
}

/* Ownership: the caller frees the result with ls_nvml_close. */
ls_nvml *ls_nvml_open(const char *library, const char *pci_bus_id, char *why, size_t why_len) {
    const char *path = library ? library : "libnvidia-ml.so.1";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(why, why_len, "cannot load %s (%s)", path, e ? e : "unknown reason");
        return NULL;
    }
    nvml_return (*init)(void) = (nvml_return(*)(void))ls_nvml_sym(lib, "nvmlInit_v2", why, why_len);
    nvml_return (*by_bus)(const char *, nvml_device *) =
        (nvml_return(*)(const char *, nvml_device *))ls_nvml_sym(lib, "nvmlDeviceGetHandleByPciBusId_v2", why, why_len);
    ls_nvml *nv = calloc(1, sizeof *nv);
    if (nv) {
        nv->lib = lib;
        nv->shutdown = (nvml_return(*)(void))ls_nvml_sym(lib, "nvmlShutdown", why, why_len);
        nv->utilization = (nvml_return(*)(nvml_device, nvml_utilization *))ls_nvml_sym(
            lib, "nvmlDeviceGetUtilizationRates", why, why_len);
    } else {
        snprintf(why, why_len, "out of memory");
    }
    if (!nv || !init || !by_bus || !nv->shutdown || !nv->utilization) {
        free(nv);
        dlclose(lib);
        return NULL;
    }
    nvml_return rc = init();
    if (rc) {
        snprintf(why, why_len, "nvmlInit failed: %s (%d)", ls_nvml_words(lib, rc), rc);
        nv->shutdown = NULL; /* nothing to shut down */
        ls_nvml_close(nv);
        return NULL;
    }
    rc = by_bus(pci_bus_id, &nv->dev);
    if (rc) {
        snprintf(why, why_len, "NVML finds no device at PCI bus %s: %s (%d)", pci_bus_id, ls_nvml_words(lib, rc), rc);
        ls_nvml_close(nv);
        return NULL;
    }
    return nv;
}

bool ls_nvml_gpu_utilization(ls_nvml *nv, unsigned *percent) {
    nvml_utilization u;
    if (!nv || nv->utilization(nv->dev, &u)) return false;
    *percent = u.gpu;
    return true;
}

void ls_nvml_close(ls_nvml *nv) {
    if (!nv) return;
    if (nv->shutdown) nv->shutdown();
    dlclose(nv->lib);
    free(nv);
}
