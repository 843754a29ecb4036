#!/usr/bin/env python3
"""Python PyTorch eager baseline (torch 2.11, build/pipefb-python) for experiments/compare_baselines.sh.

The same VGG16 layout as pipefb's model zoo (src/model/Vision.cpp: torchvision's
configuration "D" without batch norm, channels scaled by --width and rounded, the
max-pools folded after each block's last conv, adaptive avg-pool 7x7, three linears
with ReLU and dropout), the same input shape, batch and optimizer as the pipefb run it
is compared with. Data is one fixed random batch (what bench_trainer does too), so the
numbers are the training step alone: zero_grad, forward, cross entropy, backward, step.

Prints one JSON line: step time median, samples/s, and the process's peak RSS
(getrusage; compare_baselines.sh also wraps it in /usr/bin/time -v).

  build/pipefb-python experiments/python_baseline.py --width 0.125 --batch 64 --steps 40
"""
import argparse
import json
import resource
import sys
import time

import torch
import torch.nn as nn


def scaled(base, width):
    return max(1, int(round(base * width)))


def vgg16(width, channels, num_classes, dropout):
    blocks = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]
    features = []
    c_in = channels
    for block in blocks:
        for out in block:
            out = scaled(out, width)
            features += [nn.Conv2d(c_in, out, 3, padding=1), nn.ReLU(inplace=True)]
            c_in = out
        features.append(nn.MaxPool2d(2, 2))
    hidden = scaled(4096, width)
    model = nn.Sequential(
        nn.Sequential(*features),
        nn.AdaptiveAvgPool2d((7, 7)),
        nn.Flatten(1),
        nn.Linear(c_in * 7 * 7, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout),
        nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout),
        nn.Linear(hidden, num_classes),
    )
    # torchvision's init (as pipefb's initTorchvision does for vgg16).
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01)
            nn.init.zeros_(m.bias)
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=float, default=0.125)
    p.add_argument("--input-size", type=int, default=32)
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--dropout", type=float, default=0.0)  # pipefb model.dropout default
    a = p.parse_args()
    if a.steps < 1 or a.batch < 1 or a.threads < 1:
        print("python_baseline.py: --steps, --batch and --threads must be >= 1", file=sys.stderr)
        sys.exit(2)

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = vgg16(a.width, a.channels, a.classes, a.dropout)
    model.train()
    if a.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    x = torch.randn(a.batch, a.channels, a.input_size, a.input_size)
    y = torch.randint(a.classes, (a.batch,))
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        step()
    times = []
    t_all = time.perf_counter()
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - t_all
    times.sort()
    med = times[len(times) // 2]
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({
        "impl": "python-pytorch-eager",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "width": a.width, "batch": a.batch, "steps": a.steps, "optimizer": a.optimizer,
        "params": sum(p.numel() for p in model.parameters()),
        "step_ms_median": med * 1e3,
        "samples_per_s_median": a.batch / med,
        "samples_per_s_mean": a.batch * a.steps / wall,
        "peak_rss_mib": rss_kib / 1024.0,
    }))


if __name__ == "__main__":
    main()
