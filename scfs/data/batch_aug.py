"""Batched DINO multi-crop: all views of a whole batch with a handful of tensor ops, on CPU or CUDA.

Per-sample torchvision v2 transforms cost ~9 ms/sample on our CPUs (as much as the model step) and cap GPU
training at ~2,500 img/s. ``BatchMultiCrop`` takes a uint8 (B,3,H,W) batch (say, collated raw images moved to
the GPU) and returns the layout of ``default_collate`` over ``MultiCrop`` outputs, so the training code
cannot tell them apart. Parameters are drawn per sample on the images' device from an optional generator.
It also takes a list of uint8 (C,H,W) images of different sizes (files decoded on the device,
``data.decode=gpu``): boxes are drawn per image size and all images are cut from one packed canvas
(``pack_images``), still one roi_align per view size.

Semantics follow ``MultiCrop`` op by op (crop -> resize -> flip -> jitter -> grayscale -> blur -> solarize ->
normalise), with these deliberate differences:

* Resize is ``torchvision.ops.roi_align(aligned=True, sampling_ratio=-1)`` on the whole image instead of crop
  then antialiased bilinear resize. Adaptive sampling takes ceil(box/out) bilinear samples per output bin
  and axis: upscaling gets one sample at the bin centre (= bilinear, align_corners=False, what
  ``F.resize`` does), downscaling averages ~scale x scale samples (a box prefilter of the bin's width,
  slightly less smooth than torchvision's triangle antialias filter, but alias-free enough). A fixed
  ``sampling_ratio=2`` would blur upscaled local crops and alias at large downscales (ImageNet -> 96 px).
  Pixels next to the box edge interpolate with the true neighbours outside the box, not a clamped edge.
* Colour jitter uses the fixed order brightness -> contrast -> saturation -> hue (torchvision draws a random
  permutation per call; per-sample permutations would need 24 code paths or 4 gathers per op). The four
  factors are drawn per sample from the same ranges as ``v2.ColorJitter``; each op uses torchvision's
  functional float formula. Hue is a per-sample shift in HSV via a vectorised rgb->hsv->rgb (same formulas
  as torchvision's, which follow Pillow) rather than a YIQ rotation, so hue shifts match torchvision.
* Everything runs in float32 on [0, 1]: torchvision's uint8 path rounds/truncates to uint8 after the resize
  and after every colour op (up to a few /255 of drift); here nothing is quantised. Solarize uses the
  threshold 0.5, which equals uint8 ``>= 128`` on 8-bit values.
* Blur is separable (two grouped conv1d-style passes, per-sample kernels, reflect padding) instead of
  torchvision's 2-D kernel: same result up to float rounding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as tnf
from torchvision.ops import roi_align

from scfs.data.multicrop import IMAGENET_MEAN, IMAGENET_STD, MultiCrop

# Luma weights of torchvision's rgb_to_grayscale (ITU-R 601-2, as in Pillow).
_LUMA = (0.2989, 0.587, 0.114)

# Column layout of the per-(view, sample) uniform draws: one torch.rand call feeds every random decision.
_N_TRIES = 10  # RandomResizedCrop.get_params tries 10 (area, ratio) candidates before its fallback
_U_AREA, _U_RATIO = 0, _N_TRIES  # 10 columns each
_U_TOP, _U_LEFT, _U_FLIP, _U_JIT, _U_GRAY, _U_BLUR, _U_SIGMA, _U_SOL = range(2 * _N_TRIES, 2 * _N_TRIES + 8)
_U_FACT = 2 * _N_TRIES + 8  # 4 columns: brightness, contrast, saturation, hue
_N_UNIFORM = _U_FACT + 4


@dataclasses.dataclass
class BatchAugParams:
    """Per-(view, sample) parameters of one ``BatchMultiCrop`` call; every tensor is (V, B, ...).

    Split from ``forward`` so tests can check each op against torchvision per sample, and so the same draw
    can be replayed on another device.
    """

    boxes: torch.Tensor  # (V,B,4) int64 x0, y0, x1, y1 (x1/y1 exclusive), original pixels
    flip: torch.Tensor  # (V,B) bool
    jitter: torch.Tensor  # (V,B) bool: colour jitter applied
    factors: torch.Tensor  # (V,B,4) float32 brightness, contrast, saturation, hue (identity when unused)
    gray: torch.Tensor  # (V,B) bool
    blur: torch.Tensor  # (V,B) bool
    sigma: torch.Tensor  # (V,B) float32 blur sigma in output pixels
    solarize: torch.Tensor  # (V,B) bool

    def to(self, device: torch.device | str) -> BatchAugParams:
        return BatchAugParams(**{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)})


def _grayscale(x: torch.Tensor) -> torch.Tensor:
    """(N,3,h,w) -> (N,1,h,w) luma, torchvision's weights, no rounding."""
    r, g, b = x.unbind(1)
    return (r * _LUMA[0] + g * _LUMA[1] + b * _LUMA[2]).unsqueeze(1)


def _shift_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """torchvision's ``adjust_hue`` (rgb -> hsv, h += shift mod 1, hsv -> rgb; Pillow's formulas) for
    (N,3,h,w) floats in [0,1] with a per-sample (N,1,1,1) shift, in fewer passes.

    A hue shift keeps v = max and the span max - min = v*s, so hsv -> rgb reduces to channel n =
    v - span * clamp(min(k, 4 - k), 0, 1) with k = (n + 6h') mod 6, n = 5, 3, 1 for r, g, b: the branch-free
    form of the sextant table torchvision gathers from. Equal to torchvision up to float rounding (~1e-6)."""
    r, g, b = x.unbind(1)
    maxc, minc = x.amax(1), x.amin(1)
    span = maxc - minc
    # 6h * span, with Pillow's precedence r > g > b for the max channel; span == 0 -> any h (grey stays grey)
    h6 = torch.where(maxc == r, g - b, torch.where(maxc == g, (b - r).add_(span, alpha=2.0),
                                                    (r - g).add_(span, alpha=4.0)))
    h6 = h6.div_(torch.where(span == 0, torch.ones_like(span), span)).unsqueeze(1)
    n = torch.arange(5.0, 0.0, -2.0, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)  # 5, 3, 1; no H2D copy
    k = (h6 + n).add_(shift * 6.0).remainder_(6.0)
    k = torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0)
    return (maxc.unsqueeze(1) - span.unsqueeze(1) * k).clamp_(0.0, 1.0)


def _gaussian_kernels(sigma: torch.Tensor, k: int, enabled: torch.Tensor) -> torch.Tensor:
    """(N,k) 1-D Gaussian kernels exactly as torchvision's ``_get_gaussian_kernel1d`` (softmax over
    -(x/sigma)^2 on linspace(+-(k-1)/(2 sqrt 2))); a delta for samples that are not blurred (exact no-op)."""
    lim = (k - 1) / (2.0 * math.sqrt(2.0))
    x = torch.linspace(-lim, lim, steps=k, dtype=torch.float32, device=sigma.device)
    kern = torch.softmax(-(x / sigma[:, None]).pow(2), dim=1)
    delta = torch.zeros(k, dtype=torch.float32, device=sigma.device)
    delta[k // 2] = 1.0
    return torch.where(enabled[:, None], kern, delta)


def _blur(x: torch.Tensor, kern: torch.Tensor) -> torch.Tensor:
    """Separable per-sample blur with reflect padding: (N,3,h,w) and (N,k) kernels -> (N,3,h,w).

    The batch is folded into channels (1, N*3, h, w) so one grouped conv (groups=N*3) per axis applies every
    sample's own kernel."""
    n, c, h, w = x.shape
    if n == 0:
        return x
    k = kern.shape[1]
    p = k // 2
    y = tnf.pad(x, (p, p, p, p), mode="reflect").reshape(1, n * c, h + 2 * p, w + 2 * p)
    wk = kern.repeat_interleave(c, dim=0)  # (N*3, k)
    y = tnf.conv2d(y, wk.view(n * c, 1, k, 1), groups=n * c)  # vertical
    y = tnf.conv2d(y, wk.view(n * c, 1, 1, k), groups=n * c)  # horizontal
    return y.view(n, c, h, w)


class BatchMultiCrop(torch.nn.Module):
    """Vectorised ``MultiCrop`` over a batch: two global + ``n_local`` local views, their boxes and flips.

    ``forward(images uint8 (B,3,H,W) or (B,1,H,W), generator=None)`` -> ``dict(views=[(B,3,s,s)] * V,
    boxes=(B,V,4) float32 (x0,y0,x1,y1) original pixels before flip, flips=(B,V) bool)``, i.e. the layout of
    ``default_collate([MultiCrop(...)(img) for img in images])``, on the images' device. Arguments, defaults
    and validation are ``MultiCrop``'s (validation is delegated to it); ``dtype`` is the views' dtype.
    See the module docstring for the semantic differences.
    """

    def __init__(self, global_size: int = 64, local_size: int = 32, n_local: int = 6,
                 global_scale: Sequence[float] = (0.25, 1.0), local_scale: Sequence[float] = (0.05, 0.25),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), flip_p: float = 0.5,
                 jitter: Sequence[float] = (0.4, 0.4, 0.2, 0.1), jitter_p: float = 0.8, gray_p: float = 0.2,
                 blur_p: Sequence[float] = (1.0, 0.1, 0.5), blur_sigma: Sequence[float] = (0.1, 2.0),
                 blur_ref_size: int | None = 224, solarize_p: float = 0.2,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        # Delegate validation to MultiCrop: the same errors, ranges and blur kernels by construction.
        spec = MultiCrop(global_size, local_size, n_local, global_scale, local_scale, ratio, flip_p, jitter,
                         jitter_p, gray_p, blur_p, blur_sigma, blur_ref_size, solarize_p, mean, std)
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating point dtype, got {dtype}")
        self.global_size, self.local_size, self.n_local = spec.global_size, spec.local_size, spec.n_local
        self.global_scale, self.local_scale, self.ratio = spec.global_scale, spec.local_scale, spec.ratio
        self.flip_p, self.jitter_p, self.gray_p = spec.flip_p, spec.jitter_p, spec.gray_p
        self.blur_p, self.solarize_p = spec.blur_p, spec.solarize_p
        self.mean, self.std = spec.mean, spec.std
        self.dtype = dtype
        self._consts: dict[tuple[str, str], torch.Tensor] = {}  # per-device constants: one H2D copy, ever
        self._finish_compiled: Any = None  # `compile_finish`: the per-pixel ops as compiled graphs
        self.cpu_block = 2**18  # floats per block of per-pixel work on the CPU (1 MiB: about an L2)
        j = spec._jitter  # v2.ColorJitter: each range is None when that component is disabled
        self.jitter_ranges: list[tuple[float, float] | None] = [
            None if r is None else (float(r[0]), float(r[1]))
            for r in (j.brightness, j.contrast, j.saturation, j.hue)
        ]
        # size -> (odd kernel size, (sigma_lo, sigma_hi)), as MultiCrop.blur_for_size picks them
        self.blur_specs: dict[int, tuple[int, tuple[float, float]]] = {
            s: (int(b.kernel_size[0]), (float(b.sigma[0]), float(b.sigma[1])))
            for s, b in ((spec.global_size, spec._blur_global), (spec.local_size, spec._blur_local))
        }

    @property
    def n_views(self) -> int:
        return 2 + self.n_local

    def _view_table(self) -> tuple[list[int], list[tuple[float, float]], list[float], list[float]]:
        """Per view: output size, scale range, blur probability, solarize probability (MultiCrop's specs)."""
        sizes = [self.global_size] * 2 + [self.local_size] * self.n_local
        scales = [self.global_scale] * 2 + [self.local_scale] * self.n_local
        blur_p = [self.blur_p[0], self.blur_p[1]] + [self.blur_p[2]] * self.n_local
        sol_p = [0.0, self.solarize_p] + [0.0] * self.n_local
        return sizes, scales, blur_p, sol_p

    def _const(self, name: str, values: Sequence[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A small constant tensor on ``device``, made once: ``torch.tensor(..., device=cuda)`` every step would
        be a blocking host-to-device copy (a host sync) per call."""
        key = (name, str(device))
        t = self._consts.get(key)
        if t is None:
            t = self._consts[key] = torch.tensor(list(values), dtype=dtype).to(device)
        return t

    def sample_params(self, batch: int, height: int | torch.Tensor, width: int | torch.Tensor,
                      device: torch.device | str = "cpu", generator: torch.Generator | None = None,
                      global_batch: int | None = None, offset: int = 0) -> BatchAugParams:
        """Draw every view's parameters for ``batch`` images of ``height`` x ``width`` with one ``torch.rand``
        on ``device`` (no host sync): crops follow ``RandomResizedCrop.get_params`` (10 candidates, first
        valid one, else its centre-crop fallback).

        ``height`` / ``width`` are one size for the whole batch (ints) or one per image ((B,) tensors on
        ``device``: a batch of decoded files of different sizes, ``data.decode=gpu``); the draw is the same,
        so image i's box is the one a batch of images of image i's size would get.

        DDP: with ``global_batch`` (images of the step over all ranks) the draw is made for the whole global
        batch and rows ``offset:offset+batch`` are kept, so rank r of a 2 x B run gets exactly the parameters
        of images r*B..(r+1)*B-1 of the 1 x 2B run with the same generator state (the draw is V x G x 36
        numbers: negligible)."""
        device = torch.device(device)
        sizes, scales, blur_p, sol_p = self._view_table()
        v = len(sizes)
        f64 = dict(dtype=torch.float64, device=device)
        g = batch if global_batch is None else int(global_batch)
        if not 0 <= offset <= g - batch:
            raise ValueError(f"offset={offset} + batch={batch} exceeds global_batch={g}")
        u = torch.rand((v, g, _N_UNIFORM), generator=generator, **f64)
        if g != batch:
            u = u[:, offset:offset + batch]

        def col(values: Sequence[float], name: str) -> torch.Tensor:  # per-view constant over (V, B, ...)
            return self._const(name, values, torch.float64, device).view(v, 1, 1)

        lo, hi = col([s[0] for s in scales], "scale_lo"), col([s[1] for s in scales], "scale_hi")
        if isinstance(height, torch.Tensor) or isinstance(width, torch.Tensor):  # one size per image: (1, B)
            hh = torch.as_tensor(height, **f64).reshape(-1).expand(batch).reshape(1, batch)
            ww = torch.as_tensor(width, **f64).reshape(-1).expand(batch).reshape(1, batch)
            h3, w3 = hh[..., None], ww[..., None]  # against the (V, B, tries) candidates
            area: float | torch.Tensor = h3 * w3
            fw, fh = self._fallback_size(hh, ww)
        else:
            hh, ww, h3, w3 = height, width, height, width
            area = float(height * width)
            fw, fh = (float(v) for v in self._fallback_size(height, width))
        target = area * (lo + (hi - lo) * u[..., _U_AREA:_U_AREA + _N_TRIES])
        lr0, lr1 = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = torch.exp(lr0 + (lr1 - lr0) * u[..., _U_RATIO:_U_RATIO + _N_TRIES])
        w_try = torch.round(torch.sqrt(target * aspect))  # round half to even, like Python's round()
        h_try = torch.round(torch.sqrt(target / aspect))
        ok = (w_try > 0) & (w_try <= w3) & (h_try > 0) & (h_try <= h3)
        first = ok.to(torch.uint8).argmax(-1, keepdim=True)  # index of the first valid candidate
        found = ok.any(-1)
        w = torch.where(found, w_try.gather(-1, first).squeeze(-1), fw)
        h = torch.where(found, h_try.gather(-1, first).squeeze(-1), fh)
        top = torch.minimum(torch.floor(u[..., _U_TOP] * (hh - h + 1)), hh - h)
        left = torch.minimum(torch.floor(u[..., _U_LEFT] * (ww - w + 1)), ww - w)
        top = torch.where(found, top, torch.div(hh - h, 2, rounding_mode="floor"))
        left = torch.where(found, left, torch.div(ww - w, 2, rounding_mode="floor"))
        boxes = torch.stack((left, top, left + w, top + h), -1).to(torch.int64)

        jit = u[..., _U_JIT] < self.jitter_p
        ident = (1.0, 1.0, 1.0, 0.0)
        facts = []
        for i, rng in enumerate(self.jitter_ranges):
            uf = u[..., _U_FACT + i]
            val = uf.new_full(uf.shape, ident[i]) if rng is None else rng[0] + (rng[1] - rng[0]) * uf
            facts.append(torch.where(jit, val, ident[i]))
        factors = torch.stack(facts, -1).to(torch.float32)

        s_lo = col([self.blur_specs[s][1][0] for s in sizes], "sigma_lo")[..., 0]
        s_hi = col([self.blur_specs[s][1][1] for s in sizes], "sigma_hi")[..., 0]
        sigma = (s_lo + (s_hi - s_lo) * u[..., _U_SIGMA]).to(torch.float32)
        return BatchAugParams(
            boxes=boxes, flip=u[..., _U_FLIP] < self.flip_p, jitter=jit, factors=factors,
            gray=u[..., _U_GRAY] < self.gray_p, blur=u[..., _U_BLUR] < col(blur_p, "blur_p")[..., 0], sigma=sigma,
            solarize=u[..., _U_SOL] < col(sol_p, "sol_p")[..., 0],
        )

    def _fallback_size(self, height: Any, width: Any) -> tuple[Any, Any]:
        """(w, h) of RandomResizedCrop's centre-crop fallback, clamped to the allowed aspect ratios; ints, or
        float64 tensors for per-image sizes (same rounding: half to even, as Python's round)."""
        if isinstance(height, torch.Tensor):
            in_ratio = width / height
            fw = torch.where(in_ratio > max(self.ratio), torch.round(height * max(self.ratio)), width)
            fh = torch.where(in_ratio < min(self.ratio), torch.round(width / min(self.ratio)), height)
            return fw, fh
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            return width, int(round(width / min(self.ratio)))
        if in_ratio > max(self.ratio):
            return int(round(height * max(self.ratio))), height
        return width, height

    def compile_finish(self, **kwargs: Any) -> None:
        """Run the per-pixel ops and the normalisation of the views (`_finish_normalised`) as
        ``torch.compile(..., **kwargs)`` graphs, one per view size: eagerly they are ~90 small kernels per size, each
        dispatched from the host of a step that is often host-bound; compiled, a few fused ones. On the CPU this
        replaces the cache-sized blocks of the eager path by whole stacks."""
        self._finish_compiled = torch.compile(self._finish_normalised, **kwargs)

    @contextlib.contextmanager
    def eager_finish(self) -> Iterator[None]:
        """Views made inside run the per-pixel ops eagerly even when they are compiled (`compile_finish`): a run
        whose helper process compiles these graphs meanwhile makes its first batch's views this way instead of
        compiling them itself (`scfs.training.compile_child`). The same values up to float rounding."""
        compiled, self._finish_compiled = self._finish_compiled, None
        try:
            yield
        finally:
            self._finish_compiled = compiled

    @property
    def finish_compiled(self) -> bool:
        """Whether the per-pixel ops run as compiled graphs (`compile_finish`)."""
        return self._finish_compiled is not None

    def _finish_normalised(self, y: torch.Tensor, q: dict[str, torch.Tensor], blur: bool, solarize: bool,
                           shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """`_finish` on all samples at once (a delta kernel for the unblurred ones: static shapes, no host sync),
        then ``(z - mean) / std`` in ``self.dtype``."""
        return torch.addcmul(shift, self._finish(y, q, blur, solarize, subset_blur=False), scale).to(self.dtype)

    def _finish(self, y: torch.Tensor, q: dict[str, torch.Tensor], blur: bool, solarize: bool,
                subset_blur: bool | None = None) -> torch.Tensor:
        """Flip, jitter (fixed order b -> c -> s -> h), grayscale, blur and solarize the (N,3,s,s) crops ``y``
        with per-sample parameters ``q`` (flat (N,...) tensors, broadcast as (N,1,1,1)). Ops the config
        disables (probability 0, jitter component 0; blur/solarize for this view group) are skipped.
        ``subset_blur`` (default: on the CPU) blurs only the chosen samples; otherwise every sample is convolved,
        the unchosen ones with a delta kernel (the same values)."""
        def bc(t: torch.Tensor) -> torch.Tensor:
            return t.view(-1, 1, 1, 1)

        y = torch.where(bc(q["flip"]), y.flip(-1), y)
        if self.jitter_p > 0:
            fb, fc, fs, fh = (bc(q["factors"][:, i]) for i in range(4))
            if self.jitter_ranges[0] is not None:
                y = (y * fb).clamp_(0.0, 1.0)
            if self.jitter_ranges[1] is not None:
                m = _grayscale(y).mean(dim=(1, 2, 3), keepdim=True)
                y = torch.lerp(m, y, fc).clamp_(0.0, 1.0)  # c*y + (1-c)*mean
            if self.jitter_ranges[2] is not None:
                y = torch.lerp(_grayscale(y), y, fs).clamp_(0.0, 1.0)
            if self.jitter_ranges[3] is not None:
                y = torch.where(bc(q["jitter"]), _shift_hue(y, fh), y)  # the hsv round trip is not bit-exact
        if self.gray_p > 0:
            y = torch.where(bc(q["gray"]), _grayscale(y).expand_as(y), y)
        if blur:
            k = self.blur_specs[y.shape[-1]][0]
            on, sigma = q["blur"], q["sigma"]
            if subset_blur is None:
                subset_blur = y.device.type == "cpu"
            if subset_blur:  # blur only the chosen samples: saves ~half the conv work, and a
                sub = on.nonzero().squeeze(1)  # data-dependent index costs no device sync on the CPU
                y = y.index_copy(0, sub, _blur(y[sub], _gaussian_kernels(sigma[sub], k, on[sub])))
            else:  # all samples, a delta kernel for the unchosen ones: no host sync, static shapes
                y = _blur(y, _gaussian_kernels(sigma, k, on))
        if solarize:
            y = torch.where(bc(q["solarize"]) & (y >= 0.5), 1.0 - y, y)
        return y

    def apply(self, images: torch.Tensor | Sequence[torch.Tensor], params: BatchAugParams) -> dict[str, Any]:
        """Render the views of ``params`` from a uint8 (B,C,H,W) batch, or a list of B uint8 (C,H,W) images of
        different sizes (packed into one canvas, ``pack_images``): one roi_align per view size, then the
        per-pixel ops on the (n_views*B,3,s,s) stack of that size.

        On the CPU the ~40 per-pixel passes run on blocks of ~``cpu_block`` floats so that they stay in
        cache instead of streaming 100 MB float stacks (ImageNet sizes) from DRAM each time: 1.6x faster
        at 224 px, neutral at 32 px. Elsewhere the whole stack is one block (fewest kernel launches)."""
        packed = not isinstance(images, torch.Tensor)
        if packed:  # one canvas of 0..255 floats; each image's boxes shifted to where it lies in the canvas
            x, origin = pack_images(images)
            b = len(images)
            idx = torch.zeros(b, dtype=torch.float32, device=x.device)
            shift = origin.repeat(1, 2)  # (B,4): x, y, x, y
        else:
            x = _as_float_batch(images)
            b = x.shape[0]
            idx = torch.arange(b, dtype=torch.float32, device=x.device)
            shift = None
        sizes, _, blur_p, sol_p = self._view_table()
        views: list[torch.Tensor] = []
        for sel in _size_runs(sizes):
            s, n = sizes[sel.start], sel.stop - sel.start
            boxes = params.boxes[sel].to(torch.float32)
            if shift is not None:
                boxes = boxes + shift
            rois = torch.cat((idx.repeat(n)[:, None], boxes.reshape(-1, 4)), 1)
            y = roi_align(x, rois, output_size=(s, s), spatial_scale=1.0, sampling_ratio=-1, aligned=True)
            if packed:
                y = y.mul_(1.0 / 255.0)
            views += self._finish_group(y, params, sel, blur=max(blur_p[sel]) > 0, solarize=max(sol_p[sel]) > 0)
        return {"views": views, "boxes": params.boxes.transpose(0, 1).to(torch.float32).contiguous(),
                "flips": params.flip.transpose(0, 1).contiguous()}

    def _finish_group(self, y: torch.Tensor, params: BatchAugParams, sel: slice, blur: bool,
                      solarize: bool) -> list[torch.Tensor]:
        """The per-pixel ops and the normalisation of one run of equal-size views: ``y`` (n*B,3,s,s) float on
        [0, 1], view-major, with the parameters of views ``sel``; returns n views (B,3,s,s) of ``self.dtype``."""
        nb, _, s, _ = y.shape
        b = params.flip.shape[1]
        std = self._const("std", self.std, torch.float32, y.device).view(1, 3, 1, 1)
        scale = 1.0 / std
        shift = -self._const("mean", self.mean, torch.float32, y.device).view(1, 3, 1, 1) * scale
        q = {f: getattr(params, f)[sel].flatten(0, 1)
             for f in ("flip", "jitter", "factors", "gray", "blur", "sigma", "solarize")}
        if self._finish_compiled is not None:
            out = self._finish_compiled(y, q, blur, solarize, shift, scale)
            return list(out.view(nb // b, b, 3, s, s).unbind(0))
        out = torch.empty((nb, 3, s, s), dtype=self.dtype, device=y.device)
        step = max(1, self.cpu_block // (3 * s * s)) if y.device.type == "cpu" else nb
        for i in range(0, nb, step):  # blocks of samples, not a loop over samples
            blk = slice(i, i + step)
            z = self._finish(y[blk], {k: v[blk] for k, v in q.items()}, blur=blur, solarize=solarize)
            out[blk] = torch.addcmul(shift, z, scale)  # (z - mean) / std in one pass, cast to dtype
        return list(out.view(nb // b, b, 3, s, s).unbind(0))

    def colour(self, views: Sequence[torch.Tensor], generator: torch.Generator | None = None,
               global_batch: int | None = None, offset: int = 0) -> dict[str, Any]:
        """Finish views cropped elsewhere (``MultiCropGeometry`` in DataLoader workers, ``data.colour_on_device``):
        flip, colour jitter, grayscale, blur, solarize and normalise the uint8 (B,3,s,s) views of every view
        slot at once, with per-sample parameters drawn as in ``forward`` (``global_batch`` / ``offset``: DDP).
        Returns ``dict(views=[(B,3,s,s) self.dtype], flips=(B,V) bool)``."""
        sizes, _, blur_p, sol_p = self._view_table()
        if len(views) != len(sizes) or any(
                v.dtype != torch.uint8 or v.ndim != 4 or v.shape[1] != 3 or tuple(v.shape[-2:]) != (sz, sz)
                for v, sz in zip(views, sizes)):
            got = [f"{tuple(v.shape)} {v.dtype}" for v in views]
            raise ValueError(f"colour() needs {len(sizes)} uint8 views (B,3,s,s) with sizes {sizes} (2 global + "
                             f"{self.n_local} local, as MultiCropGeometry makes them), got {got}: the crops config "
                             "of the data loader and of the module must be the same")
        b = views[0].shape[0]
        params = self.sample_params(b, sizes[0], sizes[0], views[0].device, generator, global_batch, offset)
        out: list[torch.Tensor] = []
        for sel in _size_runs(sizes):
            y = torch.stack(list(views[sel])).flatten(0, 1).to(torch.float32).mul_(1.0 / 255.0)
            out += self._finish_group(y, params, sel, blur=max(blur_p[sel]) > 0, solarize=max(sol_p[sel]) > 0)
        return {"views": out, "flips": params.flip.transpose(0, 1).contiguous()}

    def forward(self, images: torch.Tensor | Sequence[torch.Tensor], generator: torch.Generator | None = None,
                global_batch: int | None = None, offset: int = 0) -> dict[str, Any]:
        """All views of a uint8 (B,3,H,W) batch, or of a list of uint8 (C,H,W) images of different sizes on one
        device (decoded files, ``data.decode=gpu``: boxes drawn per image size, in that image's pixels);
        parameters drawn on the images' device from ``generator`` (``global_batch`` / ``offset``: this rank's
        rows of a DDP step's draw, see ``sample_params``)."""
        if not isinstance(images, torch.Tensor):
            imgs = list(images)
            _check_image_list(imgs)
            device = imgs[0].device
            # image sizes are host metadata: one small host-to-device copy, no sync on the device's work
            hw = torch.tensor([tuple(im.shape[-2:]) for im in imgs], dtype=torch.float64).to(device, non_blocking=True)
            params = self.sample_params(len(imgs), hw[:, 0], hw[:, 1], device, generator, global_batch, offset)
            return self.apply(imgs, params)
        _check_batch(images)
        b, _, h, w = images.shape
        return self.apply(images, self.sample_params(b, h, w, images.device, generator, global_batch, offset))

    def extra_repr(self) -> str:
        return (f"global={self.global_size}x2 {self.global_scale}, local={self.local_size}x{self.n_local} "
                f"{self.local_scale}, dtype={self.dtype}")


def _size_runs(sizes: Sequence[int]) -> list[slice]:
    """Runs of equal view sizes: contiguous in MultiCrop's order (globals, then locals), one stack per run."""
    runs, start = [], 0
    while start < len(sizes):
        stop = start
        while stop < len(sizes) and sizes[stop] == sizes[start]:
            stop += 1
        runs.append(slice(start, stop))
        start = stop
    return runs


def _check_batch(images: torch.Tensor) -> None:
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"expected a (B,3,H,W) or (B,1,H,W) image batch, got {type(images).__name__} "
                         f"{tuple(getattr(images, 'shape', ()))}")
    if images.dtype != torch.uint8:
        raise ValueError(f"expected a uint8 image batch, got {images.dtype}")


def _check_image_list(images: Sequence[torch.Tensor]) -> None:
    if not images:
        raise ValueError("expected a non-empty list of (3,H,W) or (1,H,W) uint8 images")
    for im in images:
        if not isinstance(im, torch.Tensor) or im.ndim != 3 or im.shape[0] not in (1, 3) or im.dtype != torch.uint8:
            raise ValueError(f"expected (3,H,W) or (1,H,W) uint8 images, got {type(im).__name__} "
                             f"{tuple(getattr(im, 'shape', ()))} {getattr(im, 'dtype', '')}")
        if im.device != images[0].device:
            raise ValueError(f"images on different devices: {im.device} and {images[0].device}")


def pack_images(images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Images of different sizes as one float32 (1,3,Hc,Wc) canvas of 0..255 values, so that one ``roi_align``
    per view size crops the whole batch (roi_align wants one (N,C,H,W) input; padding every image to the
    largest one would cost memory in proportion to the largest image times the batch).

    Shelf packing (tallest first) into a canvas about as wide as it is tall. Each image gets a one-pixel
    border that repeats its edge pixels: bilinear samples within half a pixel of an image edge then read
    the edge pixel, exactly as roi_align's clamping does on the image alone, never a neighbour's pixels.
    Returns the canvas and the (B,2) float32 (x, y) of each image's top-left pixel in the canvas, on the
    images' device. Large canvases put the coordinates in the thousands, where float32 has ~1e-4 px of
    resolution: at most ~1e-4 of a pixel step of interpolation error."""
    sizes = [(int(im.shape[-2]) + 2, int(im.shape[-1]) + 2) for im in images]
    width = max(max(w for _, w in sizes), math.ceil(math.sqrt(sum(h * w for h, w in sizes))))
    origin: list[tuple[int, int]] = [(0, 0)] * len(images)
    x = y = shelf = 0
    for i in sorted(range(len(images)), key=lambda k: -sizes[k][0]):
        h, w = sizes[i]
        if x + w > width:
            x, y, shelf = 0, y + shelf, 0
        origin[i] = (x + 1, y + 1)
        x, shelf = x + w, max(shelf, h)
    device = images[0].device
    canvas = torch.zeros((1, 3, y + shelf, width), dtype=torch.float32, device=device)
    for im, (ox, oy) in zip(images, origin):
        h, w = im.shape[-2:]
        src = im.as_subclass(torch.Tensor).expand(3, -1, -1)[None].to(torch.float32)
        canvas[0, :, oy - 1:oy + h + 1, ox - 1:ox + w + 1] = tnf.pad(src, (1, 1, 1, 1), mode="replicate")[0]
    return canvas, torch.tensor(origin, dtype=torch.float32).to(device, non_blocking=True)


def _as_float_batch(images: torch.Tensor) -> torch.Tensor:
    """uint8 (B,C,H,W), any memory format -> contiguous float32 (B,3,H,W) in [0,1]: roi_align needs floats."""
    _check_batch(images)
    x = images.as_subclass(torch.Tensor).to(torch.float32).div_(255.0)
    return (x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x).contiguous()
