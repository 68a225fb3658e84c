"""Kernel backends without a GPU: Triton under TRITON_INTERPRET=1; CUDA source built with nvcc and hipcc."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch

from scfs.search import check

CSRC = Path(__file__).resolve().parents[2] / "csrc"
KERNEL_SOURCES = ("search_kernels.cu", "search_kernels_bwd.cu")
HEADERS = ("search_kernels.h", "search_common.cuh", "search_order.h")
# kernels each object must contain (both weighting orders of the forward; the chunked one is off by default)
KERNELS = {
    "search_kernels.cu": ("sim_kernel", "finalize_kernel", "weight_kernel", "weight_chunked_kernel"),
    "search_kernels_bwd.cu": ("bwd_a_kernel", "bwd_f_kernel"),
}
interp = pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton interpreter tests run on CPU-only machines (TRITON_INTERPRET=1)",
)


@interp
@pytest.mark.parametrize("case", check.cpu_cases(), ids=str)
def test_triton_interpreter_matches_float64_reference(case):
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    assert check.check_case("triton", case, torch.device("cpu"), gen) == []


@interp
def test_triton_interpreter_zero_norm_and_nan():
    assert check.check_special("triton", torch.device("cpu"), torch.Generator().manual_seed(0)) == []


def _cuda_home() -> Path | None:
    for cand in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", "/usr/local/cuda-13.0", "/opt/cuda"):
        if cand and (Path(cand) / "bin/nvcc").exists() and (Path(cand) / "include/cuda_runtime.h").exists():
            return Path(cand)
    return None


@pytest.mark.skipif(_cuda_home() is None, reason="no CUDA toolkit (bin/nvcc + include/cuda_runtime.h) found")
@pytest.mark.parametrize("arch", ["80", "90"])
@pytest.mark.parametrize("source", KERNEL_SOURCES)
def test_cuda_source_compiles_standalone(tmp_path, arch, source):
    obj = tmp_path / f"{source}_sm{arch}.o"
    cmd = [
        str(_cuda_home() / "bin/nvcc"),
        "-c",
        "-O3",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        str(CSRC / source),
        "-o",
        str(obj),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    data = obj.read_bytes()
    for kernel in KERNELS[source]:
        assert kernel.encode() in data, f"{kernel} not compiled into {obj.name}"


@pytest.mark.skipif(_cuda_home() is None, reason="no CUDA toolkit (bin/nvcc + include/cuda_runtime.h) found")
def test_binding_compiles_against_torch_headers():
    """The torch binding (set_weighting / get_weighting included) parses with torch's headers: C++20 syntax only."""
    from torch.utils import cpp_extension

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    os.environ.setdefault("CUDA_HOME", str(_cuda_home()))
    incs = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"], str(_cuda_home() / "include"), str(CSRC)]
    cmd = [cxx, "-std=c++20", "-fsyntax-only", "-DTORCH_EXTENSION_NAME=scfs_search_check", *(f"-I{i}" for i in incs)]
    res = subprocess.run([*cmd, str(CSRC / "search_binding.cpp")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]


@pytest.mark.skipif(shutil.which("hipcc") is None, reason="hipcc not installed (apt-get install hipcc libamdhip64-dev)")
@pytest.mark.parametrize("source", KERNEL_SOURCES)
def test_hipified_source_compiles_for_gfx90a(tmp_path, source):
    from torch.utils.hipify import hipify_python

    for f in (*KERNEL_SOURCES, *HEADERS):
        shutil.copy(CSRC / f, tmp_path / f)
    hipify_python.hipify(
        project_directory=str(tmp_path),
        output_directory=str(tmp_path / "hip"),
        includes=["*"],
        show_detailed=False,
        is_pytorch_extension=True,
    )
    src = tmp_path / "hip" / source.replace(".cu", ".hip")
    text = src.read_text() + "".join((tmp_path / "hip" / h).read_text() for h in HEADERS)
    assert "<<<" not in text and "_sync(" not in text and re.search(r"\basm\b", text) is None
    assert "warpSize" not in text and "32 lanes" not in text
    obj = tmp_path / f"{source}_gfx90a.o"
    env = dict(os.environ, HIP_PLATFORM="amd")
    res = subprocess.run(
        ["hipcc", "--offload-arch=gfx90a", "-O3", "-c", str(src), "-o", str(obj)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    data = obj.read_bytes()
    for kernel in KERNELS[source]:
        assert kernel.encode() in data, f"{kernel} not compiled into {obj.name}"


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 2, 256, 7, 7), (2, 3, 96, 13, 5), (4, 1, 64, 3, 3)], ids=str)
def test_triton_two_pass_forward_is_bitwise_the_one_launch_form(gen, shape, dtype):
    """The two-pass Triton forward (similarity once, then the weighting over channel splits) only moves the fp32
    similarity through memory: outputs, similarity and norms equal the one-launch form bit for bit, on shapes
    whose tiling splits the channels (7x7: 8 splits) and with a projection."""
    from scfs.search import feature_search, triton_backend
    from scfs.search.triton_backend import _tiling

    n, b, c, h, w = shape
    assert _tiling(n, b, c, h * w, torch.device("cpu"))[3] > 1  # the case the two-pass path exists for
    feats = torch.randn(b, c, h, w, generator=gen).to(dtype)
    queries = torch.randn(n, b, c, generator=gen).to(dtype)
    weight = torch.randn(32, c, generator=gen) / c**0.5
    results = {}
    for two_pass in (True, False):
        triton_backend.OPS.two_pass = two_pass
        try:
            results[two_pass] = [feature_search(feats, queries, backend="triton"),
                                 feature_search(feats, queries, weight=weight, backend="triton")]
        finally:
            triton_backend.OPS.two_pass = True
    for new, old in zip(results[True], results[False]):
        for name in ("features", "similarity", "weights"):
            assert torch.equal(getattr(new, name), getattr(old, name)), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_projection_keeps_the_feature_dtype_under_autocast(monkeypatch, gen, dtype):
    """The kernels read F and G = W F in one dtype. Under autocast a ViT's block maps stay float32 while a bare
    matmul would hand the kernels a bfloat16 G: the projection the kernels get is W F in F's dtype, as outside
    autocast."""
    from scfs.search import kernel_fn

    seen = {}

    class RecordingOps:
        def fwd_soft(self, f3, queries, g3, h, w, channels_last, eps):
            seen["f3"], seen["g3"] = f3, g3
            n, b = queries.shape[:2]
            z = torch.zeros(n, b, h * w)
            return torch.zeros(n * b, g3.shape[1], h, w, dtype=f3.dtype), z, z, torch.zeros(b, h * w), z[..., 0]

    monkeypatch.setitem(kernel_fn._OPS, "triton", RecordingOps())
    feats = torch.randn(2, 48, 5, 5, generator=gen).to(dtype)
    queries = torch.randn(3, 2, 48, generator=gen).to(dtype)
    weight = torch.randn(16, 48, generator=gen) / 48**0.5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kernel_fn.kernel_forward(feats, queries, weight, "soft", 0.25, 0.1, 1e-6, "triton")
    assert seen["g3"].dtype == dtype
    torch.testing.assert_close(seen["g3"], torch.matmul(weight.to(dtype), feats.flatten(2)), rtol=0, atol=0)
