"""What the GPU benchmarks (gpu_allreduce.py, gpu_nccl.py, step_overhead.py --device cuda)
share: this rank's GPU, the sizes they run, the grouped case, and a call's clock that covers the
GPU work it queued."""
import sys

import torch

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]   # bytes of one tensor
GROUP = (160, 100 << 10)          # 160 tensors of 100 KiB, submitted as one group


def rank_gpu(hvd):
    """This rank's GPU (local rank modulo the GPUs there are: ranks may share one), made
    current; on a machine where torch sees no GPU, exits saying so."""
    if not torch.cuda.is_available():
        sys.exit("%s needs a CUDA GPU, and torch sees none (torch %s, torch.cuda.is_available() "
                 "is False)" % (sys.argv[0], torch.__version__))
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def on_gpu(fn, device):
    """fn, then wait for the device: a call's time covers the GPU work it queued."""
    def call():
        fn()
        torch.cuda.synchronize(device)
    return call


def cases(device, max_bytes):
    """(label, tensors) per row: one float32 tensor per size up to max_bytes, then the group."""
    rows = [("allreduce", [torch.zeros(n // 4, device=device)]) for n in SIZES if n <= max_bytes]
    count, each = GROUP
    rows.append(("%d x %d KiB" % (count, each >> 10),
                 [torch.zeros(each // 4, device=device) for _ in range(count)]))
    return rows
