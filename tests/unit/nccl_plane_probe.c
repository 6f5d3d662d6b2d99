/* Test probe (tests/unit/test_nccl_plane.py): the NCCL plane's files compiled whole, so the test
 * can call its decision rules, which are static there. Loaded after the engine (whose symbols
 * it uses) was made global; nothing here runs NCCL, CUDA or MPI. */
#include "nccl_set.c"
#include "backend_nccl.c"

/* verdict() over n members with global ranks `ranks`, each described by host, bus, device, ok
 * and why: 1 (NCCL), 0 (staged, *why says why) or -1 (undecided). */
int probe_verdict(int n, const int *ranks, const char *const *hosts, const char *const *buses,
                  const int *devices, const int *ok, const char *const *whys, char *why, int len)
{
    member_info all[16];
    int members[16];
    if (n < 1 || n > 16) return -2;
    for (int i = 0; i < n; i++) {
        memset(&all[i], 0, sizeof(all[i]));
        all[i].ok = ok[i];
        all[i].device = devices[i];
        snprintf(all[i].host, sizeof(all[i].host), "%s", hosts[i]);
        snprintf(all[i].bus, sizeof(all[i].bus), "%s", buses[i]);
        snprintf(all[i].why, sizeof(all[i].why), "%s", whys[i]);
        members[i] = ranks[i];
    }
    hvl_pset ps = {.size = n, .rank = 0, .ranks = members};
    return verdict(&ps, all, why, (size_t)len);
}

/* can_run() of a set of `nranks` that chose NCCL (mode 1) or not (0), its members' GPUs with
 * memory pools (pools 1) or not. */
int probe_can_run(int nccl_chosen, int pools, int op, int reduce_op, int dtype, int memory, double prescale,
                  double postscale, int even_rows, int nranks)
{
    nccl_set s = {.mode = nccl_chosen ? USE_NCCL : STAGED, .pools = pools,
                  .comm = nccl_chosen ? (ncclComm_t)&s : NULL};
    hvl_batch_kind k = {op, reduce_op, dtype, memory, 4096, prescale, postscale, even_rows};
    hvl_pset ps = {.size = nranks};
    return hvl__nccl_set_can_run(NULL, &ps, &s, &k);
}

void probe_host_key(char *out, int len) { host_key(out, (size_t)len); }

/* The plane's loader (the engine's, util/nccl_lib.c, with the library the engine was told):
 * NCCL's version code once every symbol was found, else -1 with why. */
int probe_load(char *why, int len)
{
    if (hvl__nccl_load(hvl__engine.params.nccl_lib) != HVL_OK) {
        snprintf(why, (size_t)len, "%s", hvl_last_error());
        return -1;
    }
    return hvl__nccl_version();
}
