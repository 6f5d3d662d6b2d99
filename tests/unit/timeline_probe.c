/* Test probe (tests/unit/test_timeline_single.py): records one NCCL batch's GPU phases on the
 * open timeline, with the hooks the engine's thread calls when such a batch ends
 * (hvl__tl_device_phases, hvl__tl_batch), so the drawing of the phases can be checked on a
 * machine without a GPU. Loaded after the engine (whose symbols it uses) was made global; the
 * engine must be idle meanwhile (the hooks are its thread's). */
#include <stdio.h>
#include <string.h>
#include "timeline.h"

/* A batch of `count` float32 tensors name.0, name.1, ... (100 elements each) that began
 * `began_ms` before now; phase_ms[i] is when (ms after its start) the GPU passed phase i's end,
 * 0 for unknown; left_running: it ran past its cycle (HVLITE_NCCL_OVERLAP). */
int probe_device_batch(const char *name, int count, double began_ms, const double *phase_ms, int left_running)
{
    hvl_entry entries[8], *list[8];
    char names[8][64];
    if (count < 1 || count > 8) return -1;
    memset(entries, 0, sizeof(entries));
    for (int i = 0; i < count; i++) {
        snprintf(names[i], sizeof(names[i]), "%s.%d", name, i);
        entries[i].d = (hvl_desc){.op = HVL_ALLREDUCE, .dtype = HVL_FLOAT32, .reduce_op = HVL_SUM, .ndim = 1,
                                  .shape = {100}, .prescale = 1.0, .postscale = 1.0,
                                  .memory = HVL_MEMORY_CUDA, .name = names[i]};
        list[i] = &entries[i];
    }
    hvl_batch b = {.op = HVL_ALLREDUCE, .dtype = HVL_FLOAT32, .reduce_op = HVL_SUM, .prescale = 1.0,
                   .postscale = 1.0, .memory = HVL_MEMORY_CUDA, .count = count, .entries = list,
                   .bytes = 400 * count, .backend = "nccl", .timed = 1, .left_running = left_running};
    double t0 = hvl__now() - began_ms * 1e-3, phases[4];
    for (int i = 0; i < 4; i++) phases[i] = phase_ms[i] > 0 ? t0 + phase_ms[i] * 1e-3 : 0;
    hvl__tl_device_phases(t0, phases);
    hvl__tl_batch(&b, t0, HVL_OK);
    return 0;
}
