#!/usr/bin/python3
"""Delayed-gradient Adam in plain PyTorch 1.13, independent of pipefb.

pipefb-async's weight semantics are W[k+1] = W[k] - Adam(grad f(W[k-1])): every forward
of iteration k runs on the weights of one update earlier (tests/runtime:
PipelineAsync.WeightsFollowTheAsynchronousSemantics checks the runtime against exactly
this). This script trains the default config's model (VGG16 layout at width 1/8,
Fashion-MNIST padded to 32 px, batch 64, Adam) with and without that delay, so that what
async_convergence.sh measures can be told apart from a runtime bug.

  /usr/bin/python3 experiments/delayed_adam.py sync  300 1e-3
  /usr/bin/python3 experiments/delayed_adam.py delay 300 1e-3 [--bn]
Prints the training loss every 25 iterations (one batch, so it is noisy).
"""
import argparse
import gzip
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["sync", "delay"])
ap.add_argument("iterations", type=int)
ap.add_argument("lr", type=float)
ap.add_argument("--bn", action="store_true", help="batch norm after every conv (vgg16_bn)")
ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
args = ap.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)


def idx(name, offset):
    path = [f for f in os.listdir(args.data) if name in f][0]
    with gzip.open(os.path.join(args.data, path)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


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
opt = torch.optim.Adam(model.parameters(), args.lr)
params = list(model.parameters())
previous = [p.detach().clone() for p in params]  # W[k-1]
gen = torch.Generator().manual_seed(0)
for k in range(args.iterations):
    batch = torch.randint(0, X.shape[0], (64,), generator=gen)
    current = [p.detach().clone() for p in params]  # W[k]
    with torch.no_grad():
        for p, w in zip(params, previous if args.mode == "delay" else current):
            p.copy_(w)
    loss = F.cross_entropy(model(X[batch]), Y[batch])
    opt.zero_grad()
    loss.backward()  # the gradient at the forward's weights ...
    with torch.no_grad():
        for p, w in zip(params, current):
            p.copy_(w)
    opt.step()  # ... applied to W[k]
    previous = current
    if k % 25 == 0 or k == args.iterations - 1:
        print(f"{args.mode}{' bn' if args.bn else ''} lr {args.lr} iteration {k} loss {loss.item():.4f}", flush=True)
