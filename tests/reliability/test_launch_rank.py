"""Under DDP every process runs `scfs.train.run`; only the launcher's rank 0 takes the run-folder lock (the DDP
runs in tests/test_ddp.py would otherwise stop on rank 1 with 'run folder ... is in use')."""

import pytest

from scfs.reliability import launch_rank


@pytest.mark.parametrize(("env", "rank"), [({}, 0), ({"LOCAL_RANK": "1"}, 1), ({"RANK": "3", "LOCAL_RANK": "1"}, 3),
                                           ({"SLURM_PROCID": "5"}, 5), ({"RANK": ""}, 0)])
def test_launch_rank_reads_the_launchers_variables(monkeypatch, env, rank):
    for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert launch_rank() == rank
