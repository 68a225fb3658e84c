"""BatchMultiCrop: layout as default_collate(MultiCrop), determinism, and each op against torchvision per sample."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch
import torchvision.transforms.v2.functional as F
from torch.utils.data import default_collate
from torchvision.transforms import v2

from scfs.data.batch_aug import BatchAugParams, BatchMultiCrop
from scfs.data.multicrop import MultiCrop, blur_for_size

OFF = dict(flip_p=0.0, jitter_p=0.0, gray_p=0.0, blur_p=(0.0, 0.0, 0.0), solarize_p=0.0, mean=(0.0, 0.0, 0.0),
           std=(1.0, 1.0, 1.0))  # geometry only, views in [0, 1]


def _images(b: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (b, 3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _smooth(b: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    """Low-frequency colour images (a few periods across the image): resampling filters then barely differ."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(h) / h, torch.arange(w) / w, indexing="ij")
    ph = torch.rand(b, 3, 2, 1, 1, generator=g) * 2 * math.pi
    img = 0.5 + 0.25 * torch.sin(2 * math.pi * 1.5 * xx + ph[:, :, 0]) + 0.2 * torch.cos(2 * math.pi * yy + ph[:, :, 1])
    return (img * 255).round().clamp(0, 255).to(torch.uint8)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _plain(p: BatchAugParams) -> BatchAugParams:
    """The same draw with every colour op switched off (and no flip)."""
    ident = torch.tensor([1.0, 1.0, 1.0, 0.0]).expand_as(p.factors).clone()
    no = torch.zeros_like(p.flip)
    return dataclasses.replace(p, flip=no, jitter=no, factors=ident, gray=no, blur=no, solarize=no)


def test_signature_and_defaults_match_multicrop() -> None:
    mine = dict(inspect.signature(BatchMultiCrop).parameters)
    assert mine.pop("dtype").default is torch.float32
    theirs = inspect.signature(MultiCrop).parameters
    assert [(k, v.default) for k, v in mine.items()] == [(k, v.default) for k, v in theirs.items()]


@pytest.mark.parametrize("bad", [
    dict(global_size=0), dict(n_local=-1), dict(global_scale=(0.5, 0.2)), dict(local_scale=(0.0, 0.3)),
    dict(ratio=(2.0, 1.0)), dict(flip_p=1.5), dict(jitter=(0.4, 0.4, 0.2)), dict(jitter=(0.4, 0.4, 0.2, 0.7)),
    dict(jitter_p=-0.1), dict(gray_p=2.0), dict(blur_p=(1.0, 0.1)), dict(blur_sigma=(2.0, 0.1)),
    dict(solarize_p=1.1), dict(std=(0.2, 0.0, 0.2)), dict(mean=(0.5, 0.5)),
])
def test_validation_errors_match_multicrop(bad: dict) -> None:
    with pytest.raises(ValueError) as theirs:
        MultiCrop(**bad)
    with pytest.raises(ValueError, match=None) as mine:
        BatchMultiCrop(**bad)
    assert str(mine.value) == str(theirs.value)


def test_bad_inputs() -> None:
    m = BatchMultiCrop(16, 8, 2)
    with pytest.raises(ValueError, match="uint8"):
        m(torch.rand(2, 3, 16, 16))
    with pytest.raises(ValueError, match=r"\(B,3,H,W\)"):
        m(torch.zeros(3, 16, 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="floating point"):
        BatchMultiCrop(dtype=torch.int32)


def test_layout_matches_default_collate_of_multicrop() -> None:
    b, h, w = 5, 20, 28
    kw = dict(global_size=16, local_size=8, n_local=3)
    imgs = _images(b, h, w)
    ref = default_collate([MultiCrop(**kw)(im) for im in imgs])
    out = BatchMultiCrop(**kw)(imgs, _gen())
    assert out.keys() == ref.keys()
    assert len(out["views"]) == len(ref["views"]) == 5
    for v, r in zip(out["views"], ref["views"]):
        assert v.shape == r.shape and v.dtype == r.dtype == torch.float32 and v.is_contiguous()
    for k in ("boxes", "flips"):
        assert out[k].shape == ref[k].shape and out[k].dtype == ref[k].dtype
    bx = out["boxes"]
    assert torch.equal(bx, bx.round())  # integer pixel corners, as get_params gives
    assert (bx[..., 0] >= 0).all() and (bx[..., 1] >= 0).all() and (bx[..., 2] <= w).all() and (bx[..., 3] <= h).all()
    assert (bx[..., 2] > bx[..., 0]).all() and (bx[..., 3] > bx[..., 1]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_dtype(dtype: torch.dtype) -> None:
    out = BatchMultiCrop(16, 8, 2, dtype=dtype)(_images(3, 16, 16), _gen())
    assert all(v.dtype == dtype and v.is_contiguous() for v in out["views"])
    assert out["boxes"].dtype == torch.float32


def test_deterministic_with_seeded_generator() -> None:
    m, imgs = BatchMultiCrop(16, 8, 3), _images(6, 24, 24)
    a, b, c = m(imgs, _gen(1)), m(imgs, _gen(1)), m(imgs, _gen(2))
    assert all(torch.equal(x, y) for x, y in zip(a["views"], b["views"]))
    assert torch.equal(a["boxes"], b["boxes"]) and torch.equal(a["flips"], b["flips"])
    assert not torch.equal(a["boxes"], c["boxes"])


def test_channels_last_and_gray_inputs() -> None:
    m, imgs = BatchMultiCrop(16, 8, 2), _images(4, 20, 20)
    ref = m(imgs, _gen())
    cl = m(imgs.contiguous(memory_format=torch.channels_last), _gen())
    assert all(torch.equal(x, y) and y.is_contiguous() for x, y in zip(ref["views"], cl["views"]))
    one = imgs[:, :1]
    gray = m(one, _gen())
    assert all(torch.equal(x, y) for x, y in zip(m(one.expand(-1, 3, -1, -1), _gen())["views"], gray["views"]))


def test_cpu_blocks_do_not_change_results() -> None:
    """apply() runs the per-pixel ops in cache-sized blocks of samples on the CPU; blocks are invisible."""
    m, imgs = BatchMultiCrop(16, 8, 3), _images(7, 20, 20)
    ref = m(imgs, _gen(4))
    m.cpu_block = 3 * 16 * 16 * 2  # 2 global or 8 local samples per block: several blocks, a ragged last one
    out = m(imgs, _gen(4))
    for x, y in zip(ref["views"], out["views"]):
        torch.testing.assert_close(y, x, atol=1e-6, rtol=0)


def _check_against_resized_crop(m: BatchMultiCrop, imgs: torch.Tensor, atol: float, interior: bool) -> None:
    """Each view vs F.resized_crop(antialias=True) of its own box on the float image, sample by sample.

    interior=True compares only outputs whose bilinear source position lies inside the box: roi_align reads
    the true neighbours just outside the box where resized_crop clamps to the box edge."""
    out = m(imgs, _gen(3))
    src = imgs.float() / 255
    n_cmp = 0
    for v, view in enumerate(out["views"]):
        s = view.shape[-1]
        for i in range(imgs.shape[0]):
            x0, y0, x1, y1 = (int(c) for c in out["boxes"][i, v])
            ref = F.resized_crop(src[i], y0, x0, y1 - y0, x1 - x0, [s, s], antialias=True)
            mask = torch.ones(s, s, dtype=torch.bool)
            if interior:
                pos = torch.arange(s) + 0.5
                py, px = pos * (y1 - y0) / s - 0.5, pos * (x1 - x0) / s - 0.5
                mask = ((py >= 0) & (py <= y1 - y0 - 1))[:, None] & ((px >= 0) & (px <= x1 - x0 - 1))[None]
            err = (view[i] - ref).abs()[:, mask]
            n_cmp += err.numel()
            assert err.max() <= atol if err.numel() else True, (v, i, err.max())
    assert n_cmp > 0


def test_resize_upsampling_is_bilinear() -> None:
    """Upscaling: one roi_align sample per bin centre = bilinear (align_corners=False), exact inside the box."""
    m = BatchMultiCrop(24, 16, 3, global_scale=(0.3, 1.0), **OFF)
    _check_against_resized_crop(m, _images(6, 12, 12), atol=2e-6, interior=True)


def test_resize_smooth_image_whole_view() -> None:
    """Down- and upscaling a smooth image, whole views: box prefilter vs triangle antialias, edge handling."""
    m = BatchMultiCrop(24, 12, 3, **OFF)
    _check_against_resized_crop(m, _smooth(6, 64, 48), atol=0.02, interior=False)  # max seen 0.014


def test_flip_is_exact_mirror() -> None:
    imgs = _images(6, 24, 24)
    for kw in (OFF, {}):
        kw = {k: v for k, v in kw.items() if k != "flip_p"}
        a = BatchMultiCrop(16, 8, 3, flip_p=0.0, **kw)(imgs, _gen(5))
        b = BatchMultiCrop(16, 8, 3, flip_p=1.0, **kw)(imgs, _gen(5))
        assert torch.equal(a["boxes"], b["boxes"]) and not a["flips"].any() and b["flips"].all()
        for x, y in zip(a["views"], b["views"]):
            if kw:  # geometry only: bit-exact
                assert torch.equal(x.flip(-1), y)
            else:  # colour ops commute with the flip up to float summation order (blur, means)
                torch.testing.assert_close(x.flip(-1), y, atol=1e-5, rtol=0)


def test_box_statistics_follow_random_resized_crop() -> None:
    """~1000 draws: area fraction in scale, log aspect in ratio (up to integer rounding), uniform position,
    and the area distribution of torchvision's get_params (10 tries) for the global scale."""
    n, h, w = 1000, 48, 64
    m = BatchMultiCrop(32, 16, 1)
    p = m.sample_params(n, h, w, generator=_gen(7))
    bx = p.boxes.double()
    bw, bh = bx[..., 2] - bx[..., 0], bx[..., 3] - bx[..., 1]
    frac, logr = bw * bh / (h * w), torch.log(bw / bh)
    for v, (lo, hi) in enumerate([m.global_scale, m.global_scale, m.local_scale]):
        slack_a = (bw[v] + bh[v] + 0.25) * 0.5 / (h * w)  # |(w+-.5)(h+-.5) - wh|
        assert (frac[v] >= lo - slack_a).all() and (frac[v] <= hi + slack_a).all()
        slack_r = 0.5 / bw[v] + 0.5 / bh[v]
        assert (logr[v] >= math.log(m.ratio[0]) - slack_r).all()
        assert (logr[v] <= math.log(m.ratio[1]) + slack_r).all()
        free = bw[v] < w
        pos = bx[v, free, 0] / (w - bw[v, free])
        assert abs(pos.mean().item() - 0.5) < 0.04 and pos.min() >= 0 and pos.max() <= 1
    assert abs(frac[2].mean().item() - sum(m.local_scale) / 2) < 0.01  # all candidates valid: uniform
    torch.manual_seed(0)
    img = torch.zeros(3, h, w)
    ref = [v2.RandomResizedCrop.get_params(img, list(m.global_scale), list(m.ratio)) for _ in range(n)]
    ref_frac = torch.tensor([hh * ww / (h * w) for _, _, hh, ww in ref])
    assert abs(frac[:2].mean().item() - ref_frac.mean().item()) < 0.03  # ~4 sigma of the difference


def test_box_fallback_is_center_crop() -> None:
    """No candidate can fit (aspect 4..5 at >= 90% area): torchvision's fallback, a centred 4:1 crop."""
    p = BatchMultiCrop(16, 8, 2, global_scale=(0.9, 1.0), local_scale=(0.9, 1.0), ratio=(4.0, 5.0)).sample_params(
        50, 32, 32, generator=_gen())
    assert (p.boxes == torch.tensor([0, 12, 32, 20])).all()


def test_bernoulli_rates() -> None:
    m = BatchMultiCrop(16, 8, 2)
    p = m.sample_params(4000, 16, 16, generator=_gen(9))
    rates = {"flip": [0.5] * 4, "jitter": [0.8] * 4, "gray": [0.2] * 4, "blur": [1.0, 0.1, 0.5, 0.5],
             "solarize": [0.0, 0.2, 0.0, 0.0]}
    for name, want in rates.items():
        got = getattr(p, name).double().mean(1)
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=0.03, rtol=0)
    f = p.factors[p.jitter]
    assert f[:, :3].min() >= 0.6 - 1e-6 and f[:, :2].max() <= 1.4 + 1e-6 and f[:, 2].max() <= 1.2 + 1e-6
    assert f[:, 3].abs().max() <= 0.1 + 1e-6
    assert (p.factors[~p.jitter] == torch.tensor([1.0, 1.0, 1.0, 0.0])).all()
    g_lo, g_hi = blur_for_size(16, (0.1, 2.0), 224).sigma
    assert p.sigma[:2].min() >= g_lo - 1e-6 and p.sigma[:2].max() <= g_hi + 1e-6


def _render(m: BatchMultiCrop, imgs: torch.Tensor, seed: int = 0) -> tuple[BatchAugParams, list, list]:
    """Params, views with them, and views of the same crops with colour ops off."""
    p = m.sample_params(imgs.shape[0], imgs.shape[2], imgs.shape[3], generator=_gen(seed))
    return p, m.apply(imgs, p)["views"], m.apply(imgs, _plain(p))["views"]


def test_grayscale_gives_equal_channels() -> None:
    m = BatchMultiCrop(16, 8, 2, **{**OFF, "gray_p": 1.0})
    for v in m(_images(4, 20, 20), _gen())["views"]:
        assert torch.equal(v[:, 0], v[:, 1]) and torch.equal(v[:, 1], v[:, 2])


JITTER_FNS = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]


@pytest.mark.parametrize("i", range(4), ids=["brightness", "contrast", "saturation", "hue"])
def test_jitter_component_matches_torchvision(i: int) -> None:
    """One jitter component at a time, per sample, vs torchvision's functional op with that sample's factor."""
    jit = [0.0] * 4
    jit[i] = (0.4, 0.4, 0.4, 0.5)[i]
    m = BatchMultiCrop(16, 8, 2, **{**OFF, "jitter_p": 0.5, "jitter": tuple(jit)})
    p, views, plain = _render(m, _images(8, 20, 20))
    for v in range(4):
        for b in range(8):
            ref = JITTER_FNS[i](plain[v][b], float(p.factors[v, b, i])) if p.jitter[v, b] else plain[v][b]
            torch.testing.assert_close(views[v][b], ref, atol=1e-5, rtol=0)


def test_jitter_fixed_order() -> None:
    """All four components: brightness -> contrast -> saturation -> hue, each as torchvision's functional."""
    m = BatchMultiCrop(16, 8, 2, **{**OFF, "jitter_p": 1.0})
    p, views, plain = _render(m, _images(6, 20, 20))
    for v in range(4):
        for b in range(6):
            ref = plain[v][b]
            for i, fn in enumerate(JITTER_FNS):
                ref = fn(ref, float(p.factors[v, b, i]))
            torch.testing.assert_close(views[v][b], ref, atol=1e-5, rtol=0)


def test_blur_matches_torchvision_per_sample_sigma() -> None:
    """Kernel size scales with the crop as MultiCrop.blur_for_size; each sample its own sigma."""
    m = BatchMultiCrop(24, 12, 2, blur_ref_size=64, **{**OFF, "blur_p": (1.0, 0.5, 0.5)})
    p, views, plain = _render(m, _images(8, 32, 32))
    for v in range(4):
        size = views[v].shape[-1]
        k = blur_for_size(size, (0.1, 2.0), 64).kernel_size
        assert k[0] > 3  # a real multi-tap kernel is exercised
        for b in range(8):
            s = float(p.sigma[v, b])
            ref = F.gaussian_blur(plain[v][b], list(k), [s, s]) if p.blur[v, b] else plain[v][b]
            torch.testing.assert_close(views[v][b], ref, atol=1e-5, rtol=0)


def test_solarize_second_global_only() -> None:
    m = BatchMultiCrop(16, 8, 2, **{**OFF, "solarize_p": 1.0})
    p, views, plain = _render(m, _images(4, 20, 20))
    assert p.solarize[1].all() and not p.solarize[[0, 2, 3]].any()
    assert torch.equal(views[1], torch.where(plain[1] >= 0.5, 1 - plain[1], plain[1]))
    assert all(torch.equal(views[v], plain[v]) for v in (0, 2, 3))


def test_normalisation() -> None:
    imgs, mean, std = _images(3, 20, 20), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    a = BatchMultiCrop(16, 8, 2, **OFF)(imgs, _gen())
    b = BatchMultiCrop(16, 8, 2, **{**OFF, "mean": mean, "std": std})(imgs, _gen())
    for x, y in zip(a["views"], b["views"]):
        torch.testing.assert_close(y, F.normalize(x, list(mean), list(std)), atol=1e-5, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu_with_same_params() -> None:
    m, imgs = BatchMultiCrop(32, 16, 4), _images(16, 48, 40)
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = m(imgs.cuda(), gen)
    assert all(v.is_cuda for v in out["views"]) and out["boxes"].is_cuda and out["flips"].is_cuda
    again = m(imgs.cuda(), torch.Generator(device="cuda").manual_seed(0))
    assert all(torch.equal(x, y) for x, y in zip(out["views"], again["views"]))
    p = m.sample_params(16, 48, 40, generator=_gen())
    cpu, gpu = m.apply(imgs, p), m.apply(imgs.cuda(), p.to("cuda"))
    for x, y in zip(cpu["views"], gpu["views"]):
        torch.testing.assert_close(y.cpu(), x, atol=1e-4, rtol=0)
    assert torch.equal(cpu["boxes"], gpu["boxes"].cpu()) and torch.equal(cpu["flips"], gpu["flips"].cpu())


@pytest.mark.parametrize("cropped", [False, True])
def test_compiled_finish_gives_the_eager_views(cropped: bool) -> None:
    """`compile_finish` (the per-pixel ops traced, every sample blurred with a delta kernel for the unchosen ones)
    gives the eager views of the same parameters: the crop path (`forward`) and the colour-only path (`colour`),
    both view sizes, blur and solarize on. aot_eager traces the same graph inductor would compile."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = BatchMultiCrop(global_size=32, local_size=16, n_local=3, blur_p=(1.0, 0.5, 0.5), solarize_p=0.5)
    traced = BatchMultiCrop(global_size=32, local_size=16, n_local=3, blur_p=(1.0, 0.5, 0.5), solarize_p=0.5)
    traced.compile_finish(backend="aot_eager", dynamic=False)
    imgs = torch.randint(0, 256, (6, 3, 40, 48), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    if cropped:
        views = [torch.randint(0, 256, (6, 3, s, s), dtype=torch.uint8) for s in (32, 32, 16, 16, 16)]
        want = eager.colour(views, generator=torch.Generator().manual_seed(1))
        got = traced.colour(views, generator=torch.Generator().manual_seed(1))
    else:
        want = eager(imgs, generator=torch.Generator().manual_seed(1))
        got = traced(imgs, generator=torch.Generator().manual_seed(1))
    assert len(got["views"]) == 5 and counters["stats"]["unique_graphs"] >= 2  # one graph per view size
    for a, b in zip(got["views"], want["views"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(got["flips"], want["flips"])
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_finish_matches_eager_on_the_gpu() -> None:
    """Inductor's fused kernels of the per-pixel ops against the eager kernels, at the ImageNet recipe's sizes."""
    import torch._dynamo

    torch._dynamo.reset()
    eager = BatchMultiCrop(global_size=224, local_size=96, n_local=8)
    fused = BatchMultiCrop(global_size=224, local_size=96, n_local=8)
    fused.compile_finish(dynamic=False)
    views = [torch.randint(0, 256, (16, 3, s, s), dtype=torch.uint8, device="cuda") for s in [224] * 2 + [96] * 8]
    gen = torch.Generator(device="cuda")
    want = eager.colour(views, generator=gen.manual_seed(3))
    got = fused.colour(views, generator=gen.manual_seed(3))
    for a, b in zip(got["views"], want["views"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
