"""OnlineLinearMonitor (scfs/training/monitors.py): trains its own stop-gradient classifier, logs every epoch,
does nothing when the module exposes no features. (Mirrors tests/method/; kept here with the eval tests.)"""

import copy
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from scfs.training.monitors import OnlineLinearMonitor


class _Toy(L.LightningModule):
    def __init__(self, expose: bool = True):
        super().__init__()
        self.net = nn.Linear(16, 16)
        self.expose = expose

    def training_step(self, batch, batch_idx):
        x, y = batch
        f = self.net(x)
        if self.expose:
            self.last_features = x.detach()  # separable "features"
            self.last_labels = y
        return f.pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=0.0)


def _data():
    g = torch.Generator().manual_seed(0)
    centers = 3 * torch.randn(4, 16, generator=g)
    y = torch.randint(0, 4, (256,), generator=g)
    return DataLoader(TensorDataset(centers[y] + 0.3 * torch.randn(256, 16, generator=g), y), batch_size=32)


def _fit(module, monitor, epochs=3):
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[monitor])
    trainer.fit(module, _data())
    return trainer


def test_online_monitor_learns_and_logs():
    module = _Toy()
    before = module.net.weight.detach().clone()
    monitor = OnlineLinearMonitor(num_classes=4, every_n_epochs=1)
    trainer = _fit(module, monitor)
    assert trainer.callback_metrics["online/linear_top1"] > 90
    assert "online/linear_loss" in trainer.callback_metrics
    assert torch.equal(module.net.weight, before)  # the module's optimiser and weights are not involved
    assert monitor.linear.weight.shape == (4, 16)
    state = monitor.state_dict()
    again = OnlineLinearMonitor(num_classes=4)
    again.load_state_dict(state)
    assert torch.equal(again.linear.weight, monitor.linear.weight)


def test_online_monitor_is_inert_without_features():
    monitor = OnlineLinearMonitor(num_classes=4)
    trainer = _fit(_Toy(expose=False), monitor, epochs=1)
    assert monitor.linear is None and "online/linear_top1" not in trainer.callback_metrics
    assert monitor.state_dict() == {}


def test_online_monitor_with_the_scfs_module(shapes_root):
    """The real SCFSModule exposes last_features/last_labels; the monitor trains on them next to pretraining."""
    from helpers import compose_cfg

    from scfs.train import build

    cfg = compose_cfg(["eval.knn_at_start=false"], data_root=shapes_root)
    dm, model = build(cfg)
    monitor = OnlineLinearMonitor(every_n_epochs=1)  # num_classes read from the datamodule
    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[monitor])
    trainer.fit(model, datamodule=dm)
    assert monitor.linear.weight.shape == (dm.train_set.num_classes, model.backbone("student").embed_dim)
    assert 0 <= float(trainer.callback_metrics["online/linear_top1"]) <= 100
    module_params = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    assert not {id(p) for p in monitor.linear.parameters()} & module_params  # its own optimiser, not the module's


def test_online_monitor_counts_survive_a_mid_epoch_resume():
    """A mid-epoch checkpoint carries the epoch's running counts, restored when the resumed epoch starts; an
    epoch-end checkpoint carries none, so the next epoch starts from zero."""
    monitor = OnlineLinearMonitor(num_classes=4, every_n_epochs=1)
    saved = {}

    class Snapshot(L.Callback):  # what a step checkpoint after batch 3 (of the epoch's 8) would hold
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 3:
                saved.update(monitor.state_dict())

    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[monitor, Snapshot()])
    trainer.fit(_Toy(), _data())
    state = saved
    assert state["counts"][1] == 3 * 32  # (correct, seen, loss_sum): 3 batches of 32 seen
    again = OnlineLinearMonitor(num_classes=4)
    again.load_state_dict(state)
    again.on_train_epoch_start(None, None)
    assert torch.equal(again.counts, state["counts"])
    again.on_train_epoch_start(None, None)  # a later epoch: fresh counts
    assert again.counts is None
    full = OnlineLinearMonitor(num_classes=4, every_n_epochs=1)
    _fit(_Toy(), full, epochs=1)
    assert "counts" not in full.state_dict()


# ---- the closed-form step against autograd + torch.optim.SGD ----------------------------------------------------
def _reference(monitor: OnlineLinearMonitor, device: str):
    """A plain nn.Linear + torch.optim.SGD starting from the monitor's initial classifier."""
    ref = nn.Linear(*reversed(monitor.linear.weight.shape)).to(device)
    ref.load_state_dict(monitor.linear.state_dict())
    return ref, torch.optim.SGD(ref.parameters(), lr=monitor.lr, momentum=monitor.momentum,
                                weight_decay=monitor.weight_decay)


def _reference_step(ref, opt, x, y):
    logits = ref(x.float())
    loss = F.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return torch.stack(((logits.argmax(1) == y).sum().float(), torch.tensor(float(len(y))), loss.detach() * len(y)))


def _assert_same(monitor, ref, opt, counts, momentum):
    tol = {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(monitor.linear.weight, ref.weight, **tol)
    torch.testing.assert_close(monitor.linear.bias, ref.bias, **tol)
    if momentum:
        for p, q in zip(monitor.linear.parameters(), ref.parameters()):
            torch.testing.assert_close(monitor.optimizer.state[p]["momentum_buffer"],
                                       opt.state[q]["momentum_buffer"], **tol)
    got = monitor.counts.cpu()
    assert got[0] == counts[0] and got[1] == counts[1]  # correct and seen: exact
    torch.testing.assert_close(got[2], counts[2].cpu(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize(("momentum", "weight_decay"), [(0.9, 0.0), (0.9, 1e-3), (0.0, 1e-3), (0.0, 0.0)])
def test_online_monitor_step_equals_autograd_and_sgd(device, momentum, weight_decay):
    """Several steps on fresh random features (bf16 ones among them, a smaller last batch), under CPU autocast:
    weights, momentum buffers and counts equal those of nn.Linear + F.cross_entropy + torch.optim.SGD; the
    optimiser's state_dict keeps SGD's format, and a monitor resumed from it continues identically."""
    torch.manual_seed(0)
    d, c = 32, 7
    monitor = OnlineLinearMonitor(num_classes=c, lr=0.5, momentum=momentum, weight_decay=weight_decay)
    trainer = SimpleNamespace(datamodule=None)
    counts = torch.zeros(3)
    ref = opt = None
    for step, b in enumerate([16, 16, 16, 16, 9]):
        x = (3 * torch.randn(b, d)).to(device)
        x = x.bfloat16() if step == 2 else x
        y = torch.randint(0, c, (b,), device=device)
        if monitor.linear is None:
            monitor._build(d, c, torch.device(device))
            ref, opt = _reference(monitor, device)
        counts += _reference_step(ref, opt, x, y).cpu()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            monitor.on_train_batch_end(trainer, SimpleNamespace(last_features=x, last_labels=y), None, None, step)
        _assert_same(monitor, ref, opt, counts, momentum)
    state, ref_state = monitor.state_dict(), opt.state_dict()
    assert state["optimizer"]["param_groups"] == ref_state["param_groups"]
    assert state["optimizer"]["state"].keys() == ref_state["state"].keys()
    resumed = OnlineLinearMonitor(num_classes=c, lr=0.5, momentum=momentum, weight_decay=weight_decay)
    resumed.load_state_dict(copy.deepcopy(state))  # as from a checkpoint file: SGD's state_dict shares its buffers
    resumed.on_train_epoch_start(trainer, None)
    x, y = torch.randn(16, d, device=device), torch.randint(0, c, (16,), device=device)
    for m in (monitor, resumed):
        m.on_train_batch_end(trainer, SimpleNamespace(last_features=x, last_labels=y), None, None, 5)
    torch.testing.assert_close(resumed.linear.weight, monitor.linear.weight, rtol=0, atol=0)
    torch.testing.assert_close(resumed.counts.cpu(), monitor.counts.cpu(), rtol=0, atol=0)


_DDP_WORKER = """
import sys, torch, torch.distributed as dist
from types import SimpleNamespace
from scfs.training.monitors import OnlineLinearMonitor
rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
g = torch.Generator().manual_seed(0)
monitor = OnlineLinearMonitor(num_classes=5, lr=0.5, momentum=0.9, weight_decay=1e-3)
for step in range(3):
    x, y = torch.randn(16, 8, generator=g), torch.randint(0, 5, (16,), generator=g)
    half = slice(8 * rank, 8 * rank + 8)
    monitor.on_train_batch_end(SimpleNamespace(datamodule=None),
                               SimpleNamespace(last_features=x[half], last_labels=y[half]), None, None, step)
torch.save(monitor.state_dict(), out)
dist.destroy_process_group()
"""


def test_online_monitor_averages_gradients_over_ranks(tmp_path):
    """Two gloo ranks, each on its half of every batch, train the same classifier as one process on the whole
    batch (equal halves: the mean of the ranks' mean gradients is the batch's mean gradient), and stay identical."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _DDP_WORKER, str(r), str(tmp_path / "store"),
                               str(tmp_path / f"rank{r}.pt")], env=env, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))
    for a, b in zip(r0["linear"].values(), r1["linear"].values()):
        assert torch.equal(a, b)
    g = torch.Generator().manual_seed(0)
    monitor = OnlineLinearMonitor(num_classes=5, lr=0.5, momentum=0.9, weight_decay=1e-3)
    monitor._build(8, 5, torch.device("cpu"))
    ref, opt = _reference(monitor, "cpu")
    for _ in range(3):
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 5, (16,), generator=g)
        _reference_step(ref, opt, x, y)
    torch.testing.assert_close(r0["linear"]["weight"], ref.weight.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r0["linear"]["bias"], ref.bias.detach(), rtol=1e-5, atol=1e-6)
    assert r0["counts"][1] == 3 * 8  # each rank counts its own samples; the epoch end sums them over the ranks
