"""What keeps a run from losing work or leaking data when something goes wrong.

This package module stays import-light (no torch / Lightning at import: `scfs.train` imports it, and a config
error must fail in a second). The Lightning pieces of a run that survives crashes are `scfs.models.checkpoint_io`
(atomic checkpoint writes) and `scfs.training.checkpointing` (`last.ckpt`, exact mid-epoch resume).

* `check_finite`: the names of non-finite tensors of a checkpoint (a checkpoint with NaN weights is never written).
* `find_secrets` / `refuse_secrets` / `scrub_files`: secret-looking config keys are refused and never left in run
  folders.
* `NetworkGuard` / `offline_by_default`: nothing leaves the machine by default, and tests can prove it.
* `RunFolderLock`: one training run per run folder at a time.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import logging
import os
import re
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scfs.errors import ReportedError

log = logging.getLogger("scfs.reliability")

# ---- nothing leaves the machine by default -----------------------------------------------------------------------
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def offline_by_default() -> None:
    """Turn the Hugging Face hub offline unless the user chose otherwise (it is read when huggingface_hub is
    imported, so the entry points call this before timm is imported). timm never downloads here anyway
    (`pretrained=False`); this makes an accidental `pretrained=True` fail at once instead of reaching out."""
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)


def _is_loopback_host(host: Any) -> bool:
    if host in (None, "", b"", "localhost", b"localhost"):
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    try:
        return ipaddress.ip_address(str(host).split("%", 1)[0]).is_loopback
    except ValueError:
        return False  # a name other than localhost: resolving it is already a network access (DNS)


class NetworkGuard:
    """Refuse, and record, every non-loopback socket connection and DNS lookup of this process.

    Unix sockets and loopback addresses (W&B's local service, DataLoader workers) stay allowed. Used by the tests
    to prove that a default run talks to nobody; `sitecustomize_source()` installs the same guard in Python
    subprocesses.
    """

    def __init__(self) -> None:
        self.attempts: list[str] = []
        self._saved: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _refuse(self, what: str) -> OSError:
        with self._lock:
            self.attempts.append(what)
        return ConnectionRefusedError(f"network access blocked by scfs NetworkGuard: {what}")

    def _check_address(self, sock: socket.socket, address: Any, what: str) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback_host(address[0]):
            raise self._refuse(f"{what} {address!r}")

    def __enter__(self) -> NetworkGuard:
        guard, cls = self, socket.socket
        self._saved = {"connect": cls.connect, "connect_ex": cls.connect_ex, "sendto": cls.sendto,
                       "getaddrinfo": socket.getaddrinfo, "gethostbyname": socket.gethostbyname}
        orig = dict(self._saved)

        def connect(sock, address):
            guard._check_address(sock, address, "connect")
            return orig["connect"](sock, address)

        def connect_ex(sock, address):
            guard._check_address(sock, address, "connect")
            return orig["connect_ex"](sock, address)

        def sendto(sock, data, *args):
            guard._check_address(sock, args[-1], "sendto")
            return orig["sendto"](sock, data, *args)

        def getaddrinfo(host, *args, **kwargs):
            if not _is_loopback_host(host):
                raise guard._refuse(f"getaddrinfo {host!r}")
            return orig["getaddrinfo"](host, *args, **kwargs)

        def gethostbyname(host):
            if not _is_loopback_host(host):
                raise guard._refuse(f"gethostbyname {host!r}")
            return orig["gethostbyname"](host)

        cls.connect, cls.connect_ex, cls.sendto = connect, connect_ex, sendto
        socket.getaddrinfo, socket.gethostbyname = getaddrinfo, gethostbyname
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in ("connect", "connect_ex", "sendto"):
            setattr(socket.socket, name, self._saved[name])
        socket.getaddrinfo, socket.gethostbyname = self._saved["getaddrinfo"], self._saved["gethostbyname"]


def sitecustomize_source(log_file: str | os.PathLike) -> str:
    """A `sitecustomize.py` that installs `NetworkGuard` in every Python process started with its folder on
    PYTHONPATH, appending each blocked attempt to `log_file`."""
    return (
        "import atexit\n"
        "from scfs.reliability import NetworkGuard\n"
        "_g = NetworkGuard().__enter__()\n"
        f"_log = {str(log_file)!r}\n"
        "atexit.register(lambda: _g.attempts and open(_log, 'a').write(''.join(a + '\\n' for a in _g.attempts)))\n"
    )


# ---- secrets -----------------------------------------------------------------------------------------------------
SECRET_KEY = re.compile(r"(^|[^a-z])(api_?keys?|secrets?|token|passwords?|passwd|credentials?|private_key)([^a-z]|$)")


def is_secret_key(key: Any) -> bool:
    """Whether a config key name looks like it holds a secret (``api_key``, ``hf_token``, ``password`` ...)."""
    return bool(SECRET_KEY.search(str(key).lower()))


def scrub(obj: Any) -> Any:
    """A copy of a nested dict/list config with every secret-looking key's value masked as ``***``: what gets
    logged anywhere (W&B, reports)."""
    if isinstance(obj, Mapping):
        return {k: ("***" if is_secret_key(k) else scrub(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub(v) for v in obj]
    return obj


def find_secrets(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every secret-looking key of a nested dict/list config."""
    found: list[tuple[str, Any]] = []
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            key = f"{prefix}{k}"
            if is_secret_key(k) and v not in (None, "", "***"):
                found.append((key, v))
            else:
                found.extend(find_secrets(v, key + "."))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            found.extend(find_secrets(v, f"{prefix}{i}."))
    return found


def refuse_secrets(cfg: Any) -> None:
    """Secrets never belong in a config: Hydra saves it to `.hydra/`, the logger stores it, runs get shared.

    Raises `ConfigError` naming the key (not the value) and saying where the secret should live instead.
    """
    from omegaconf import OmegaConf

    from scfs.config import ConfigError

    found = find_secrets(OmegaConf.to_container(cfg, resolve=False))
    if found:
        keys = ", ".join(k for k, _ in found)
        raise ConfigError(f"config key(s) {keys} look like secrets (value not shown): secrets must not be put in "
                          "configs or overrides, which are saved in the run folder and logged; set them in the "
                          "environment instead (W&B reads WANDB_API_KEY, Hugging Face HF_TOKEN)")


def scrub_files(folder: str | os.PathLike, values: list[Any], min_len: int = 4) -> list[Path]:
    """Replace every occurrence of the given secret values by ``***`` in the files under `folder` (Hydra has
    written the composed config and the command-line overrides to `.hydra/` before our code runs)."""
    needles = [str(v).encode() for v in values if v is not None and len(str(v)) >= min_len]
    changed: list[Path] = []
    if not needles:
        return changed
    for path in Path(folder).rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        new = data
        for n in needles:
            new = new.replace(n, b"***")
        if new != data:
            path.write_bytes(new)
            changed.append(path)
    return changed


# ---- non-finite values, out of memory ------------------------------------------------------------------------------
def check_finite(checkpoint: Any, limit: int = 8) -> list[str]:
    """Names (dotted paths) of the floating-point tensors holding NaN or Inf in a checkpoint's weights and
    optimizer state (the parts a resumed run would continue from; callback bookkeeping such as
    ModelCheckpoint's ``kth_value=inf`` is legitimately infinite and not looked at), the first `limit` in the
    checkpoint's order.

    Every save calls this on the training thread, so it waits for the GPU once per device, not once per tensor:
    a tensor-by-tensor check costs a host sync for each of the ResNet-50 recipe's 900-odd tensors (weights, EMA
    teacher, momentum). A screen first takes every tensor's L2 norm in one fused call per device and dtype
    (`torch._foreach_norm`, as `clip_grad_norm_` does); a norm is non-finite when a value is (NaN and Inf carry
    through a sum of squares) or when the sum overflows, so the flagged tensors alone are then checked value by
    value (`non_finite_tensors`), which keeps a large but finite tensor off the list."""
    tensors = checked_tensors(checkpoint)
    flagged = non_finite_norms(tensors)
    return non_finite_tensors([tensors[i] for i in flagged], limit)


def non_finite_tensors(named: list[tuple[str, Any]], limit: int = 8) -> list[str]:
    """The names of the `(name, tensor)` pairs whose tensor holds NaN or Inf, checked one by one (a host sync
    each on a GPU): the reference `check_finite`'s screen is tested against."""
    import torch

    bad: list[str] = []
    for name, t in named:
        if len(bad) >= limit:
            break
        if not bool(torch.isfinite(t).all()):
            bad.append(name)
    return bad


def checked_tensors(checkpoint: Any) -> list[tuple[str, Any]]:
    """`(dotted name, tensor)` of every non-empty floating-point or complex tensor `check_finite` looks at, in
    the checkpoint's order (`non_finite_tensors(checked_tensors(c))` is the one-by-one check of all of them)."""
    import torch

    found: list[tuple[str, Any]] = []

    def walk(o: Any, name: str) -> None:
        if isinstance(o, torch.Tensor):
            if (o.is_floating_point() or o.is_complex()) and o.numel():
                found.append((name, o))
        elif isinstance(o, Mapping):
            for k, v in o.items():
                walk(v, f"{name}.{k}" if name else str(k))
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, f"{name}.{i}" if name else str(i))

    if isinstance(checkpoint, Mapping) and ("state_dict" in checkpoint or "optimizer_states" in checkpoint):
        for key in ("state_dict", "optimizer_states"):
            walk(checkpoint.get(key), key)
    else:
        walk(checkpoint, "")
    return found


def non_finite_norms(tensors: list[tuple[str, Any]]) -> list[int]:
    """Indices into the `(name, tensor)` pairs whose L2 norm is not finite (a superset of those holding NaN or Inf),
    ascending: one fused norm per device and dtype, one host read per device. Complex tensors are always passed
    on. `check_finite`'s screen, and the gradient check before each optimizer step."""
    import torch

    groups: dict[tuple[Any, Any], list[int]] = {}
    flagged: list[int] = []
    for i, (_, t) in enumerate(tensors):
        if t.is_complex():
            flagged.append(i)
        else:
            groups.setdefault((t.device, t.dtype), []).append(i)
    by_device: dict[Any, list[tuple[list[int], Any]]] = {}
    for (device, _), idx in groups.items():
        norms = torch._foreach_norm([tensors[i][1] for i in idx])
        by_device.setdefault(device, []).append((idx, ~torch.isfinite(torch.stack(norms))))
    for parts in by_device.values():
        flags = torch.cat([f for _, f in parts]).tolist()
        order = [i for idx, _ in parts for i in idx]
        flagged += [i for i, bad in zip(order, flags, strict=True) if bad]
    return sorted(flagged)


class BatchTooLargeError(ReportedError, RuntimeError):
    """CUDA ran out of memory during training; the message says which batch size to try."""


def is_cuda_oom(err: BaseException) -> bool:
    """CUDA ran out of memory: the caching allocator's `torch.OutOfMemoryError`, or a CUDA runtime call that could
    not allocate (cuBLAS' or cuDNN's own workspace, a kernel launch's), which torch raises as `torch.AcceleratorError`
    with "CUDA error: out of memory". Both mean the same to a user (a smaller batch, or a GPU with more free
    memory). By class name, so a caller need not import torch."""
    names = {c.__name__ for c in type(err).__mro__}
    return "OutOfMemoryError" in names or ("AcceleratorError" in names and "out of memory" in str(err))


def oom_message(batch_size: int, step: int, checkpoint: str | None, devices: Any = 1) -> str:
    half = max(batch_size // 2, 1)
    fix = (f"try batch_size={half} (per device; e.g. python -m scfs.train ... batch_size={half}), "
           "fewer local crops (crops.n_local) or precision=bf16-mixed" if batch_size > 1 else
           "batch_size is already 1: use a smaller backbone, fewer/smaller crops or precision=bf16-mixed")
    where = (f"the last checkpoint is kept ({checkpoint}); add resume=auto to continue from it" if checkpoint
             else "no checkpoint was written yet")
    return (f"CUDA out of memory at step {step} with batch_size={batch_size} per device "
            f"(trainer.devices={devices}): {fix}; {where}")


def one_line(err: BaseException) -> str:
    """An exception message on one line; Hydra's 'Available options' lists become comma-separated."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    out: list[str] = []
    listing = False
    for ln in lines:
        if ln.startswith("Config search path"):  # Hydra's provider list: noise for a user
            break
        if listing and not ln.endswith(":") and " " not in ln:
            out[-1] += (" " if out[-1].endswith(":") else ", ") + ln
            continue
        listing = ln.endswith(":")
        out.append(ln)
    text = " ".join(ln if ln.endswith((".", ":")) else ln + ";" for ln in out).rstrip(";") or type(err).__name__
    # Hydra's advice for an override of a key that is not in the config would silently add a typo'd key
    return re.sub(r"Could not override '([^']+)'\. To append to your config use (\+\S+)",
                  r"Could not override '\1': the config has no such key or group (a typo?); only to add a new key "
                  r"on purpose use \2", text)


# ---- one run per run folder ----------------------------------------------------------------------------------------
class RunFolderBusyError(ReportedError, RuntimeError):
    """Another live process trains in this run folder; both would overwrite each other's checkpoints and logs."""


def launch_rank() -> int:
    """This process's global rank as its launcher set it (torchrun: RANK; Lightning's DDP children: LOCAL_RANK;
    srun: SLURM_PROCID), 0 for a single process: known before Lightning sets up the process group."""
    for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


class RunFolderLock:
    """An exclusive `flock` on `<run_dir>/.scfs.lock` for the duration of a training run.

    The kernel drops the lock when its process dies (crash, `kill -9`, power cut), so a killed run never blocks the
    next one in its folder; the file only records who holds it, for the message."""

    NAME = ".scfs.lock"

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / self.NAME
        self._fd: int | None = None

    def __enter__(self) -> RunFolderLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise RunFolderBusyError(
                f"run folder {self.path.parent} is in use by another training run ({holder}): two runs in one "
                "folder overwrite each other's checkpoints and logs; give this one its own folder (leave "
                "hydra.run.dir at its default, or pick another) or wait for the other to finish") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None
