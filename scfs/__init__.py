"""scfs: Semantics-Consistent Feature Search (SCFS) self-supervised pretraining workbench.

Kept import-light on purpose: `import scfs` must not pull in Hydra, W&B or Lightning, so that the search
kernels and benchmarks run on machines that only have torch.
"""

__version__ = "0.1.0"
