"""`scfs.bench.published`: the published step, timed from a checkout in the same call as ours.

The published code is not part of this project, so the fast tests drive the harness through a stand-in checkout
with the published module layout and call signatures (tiny modules written here); the slow test runs a real
checkout when one is present (`SCFS_PUBLISHED_TREE`, or `.pub/skyoux-scfs` in the repository)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torchvision

from scfs.bench import published
from scfs.bench.step import main as step_main
from scfs.bench.step import markdown, published_reference, targets

ROOT = Path(__file__).resolve().parents[2]

STANDIN_MODELS = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist


class DINOHead(nn.Module):
    def __init__(self, in_dim, out_dim, use_bn=False, norm_last_layer=True):
        super().__init__()
        self.mlp = nn.Linear(in_dim, 16)
        self.last_layer = nn.Linear(16, out_dim, bias=False)

    def forward(self, x):
        return self.last_layer(F.normalize(self.mlp(x), dim=-1))


class DINOShallowHead(nn.Module):
    def __init__(self, in_dim, out_dim, bottleneck_dim, hidden_dim):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.BatchNorm1d(hidden_dim),
                                 nn.Linear(hidden_dim, out_dim))

    def forward(self, x):
        return F.normalize(self.mlp(x.mean(dim=(2, 3))), dim=-1)


class _CE(nn.Module):
    def __init__(self, out_dim, ncrops, *schedule):
        super().__init__()
        self.register_buffer("center", torch.zeros(1, out_dim))

    def ce(self, s, t):
        return torch.sum(-F.softmax(t.detach(), -1) * F.log_softmax(s, -1), -1).mean()

    def centre(self, t):
        c = t.detach().sum(0, keepdim=True)
        dist.all_reduce(c)
        self.center = 0.9 * self.center + 0.1 * c / len(t)


class DINOLoss(_CE):
    def forward(self, student, teacher, epoch):
        self.centre(teacher)
        return self.ce(student[: len(teacher)], teacher)


class DINOShallowLoss(_CE):
    def forward(self, student_g, teacher_g, student_l, teacher_l, epoch):
        self.centre(teacher_g)
        return self.ce(student_g, teacher_g), self.ce(student_l, teacher_l)


def _maps(bb, x):
    x = bb.maxpool(bb.relu(bb.bn1(bb.conv1(x))))
    f2 = bb.layer2(bb.layer1(x))
    f3 = bb.layer3(f2)
    f4 = bb.layer4(f3)
    return f4.mean(dim=(2, 3)), f2, f3, f4


class StudentWrapper(nn.Module):
    def __init__(self, backbone, head, l2, l3, l4):
        super().__init__()
        backbone.fc = nn.Identity()
        self.backbone, self.head, self.l2, self.l3, self.l4 = backbone, head, l2, l3, l4

    def forward(self, x):
        g, f2, f3, f4 = _maps(self.backbone, torch.cat(x[:]))
        return self.head(g), self.l2(f2), self.l3(f3), self.l4(f4), f2, f3, f4


class TeacherWrapper(nn.Module):
    def __init__(self, backbone, head, l2, l3, l4, num_crops):
        super().__init__()
        backbone.fc = nn.Identity()
        self.backbone, self.head, self.l2, self.l3, self.l4 = backbone, head, l2, l3, l4
        self.num_crops = num_crops

    def forward(self, x, s2, s3, s4, box_generator):
        g, f2, f3, f4 = _maps(self.backbone, torch.cat(x[:]))
        local = []
        for h, s, f in ((self.l2, s2, f2), (self.l3, s3, f3), (self.l4, s4, f4)):
            q = F.normalize(s.mean(dim=(2, 3), keepdim=True), dim=1).chunk(self.num_crops)
            fn = F.normalize(f, dim=1).chunk(2)[0]
            local.append(h(torch.cat([(fn * qi).sum(1, keepdim=True) * f.chunk(2)[0] for qi in q])))
        return (self.head(g), self.l2(f2), self.l3(f3), self.l4(f4), *local, [], [], [])
'''

STANDIN_UTILS = '''
import numpy as np


def has_batchnorms(model):
    return any(m.__class__.__name__.startswith("BatchNorm") for m in model.modules())


def get_params_groups(model):
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() <= 1]
    return [{"params": decay}, {"params": rest, "weight_decay": 0.0}]


def clip_gradients(model, clip):
    norms = []
    for p in model.parameters():
        if p.grad is not None:
            n = p.grad.norm(2)
            norms.append(n.item())
            factor = clip / (n + 1e-6)
            if factor < 1:
                p.grad.mul_(factor)
    return norms


def cancel_gradients_last_layer(epoch, model, freeze_last_layer):
    return None


def cosine_scheduler(base_value, final_value, epochs, niter_per_ep, warmup_epochs=0):
    iters = np.arange(epochs * niter_per_ep)
    return final_value + 0.5 * (base_value - final_value) * (1 + np.cos(np.pi * iters / len(iters)))
'''


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    tree = tmp_path / "published"
    (tree / "models").mkdir(parents=True)
    (tree / "utils").mkdir()
    (tree / "models" / "scfs.py").write_text(textwrap.dedent(STANDIN_MODELS))
    (tree / "utils" / "utils.py").write_text(textwrap.dedent(STANDIN_UTILS))
    return tree


def _real_tree() -> Path | None:
    tree = Path(os.environ.get("SCFS_PUBLISHED_TREE", ROOT / ".pub" / "skyoux-scfs"))
    return tree if all((tree / f).is_file() for f in published.TREE_FILES) else None


def _run_child(tree: Path) -> dict:
    """`published.run_subprocess` on a checkout, tiny and on the CPU (its own process: `models` and `utils` are
    the checkout's)."""
    return published.run_subprocess(tree, [2], ["fp32"], "cpu", 1, 1, tiny=True)


def test_a_checkout_without_the_published_files_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(published.PublishedTreeError, match=r"no models/scfs.py, utils/utils.py there.*skyoux/scfs"):
        published.load_tree(tmp_path)


def test_a_missing_dependency_of_the_checkout_names_it_and_the_install(standin: Path) -> None:
    (standin / "models" / "scfs.py").write_text("import torchextractor_not_installed_here\n")
    code = ("import sys; from pathlib import Path; from scfs.bench.published import load_tree, PublishedTreeError\n"
            "try:\n    load_tree(Path(sys.argv[1]))\nexcept PublishedTreeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(standin)], capture_output=True, text=True, cwd=ROOT)
    assert "'torchextractor_not_installed_here'" in out.stdout and "pip install torchextractor kornia" in out.stdout


def test_the_step_trains_the_student_and_moves_the_teacher(standin: Path) -> None:
    """One published step on the stand-in: the SGD step changes the student, the EMA moves the teacher towards
    it, and the teacher's centre is updated through the one-process group."""
    code = textwrap.dedent('''
        import sys, json, torch
        from pathlib import Path
        from scfs.bench import published as P
        pm, pu = P.load_tree(Path(sys.argv[1]))
        dev = torch.device("cpu")
        P.init_process_group(dev)
        P.RECIPE["lr"] = 100.0  # the schedule's first steps are tiny; a large rate makes the updates visible
        shapes = dict(P.RECIPE, **P.TINY)
        out = {}
        for method in P.METHODS:
            torch.manual_seed(0)
            parts = P.build(pm, pu, method, dev, False, shapes)
            views = [torch.randn(2, 3, s, s) for s in [64, 64] + [32] * shapes["n_local"]]
            s0 = [p.detach().clone() for p in parts["student"].parameters()]
            t0 = [p.detach().clone() for p in parts["teacher"].parameters()]
            assert all(torch.equal(a, b) for a, b in zip(s0, t0))  # the teacher starts as the student
            P.make_step(parts, pu, method, views, "fp32", 4)(0)
            s1 = list(parts["student"].parameters())
            t1 = list(parts["teacher"].parameters())
            out[method] = {
                "trained": sum(p.requires_grad for p in s1),
                "student_moved": sum(not torch.equal(a, b) for a, b in zip(s0, s1)),
                "teacher_moved": sum(not torch.equal(a, b) for a, b in zip(t0, t1)),
                "teacher_between": all(bool(((b - a).abs() <= (c - a).abs() + 1e-6).all())
                                       for a, b, c in zip(t0, t1, s1)),
                "centre_set": bool(parts["losses"]["final"].center.abs().sum() > 0),
                "losses": sorted(parts["losses"]),
            }
        print(json.dumps(out))
    ''')
    res = subprocess.run([sys.executable, "-c", code, str(standin)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for method in ("scfs", "dino"):
        # the SGD step moves most trained tensors (on this stand-in's nearly flat loss the BatchNorm scales get
        # gradients of 1e-10, too small to change a weight of 1.0) and the EMA moves the teacher's alike
        assert out[method]["student_moved"] >= 0.6 * out[method]["trained"] > 20, out
        assert out[method]["teacher_moved"] >= 0.9 * out[method]["student_moved"], out
        assert out[method]["teacher_between"] and out[method]["centre_set"], out
    assert out["scfs"]["losses"] == ["final", "l2", "l3", "l4"] and out["dino"]["losses"] == ["final"], out


def test_the_diagnostic_without_host_syncs_does_the_same_arithmetic(standin: Path) -> None:
    """`syncs=False` leaves the host synchronisations out, not work: from the same start, two steps give
    bit-identical students and teachers, with gradients large enough that some are clipped."""
    code = textwrap.dedent('''
        import sys, json, torch
        from pathlib import Path
        from scfs.bench import published as P
        pm, pu = P.load_tree(Path(sys.argv[1]))
        dev = torch.device("cpu")
        P.init_process_group(dev)
        shapes = dict(P.RECIPE, **P.TINY)
        P.RECIPE["clip_grad"] = 1e-3  # every gradient clipped: the factor path is taken
        states = []
        for syncs in (True, False):
            torch.manual_seed(0)
            parts = P.build(pm, pu, "scfs", dev, False, shapes)
            views = [torch.randn(2, 3, s, s, generator=torch.Generator().manual_seed(i))
                     for i, s in enumerate([64, 64] + [32] * shapes["n_local"])]
            step = P.make_step(parts, pu, "scfs", views, "fp32", 4, syncs)
            step(0), step(1)
            states.append([t.detach().clone() for t in [*parts["student"].parameters(),
                                                        *parts["teacher"].parameters()]])
        a, b = states
        print(json.dumps({"n": len(a), "equal": all(torch.equal(x, y) for x, y in zip(a, b))}))
    ''')
    res = subprocess.run([sys.executable, "-c", code, str(standin)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["n"] > 100 and out["equal"], out


def test_clip_without_sync_matches_the_published_per_parameter_clip() -> None:
    """Each gradient scaled to norm `clip` where larger, left bit-identical where not."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    m(torch.randn(4, 8)).pow(2).sum().backward()
    norms = [p.grad.norm().item() for p in m.parameters()]
    clip = sorted(norms)[1] + 1e-3  # some above it, some below
    before = [p.grad.clone() for p in m.parameters()]
    published.clip_without_sync(m, clip)
    for g0, p, n in zip(before, m.parameters(), norms, strict=True):
        if n > clip:
            assert torch.allclose(p.grad, g0 * clip / (n + 1e-6)) and abs(p.grad.norm().item() - clip) < 1e-4
        else:
            assert torch.equal(p.grad, g0)


def test_run_subprocess_times_both_methods_and_names_the_checkout(standin: Path) -> None:
    res = _run_child(standin)
    assert [(r["method"], r["B"], r["setting"]) for r in res["rows"]] == [("scfs", 2, "fp32"), ("dino", 2, "fp32")]
    for r in res["rows"]:
        assert r["step_ms"] > 0 and r["img_per_s"] > 0 and r["steps"] == 1, r
    assert res["source"].startswith("sha256:") and res["tiny"] is True and res["syncs"] is True
    assert all(r["syncs"] is True for r in res["rows"])
    assert "| scfs | 2 | fp32 |" in published.table(res)


def test_the_command_writes_a_record_that_says_when_the_syncs_were_left_out(standin: Path, tmp_path: Path) -> None:
    out = tmp_path / "records"
    res = subprocess.run([sys.executable, "-m", "scfs.bench.published", "--tree", str(standin), "--device", "cpu",
                          "--tiny", "--batch", "2", "--setting", "fp32", "--method", "dino", "--warmup", "1",
                          "--steps", "1", "--no-syncs", "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    (js,) = out.glob("published-cpu-*-nosyncs.json")
    rec = json.loads(js.read_text())
    assert rec["syncs"] is False and [r["method"] for r in rec["rows"]] == ["dino"] and rec["meta"]["commit"]
    md = js.with_suffix(".md").read_text()
    assert "without the loop's host synchronisations" in md and "| dino | 2 | fp32, no host syncs |" in md
    assert "python -m scfs.bench.published --tree" in md


def test_run_subprocess_reports_a_broken_checkout_with_its_last_lines(standin: Path) -> None:
    (standin / "models" / "scfs.py").write_text("raise RuntimeError('this checkout is broken')\n")
    res = _run_child(standin)
    assert "rows" not in res and "this checkout is broken" in res["error"]


def test_the_checkout_digest_follows_its_code(standin: Path) -> None:
    a = published.tree_identity(standin)
    (standin / "utils" / "utils.py").write_text(STANDIN_UTILS + "\n# another version\n")
    assert published.tree_identity(standin) != a and a.startswith("sha256:")


def test_the_same_call_reference_wins_over_the_measurements_file() -> None:
    same = {"rows": [{"method": "scfs", "B": 64, "setting": "bf16_cl", "step_ms": 120.0, "img_per_s": 533.3,
                      "peak_GiB": 14.0}]}
    ref = published_reference("resnet50", "scfs", 64, "bf16_cl_graphs", same)
    assert ref == {"step_ms": 120.0, "img_per_s": 533, "peak_GiB": 14.0, "setting": "bf16 + channels_last",
                   "source": "same call"}
    # no same-call row for DINO at 64 or for B=32: the measurements file's numbers, said so
    assert published_reference("resnet50", "dino", 64, "bf16_cl", same)["source"] == "MEASUREMENTS.md"
    assert published_reference("resnet50", "scfs", 32, "bf16_cl", same)["img_per_s"] == 352
    assert published_reference("vit", "scfs", 64, "bf16", same) is None


def test_targets_and_markdown_judge_against_the_same_call_rows() -> None:
    rows = [{"method": m, "B": 64, "setting": s, "step_ms": ms, "img_per_s": 64e3 / ms, "peak_GiB": 12.0}
            for m, s, ms in (("scfs", "bf16_cl_graphs", 60.0), ("dino", "bf16_cl_graphs", 50.0),
                             ("scfs", "bf16_cl", 150.0))]
    same = {"rows": [{"method": "scfs", "B": 64, "setting": "bf16_cl", "step_ms": 160.0, "img_per_s": 400.0,
                      "step_ms_p10_p90": [150.0, 170.0], "peak_GiB": 14.7, "warmup_s": 3.0}],
            "source": "abc123", "warmup": 8, "steps": 30}
    result = {"meta": {"suite": "resnet50", "gpu": "H200", "date": "2026-12-03", "torch": "2", "lightning": "2",
                       "processes": 1, "data": "synthetic", "warmup": 10, "steps": 30}, "rows": rows,
              "published_same_call": same}
    from scfs.bench.step import add_reference

    add_reference(rows, "resnet50", None, same)
    checks = {c["target"]: c for c in targets(result)}
    assert checks["SCFS default >= 2.0x published (800 img/s, same call)"]["met"] is True  # 1,067 against 2 x 400
    assert checks["SCFS eager >= published (400 img/s, same call)"]["measured"].startswith("427 img/s")
    md = markdown(result)
    assert "timed first in this call" in md and "checkout abc123" in md
    assert "| scfs | 64 | bf16_cl | 160.0 | 400 |" in md
    assert "160.0 (400, bf16 + channels_last, same call)" in md and "timed in this call where the target says" in md
    # a published step whose rows all failed: every reference is the measurements file's, and the record says so
    failed = dict(result, published_same_call={"rows": [{"method": "scfs", "B": 64, "setting": "bf16_cl",
                                                         "error": "RuntimeError: x"}]})
    for r in rows:
        r.pop("published")
    add_reference(rows, "resnet50", None, failed["published_same_call"])
    md = markdown(failed)
    assert "timed first in this call" not in md and "measured separately (../shared/MEASUREMENTS.md)" in md
    assert "SCFS eager >= published (561 img/s) |" in md and "same call" not in md.split("RuntimeError")[0]


def test_step_refuses_a_published_tree_it_cannot_use(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        step_main(["--device", "cpu", "--tiny", "--published-tree", str(tmp_path), "--out", str(tmp_path)])
    assert "no models/scfs.py, utils/utils.py there" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        step_main(["--suite", "vit", "--device", "cpu", "--tiny", "--published-tree", str(tmp_path)])
    assert "the published step is the ResNet-50 one" in capsys.readouterr().err


def test_step_times_the_published_rows_first_in_the_same_record(standin: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    out = tmp_path / "out"
    assert step_main(["--device", "cpu", "--tiny", "--batch", "2", "--warmup", "1", "--steps", "1", "--strict",
                      "--no-ceiling", "--published-tree", str(standin), "--published-warmup", "1",
                      "--out", str(out)]) == 0
    (js,) = out.glob("step-cpu-*-tiny.json")
    rec = json.loads(js.read_text())
    assert [r["method"] for r in rec["published_same_call"]["rows"]] == ["scfs", "dino"]
    for r in rec["rows"]:
        assert r["published"]["source"] == "same call"
        assert r["published"]["step_ms"] == next(p["step_ms"] for p in rec["published_same_call"]["rows"]
                                                 if p["method"] == r["method"])


@pytest.mark.slow
def test_the_real_published_step_runs_on_the_cpu() -> None:
    """The published code itself (a checkout in SCFS_PUBLISHED_TREE or .pub/skyoux-scfs, with torchextractor and
    kornia installed): both methods time a step, tiny shapes, fp32."""
    tree = _real_tree()
    if tree is None:
        pytest.skip("no checkout of github.com/skyoux/scfs (set SCFS_PUBLISHED_TREE or export one to .pub/skyoux-scfs)")
    res = _run_child(tree)
    assert "error" not in res, res
    assert [r["method"] for r in res["rows"]] == ["scfs", "dino"] and all(r["step_ms"] > 0 for r in res["rows"])


def test_the_published_work_is_its_networks_forward_and_the_backward_beside_it(standin: Path) -> None:
    """`--flops` on a stand-in checkout: DINO's forward is exactly its networks' convolutions and matmuls per image
    (counted here on torchvision's ResNet-18 and the stand-in head's two Linears; its loss has none), the step is
    forward + backward, and SCFS's stage heads and search add work."""
    from torch.utils.flop_counter import FlopCounterMode

    res = published.flops_subprocess(standin, 2, tiny=True)
    assert "error" not in res, res
    s, d = res["rows"]["scfs"], res["rows"]["dino"]
    shapes, b = dict(published.RECIPE, **published.TINY), 2
    bb = torchvision.models.resnet18()
    bb.fc = torch.nn.Identity()
    g, loc = torch.randn(2 * b, 3, 64, 64), torch.randn(2 * b, 3, 32, 32)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        bb(g), bb(loc), bb(g)  # the student's two resolutions and the teacher's global views
    head = 2 * (512 * 16 + 16 * shapes["out_dim"])  # per view: the stand-in DINOHead's two Linears
    views = 2 + shapes["n_local"] + 2  # the student's global and local views, the teacher's global ones
    assert d["forward"] == (counter.get_total_flops() + head * views * b) / b
    for r in (s, d):
        assert r["forward"] > 0 and r["backward"] > 0 and r["total"] == r["forward"] + r["backward"]
    assert s["total"] > d["total"] and res["ratio"] == pytest.approx(s["total"] / d["total"])
    assert res["source"].startswith("sha256:") and res["batch"] == 2


def test_the_flops_record_sets_the_published_work_beside_ours(standin: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    from scfs.bench.flops import main as flops_main

    assert flops_main(["--tiny", "--recipe", "default", "--batch", "2", "--published-tree", str(standin),
                       "--out", str(tmp_path)]) == 0
    rec = json.loads(next(tmp_path.glob("flops-*.json")).read_text())
    assert rec["published"]["ratio"] > 1 and rec["published"]["batch"] == 2
    md = next(tmp_path.glob("flops-*.md")).read_text()
    assert "## The published step" in md and "Published SCFS / DINO work ratio" in md
    # its ResNet-50 step is compared with the imagenet recipe's only, not with a tiny network's
    assert "times the published SCFS step's work" not in md
    # a folder that is not a checkout is refused before any counting, with the fix
    assert flops_main(["--tiny", "--recipe", "default", "--published-tree", str(tmp_path / "nowhere"),
                       "--out", str(tmp_path / "x")]) == 2
    assert "no models/scfs.py" in capsys.readouterr().err and not (tmp_path / "x").exists()
