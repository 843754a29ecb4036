"""A small GPT-like model written as a user would, for pipefb_export.py's 'module' form:

  build/pipefb-python python/pipefb_export.py module python.examples.tiny_gpt:make \
      --sample-shape 64 --input-dtype int64 -o tiny_gpt.pt

An nn.Sequential of an embedding, transformer blocks and a head: (B, T) token ids in,
(B, T, vocab) logits out. Dropout after attention and in the MLP (pipefb replays it in a
recompute: Note [Dropout streams]).
"""
import math

import torch
from torch import nn

VOCAB, T, DIM, HEADS, LAYERS, DROPOUT = 256, 64, 128, 4, 2, 0.1


class Embed(nn.Module):
    def __init__(self, vocab: int, dim: int, seq: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)

    def forward(self, idx):
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
                                 nn.Dropout(dropout))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    def __init__(self, dim: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, x):
        return self.out(self.ln(x))


def make():
    torch.manual_seed(0)
    layers = [("embed", Embed(VOCAB, DIM, T))]
    layers += [(f"block{i}", Block(DIM, HEADS, DROPOUT)) for i in range(LAYERS)]
    layers.append(("head", Head(DIM, VOCAB)))
    import collections
    return nn.Sequential(collections.OrderedDict(layers))
