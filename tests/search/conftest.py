"""Search-test fixtures. Triton must see TRITON_INTERPRET before any @triton.jit function is defined."""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def gen() -> torch.Generator:
    """A freshly seeded generator per test (seed printed on failure via the fixture value)."""
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    print(f"seed={seed}")
    return g


def loop_search(feats, queries, mode="soft", weight=None, topk=0.25, temperature=0.1, eps=1e-6):
    f = feats.double()
    q = queries.double()
    n_q, b_n = q.shape[:2]
    _, c, h, w = f.shape
    sim = torch.zeros(n_q, b_n, h, w, dtype=torch.float64)
    for n in range(n_q):
        for b in range(b_n):
            qn = q[n, b] / max(q[n, b].norm().item(), eps)
            for y in range(h):
                for x in range(w):
                    v = f[b, :, y, x]
                    sim[n, b, y, x] = (qn * v).sum() / max(v.norm().item(), eps)
    a = sim.clone()
    if mode == "hard":
        k = max(1, math.ceil(topk * h * w - 1e-9))
        for n in range(n_q):
            for b in range(b_n):
                vals = sorted(sim[n, b].flatten().tolist(), reverse=True)
                thr = vals[k - 1]
                a[n, b] = torch.where(sim[n, b] >= thr, sim[n, b], torch.zeros(()))
    elif mode == "softmax":
        for n in range(n_q):
            for b in range(b_n):
                e = torch.exp(sim[n, b] / temperature)
                a[n, b] = h * w * e / e.sum()
    g = f if weight is None else torch.nn.functional.conv2d(f, weight.double()[:, :, None, None])
    out = torch.zeros(n_q * b_n, g.shape[1], h, w, dtype=torch.float64)
    for n in range(n_q):
        for b in range(b_n):
            out[n * b_n + b] = a[n, b] * g[b]
    return out, sim, a


@pytest.fixture(name="loop_search")
def loop_search_fixture():
    """The slow float64 Python-loop oracle written from the published semantics."""
    return loop_search
