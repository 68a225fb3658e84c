"""What a training run adds around the method: callbacks (kNN monitor, wall-clock budget) and the online linear
monitor. The atomic checkpoint writer lives in `scfs.models.checkpoint_io` (evaluation writes with it too)."""
