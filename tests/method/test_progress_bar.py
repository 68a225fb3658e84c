"""LoggedStepsProgressBar (scfs/training/callbacks.py): its training refreshes, the only place it reads logged
values on the host, fall on exactly the steps where the loggers write, epoch lengths and gradient accumulation
notwithstanding; the counter still reaches the epoch's last batch."""

from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from scfs.training.callbacks import LoggedStepsProgressBar


class _Loss(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.net(batch[0]).pow(2).mean()
        self.log("loss", loss, prog_bar=True, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.net.parameters(), lr=0.01)


class _StepLogger(Logger):
    """The steps at which Lightning hands per-step metrics to the loggers (where it reads them on the host)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []

    name, version = "steps", 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if "loss_step" in metrics:
            self.steps.append(int(step))

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass


class _Spy(LoggedStepsProgressBar):
    def __init__(self, refresh_rate: int) -> None:
        super().__init__(refresh_rate=refresh_rate)
        self.reads: list[int] = []
        self.epoch_end_n: list[int] = []
        self._epoch_end = False

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        if not self._epoch_end:
            self.reads.append(trainer.fit_loop.epoch_loop._batches_that_stepped)  # the loggers' step numbering
        return super().get_metrics(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.epoch_end_n.append(self.train_progress_bar.n)
        self._epoch_end = True
        super().on_train_epoch_end(trainer, pl_module)
        self._epoch_end = False


@pytest.mark.parametrize("accumulate", [1, 2])
def test_progress_bar_reads_metrics_on_the_logging_steps_only(accumulate: int) -> None:
    data = DataLoader(TensorDataset(torch.randn(56, 4)), batch_size=8)  # 7 batches: not a multiple of the rate
    bar, logger = _Spy(refresh_rate=3), _StepLogger()
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", logger=logger, log_every_n_steps=3,
                        accumulate_grad_batches=accumulate, enable_checkpointing=False, enable_model_summary=False,
                        callbacks=[bar])
    trainer.fit(_Loss(), data)
    assert logger.steps and bar.reads == logger.steps
    assert bar.epoch_end_n == [7, 7, 7]


def test_the_training_callbacks_use_the_logged_steps_bar(shapes_root, tmp_path) -> None:
    from helpers import compose_cfg

    from scfs.train import build
    from scfs.training.setup import make_callbacks

    cfg = compose_cfg(["eval.knn_at_start=false", "trainer.log_every_n_steps=7",
                       "trainer.enable_progress_bar=true"], data_root=shapes_root)
    dm, _ = build(cfg)
    callbacks, _, _ = make_callbacks(cfg, dm, tmp_path)
    bars = [c for c in callbacks if isinstance(c, L.pytorch.callbacks.ProgressBar)]
    assert len(bars) == 1 and isinstance(bars[0], LoggedStepsProgressBar) and bars[0].refresh_rate == 7
