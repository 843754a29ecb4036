#!/usr/bin/env python3
"""Write a model as a TorchScript chain that pipefb trains (model.name: torchscript).

pipefb partitions a module's top-level children, run one after another (Note [TorchScript
models] in include/pipefb/model/Model.h). This writes such a module with torch.jit.script
and prints the config keys that train it.

  # a torchvision model, as a chain of its natural blocks (a ResNet's stem, each block and
  # its head; VGG's convolutions and classifier layers); model.pt loads back into
  # torchvision's own class with strict=True
  pipefb_export.py torchvision resnet50 --num-classes 10 --sample-shape 3,32,32 -o resnet50.pt

  # your own nn.Sequential (or a module whose children run in order), from a function
  pipefb_export.py module my_models:make_net --sample-shape 128 -o net.pt

Needs torch (and torchvision for the first form) only.
"""
import argparse
import collections
import importlib
import os
import sys

import torch
from torch import nn


def chain(blocks):
    """blocks: (child name, state_dict key prefix, [(name, module), ...]). Each block is an
    nn.Sequential of the named modules, so its keys are prefix + name + parameter."""
    top = nn.Sequential(
        collections.OrderedDict(
            (name, nn.Sequential(collections.OrderedDict(mods))) for name, _, mods in blocks
        )
    )
    # The helper's own state_dict keys are the original module's: pipefb reads them here.
    top.pipefb_key_prefixes = [prefix for _, prefix, _ in blocks]
    return top


def resnet_blocks(m):
    blocks = [("stem", "", [("conv1", m.conv1), ("bn1", m.bn1), ("relu", m.relu),
                            ("maxpool", m.maxpool)])]
    for stage in ("layer1", "layer2", "layer3", "layer4"):
        for i, block in enumerate(getattr(m, stage)):
            # A one-module block whose prefix is the block's own key: "layer1.0".
            blocks.append((f"{stage}_{i}", stage, [(str(i), block)]))
    blocks.append(("head", "", [("avgpool", m.avgpool), ("flatten", nn.Flatten(1)),
                                ("fc", m.fc)]))
    return blocks


def vgg_blocks(m):
    blocks, current = [], []
    for i, layer in enumerate(m.features):
        if isinstance(layer, nn.Conv2d) and current:
            blocks.append((f"features_{current[0][0]}", "features", current))
            current = []
        current.append((str(i), layer))
    blocks.append((f"features_{current[0][0]}", "features", current))
    cls = list(m.classifier)
    # The pool and the flatten of VGG.forward go with the first linear layer.
    first = [("avgpool", m.avgpool), ("flatten", nn.Flatten(1)),
             ("classifier", nn.Sequential(collections.OrderedDict(
                 (str(i), cls[i]) for i in range(0, 3))))]
    blocks.append(("classifier_0", "", first))
    blocks.append(("classifier_3", "classifier", [(str(i), cls[i]) for i in range(3, 6)]))
    blocks.append(("classifier_6", "classifier", [("6", cls[6])]))
    return blocks


def torchvision_chain(name, num_classes, dropout, **extra):
    import torchvision

    kwargs = dict(extra, num_classes=num_classes)
    if name.startswith("vgg"):
        kwargs["dropout"] = dropout
    m = getattr(torchvision.models, name)(weights=None, **kwargs)
    if name.startswith("resnet") or name.startswith("resnext") or name.startswith("wide_resnet"):
        return m, chain(resnet_blocks(m))
    if name.startswith("vgg"):
        return m, chain(vgg_blocks(m))
    sys.exit(f"pipefb_export.py: no block split known for torchvision's {name}; "
             "write it as an nn.Sequential and use the 'module' form")


def user_module(spec):
    if ":" not in spec:
        sys.exit(f"pipefb_export.py: module: '{spec}' is not MODULE:FUNCTION")
    mod, fn = spec.split(":", 1)
    sys.path.insert(0, os.getcwd())
    m = getattr(importlib.import_module(mod), fn)()
    if not isinstance(m, nn.Module):
        sys.exit(f"pipefb_export.py: {spec} returned a {type(m).__name__}, not an nn.Module")
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=["torchvision", "module"])
    ap.add_argument("what", help="a torchvision model name (resnet50, vgg16), or MODULE:FUNCTION")
    ap.add_argument("--sample-shape", required=True,
                    help="one sample's shape without the batch, e.g. 3,32,32 or 128")
    ap.add_argument("--input-dtype", default="float32", choices=["float32", "float64", "int64"],
                    help="float64 also writes the model in double precision (to check a "
                         "pipeline against float64 autograd)")
    ap.add_argument("--num-classes", type=int, default=1000, help="torchvision: its classes")
    ap.add_argument("--dropout", type=float, default=0.0, help="torchvision VGG: its dropout")
    ap.add_argument("--seed", type=int, default=0, help="torch.manual_seed before building")
    ap.add_argument("--state-dict", help="also write the original module's state_dict here")
    ap.add_argument("-o", "--out", required=True, help="the TorchScript file to write")
    a = ap.parse_args()
    try:
        shape = [int(d) for d in a.sample_shape.split(",")]
    except ValueError:
        sys.exit(f"pipefb_export.py: --sample-shape: '{a.sample_shape}' is not sizes like 3,32,32")
    torch.manual_seed(a.seed)
    if a.kind == "torchvision":
        original, net = torchvision_chain(a.what, a.num_classes, a.dropout)
    else:
        original = net = user_module(a.what)
    net.train()
    if a.input_dtype == "float64":
        net.double()
    dtype = {"int64": torch.long, "float64": torch.float64}.get(a.input_dtype, torch.float32)
    if dtype == torch.long:
        x = torch.zeros([2] + shape, dtype=dtype)
    else:
        x = torch.randn([2] + shape, dtype=dtype)
    with torch.no_grad():
        net.eval()
        y = net(x)
        net.train()
    classes = y.shape[-1]
    if a.kind == "torchvision":
        # The chain's keys are the original's (pipefb_key_prefixes).
        assert len(net.state_dict()) == len(original.state_dict())
    scripted = torch.jit.script(net)
    tmp = a.out + ".tmp"
    torch.jit.save(scripted, tmp)
    os.replace(tmp, a.out)  # atomic
    if a.state_dict:
        torch.save(original.state_dict(), a.state_dict)
    print(f"# {a.out}: {len(list(net.children()))} children, "
          f"{sum(p.numel() for p in net.parameters())} parameters")
    print("model:")
    print("  name: torchscript")
    print(f"  path: {a.out}")
    print(f"  sample_shape: [{', '.join(str(d) for d in shape)}]")
    print(f"  input_dtype: {a.input_dtype}")
    print(f"  num_classes: {classes}")


if __name__ == "__main__":
    main()
