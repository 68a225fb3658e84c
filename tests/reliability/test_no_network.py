"""Nothing leaves the machine by default: a short train + kNN eval with the W&B logger on (offline, the default)
runs with every non-loopback connection and DNS lookup refused, and no API key ends up in the run folders."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest
from helpers import compose_cfg

from scfs.eval.common import compose_eval_cfg
from scfs.eval.knn import run_knn
from scfs.reliability import NetworkGuard, offline_by_default, sitecustomize_source
from scfs.train import run

FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"  # W&B keys are 40 hex characters
SHAPES = ["++data.n_train=48", "++data.n_val=24", "++data.image_size=32"]


class ProxyTrap:
    """A loopback listener that every HTTP(S) client honouring *_PROXY (requests, urllib, Go's net/http in
    wandb-core) would reach first: it counts connections."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.hits = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            conn.close()


@pytest.fixture
def no_network(tmp_path, monkeypatch):
    """NetworkGuard in this process, the same guard in Python subprocesses (sitecustomize on PYTHONPATH), a proxy
    trap for everything else; W&B as a user would have it: no WANDB_MODE, an API key in the environment."""
    site = tmp_path / "site"
    site.mkdir()
    log = tmp_path / "subprocess_network.log"
    (site / "sitecustomize.py").write_text(sitecustomize_source(log))
    repo = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), repo, os.environ.get("PYTHONPATH", "")]))
    trap = ProxyTrap()
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(var, trap.url)
    for var in ("NO_PROXY", "no_proxy", "WANDB_MODE", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR",
                "WANDB_DIR", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    with NetworkGuard() as guard:
        yield guard, trap, log
    trap.sock.close()


def test_train_and_knn_eval_talk_to_nobody_and_store_no_api_key(tmp_path, shapes_root, no_network):
    guard, trap, sub_log = no_network
    summary = run(compose_cfg(["logger=wandb"], data_root=shapes_root), tmp_path / "train")
    assert summary["steps"] == 2 and summary["wandb_dir"]
    assert list((tmp_path / "train" / "wandb").glob("offline-run-*/run-*.wandb"))
    eval_cfg = compose_eval_cfg("knn", [f"ckpt={summary['checkpoint']}", f"data.root={shapes_root}", *SHAPES,
                                        "feature_cache=null", "ks=[5]", "report_k=5", "progress=false",
                                        "logger.wandb=true"])
    doc = run_knn(eval_cfg, tmp_path / "eval")
    assert doc["metrics"]["top1"] >= 0 and doc.get("wandb_dir")

    assert guard.attempts == [], f"network access attempted: {guard.attempts}"
    assert trap.hits == 0, "something tried to reach the network through the proxy"
    assert not sub_log.exists(), sub_log.read_text()
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    leaks = [p for d in ("train", "eval") for p in (tmp_path / d).rglob("*")
             if p.is_file() and FAKE_KEY.encode() in p.read_bytes()]
    assert not leaks, f"the W&B API key was written to {leaks}"


def test_the_guard_refuses_and_records_remote_connections():
    """The guard itself: a non-loopback connect and a DNS lookup are refused and recorded, loopback works."""
    server = socket.create_server(("127.0.0.1", 0))
    with NetworkGuard() as guard:
        socket.create_connection(server.getsockname(), timeout=5).close()
        with pytest.raises(OSError, match="blocked"):
            socket.create_connection(("192.0.2.1", 443), timeout=5)  # TEST-NET-1
        with pytest.raises(OSError, match="blocked"):
            socket.getaddrinfo("api.wandb.ai", 443)
    server.close()
    assert len(guard.attempts) == 2


def test_hf_hub_offline_by_default_but_the_user_decides(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    offline_by_default()
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    offline_by_default()
    assert os.environ["HF_HUB_OFFLINE"] == "0"


def test_backbone_never_asks_timm_for_pretrained_weights(monkeypatch):
    import timm

    from scfs.models.backbone import Backbone

    seen = []
    create = timm.create_model

    def spy(*args, **kwargs):
        seen.append(kwargs.get("pretrained"))
        return create(*args, **kwargs)

    monkeypatch.setattr(timm, "create_model", spy)
    Backbone("resnet18", layers=(1, 1, 1, 1), channels=(8, 8, 8, 8), cifar_stem=True)
    assert seen == [False]
