/* backend.c: the data-plane registry. Backends are listed in priority order; the first that
 * accepts a collective runs it. Only this file knows which backends were compiled in. bg thread. */
#include <stddef.h>
#include "internal.h"

static const hvl_backend *const registry[] = {
    /* NCCL (GPU buffers) plugs in here, before shared memory. */
    &hvl__backend_shm,      /* every member of the set on this host (HVLITE_SHM_DISABLE=1: off) */
    &hvl__backend_hier,     /* allreduce across hosts, if HVLITE_HIERARCHICAL_ALLREDUCE=1 */
    &hvl__backend_mpi,
};

const hvl_backend *hvl__backend_for(const hvl_engine *e, const hvl_pset *ps, int op, int dtype, int64_t bytes)
{
    for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]); i++)
        if (registry[i]->can_run(e, ps, op, dtype, bytes)) return registry[i];
    return NULL;
}

int hvl_mpi_built(void) { return 1; }
int hvl_nccl_built(void) { return 0; }
int hvl_shm_built(void) { return 1; }   /* the engine is Linux-only (futex, /dev/shm) */
