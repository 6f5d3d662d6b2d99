/* backend.c: the data-plane registry. Planes are listed in priority order; the first that
 * accepts a batch runs it (the contract is in backend.h). The registry opens and closes each
 * plane's per-set state and counts what each plane ran. Only this file knows which planes were
 * compiled in. bg thread, except the counters and build facts (any thread). */
#include <stddef.h>
#include <string.h>
#include "backend.h"

static const hvl_backend *const registry[] = {
    &hvl__backend_nccl,     /* CUDA tensors, every member on its own GPU (loaded at first use) */
    &hvl__backend_shm,      /* every member of the set on this host (HVLITE_SHM_DISABLE=1: off) */
    &hvl__backend_hier,     /* allreduce across hosts, if HVLITE_HIERARCHICAL_ALLREDUCE=1 */
    &hvl__backend_mpi,      /* everything; last */
};
#define NPLANES ((int)(sizeof(registry) / sizeof(registry[0])))
_Static_assert(NPLANES <= HVL_MAX_BACKENDS, "raise HVL_MAX_BACKENDS");

int hvl__planes_open(hvl_engine *e, hvl_pset *ps)
{
    for (int i = 0; i < NPLANES; i++) {
        ps->plane_state[i] = NULL;
        if (!registry[i]->open || ps->rank < 0) continue;
        int rc = registry[i]->open(e, ps, &ps->plane_state[i]);
        if (rc != HVL_OK) {
            hvl__planes_close(ps, 0);
            return rc;
        }
    }
    return HVL_OK;
}

void hvl__planes_close(hvl_pset *ps, int clean)
{
    for (int i = 0; i < NPLANES; i++) {
        if (ps->plane_state[i] && registry[i]->close) registry[i]->close(ps->plane_state[i], clean);
        ps->plane_state[i] = NULL;
    }
}

int hvl__planes_prepare(hvl_engine *e, hvl_pset *ps, const hvl_batch_kind *k, int device)
{
    for (int i = 0; i < NPLANES; i++)
        if (registry[i]->prepare && ps->plane_state[i])
            HVL_CHECK(registry[i]->prepare(e, ps, ps->plane_state[i], k, device));
    return HVL_OK;
}

static int pick(const hvl_engine *e, const hvl_pset *ps, const hvl_batch_kind *k)
{
    int adasum = k->op == HVL_ALLREDUCE && k->reduce_op == HVL_ADASUM;
    for (int i = 0; i < NPLANES; i++) {
        void *state = ps->plane_state[i];
        if (registry[i]->open && !state) continue;      /* it does not serve this set */
        if (adasum && !registry[i]->adasum) continue;
        if (registry[i]->can_run(e, ps, state, k)) return i;
    }
    return -1;
}

hvl_plane hvl__plane_staged(const hvl_engine *e, const hvl_pset *ps, const hvl_batch_kind *k)
{
    hvl_batch_kind host = *k;
    host.memory = HVL_MEMORY_HOST;
    int i = pick(e, ps, &host);
    if (i < 0) i = NPLANES - 1;
    return (hvl_plane){registry[i], ps->plane_state[i], i, 1};
}

hvl_plane hvl__plane_for(const hvl_engine *e, const hvl_pset *ps, const hvl_batch_kind *k)
{
    int i = pick(e, ps, k);
    if (i < 0 && k->memory != HVL_MEMORY_HOST) return hvl__plane_staged(e, ps, k);
    if (i < 0) i = NPLANES - 1;
    return (hvl_plane){registry[i], ps->plane_state[i], i, 0};
}

void hvl__plane_count(hvl_engine *e, const hvl_plane *p, int64_t bytes)
{
    hvl__count(&e->plane_counts[p->index].collectives, 1);
    hvl__count(&e->plane_counts[p->index].bytes, bytes);
}

int hvl_backend_count(void) { return NPLANES; }

int hvl_get_backend_counters(int index, hvl_backend_counters *out)
{
    if (index < 0 || index >= NPLANES)
        return hvl__fail(HVL_ERR_INVALID_ARG, "no data plane %d (there are %d)", index, NPLANES);
    out->name = registry[index]->name;
    out->collectives = __atomic_load_n(&hvl__engine.plane_counts[index].collectives, __ATOMIC_RELAXED);
    out->bytes = __atomic_load_n(&hvl__engine.plane_counts[index].bytes, __ATOMIC_RELAXED);
    return HVL_OK;
}

/* Build facts, from the table above: a plane is built when it is listed. */
static int listed(const char *name)
{
    for (int i = 0; i < NPLANES; i++)
        if (strcmp(registry[i]->name, name) == 0) return 1;
    return 0;
}

int hvl_mpi_built(void) { return listed("mpi"); }
int hvl_nccl_built(void) { return listed("nccl"); }
int hvl_shm_built(void) { return listed("shm"); }
