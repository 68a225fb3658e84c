"""GPU benchmarks (search op, training step)."""
