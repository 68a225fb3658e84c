"""`python -m scfs.sweep OVERRIDES...`: the same as `python -m scfs.train -m OVERRIDES...` (a Hydra multirun).

Several configurations are a multirun: comma-separated values sweep (`method=scfs,dino seed=0,1,2`), a study
config holds a sweep and its common overrides (`+study=cifar10_seeds`), `hydra/launcher=local_gpus
hydra.launcher.per_gpu=N` runs jobs side by side on this machine's GPUs, `hydra/launcher=slurm` on a cluster, and
`python -m scfs.eval.compare runs/multirun/<date>/<time>` tabulates them. The options of the former runner
(`--out`, `--parallel`, `--gpus`, `--resume`, `LABEL:overrides`) are refused with the multirun way to say it.
"""

from __future__ import annotations

import sys

FORMER_OPTIONS = {
    "--out": "the table: python -m scfs.eval.compare runs/multirun/<date>/<time>",
    "--parallel": "hydra/launcher=local_gpus hydra.launcher.per_gpu=N",
    "--gpus": "hydra/launcher=local_gpus hydra.launcher.gpus=[0,1]",
    "--resume": "nothing: running the same multirun again resumes its jobs cut short and skips finished ones",
    "--common": "the overrides themselves (every job gets the ones without commas)",
    "--root": "hydra.sweep.dir=<folder>",
    "--k": "eval.knn_k=[20,200] (and python -m scfs.eval.compare <folder> --k 200)",
}


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    for a in args:
        option = a.split("=", 1)[0]
        label = a.split("=", 1)[0].partition(":")
        if option in FORMER_OPTIONS or (label[1] and "/" not in label[0] and "=" in a):
            fix = FORMER_OPTIONS.get(option, "one override per key, comma-separated values for a sweep "
                                     "(method=scfs,dino); a job folder is named by its number")
            print(f"scfs.sweep: config error: {a!r} is an option of the former sweep runner; in a multirun "
                  f"(python -m scfs.train -m ...) use {fix}", file=sys.stderr)
            raise SystemExit(2)
    from scfs.train import cli

    sys.argv = ["scfs.train", "-m", *args]
    cli()


if __name__ == "__main__":
    main()
