"""`scfs.bench.checkpoint_writes` on the CPU: every way of writing makes a loadable file of the state at its step,
the record holds one row per way with the baseline's extra at zero, and a hand-over step outside the loop is one
line that says so."""

from __future__ import annotations

import json

import torch

from scfs.bench import checkpoint_writes as cw
from scfs.models.checkpoint import safe_load


def test_each_writer_leaves_the_state_at_its_step(tmp_path) -> None:
    state = cw.make_state(0.05, 3, torch.device("cpu"))
    for mode in cw.WRITERS:
        path = tmp_path / f"{mode.replace(' ', '_').replace(',', '')}.ckpt"
        out = cw.run_loop(mode, state, path, torch.device("cpu"), steps=4, at=1, matmuls=1, size=8)
        assert out["save_call_ms"] > 0 and out["write_done_s"] > 0
        if mode.startswith("finite check"):  # the check alone: no file, over when the call returns
            assert not path.exists() and out["write_done_s"] <= out["save_call_ms"] / 1e3 and out["inside"]
            continue
        if mode == "training thread":  # it ends inside the save call
            assert out["write_done_s"] <= out["save_call_ms"] / 1e3 and out["inside"]
        saved = safe_load(path)
        for k, v in state["state_dict"].items():
            torch.testing.assert_close(saved["state_dict"][k], v, rtol=0, atol=0)


def test_the_record_has_a_row_per_way_against_the_loop_alone(tmp_path, capsys) -> None:
    rc = cw.main(["--device", "cpu", "--mb", "0.2", "--tensors", "4", "--steps", "6", "--at", "1", "--matmuls", "1",
                  "--size", "16", "--repeats", "2", "--dir", str(tmp_path), "--out", str(tmp_path / "out")])
    assert rc == 0
    (record,) = (tmp_path / "out").glob("checkpoint-writes-cpu-*.json")
    rows = {r["mode"]: r for r in json.loads(record.read_text())["rows"]}
    assert list(rows) == list(cw.MODES)
    assert rows["none"]["extra_ms"] == 0 and rows["none"]["save_call_ms"] == 0
    assert all(len(r["runs"]) == 2 for r in rows.values())
    assert "| background, own stream |" in capsys.readouterr().out
    assert not list(tmp_path.glob("tmp*"))  # the checkpoints' folder is gone


def test_the_check_rows_refuse_a_state_with_nan(tmp_path) -> None:
    """The check rows run the real checks: a poisoned state stops the loop instead of timing a check that passed
    nothing."""
    import pytest

    state = cw.make_state(0.05, 3, torch.device("cpu"))
    state["state_dict"]["w2"][7] = float("nan")
    for mode in ("finite check, one by one", "finite check, as shipped"):
        with pytest.raises(FloatingPointError, match="NaN or Inf"):
            cw.run_loop(mode, state, tmp_path / "x.ckpt", torch.device("cpu"), steps=3, at=1, matmuls=1, size=8)


def test_a_hand_over_step_outside_the_loop_is_one_line(capsys) -> None:
    assert cw.main(["--device", "cpu", "--steps", "4", "--at", "9"]) == 2
    assert "--at 9 is outside the loop's 4 steps" in capsys.readouterr().err
