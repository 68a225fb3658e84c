"""The fast path's one-step-per-epoch loop trains exactly the old per-minibatch protocol: a plain PyTorch loop
(the same seeded sample order, torch's SGD per member, the cosine factor once per epoch) ends at the same weights
and logits, for a grid and for a single head; a reference with another order or schedule does not."""

import math

import pytest
import torch
import torch.nn.functional as F

from scfs.eval.linear import (
    EpochOrder,
    LinearProbe,
    _trainer,
    feature_loader,
    probe_scores,
    train_linear_on_features,
)

DIM, CLASSES, BATCH, EPOCHS, SEED = 12, 4, 64, 3, 7
SIZES = [300, 256]  # 4 x 64 + 44 (a shorter last minibatch) and 4 x 64 (none): the sampler draws differ
GRID = ([0.01, 0.3, 1.0, 1.0], [0.0, 0.0, 1e-3, 1e-2])
SINGLE = ([0.3], [1e-3])


def _data(n, seed=11):
    gen = torch.Generator().manual_seed(seed)
    return 2.0 + torch.randn(n, DIM, generator=gen), torch.randint(0, CLASSES, (n,), generator=gen)


def _reference(x, y, lr, wd, norm, order="sampler", schedule="epoch"):
    """One head trained by the old protocol in plain PyTorch: weights N(0, 0.01) from the seed, bias 0; every
    epoch a permutation from a generator seeded once, plus a second, unused one when the epoch ends on a shorter
    minibatch (the old loader's RandomSampler is then read to its end); minibatches of BATCH, the last one
    shorter; mean cross-entropy; torch.optim.SGD with momentum 0.9 and weight decay; lr x BATCH / 256, cosine to 0
    over EPOCHS, once per epoch. `order` / `schedule` give the wrong variants the test must tell apart. Returns
    (weight, bias, eval logits)."""
    n = x.shape[0]
    torch.manual_seed(SEED)  # what the probe's seeding leaves the init to draw from
    w = torch.empty(CLASSES, DIM).normal_(0.0, 0.01).requires_grad_()
    b = torch.zeros(CLASSES, requires_grad=True)
    mean, var = torch.zeros(DIM), torch.ones(DIM)
    base = lr * BATCH / 256
    opt = torch.optim.SGD([w, b], lr=base, momentum=0.9, weight_decay=wd)
    gen = torch.Generator().manual_seed(SEED)

    def normed(v, training):
        if norm == "bn":
            return F.batch_norm(v, mean, var, training=training)
        return F.normalize(v, dim=1) if norm == "l2" else v

    for epoch in range(EPOCHS):
        perm = torch.randperm(n, generator=gen)
        if order == "sampler" and n % BATCH:
            torch.randperm(n, generator=gen)
        for step, idx in enumerate(perm.split(BATCH)):
            if schedule == "epoch":
                factor = 0.5 * (1 + math.cos(math.pi * epoch / EPOCHS))
            else:  # cosine per minibatch: a different protocol
                steps = math.ceil(n / BATCH)
                factor = 0.5 * (1 + math.cos(math.pi * (epoch * steps + step) / (EPOCHS * steps)))
            opt.param_groups[0]["lr"] = base * factor
            opt.zero_grad()
            F.cross_entropy(normed(x[idx], True) @ w.T + b, y[idx]).backward()
            opt.step()
    with torch.no_grad():
        return w.detach(), b.detach(), normed(x, False) @ w.T + b


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("norm", ["bn", "l2", "none"])
@pytest.mark.parametrize("grid", [GRID, SINGLE], ids=["grid", "single"])
def test_fast_path_is_the_per_minibatch_protocol(grid, norm, n):
    x, y = _data(n)
    lrs, wds = grid
    probe = train_linear_on_features(x, y, CLASSES, epochs=EPOCHS, batch_size=BATCH, lr=lrs, weight_decay=wds,
                                     seed=SEED, feature_norm=norm)
    logits = probe_scores(probe, x, member=None)
    assert probe.heads.weight.shape[0] == len(lrs)
    for g, (lr, wd) in enumerate(zip(lrs, wds, strict=True)):
        w, b, ref_logits = _reference(x, y, lr, wd, norm)
        torch.testing.assert_close(probe.heads.weight[g], w, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(probe.heads.bias[g], b, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(logits[g], ref_logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", SIZES)
def test_fast_path_matches_the_per_minibatch_lightning_loop(n):
    """Against the loop it replaces: `LinearProbe` (automatic optimization, one Lightning step a minibatch) on
    `feature_loader`, with the same seed; the BatchNorm statistics too."""
    import lightning as L

    x, y = _data(n)
    lrs, wds = GRID
    fast = train_linear_on_features(x, y, CLASSES, epochs=EPOCHS, batch_size=BATCH, lr=lrs, weight_decay=wds,
                                    seed=SEED, feature_norm="bn")
    L.seed_everything(SEED, verbose=False)
    old = LinearProbe(DIM, CLASSES, None, lrs, BATCH, 0.9, wds, EPOCHS, feature_norm="bn")
    _trainer({}, EPOCHS, None, None, True, 0).fit(old, feature_loader(x, y, BATCH, True, SEED))
    for a, b in [(fast.heads.weight, old.heads.weight), (fast.heads.bias, old.heads.bias),
                 (fast.norm.bn.running_mean, old.norm.bn.running_mean),
                 (fast.norm.bn.running_var, old.norm.bn.running_var)]:
        torch.testing.assert_close(a, b.cpu(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("variant", [{"order": "one permutation a pass"}, {"schedule": "per minibatch"}])
def test_reference_tells_another_order_or_schedule_apart(variant):
    """The tolerance above is tight enough: the same loop with the minibatch order or the schedule changed ends
    far outside it."""
    x, y = _data(SIZES[0])
    probe = train_linear_on_features(x, y, CLASSES, epochs=EPOCHS, batch_size=BATCH, lr=SINGLE[0],
                                     weight_decay=SINGLE[1], seed=SEED, feature_norm="bn")
    w, _, _ = _reference(x, y, SINGLE[0][0], SINGLE[1][0], "bn", **variant)
    assert (probe.heads.weight[0] - w).abs().max() > 100 * (1e-6 + 1e-4 * w.abs().max())


@pytest.mark.parametrize("n", [*SIZES, 40])
def test_epoch_order_is_the_order_the_per_minibatch_loop_saw(n):
    """Epoch after epoch, `EpochOrder` gives the samples the per-minibatch Lightning loop trained on, in order."""
    import lightning as L

    class Recorder(LinearProbe):
        def training_step(self, batch, batch_idx):
            seen.append(batch[0].clone())
            return super().training_step(batch, batch_idx)

    seen = []
    x = torch.arange(n, dtype=torch.float32)[:, None].expand(n, DIM).contiguous()  # row i holds i
    L.seed_everything(SEED, verbose=False)
    _trainer({}, EPOCHS, None, None, True, 0).fit(Recorder(DIM, CLASSES, None, 0.1, BATCH, epochs=EPOCHS),
                                                  feature_loader(x, torch.zeros(n, dtype=torch.long), BATCH, True,
                                                                 SEED))
    old = torch.cat(seen)[:, 0].long()
    order = EpochOrder(n, BATCH, SEED)
    new = torch.cat([perm for _ in range(EPOCHS) for perm in order])
    assert torch.equal(new, old) and not torch.equal(new[:n], new[n:2 * n])


def test_bad_training_features_fail_in_one_line():
    with pytest.raises(ValueError, match=r"^features \(10, 3\) and labels \(9,\)"):
        train_linear_on_features(torch.randn(10, 3), torch.zeros(9, dtype=torch.long), 2, epochs=1)
