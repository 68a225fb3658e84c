"""`failure_line`: the line of a failed process's output that says why, whatever it printed after it; and its shell
copy in scripts/failure_line.sh (the GPU smoke's, which runs without the project) held to the same cases."""

import shutil
import subprocess
from pathlib import Path

import pytest

from scfs.errors import failure_line

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "failure_line.sh"
BAR = "Epoch 0:   0%|          | 0/4 [00:05<?, ?it/s]"
CUDA_ADVICE = ("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
               "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
               "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
CASES = {
    "cli-error": (f"{BAR}\nscfs.train: error: CUDA out of memory at step 0 with batch_size=512\n{BAR}",
                  "scfs.train: error: CUDA out of memory at step 0 with batch_size=512"),
    "config-error": ("scfs.eval.knn: config error: ckpt=... is required\n",
                     "scfs.eval.knn: config error: ckpt=... is required"),
    "exception-then-advice": (f"{BAR}\nTraceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n"
                              f"torch.AcceleratorError: CUDA error: out of memory\n{CUDA_ADVICE}",
                              "torch.AcceleratorError: CUDA error: out of memory"),
    "bare-exception": ("Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyboardInterrupt\n",
                       "KeyboardInterrupt"),
    "cli-line-over-its-exception": ("Traceback (most recent call last):\nValueError: bad\n"
                                    "scfs.train: error: bad value for x\n", "scfs.train: error: bad value for x"),
    "progress-bar-last": (f"loading\n{BAR}\n", "loading"),
    "only-a-bar": (f"{BAR}\n", BAR),
    "empty": ("", ""),
}


@pytest.mark.parametrize("case", CASES)
def test_the_line_that_says_why(case):
    text, line = CASES[case]
    assert failure_line(text) == line


def test_long_lines_are_cut():
    assert failure_line("ValueError: " + "x" * 900, limit=40) == "ValueError: " + "x" * 28


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("case", CASES)
def test_the_device_scripts_shell_copy_gives_the_same_line(tmp_path, case):
    text, line = CASES[case]
    log = tmp_path / "row.log"
    log.write_text(text)
    got = subprocess.run(["bash", "-c", '. "$0"; failure_line "$1"', str(SCRIPT), str(log)], capture_output=True,
                         text=True, check=True).stdout
    assert got == line
