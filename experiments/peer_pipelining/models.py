"""The models both sides train (issue 35), as Python modules whose top-level children are
pipefb's layers: pipefb trains them as TorchScript (Note [TorchScript models]), torch's
pipelining as the modules themselves, from the same weights.

  gpt2-tiny      pipefb's GPT-2 tiny sizes: vocabulary 256, 64 tokens, 128 dims, 4 heads,
                 2 blocks (python/examples/tiny_gpt.py, without dropout): 4 layers
  vgg16-quarter  VGG16 at width 1/4 on 32 px, 10 classes, layered as pipefb's zoo: each
                 convolution with its ReLU (and pooling), then the three classifier layers
                 (the pool and flatten with the first): 16 layers
"""
import collections
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from python.examples import tiny_gpt  # noqa: E402


def gpt2_tiny():
    torch.manual_seed(0)
    layers = [("embed", tiny_gpt.Embed(256, 128, 64))]
    layers += [(f"block{i}", tiny_gpt.Block(128, 4, 0.0)) for i in range(2)]
    layers.append(("head", tiny_gpt.Head(128, 256)))
    return nn.Sequential(collections.OrderedDict(layers))


def vgg16_quarter():
    torch.manual_seed(0)
    blocks = [[16, 16], [32, 32], [64, 64, 64], [128, 128, 128], [128, 128, 128]]
    layers, cin = [], 3
    for b, widths in enumerate(blocks):
        for i, w in enumerate(widths):
            mods = [nn.Conv2d(cin, w, 3, padding=1), nn.ReLU()]
            if i + 1 == len(widths):
                mods.append(nn.MaxPool2d(2))
            layers.append((f"conv{b + 1}_{i + 1}", nn.Sequential(*mods)))
            cin = w
    layers.append(("fc6", nn.Sequential(nn.AdaptiveAvgPool2d(7), nn.Flatten(1),
                                        nn.Linear(cin * 49, 1024), nn.ReLU())))
    layers.append(("fc7", nn.Sequential(nn.Linear(1024, 1024), nn.ReLU())))
    layers.append(("fc8", nn.Sequential(nn.Linear(1024, 10))))
    return nn.Sequential(collections.OrderedDict(layers))


MODELS = {
    # name: (builder, sample shape, input dtype, classes)
    "gpt2-tiny": (gpt2_tiny, [64], torch.long, 256),
    "vgg16-quarter": (vgg16_quarter, [3, 32, 32], torch.float32, 10),
}


def batch(name, n, seed):
    _, shape, dtype, classes = MODELS[name]
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.long:
        x = torch.randint(0, classes, [n] + shape, generator=g)
        return x, torch.randint(0, classes, [n] + shape, generator=g)
    return torch.randn([n] + shape, generator=g), torch.randint(0, classes, (n,), generator=g)


def loss_fn(out, target):
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
