/* The CUDA device's utilisation through NVML, loaded at run time:
 * libnvidia-ml ships with the driver, not the toolkit, so the server has
 * no link-time tie to it and runs (without the figure) where it is absent. */
#ifndef LS_GPU_NVML_H
#define LS_GPU_NVML_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ls_nvml ls_nvml;

/* NVML from library (NULL: the driver's "libnvidia-ml.so.1"), initialised,
 * with the device at pci_bus_id (as cudaDeviceGetPCIBusId writes it).
 * NULL when any step fails, with why (what failed and NVML's words)
 * in why. Ownership: the caller frees the result with ls_nvml_close. */
ls_nvml *ls_nvml_open(const char *library, const char *pci_bus_id, char *why, size_t why_len);

/* The percent of NVML's last sample period (1/6 s to 1 s, by product) in
 * which a kernel ran on the device; false when NVML does not say (a MIG
 * instance, a lost device). Safe from any thread (NVML's calls are). */
bool ls_nvml_gpu_utilization(ls_nvml *nv, unsigned *percent);

/* Shuts NVML down and unloads it; NULL is a no-op. */
void ls_nvml_close(ls_nvml *nv);

#ifdef __cplusplus
}
#endif

#endif
