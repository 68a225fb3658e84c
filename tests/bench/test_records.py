"""The record helpers the benchmarks share: one GPU name slug, so records of one GPU carry one name."""

from __future__ import annotations

from pathlib import Path

import pytest

from scfs.bench.records import device_slug, record_stem


@pytest.mark.parametrize(("name", "slug"), [
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100sxm4"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H200 NVL 141GB HBM3e", "h200nvl"),
    ("NVIDIA GeForce RTX 4090", "geforcertx4090"),
    ("Tesla T4", "teslat4"),
    ("NVIDIA", "gpu"),
    ("", "gpu"),
])
def test_device_slug_keeps_the_model_without_the_vendor_or_the_memory(name: str, slug: str) -> None:
    assert device_slug(name) == slug


def test_end_to_end_records_are_named_by_the_slug() -> None:
    assert record_stem(Path("r"), "imagenet-e2e", "NVIDIA A100-SXM4-80GB", "2026-12-02", None, "-tiny") == Path(
        "r/imagenet-e2e-a100sxm4-2026-12-02-tiny")
