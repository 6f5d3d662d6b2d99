"""What the GPU benchmarks (gpu_allreduce.py, gpu_nccl.py) share: the sizes they run, the
grouped case, and a call's clock that covers the GPU work it queued."""
import torch

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]   # bytes of one tensor
GROUP = (160, 100 << 10)          # 160 tensors of 100 KiB, submitted as one group


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
