/* Backend entry points that exist in every build. Without CUDA compiled in
 * (LS_HAVE_CUDA undefined) the CUDA constructor reports that plainly, so
 * --device cuda fails with a message instead of a link error; gpu/cuda/
 * provides both functions in a CUDA build. */
#include "gpu/backend.h"

#ifndef LS_HAVE_CUDA

/* Always fails: *out stays NULL and err says how to get a CUDA build. */
ls_status ls_backend_cuda_create(const ls_backend_config *cfg, ls_backend **out, ls_error *err) {
    (void)cfg;
    *out = NULL;
    return ls_error_set(err, LS_DEVICE_ERROR, NULL,
                        "this build has no CUDA backend (rebuild with nvcc and -DLORASINK_CUDA=ON)");
}

int ls_backend_cuda_available(void) { return 0; }

#endif
