"""What a training run needs around the method: callbacks (kNN monitor, wall-clock budget), the online linear
monitor and the atomic checkpoint writer."""
