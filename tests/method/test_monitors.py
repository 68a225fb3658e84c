"""OnlineLinearMonitor (scfs/training/monitors.py): trains its own stop-gradient classifier, logs every epoch,
does nothing when the module exposes no features. (Mirrors tests/method/; kept here with the eval tests.)"""

import lightning as L
import torch
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
