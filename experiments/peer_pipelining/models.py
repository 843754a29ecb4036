"""The models both sides train (issue 35), as Python modules whose top-level children are
pipefb's layers: pipefb trains them as TorchScript (Note [TorchScript models]), torch's
pipelining as the modules themselves, from the same weights.

  gpt2-tiny      pipefb's GPT-2 tiny sizes: vocabulary 256, 64 tokens, 128 dims, 4 heads,
                 2 blocks (python/examples/tiny_gpt.py, without dropout): 4 layers
  vgg16-quarter  VGG16 at width 1/4 on 32 px, 10 classes, layered as pipefb's zoo: each
                 convolution with its ReLU (and pooling), then the three classifier layers
                 (the pool and flatten with the first): 16 layers
  resnet50-eighth  ResNet50 (torchvision's v1.5 bottlenecks, BatchNorm) at width 1/8 on
                 32 px, 10 classes, layered as pipefb's zoo: the stem, the 16 bottlenecks and
                 the head (pool, flatten, fc): 18 layers
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


class Bottleneck(nn.Module):
    """torchvision's v1.5 bottleneck: the stride on the 3x3 convolution."""

    def __init__(self, cin, planes, stride):
        super().__init__()
        out = planes * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out)
        self.down = (nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                     if stride != 1 or cin != out else nn.Identity())

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        return torch.relu(self.bn3(self.conv3(y)) + self.down(x))


def resnet50_eighth():
    torch.manual_seed(0)
    w = 8  # 64 / 8
    layers = [("stem", nn.Sequential(nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w),
                                     nn.ReLU(), nn.MaxPool2d(3, 2, 1)))]
    cin = w
    for g, (blocks, planes, stride) in enumerate([(3, w, 1), (4, 2 * w, 2), (6, 4 * w, 2),
                                                   (3, 8 * w, 2)]):
        for b in range(blocks):
            layers.append((f"layer{g + 1}_{b}", Bottleneck(cin, planes, stride if b == 0 else 1)))
            cin = planes * 4
    layers.append(("head", nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1),
                                         nn.Linear(cin, 10))))
    return nn.Sequential(collections.OrderedDict(layers))


MODELS = {
    # name: (builder, sample shape, input dtype, classes)
    "gpt2-tiny": (gpt2_tiny, [64], torch.long, 256),
    "vgg16-quarter": (vgg16_quarter, [3, 32, 32], torch.float32, 10),
    "resnet50-eighth": (resnet50_eighth, [3, 32, 32], torch.float32, 10),
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
