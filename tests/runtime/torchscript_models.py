#!/usr/bin/env python3
"""Test fixtures for tests/runtime/TorchScriptTest.cpp (Note [TorchScript models]).

  torchscript_models.py DIR

writes into DIR, with python/pipefb_export.py's own functions:
  seq.pt            a user's nn.Sequential with dropout (8x8 inputs, 5 classes)
  resnet50.pt       torchvision's resnet50 (10 classes) as the helper's chain, float32
  resnet50_f64.pt   the same in float64
  resnet50_ref.pt   {"x", "y", "grads32", "grads64"}: a batch of 8 (32 px) and the
                    gradients of torchvision's own module, in float32, in float64 and
                    in float32 under torch.autocast("cpu", dtype=torch.bfloat16) (grads_bf16),
                    summed over 2 microbatches of 4 as pipefb sums them (each
                    microbatch's mean loss x 4 / 8)
"""
import copy
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import pipefb_export  # noqa: E402


def grads(module, x, y, dtype, autocast=False):
    module.train()
    for xm, ym in zip(x.chunk(2), y.chunk(2)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = nn.functional.cross_entropy(module(xm.to(dtype)), ym) * (xm.shape[0] / x.shape[0])
        loss.backward()
    return {k: p.grad for k, p in module.named_parameters()}


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Dropout(0.3),
                        nn.Linear(48, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 5))
    torch.jit.save(torch.jit.script(seq), os.path.join(out, "seq.pt"))

    torch.manual_seed(1)
    # zero_init_residual: each block starts as its shortcut. With torchvision's default
    # init the model is chaotic at this size (BatchNorm over 4 samples of layer4's 1x1
    # maps): Python's own float32 gradients were 22% off its float64 ones at the worst
    # tensor; with it, 2e-5.
    original, net = pipefb_export.torchvision_chain("resnet50", 10, 0.0, zero_init_residual=True)
    torch.jit.save(torch.jit.script(net), os.path.join(out, "resnet50.pt"))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (8,), generator=g)
    g32 = grads(copy.deepcopy(original), x, y, torch.float32)
    gbf16 = grads(copy.deepcopy(original), x, y, torch.float32, autocast=True)
    net.double()  # the chain shares its modules with `original`: both are float64 now
    torch.jit.save(torch.jit.script(net), os.path.join(out, "resnet50_f64.pt"))
    g64 = grads(original, x, y, torch.float64)
    torch.save({"x": x, "y": y, "grads32": g32, "grads64": g64, "grads_bf16": gbf16},
               os.path.join(out, "resnet50_ref.pt"))


if __name__ == "__main__":
    main()
