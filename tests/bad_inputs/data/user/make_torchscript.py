#!/usr/bin/env python3
"""Writes the TorchScript files of tests/bad_inputs (cases 97 on): each breaks one rule of
Note [TorchScript models]. Run with the build's Python: build/pipefb-python THIS."""
import os

import torch
from torch import nn

here = os.path.dirname(os.path.abspath(__file__))


def save(module, name):
    torch.jit.save(torch.jit.script(module), os.path.join(here, name))


class NoChildren(nn.Module):
    def forward(self, x):
        return x * 2


class NotInOrder(nn.Module):  # its forward doubles what its children give
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x):
        return 2 * self.b(torch.relu(self.a(x)))


class Noisy(nn.Module):  # a random op other than dropout
    def forward(self, x):
        return x + 0.1 * torch.randn_like(x)


class AttentionWithDropout(nn.Module):  # dropout inside scaled_dot_product_attention
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(4, 12)

    def forward(self, x):
        q, k, v = self.qkv(x).unsqueeze(1).split(4, dim=2)
        y = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        return y.squeeze(1)[:, :2]


torch.manual_seed(0)
save(NoChildren(), "ts-no-children.pt")
save(nn.Sequential(nn.Linear(4, 8), nn.Linear(5, 2)), "ts-chain-break.pt")
save(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), "ts-good.pt")
save(NotInOrder(), "ts-not-in-order.pt")
tied = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
tied[2].weight = tied[0].weight
save(tied, "ts-tied.pt")
save(nn.Sequential(nn.Linear(4, 4), Noisy(), nn.Linear(4, 2)), "ts-random.pt")
save(nn.Sequential(AttentionWithDropout()), "ts-sdpa-dropout.pt")
