"""Synthetic training throughput with hvlite: Horovod's pytorch_synthetic_benchmark, drop-in.

    hvlrun -np 2 python examples/pytorch_synthetic_benchmark.py                   # ResNet-50
    hvlrun -np 2 python examples/pytorch_synthetic_benchmark.py --model resnet --num-iters 5
    hvlrun -np 4 python examples/pytorch_synthetic_benchmark.py --fp16-allreduce  # on GPUs

Horovod's flags (--model, --batch-size, --num-warmup-batches, --num-batches-per-iter,
--num-iters, --fp16-allreduce, --use-adasum, --no-cuda) and Horovod's lines: img/sec per device
for each iteration, their mean +- 1.96 standard deviations, and the total over all devices. Each
rank uses the GPU of its local rank (modulo the GPUs there are) when CUDA is available (unless
--no-cuda), else the CPU.

Models built here (torchvision's are used for any other name, when torchvision is installed):
  resnet50  ResNet-50 (3-4-6-3 bottleneck blocks, widths 64-512 times 4) on 224x224 images, 1000
          classes: 161 parameter tensors, 25.6 M parameters, torchvision's layout — the default;
  resnet  ResNet-34 layout (3-4-6-3 basic blocks, widths 16-128) on 32x32 images: 110 parameter
          tensors, 1.3 M parameters — many small gradients, where fusion matters;
  mlp     5 fully connected layers of width 1024: 10 parameter tensors, 4.2 M parameters — few
          large gradients, where bandwidth matters.
``--json`` prints one JSON line instead: samples/s over all ranks, each rank's from its median
iteration (bench/torch_training.py runs it with --num-batches-per-iter 1: the median step).
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def shortcut(cin, cout, stride):
    """The residual path's projection where the shape changes (None: identity)."""
    if stride == 1 and cin == cout:
        return None
    return torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                               torch.nn.BatchNorm2d(cout))


class Block(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.short = shortcut(cin, cout, stride)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.short(x) if self.short is not None else x))


class ResNet(torch.nn.Module):
    def __init__(self, layers=(3, 4, 6, 3), widths=(16, 32, 64, 128), classes=10):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                        torch.nn.BatchNorm2d(widths[0]), torch.nn.ReLU())
        blocks, cin = [], widths[0]
        for i, (n, w) in enumerate(zip(layers, widths)):
            for j in range(n):
                blocks.append(Block(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w
        self.blocks = torch.nn.Sequential(*blocks)
        self.fc = torch.nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))


class Bottleneck(torch.nn.Module):
    """1x1 down to `width`, 3x3 (carrying the stride), 1x1 up to 4 x `width`, plus the shortcut."""

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = 4 * width
        self.conv1 = torch.nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(width)
        self.conv2 = torch.nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(width)
        self.conv3 = torch.nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = torch.nn.BatchNorm2d(cout)
        self.short = shortcut(cin, cout, stride)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.short(x) if self.short is not None else x))


class ResNet50(torch.nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False),
                                        torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
                                        torch.nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for i, (n, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
            for j in range(n):
                blocks.append(Bottleneck(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = 4 * width
        self.blocks = torch.nn.Sequential(*blocks)
        self.fc = torch.nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))


BUILT_HERE = ("resnet50", "resnet", "mlp")


def build(name):
    """(model, input batch maker) for a model name: one built here, else torchvision's."""
    if name == "resnet50":
        return ResNet50(), lambda b: (torch.randn(b, 3, 224, 224), torch.randint(0, 1000, (b,)))
    if name == "resnet":
        return ResNet(), lambda b: (torch.randn(b, 3, 32, 32), torch.randint(0, 10, (b,)))
    if name == "mlp":
        layers = []
        for _ in range(4):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(1024, 10))
        return model, lambda b: (torch.randn(b, 1024), torch.randint(0, 10, (b,)))
    try:
        from torchvision import models
    except ImportError:
        raise SystemExit("unknown model %r: built here are %s; any other needs torchvision"
                         % (name, ", ".join(BUILT_HERE)))
    if not callable(getattr(models, name, None)):
        raise SystemExit("unknown model %r: neither built here (%s) nor in torchvision.models"
                         % (name, ", ".join(BUILT_HERE)))
    return getattr(models, name)(), \
        lambda b: (torch.randn(b, 3, 224, 224), torch.randint(0, 1000, (b,)))


def step_times(model, optimizer, batch, iters, warmup, per_iter=1):
    """Seconds of each of `iters` timed iterations of `per_iter` training steps, after `warmup`
    steps. On a GPU each iteration ends with a synchronize, so it times the work, not the launch."""
    x, y = batch
    cuda = x.is_cuda

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        for _ in range(per_iter):
            step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return times


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50",
                   help="resnet50, resnet, mlp, or any torchvision model (default resnet50)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank (default 32)")
    p.add_argument("--num-warmup-batches", type=int, default=10,
                   help="steps before timing (default 10)")
    p.add_argument("--num-batches-per-iter", type=int, default=10,
                   help="steps in one timed iteration (default 10)")
    p.add_argument("--num-iters", type=int, default=10, help="timed iterations (default 10)")
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="send gradients as float16 (hvd.Compression.fp16)")
    p.add_argument("--use-adasum", action="store_true",
                   help="reduce with Adasum instead of averaging (power-of-2 ranks)")
    p.add_argument("--no-cuda", action="store_true", help="train on the CPU even with a GPU")
    p.add_argument("--json", action="store_true", help="print one JSON line (for bench/)")
    args = p.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    return args


def main():
    args = parse_args()
    import hvlite.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    if args.cuda:
        # One GPU per rank; with more ranks than GPUs they share (hvlite stages their buffers).
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    else:
        torch.set_num_threads(1)  # ranks share the cores: one thread each, no oversubscription
    device = torch.device("cuda" if args.cuda else "cpu")
    model, make_batch = build(args.model)
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    batch = tuple(t.to(device) for t in make_batch(args.batch_size))
    if hvd.rank() == 0 and not args.json:
        print("Model: %s\nBatch size: %d\nNumber of %ss: %d\nRunning benchmark..."
              % (args.model, args.batch_size, "GPU" if args.cuda else "CPU", hvd.size()), flush=True)
    times = step_times(model, optimizer, batch, args.num_iters, args.num_warmup_batches,
                       args.num_batches_per_iter)
    samples = args.batch_size * args.num_batches_per_iter
    # Every rank's rate for each iteration, summed over ranks once timing is over.
    rates = hvd.allreduce(torch.tensor([samples / t for t in times], dtype=torch.float64),
                          op=hvd.Sum, name="benchmark.rates")
    median = hvd.allreduce(torch.tensor(samples / statistics.median(times), dtype=torch.float64),
                           op=hvd.Sum, name="benchmark.median")
    if hvd.rank() != 0:
        return
    if args.json:
        print(json.dumps({"runner": "hvlite", "model": args.model, "ranks": hvd.size(),
                          "samples_per_s": median.item(),
                          "parameter_tensors": sum(1 for _ in model.parameters())}))
        return
    unit = "GPU" if args.cuda else "CPU"
    per_device = [r / hvd.size() for r in rates.tolist()]
    for i, r in enumerate(per_device):
        print("Iter #%d: %.1f img/sec per %s" % (i, r, unit))
    mean = statistics.fmean(per_device)
    conf = 1.96 * (statistics.stdev(per_device) if len(per_device) > 1 else 0.0)
    print("Img/sec per %s: %.1f +-%.1f" % (unit, mean, conf))
    print("Total img/sec on %d %s(s): %.1f +-%.1f" % (hvd.size(), unit, hvd.size() * mean,
                                                     hvd.size() * conf))


if __name__ == "__main__":
    main()
