"""`python -m scfs.sweep` is `python -m scfs.train -m`; the former runner's options are refused in one line that
says how a multirun does it."""

import sys

import pytest

from scfs.sweep import main


@pytest.mark.parametrize("args, fix", [
    (["--out", "rec.json", "method=dino"], "python -m scfs.eval.compare"),
    (["--parallel=4", "method=dino"], "hydra.launcher.per_gpu=N"),
    (["a:method=scfs", "b:method=dino"], "comma-separated values"),
], ids=["out", "parallel", "labelled-runs"])
def test_former_options_say_the_multirun_way(capsys, args, fix):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("scfs.sweep: config error: ") and fix in err[0]


def test_sweep_is_the_multirun_of_scfs_train(monkeypatch):
    import scfs.train

    seen = {}
    monkeypatch.setattr(scfs.train, "cli", lambda: seen.setdefault("argv", list(sys.argv)))
    main(["method=scfs,dino", "hydra/launcher=local_gpus", "data.root=/tmp/x:y"])
    assert seen["argv"] == ["scfs.train", "-m", "method=scfs,dino", "hydra/launcher=local_gpus", "data.root=/tmp/x:y"]
