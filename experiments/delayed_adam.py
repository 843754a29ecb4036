#!/usr/bin/env python3
"""Delayed-gradient Adam in plain PyTorch 1.13, independent of pipefb.

pipefb-async's weight semantics are W[k+1] = W[k] - Adam(grad f(W[k-1])): every forward
of iteration k runs on the weights of one update earlier (tests/runtime:
PipelineAsync.WeightsFollowTheAsynchronousSemantics checks the runtime against exactly
this). This script trains the default config's model (VGG16 layout at width 1/8,
Fashion-MNIST padded to 32 px, batch 64, Adam) with and without that delay, so that what
async_convergence.sh measures can be told apart from a runtime bug.

  build/pipefb-python experiments/delayed_adam.py sync  300 1e-3
  build/pipefb-python experiments/delayed_adam.py delay 300 1e-3 [--bn]
  build/pipefb-python experiments/delayed_adam.py predict 937 3e-4 --bn
Modes: sync (no delay), delay (the gradient at W[k-1]), predict (at W[k-1] + (W[k-1] - W[k-2]),
what pipeline.weight_prediction=linear does). Options to test remedies: --warmup N (linear lr
warm-up), --clip C (gradient-norm clipping), --beta1 B, --sgd MOMENTUM (SGD instead of Adam),
--dc L (DC-ASGD delay compensation), --delayed-layers N (delay only a prefix of the modules).
Prints the training loss every 25 iterations (one batch, so it is noisy) and the test accuracy
at the end.
"""
import argparse
import gzip
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["sync", "delay", "predict"])
ap.add_argument("iterations", type=int)
ap.add_argument("lr", type=float)
ap.add_argument("--bn", action="store_true", help="batch norm after every conv (vgg16_bn)")
ap.add_argument("--warmup", type=int, default=0, help="linear learning-rate warm-up steps")
ap.add_argument("--clip", type=float, default=0, help="clip the gradient norm to this (0: off)")
ap.add_argument("--beta1", type=float, default=0.9)
ap.add_argument("--delayed-layers", type=int, default=-1,
                help="delay only the parameters of the first N modules (a stage prefix; -1: all)")
ap.add_argument("--sgd", type=float, default=0, help="SGD with this momentum instead of Adam")
ap.add_argument("--dc", type=float, default=0,
                help="delay compensation (DC-ASGD): g + dc * g*g*(W[k] - W[k-1]) (0: off)")
ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
args = ap.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)


def idx(name, offset):
    path = [f for f in os.listdir(args.data) if name in f][0]
    with gzip.open(os.path.join(args.data, path)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def images(name):
    x = torch.tensor(idx(name, 16).reshape(-1, 1, 28, 28)).float() / 255
    return F.pad((x - 0.2860) / 0.3530, (2, 2, 2, 2))


X_test, Y_test = images("t10k-images"), torch.tensor(idx("t10k-labels", 8)).long()
X = torch.tensor(idx("train-images", 16).reshape(-1, 1, 28, 28)).float() / 255
Y = torch.tensor(idx("train-labels", 8)).long()
X = F.pad((X - 0.2860) / 0.3530, (2, 2, 2, 2))
layers, c = [], 1
for v in [8, 8, "M", 16, 16, "M", 32, 32, 32, "M", 64, 64, 64, "M", 64, 64, 64, "M"]:
    if v == "M":
        layers.append(nn.MaxPool2d(2))
    else:
        layers += [nn.Conv2d(c, v, 3, padding=1)] + ([nn.BatchNorm2d(v)] if args.bn else []) + [nn.ReLU()]
        c = v
model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(64 * 49, 512), nn.ReLU(),
                      nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = (torch.optim.SGD(model.parameters(), args.lr, momentum=args.sgd) if args.sgd else
       torch.optim.Adam(model.parameters(), args.lr, betas=(args.beta1, 0.999)))
warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / args.warmup) if args.warmup else 1.0)
params = list(model.parameters())
n_delayed = len(params) if args.delayed_layers < 0 else len(list(model[:args.delayed_layers].parameters()))
previous = [p.detach().clone() for p in params]  # W[k-1]
before = [p.detach().clone() for p in params]  # W[k-2]
gen = torch.Generator().manual_seed(0)
for k in range(args.iterations):
    batch = torch.randint(0, X.shape[0], (64,), generator=gen)
    current = [p.detach().clone() for p in params]  # W[k]
    with torch.no_grad():
        if args.mode == "predict":  # W[k-1] + (W[k-1] - W[k-2]): the last update repeated
            for p, w, b in zip(params, previous, before):
                p.copy_(2 * w - b)
        else:
            for i, (p, w, c) in enumerate(zip(params, previous, current)):
                p.copy_(w if args.mode == "delay" and i < n_delayed else c)
    loss = F.cross_entropy(model(X[batch]), Y[batch])
    opt.zero_grad()
    loss.backward()  # the gradient at the forward's weights ...
    with torch.no_grad():
        for p, w in zip(params, current):
            p.copy_(w)
    if args.dc and args.mode != "sync":
        with torch.no_grad():
            for p, w, c in zip(params, previous, current):
                p.grad.add_(args.dc * p.grad * p.grad * (c - w))
    if args.clip:
        nn.utils.clip_grad_norm_(params, args.clip)
    opt.step()  # ... applied to W[k]
    warm.step()
    before, previous = previous, current
    if k % 25 == 0 or k == args.iterations - 1:
        print(f"{args.mode}{' bn' if args.bn else ''} lr {args.lr} iteration {k} loss {loss.item():.4f}", flush=True)
model.eval()
with torch.no_grad():
    correct = sum(int((model(X_test[i:i + 1000]).argmax(1) == Y_test[i:i + 1000]).sum()) for i in range(0, 10000, 1000))
print(f"{args.mode}{' bn' if args.bn else ''} lr {args.lr} test accuracy {correct / 10000:.4f}", flush=True)
