"""Synthetic training throughput with hvlite (Horovod's pytorch_synthetic_benchmark, on CPU).

    hvlrun -np 2 python examples/pytorch_synthetic_benchmark.py --model resnet --batch-size 32
    hvlrun -np 2 python examples/pytorch_synthetic_benchmark.py --model mlp --iters 30

Models (built here: torchvision does not import beside this torch build):
  resnet  ResNet-34 layout (3-4-6-3 basic blocks, widths 16-128) on 32x32 images: 110 parameter
          tensors, 1.3 M parameters — many small gradients, where fusion matters;
  mlp     5 fully connected layers of width 1024: 10 parameter tensors, 4.2 M parameters — few
          large gradients, where bandwidth matters;
  resnet50  ResNet-50 (3-4-6-3 bottleneck blocks, widths 64-512 times 4) on 224x224 images, 1000
          classes: 161 parameter tensors, 25.6 M parameters — the standard GPU benchmark.
Prints samples/s per rank and in total (median step time over --iters after --warmup steps).
``--json`` prints one JSON line instead (used by bench/torch_training.py).
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


def build(name):
    """(model, input batch maker) for a model name."""
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
    raise ValueError("unknown model %r (resnet, resnet50, mlp)" % name)


def step_times(model, optimizer, batch, iters, warmup):
    x, y = batch
    times = []
    for i in range(warmup + iters):
        t = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet", choices=["resnet", "resnet50", "mlp"])
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    import hvlite.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, make_batch = build(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    times = step_times(model, optimizer, make_batch(args.batch_size), args.iters, args.warmup)
    per_rank = args.batch_size / statistics.median(times)
    total = hvd.allreduce(torch.tensor(per_rank, dtype=torch.float64), op=hvd.Sum, name="rate").item()
    if hvd.rank() == 0:
        params = sum(1 for _ in model.parameters())
        if args.json:
            print(json.dumps({"runner": "hvlite", "model": args.model, "ranks": hvd.size(),
                              "samples_per_s": total, "parameter_tensors": params}))
        else:
            print("model %s (%d parameter tensors), batch %d per rank, %d ranks" %
                  (args.model, params, args.batch_size, hvd.size()))
            print("samples/s per rank: %.1f   total: %.1f" % (per_rank, total))


if __name__ == "__main__":
    main()
