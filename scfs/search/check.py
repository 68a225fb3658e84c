"""Correctness harness: every available backend against a float64 reference, forward and all gradients.

Fresh random inputs per run (seed printed), shapes/dtypes/modes swept, raw and centred (``centre=True``), outputs
NaN-poisoned before each call, bitwise-identical reruns, batch invariance, zero-norm pixels/queries, NaN propagation.
The CUDA backend runs under each weighting-pass order asked for (``--weighting tiled|chunked|both``, default
both; see ``scfs.search.cuda_backend.set_weighting``); with both, every case is also run forward under the chunked
order at several chunk/block sizes and must match the tiled order bitwise.
Usage: ``python -m scfs.search.check [--quick] [--backends cuda,triton] [--weighting both] [--shapes vit]``;
exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from scfs.search import buffers, feature_search
from scfs.search.api import kernel_unavailable_reason
from scfs.search.centre import centre_inputs
from scfs.search.reference import reference_search, topk_count

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}
TOPK, TEMPERATURE, EPS = 0.3, 0.5, 1e-6  # EPS: feature_search's default
# hard mode: similarities this close to the k-th largest (float64) may rank either way in a kernel's float32
# arithmetic; a selection is wrong only when it keeps a position clearly below, or drops one clearly above
TIE_BAND = 1e-4


@dataclass(frozen=True)
class Case:
    n: int
    b: int
    c: int
    h: int
    w: int
    dtype: torch.dtype = torch.float32
    mode: str = "soft"
    proj: int = 0
    channels_last: bool = False
    centre: bool = False

    def __str__(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        cl = ",cl" if self.channels_last else ""
        centred = " centred" if self.centre else ""
        return f"N{self.n} B{self.b} C{self.c} {self.h}x{self.w} {dt} {self.mode} proj{self.proj}{cl}{centred}"


def gpu_cases() -> list[Case]:
    """The GPU sweep: ResNet-50-like stages, non-tile sizes, N 1..32, C 16..2048, all modes/dtypes."""
    cases = []
    shapes = [
        (8, 4, 512, 28, 28),
        (8, 4, 1024, 14, 14),
        (8, 4, 2048, 7, 7),
        (3, 2, 48, 13, 7),
        (1, 1, 16, 1, 1),
        (32, 2, 64, 5, 9),
        (17, 3, 200, 13, 13),
        (2, 1, 96, 64, 64),
    ]
    for s in shapes:
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            cases.append(Case(*s, dtype=dt))
        for mode in ("hard", "softmax"):
            cases.append(Case(*s, mode=mode))
        cases.append(Case(*s, proj=64))
        cases.append(Case(*s, dtype=torch.bfloat16, proj=256, mode="hard"))
        cases.append(Case(*s, channels_last=True, dtype=torch.bfloat16))
        for mode in ("soft", "hard", "softmax"):
            cases.append(Case(*s, mode=mode, centre=True))
        cases.append(Case(*s, dtype=torch.bfloat16, proj=64, centre=True))
        cases.append(Case(*s, dtype=torch.float16, channels_last=True, centre=True))
    return cases


def cpu_cases() -> list[Case]:
    """Small shapes for the Triton interpreter on the CPU."""
    return [
        Case(3, 2, 40, 5, 7),
        Case(2, 1, 16, 1, 1),
        Case(3, 2, 40, 5, 7, mode="hard", proj=24),
        Case(2, 2, 33, 3, 5, mode="softmax", channels_last=True),
        Case(3, 2, 40, 5, 7, dtype=torch.bfloat16),
        Case(17, 1, 20, 2, 3, dtype=torch.float16, proj=8),
        Case(3, 2, 40, 5, 7, centre=True),
        Case(3, 2, 40, 5, 7, mode="hard", proj=24, centre=True),
        Case(2, 2, 33, 3, 5, mode="softmax", channels_last=True, centre=True),
        Case(3, 2, 40, 5, 7, dtype=torch.bfloat16, proj=8, centre=True),
    ]


def vit_cases(device_type: str) -> list[Case]:
    """ViT token maps as the search gets them: C = 192 / 384 / 768 (ViT-Ti / S / B), patch grids 7x7 to 14x14
    (224 px at patch 32 / 16, 32 px at patch 4), N = 10 local views (DINO's ViT recipe) on the GPU. The CPU set
    keeps the widths and grids with fewer views, for the Triton interpreter."""
    if device_type != "cuda":
        return [Case(2, 1, 192, 8, 8), Case(2, 1, 384, 14, 14, dtype=torch.bfloat16),
                Case(2, 1, 768, 7, 7, mode="hard", proj=32), Case(3, 1, 384, 14, 14, mode="softmax", proj=16)]
    cases = []
    for s in ((10, 4, 192, 8, 8), (10, 4, 384, 14, 14), (10, 4, 768, 14, 14), (10, 4, 384, 7, 7), (6, 2, 384, 11, 9)):
        cases += [Case(*s), Case(*s, dtype=torch.bfloat16), Case(*s, mode="hard", proj=96),
                  Case(*s, dtype=torch.bfloat16, mode="softmax", proj=384)]
    return cases


def make_inputs(case: Case, device: torch.device, gen: torch.Generator):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    fmt = torch.channels_last if case.channels_last else torch.contiguous_format
    feats = rnd(case.b, case.c, case.h, case.w)
    if case.centre:  # post-ReLU-like: a shared positive mean direction, what centring is for
        feats = feats.relu() + 2.0
    feats = feats.to(case.dtype).contiguous(memory_format=fmt)
    queries = rnd(case.n, case.b, case.c).to(case.dtype)
    weight = (rnd(case.proj, case.c) / case.c**0.5).to(case.dtype) if case.proj else None
    return feats, queries, weight


def _relerr(got: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _run(backend, feats, queries, weight, mode, grads, mask=None, centre=False):
    """Outputs and input gradients of one call; backend "reference" (float64 inputs) may take a hard `mask`."""
    ins = [t.detach().requires_grad_(True) if t is not None else None for t in (feats, queries, weight)]
    if backend == "reference":
        out = reference_search(ins[0], ins[1], mode, ins[2], TOPK, TEMPERATURE, EPS, mask, centre=centre)
    else:
        out = feature_search(ins[0], ins[1], mode=mode, weight=ins[2], topk=TOPK, temperature=TEMPERATURE,
                             backend=backend, centre=centre)
    live = [t for t in ins if t is not None]
    loss = sum((o.double() * g).sum() for o, g in zip(out, grads))
    return out, torch.autograd.grad(loss, live)


def hard_selection_problems(sim: torch.Tensor, kept: torch.Tensor, topk: float, band: float = TIE_BAND) -> list[str]:
    """What is wrong with a kernel's hard-mode selection `kept` (N,B,H,W bool) against the float64 similarity:
    a count other than ceil(topk*H*W) per map, or a position outside the tie band on the wrong side of the k-th
    largest value."""
    n, b, h, w = sim.shape
    k = topk_count(topk, h * w)
    flat, keep = sim.reshape(n * b, h * w), kept.reshape(n * b, h * w)
    fails = []
    counts = keep.sum(-1)
    if not bool((counts == k).all()):
        fails.append(f"hard mode kept {sorted(set(counts.tolist()))} positions per map, not {k}")
    kth = flat.topk(k, dim=-1).values[:, -1:]
    if bool((keep & (flat < kth - band)).any()) or bool((~keep & (flat > kth + band)).any()):
        fails.append("hard mode kept a position clearly outside the top-k")
    return fails


def rounded_centred_similarity(feats: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """The float64 similarity of the centred map and queries as `centre_inputs` rounds them to their dtype (about
    1e-3 in bfloat16, ten times the tie band): what the kernels rank, so what a centred hard selection is judged on."""
    centred, q_centred, _ = centre_inputs(feats, queries)
    return reference_search(centred.double(), q_centred.double(), "hard", None, TOPK, TEMPERATURE, EPS)[1]


def check_case(backend: str, case: Case, device: torch.device, gen: torch.Generator) -> list[str]:
    """All checks of one case; returns failure messages (empty when it passes)."""
    feats, queries, weight = make_inputs(case, device, gen)
    fails: list[str] = []
    tol = TOL[case.dtype]
    ref_in = [t.double() if t is not None else None for t in (feats, queries, weight)]
    if case.channels_last:
        ref_in[0] = ref_in[0].contiguous(memory_format=torch.channels_last)
    probe = reference_search(ref_in[0], ref_in[1], case.mode, ref_in[2], TOPK, TEMPERATURE, EPS, centre=case.centre)
    grads = [torch.randn(t.shape, generator=gen, device=device, dtype=torch.float64) for t in probe]
    grads[0] = grads[0].to(case.dtype).double()
    buffers.POISON = True
    try:
        out, out_g = _run(backend, feats, queries, weight, case.mode, grads, centre=case.centre)
        out2, out2_g = _run(backend, feats, queries, weight, case.mode, grads, centre=case.centre)
    finally:
        buffers.POISON = False
    mask = None
    if case.mode == "hard":  # scored on the positions the kernel kept, once that choice is checked
        mask = out.weights.detach() != 0
        sim = rounded_centred_similarity(feats, queries) if case.centre else probe[1]
        fails += hard_selection_problems(sim, mask, TOPK)
    ref, ref_g = _run("reference", *ref_in, case.mode, grads, mask, centre=case.centre)
    names = ("features", "similarity", "weights")
    for name, got, want in zip(names, out, ref):
        err = _relerr(got, want)
        if not err <= tol:
            fails.append(f"{name} rel err {err:.2e} > {tol:.0e}")
    if out.features.dtype != case.dtype:
        fails.append(f"features dtype {out.features.dtype}")
    fmt = torch.channels_last if case.channels_last else torch.contiguous_format
    if not out.features.is_contiguous(memory_format=fmt):
        fails.append("features memory format differs from feats")
    for name, got, want in zip(("d_feats", "d_queries", "d_weight"), out_g, ref_g):
        err = _relerr(got, want)
        if not err <= 2 * tol:
            fails.append(f"{name} rel err {err:.2e} > {2 * tol:.0e}")
    for name, a, b in zip((*names, "d_feats", "d_queries", "d_weight"), (*out, *out_g), (*out2, *out2_g)):
        if not torch.equal(a, b):
            fails.append(f"{name} not bitwise identical across runs")
    if case.b > 1:  # batch invariance: image 1 alone gives what it gave inside the batch
        one, one_g = _run(
            backend,
            feats[1:2],
            queries[:, 1:2],
            weight,
            case.mode,
            [grads[0].view(case.n, case.b, *grads[0].shape[1:])[:, 1], grads[1][:, 1:2], grads[2][:, 1:2]],
            centre=case.centre,
        )
        full = out.features.view(case.n, case.b, *out.features.shape[1:])[:, 1]
        # batched cuBLAS may pick another algorithm for B=1, and torch's mean over positions (centring) may
        # vectorise differently with B, so those get a tolerance, not bitwise
        loose = bool(case.proj) or case.centre
        same = _relerr(one.features, full.double()) <= tol if loose else torch.equal(one.features, full)
        if not same:
            fails.append("batch invariance: features of image 1 differ when run alone")
        # kernels reduce in a B-independent order (bitwise); torch's row reductions (softmax backward) and
        # batched cuBLAS (projection) may vectorise differently with B, so those get fp32-rounding tolerance
        if loose:
            g_same = _relerr(one_g[0], out_g[0][1:2].double()) <= tol
        elif case.mode == "softmax":
            g_same = _relerr(one_g[0], out_g[0][1:2].double()) <= 1e-6
        else:
            g_same = torch.equal(one_g[0], out_g[0][1:2])
        if not g_same:
            fails.append("batch invariance: d_feats of image 1 differ when run alone")
    return fails


def check_special(backend: str, device: torch.device, gen: torch.Generator) -> list[str]:
    """Zero-norm pixels/queries stay finite (outputs and gradients); NaN in gives NaN out."""
    fails = []
    for dtype in (torch.float32, torch.bfloat16):
        feats, queries, _ = make_inputs(Case(3, 2, 40, 5, 7, dtype=dtype), device, gen)
        feats[0, :, 1, 2] = 0
        queries[1, 0] = 0
        f = feats.clone().requires_grad_(True)
        q = queries.clone().requires_grad_(True)
        for mode in ("soft", "hard", "softmax"):
            for centre in (False, True):
                out = feature_search(f, q, mode=mode, backend=backend, centre=centre)
                g = torch.autograd.grad(out.features.float().sum() + out.similarity.sum(), (f, q))
                if not all(torch.isfinite(t).all() for t in (*out, *g)):
                    fails.append(f"{dtype} {mode} centre={centre}: zero-norm inputs gave non-finite values")
        flat = torch.ones_like(f[:1]).requires_grad_(True)  # every position equals the mean: centred norm 0
        out = feature_search(flat, q[:, :1], backend=backend, centre=True)
        g = torch.autograd.grad(out.features.float().sum() + out.similarity.sum(), (flat,))
        if not all(torch.isfinite(t).all() for t in (*out, *g)):
            fails.append(f"{dtype}: a map equal to its mean gave non-finite centred values")
        f2 = feats.clone()
        f2[1, 3, 2, 4] = float("nan")
        out = feature_search(f2, queries, backend=backend)
        if not torch.isnan(out.features.view(3, 2, 40, 5, 7)[:, 1, :, 2, 4]).all():
            fails.append(f"{dtype}: NaN in feats did not give NaN out at that pixel")
        if torch.isnan(out.features.view(3, 2, 40, 5, 7)[:, 0]).any():
            fails.append(f"{dtype}: NaN leaked into another image")
    return fails


# chunked-order sizes the cross-check runs: those in force (defaults or SCFS_SEARCH_WEIGHT_*_KIB), one unit per
# chunk and the smallest blocks, and a chunk of a few units (a partial last chunk on most shapes)
CHUNKED_SIZES = ((None, None), (1.0, 1.0), (40.0, 4.0))


@contextlib.contextmanager
def weighting(order: str, chunk_kib: float | None = None, block_kib: float | None = None) -> Iterator[None]:
    """Run the CUDA backend's weighting pass in this order (and sizes; None keeps the size in force) inside the
    block, restoring the option after."""
    from scfs.search import cuda_backend

    before = (cuda_backend.WEIGHTING, cuda_backend.WEIGHT_CHUNK_KIB, cuda_backend.WEIGHT_BLOCK_KIB)
    cuda_backend.set_weighting(order, chunk_kib=chunk_kib, block_kib=block_kib)  # None: keep the size in force
    try:
        yield
    finally:
        cuda_backend.set_weighting(before[0], chunk_kib=before[1], block_kib=before[2])


def bitwise_difference(x: torch.Tensor, y: torch.Tensor) -> str:
    """'' when x and y have the same dtype, shape, strides and bits (NaN payloads included), else what differs."""
    if x.dtype != y.dtype or x.shape != y.shape or x.stride() != y.stride():
        return f"layout differs: {x.dtype} {tuple(x.shape)} {x.stride()} vs {y.dtype} {tuple(y.shape)} {y.stride()}"
    bits = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[x.element_size()]
    xb, yb = x.detach().contiguous().view(bits), y.detach().contiguous().view(bits)
    if torch.equal(xb, yb):
        return ""
    return f"differ in {int((xb != yb).sum())} of {x.numel()} elements"


def check_weighting_orders(case: Case, device: torch.device, gen: torch.Generator) -> list[str]:
    """CUDA forward under the chunked order (several chunk/block sizes) is bitwise identical to the tiled order:
    features, similarity and weights, outputs NaN-poisoned before each call."""
    feats, queries, weight = make_inputs(case, device, gen)
    fails: list[str] = []

    def fwd():
        with torch.no_grad():
            return feature_search(
                feats, queries, mode=case.mode, weight=weight, topk=TOPK, temperature=TEMPERATURE, backend="cuda"
            )

    buffers.POISON = True
    try:
        with weighting("tiled"):
            want = fwd()
        for chunk_kib, block_kib in CHUNKED_SIZES:
            with weighting("chunked", chunk_kib, block_kib):
                got = fwd()
            for name, x, y in zip(("features", "similarity", "weights"), got, want):
                why = bitwise_difference(x, y)
                if why:
                    fails.append(f"chunk {chunk_kib} KiB block {block_kib} KiB: {name} {why} (vs tiled)")
    finally:
        buffers.POISON = False
    return fails


def available(device: torch.device) -> list[str]:
    probe = torch.zeros(1, 16, 1, 1, device=device)
    qprobe = torch.zeros(1, 1, 16, device=device)
    return [b for b in ("cuda", "triton") if kernel_unavailable_reason(b, probe, qprobe) is None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backends", default="", help="comma list (default: all available)")
    ap.add_argument("--quick", action="store_true", help="first few cases only")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--special-only", action="store_true", help="only the zero-norm / NaN checks")
    ap.add_argument("--shapes", choices=("default", "vit", "all"), default="default",
                    help="default: the CNN sweep; vit: ViT token maps (C 192-768, 7x7-14x14 grids); all: both")
    from scfs.search import cuda_backend

    cuda_backend.add_weighting_argument(
        ap, "weighting-pass order(s) of the CUDA backend; both also cross-checks them bitwise")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device=device).manual_seed(seed)
    backends = args.backends.split(",") if args.backends else available(device)
    cases = gpu_cases() if device.type == "cuda" else cpu_cases()
    cases = {"default": cases, "vit": vit_cases(device.type), "all": cases + vit_cases(device.type)}[args.shapes]
    if args.quick:  # the first few raw cases and the first few centred ones
        cases = [c for c in cases if not c.centre][:6] + [c for c in cases if c.centre][:4]
    if args.special_only:
        cases = []
    orders = ("tiled", "chunked") if args.weighting == "both" else (args.weighting,)
    runs: list[tuple[str, str, str | None]] = []  # (label, backend, weighting order)
    for backend in backends:
        if backend == "cuda":
            runs += [("cuda" if o == "tiled" else f"cuda/{o}", backend, o) for o in orders]
        else:
            runs.append((backend, backend, None))
    print(f"seed={seed} device={device} backends={backends} weighting={orders} cases={len(cases)}", flush=True)
    n_fail = 0

    def report(label: str, what: str, fails: list[str]) -> None:
        nonlocal n_fail
        n_fail += bool(fails)
        tail = ": " + "; ".join(fails) if fails else ""
        print(f"{'FAIL' if fails else 'ok  '} {label:12s} {what}{tail}", flush=True)

    for label, backend, order in runs:
        with weighting(order) if order is not None else contextlib.nullcontext():
            if order is not None:
                from scfs.search import cuda_backend

                print(f"== {label}: weighting {cuda_backend.weighting()}", flush=True)
            for case in cases:
                report(label, str(case), check_case(backend, case, device, gen))
            report(label, "zero-norm/NaN", check_special(backend, device, gen))
    if "cuda" in backends and len(orders) == 2:
        for case in cases:
            report("cuda t==c", str(case), check_weighting_orders(case, device, gen))
    print(f"{n_fail} failing checks", flush=True)
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
