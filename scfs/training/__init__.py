"""A training run, step by step (`scfs.train.run` strings them together).

* `setup`: config checks, resume preparation, run folder and lock, data and model, callbacks, the Trainer.
* `fit`: `trainer.fit` with its known failures said in one line naming the last good checkpoint.
* `summary`: the kNN of the teacher outside the Trainer, `summary.json` and the final line.
* `loggers`: W&B (offline by default) or CSV.
* `checkpointing`: checkpoints as resume points: `last.ckpt`, RNG state, the train loader that continues
  mid-epoch, resume-file checks. The files are written by `scfs.models.checkpoint_io` (evaluation writes with it
  too, and evaluation sits below training).
* `callbacks`, `monitors`: the kNN monitor, the wall-clock budget, the online linear monitor.
"""
