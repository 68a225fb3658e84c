"""The self-distillation base every method shares (a LightningModule); methods subclass it (`scfs.methods`)."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from torch.profiler import record_function

from scfs.config import COMPILE_BACKENDS, COMPILE_SCOPES, COMPILE_STUDENT_GRAPHS
from scfs.methods.ema import ema_update, without_stochastic_regularisation_
from scfs.methods.networks import (
    build_network,
    raise_block_recompile_limit,
    raise_recompile_limit,
    repeated_blocks,
    student_forward,
    student_head_outputs,
    student_outputs,
    student_view_features,
    teacher_forward,
)
from scfs.methods.precision import cached_weight_casts
from scfs.methods.schedules import cosine, linear_warmup
from scfs.models import Backbone
from scfs.optim import (
    FP16_SCALED,
    build_optimizer,
    clip_gradients_,
    fill_momentum_buffers_,
    use_fused_optimizer,
)
from scfs.reliability import non_finite_norms

# compile options of the loss graph per `compile_mode` (see `_compile`): the same mode without CUDA graphs
LOSS_COMPILE: dict[str, dict[str, Any]] = {"reduce-overhead": {"mode": None},
                                           "max-autotune": {"mode": "max-autotune-no-cudagraphs"}}


def discard_saved_tensors() -> contextlib.AbstractContextManager:
    """Autograd keeps none of the tensors it would save for the backward (they are freed as the forward goes on):
    for a forward whose graph is cut off after it (`helper_student_outputs`), so its activations never sit in
    memory."""
    return torch.autograd.graph.saved_tensors_hooks(lambda _: None, lambda _: None)


def helper_student_outputs(st: dict[str, Any]) -> dict[str, Any]:
    """The student's outputs as a `compile_parallel` helper passes them on: each tensor cut from the student's
    graph (`detach`) and made a leaf that requires grad exactly when the run's output does. The losses' graphs
    see the same shapes, strides, dtypes and `requires_grad` as in the run (so they build the run's cache
    entries), their backward stops at these leaves, and the helper needs no memory for the student's activations
    (run under `discard_saved_tensors`)."""
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.detach().requires_grad_(t.requires_grad), st)


def step_losses(method: SelfDistillation, st: dict[str, Any], te: dict[str, Any], b: int, n_local: int,
                temp: float | torch.Tensor, diagnostics: bool) -> tuple[torch.Tensor, dict[str, Any]]:
    """A step's loss and its logged terms (`method.loss_terms`); module-level, so `compile=true` traces it as one
    graph with the method passed in, like the networks' calls (`scfs.methods.networks`)."""
    logs: dict[str, Any] = {}
    loss = method.loss_terms(st, te, b, n_local, temp, logs, diagnostics)
    return loss, logs


class SelfDistillation(L.LightningModule):
    """Student / EMA-teacher self-distillation on multi-crop views: what every method here shares.

    The teacher is an EMA of the student (momentum on a cosine schedule to 1) and never gets gradients; the base
    owns the networks' two step-time calls, the schedules (lr, weight decay, teacher temperature, momentum), the
    optimizer and its clipping, the last-layer freeze, finite checks, the views made on the training device and
    logging. A method adds its loss terms (`loss_terms`), the backbone stages it needs heads on (`stage_names`)
    and its loss at the uniform solution (`uniform_loss`); it registers under its config name
    (`scfs.methods.register`).
    """

    method_name: str = ""  # the config name it is registered under (`register` sets it)

    def __init__(
        self,
        backbone: Mapping[str, Any],
        method: Mapping[str, Any],
        search: Mapping[str, Any],
        optim: Mapping[str, Any],
        batch_size: int,
        n_local: int,
        crops: Mapping[str, Any] | None = None,
        seed: int = 0,
        compile: bool = False,
        finite_check_every_n_steps: int = 1,
        compile_mode: str = "default",
        compile_scope: str = "model",
        compile_student_graphs: str = "one",
        compile_backend: str = "inductor",
        compile_views: bool = False,
        compile_background: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if compile_scope not in COMPILE_SCOPES:  # before the networks are built: a bad setting fails at once
            raise ValueError(f"compile_scope={compile_scope!r}: allowed are {', '.join(COMPILE_SCOPES)}")
        if compile_student_graphs not in COMPILE_STUDENT_GRAPHS:
            raise ValueError(f"compile_student_graphs={compile_student_graphs!r}: allowed are "
                             f"{', '.join(COMPILE_STUDENT_GRAPHS)}")
        if compile_backend not in COMPILE_BACKENDS:
            raise ValueError(f"compile_backend={compile_backend!r}: allowed are {', '.join(COMPILE_BACKENDS)}")
        if compile_backend != "inductor" and compile_mode != "default":
            raise ValueError(f"compile_mode={compile_mode!r} is inductor's: with compile_backend={compile_backend} "
                             "use compile_mode=default")
        self.method_cfg, self.search_cfg, self.optim_cfg = dict(method), dict(search), dict(optim)
        self.stages: tuple[str, ...] = self.stage_names()
        self.channels_last = bool(backbone.get("channels_last", False))
        self.student = build_network(backbone, self.method_cfg, self.stages)
        self.teacher = without_stochastic_regularisation_(copy.deepcopy(self.student))
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        if self.channels_last:  # the weights in the views' layout: else every conv call converts its weight and,
            # in the backward, its gradient (one more kernel and its host dispatch each, on a host-bound step)
            self.student.to(memory_format=torch.channels_last)
            self.teacher.to(memory_format=torch.channels_last)
        self.build_losses()
        self.n_local = n_local
        self.seed = seed
        self.batch_aug = None
        if crops is not None:
            from scfs.data.batch_aug import BatchMultiCrop

            self.batch_aug = BatchMultiCrop(**{k: tuple(v) if isinstance(v, (list, tuple)) else v
                                               for k, v in dict(crops).items()})
        self._aug_gen: torch.Generator | None = None
        # compile_background: eager until `compile_now` (scfs.training.background_compile switches when a child
        # process has filled the compile cache)
        self.compile_nets = bool(compile) and not compile_background
        self._local_heads = self.uses_local_heads()
        # the step's student and teacher calls; `_compile` swaps in compiled versions. Module-level functions that
        # take the networks as arguments: a copy of this module calls them with its own networks.
        self._student_fn: Any = student_forward
        self._teacher_fn: Any = teacher_forward
        self._loss_fn: Any = step_losses
        # compile_student_graphs=per_view_size: the student's call as `split_student_call` of these two, compiled
        self._features_fn: Any = student_view_features
        self._heads_fn: Any = student_head_outputs
        self._temp: torch.Tensor | None = None  # compiled loss: the teacher temperature as a 0-d device tensor
        self._loss_prepared = False
        # compile_parallel: called with "student", "teacher", "loss" before those calls (and with the student's call
        # per view size, "student_local" and "student_heads" before its local views' and its heads' graphs),
        # "student_backward" before the backward and "views" before the views it handed over
        # (`hand_views_to_helper`) while other processes compile them
        # (`scfs.training.background_compile.ParallelCompile`): waits for their cache entries; None otherwise
        self.compile_gate: Callable[[str], None] | None = None
        # compile_parallel with the views compiled (`hand_views_to_helper`): "eager" until the first batch's views
        # are made, "ask" until the next batch has asked `compile_gate` for "views"; None otherwise
        self.views_handoff: str | None = None
        self.compile_mode = compile_mode
        self.compile_scope = compile_scope
        self.compile_student_graphs = compile_student_graphs
        self.compile_backend = compile_backend
        self.compile_views = bool(compile_views)
        self.finite_every = max(int(finite_check_every_n_steps), 1)
        self._nonfinite: torch.Tensor | None = None  # device flag: a non-finite loss since the last check
        if self.compile_nets:
            self._compile()

    # ---- what a method defines -------------------------------------------------------------------------
    def stage_names(self) -> tuple[str, ...]:
        """Backbone stages that get a stage head (built before the losses; none by default)."""
        return ()

    def uses_local_heads(self) -> bool:
        """Whether the student's stage heads also run on the local views' maps."""
        return False

    def build_losses(self) -> None:
        """Create the loss modules (they hold state such as DINO's centre, so they are submodules)."""

    def loss_terms(self, st: dict[str, Any], te: dict[str, Any], b: int, n_local: int, temp: float | torch.Tensor,
                   logs: dict[str, Any], diagnostics: bool) -> torch.Tensor:
        """The total loss of a step from the student's and the teacher's outputs (`student_forward`,
        `teacher_forward`); terms go into `logs` as `loss/<name>`, and on the steps whose logs are written
        (`diagnostics`) also any extra statistics. Traced by `torch.compile` under `compile=true` (`step_losses`):
        no host syncs, no Python state that changes per step (`temp` is then a 0-d device tensor)."""
        raise NotImplementedError

    def prepare_loss(self, st: dict[str, Any], te: dict[str, Any]) -> None:
        """Eager set-up before the (possibly compiled) loss of the first step, such as choosing a kernel backend:
        work that must not be traced."""

    def uniform_loss(self) -> float:
        """The loss value when every output is uniform (log of the head sizes): a stuck objective sits here."""
        raise NotImplementedError

    def compile_now(self) -> None:
        """Compile the step now (`compile_background=true`: when the child has filled the cache); the next step
        builds the graphs. Idempotent."""
        if not self.compile_nets:
            self.compile_nets = True
            self._compile()

    def _compile(self) -> None:
        """`torch.compile` what `compile_scope` names. `model`: the step's student and teacher calls (one graph
        each); in place (`nn.Module.compile`) also what runs outside them: both backbones (other callers; the kNN
        passes run them eager, `scfs.eval.features`) and the teacher's stage heads (RoI crops, the searched branch).
        `blocks`: only the backbones' repeated blocks (`repeated_blocks`), in place, so blocks of one shape share
        one compiled graph and the cold compile traces and lowers a block instead of a network; stems and heads run
        eager. The losses are one graph in both.
        Parameter names, checkpoints and the EMA are unchanged. `compile_mode="reduce-overhead"` replays the graphs
        as CUDA graphs (the step is launch-bound at small batches).
        `compile_backend="cudagraphs"` traces the same calls (dynamo + AOTAutograd) but generates no kernels: the
        graphs' own aten kernels are replayed as CUDA graphs. A cold start then costs the tracing alone, not the
        minutes of kernel generation, and the step loses inductor's fusion but not the replay. Its loss stays eager:
        small, and outside CUDA graphs for the reason given below.
        `compile_views` (inductor only) also fuses the per-pixel ops of the views made on the device
        (`BatchMultiCrop.compile_finish`), outside CUDA graphs like the loss."""
        # dynamic=False: one static graph per input shape (global and local views). Without it the second shape
        # a module sees makes dynamo recompile it with symbolic sizes (slower kernels, a longer compile; seen as
        # [0/1] [0/2] recompiles on the ResNet-50 step), and CUDA graphs record one graph per shape either way.
        kw: dict[str, Any] = {"dynamic": False}
        raise_recompile_limit(len(self.stages))
        if self.compile_mode != "default":
            kw["mode"] = self.compile_mode
        if self.compile_backend != "inductor":
            kw["backend"] = self.compile_backend
        # the losses (with SCFS's searched targets and stage heads) as one graph, without CUDA graphs: its
        # outputs are the step's logged values, which Lightning may read after the next replay of a CUDA graph
        # would have overwritten them, and the graph is a few fused kernels, so replaying it saves little
        loss_kw = {**kw, **LOSS_COMPILE.get(self.compile_mode, {})}
        compile_loss = self.compile_backend == "inductor"
        if self.compile_views and compile_loss and self.batch_aug is not None:
            # the views' per-pixel ops, fused; like the loss without CUDA graphs: the views outlive the next replay
            self.batch_aug.compile_finish(**loss_kw)
        if self.compile_scope == "blocks":
            self._loss_fn = torch.compile(step_losses, **loss_kw) if compile_loss else step_losses
            blocks = [blk for net in (self.student, self.teacher) for blk in repeated_blocks(net["backbone"])]
            raise_block_recompile_limit(blocks)
            for blk in blocks:
                blk.compile(**kw)
            return
        # the student's and the teacher's step-time calls as one graph each (see `student_forward`), or the
        # student's as one graph per view size and one for its heads (`split_student_call`)
        if self.compile_student_graphs == "per_view_size":
            self._features_fn = torch.compile(student_view_features, **kw)
            self._heads_fn = torch.compile(student_head_outputs, **kw)
            self._student_fn = self.split_student_call
        else:
            self._student_fn = torch.compile(student_forward, **kw)
        self._teacher_fn = torch.compile(teacher_forward, **kw)
        self._loss_fn = torch.compile(step_losses, **loss_kw) if compile_loss else step_losses
        for net in (self.student, self.teacher):
            net["backbone"].compile(**kw)
        for head in self.teacher["stage_heads"].values():
            head.compile(**kw)
            head.compile_searched(**kw)  # the teacher's N·B searched maps go through forward_searched

    # ---- schedules -------------------------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        if self._trainer is None:
            return 1
        total = self.trainer.estimated_stepping_batches
        return int(total) if math.isfinite(total) else 1

    @property
    def steps_per_epoch(self) -> float:
        return self.total_steps / max(self.trainer.max_epochs or 1, 1) if self._trainer is not None else 1.0

    def teacher_temp(self) -> float:
        m = self.method_cfg
        epoch = self.global_step / max(self.steps_per_epoch, 1.0)
        return linear_warmup(epoch, m.get("warmup_teacher_temp_epochs", 0), m.get("warmup_teacher_temp", 0.04),
                             m.get("teacher_temp", 0.04))

    def teacher_momentum(self, step: int | None = None) -> float:
        m = self.method_cfg
        step = self.global_step if step is None else step
        return cosine(step, self.total_steps, m.get("momentum_teacher", 0.996), 1.0)

    def global_batch_size(self) -> int:
        """Images per optimizer step over all processes: batch_size (per device) x devices x nodes x
        accumulate_grad_batches. `optim.lr` is the lr *per 256 images* of it (linear scaling rule of Goyal et al.,
        as in DINO: lr = optim.lr x global_batch / 256) when `optim.scale_lr` (default true)."""
        if self._trainer is None:
            return int(self.hparams.batch_size)
        return int(self.hparams.batch_size) * max(self.trainer.world_size, 1) * max(
            int(self.trainer.accumulate_grad_batches), 1)

    def _lr_wd(self) -> tuple[float, float]:
        o = self.optim_cfg
        scale = self.global_batch_size() / 256 if o.get("scale_lr", True) else 1.0
        warm = int(o.get("warmup_epochs", 0) * self.steps_per_epoch)
        lr = cosine(self.global_step, self.total_steps, o["lr"] * scale, o.get("min_lr", 0.0), warm)
        wd = cosine(self.global_step, self.total_steps, o.get("weight_decay", 0.0),
                    o.get("weight_decay_end", o.get("weight_decay", 0.0)))
        return lr, wd

    # ---- optimisation ----------------------------------------------------------------------------------
    def configure_optimizers(self):
        decay, no_decay = [], []
        backbone = self.student["backbone"]
        # norms and biases take no weight decay (DINO); a ViT's position embedding and CLS token neither (timm's
        # `no_weight_decay()`, as DeiT and timm train ViTs), unless `optim.decay_tokens` (DINO's own code decays them)
        tokens = set() if self.optim_cfg.get("decay_tokens", False) else {
            f"backbone.{n}" for n in getattr(backbone, "no_weight_decay_names", set)()}
        for name, p in self.student.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim <= 1 or name.endswith(".bias") or name in tokens else decay).append(p)
        groups = [{"params": decay, "apply_wd": True}, {"params": no_decay, "apply_wd": False, "weight_decay": 0.0}]
        trainer = self._trainer
        fused = use_fused_optimizer(
            self.optim_cfg.get("fused", "auto"), self.optim_cfg.get("name", "sgd"),
            trainer is not None and str(trainer.precision) in FP16_SCALED,
            float((trainer.gradient_clip_val or 0.0) if trainer is not None else 0.0))
        return build_optimizer(groups, self.optim_cfg, fused)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Clip here, not in Lightning's mixed-precision plugin, which refuses any fused optimizer even under bf16.

        Without a loss scaler the gradients are already true, so `clip_gradients_` is exact. Under fp16 loss
        scaling Lightning has unscaled them before this hook (the optimizer is never fused with clipping there:
        `use_fused_optimizer`), and its own clipping runs."""
        if not gradient_clip_val:
            return
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        clip_gradients_((p for g in optimizer.param_groups for p in g["params"]), float(gradient_clip_val),
                        gradient_clip_algorithm)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        lr, wd = self._lr_wd()
        for g in self.optimizers().optimizer.param_groups:
            g["lr"] = lr
            if g.get("apply_wd", False):
                g["weight_decay"] = wd

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.current_epoch < self.method_cfg.get("freeze_last_layer_epochs", 0):
            for name, p in self.student.named_parameters():
                if "last_layer" in name:
                    p.grad = None
        if self._check_now():
            self._check_finite_grads()
        opt = getattr(optimizer, "optimizer", optimizer)  # the torch optimizer under Lightning's wrapper
        if isinstance(opt, torch.optim.SGD) and opt.defaults.get("fused"):
            fill_momentum_buffers_(opt)

    def _check_now(self) -> bool:
        """Finite checks read a device value on the host (a sync): every step by default, every
        `finite_check_every_n_steps` steps on GPU recipes (a non-finite loss in between is remembered on the
        device and reported at the next check; `AtomicCheckpointIO` never writes non-finite weights)."""
        return self.finite_every <= 1 or (self.global_step + 1) % self.finite_every == 0

    def _check_finite_grads(self) -> None:
        """Stop before the optimizer step when a gradient is NaN/Inf although the loss was finite: the step
        would write NaN into every weight (clipping spreads it) and the next checkpoint would be lost.
        Skipped under fp16 loss scaling, where inf gradients are expected and the scaler skips the step."""
        if self._trainer is not None and getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            return
        named = [(n, p.grad) for n, p in self.student.named_parameters() if p.grad is not None]
        bad = [named[i][0] for i in non_finite_norms(named)]
        if not bad:
            return
        raise FloatingPointError(
            f"non-finite gradient at step {self.global_step} (epoch {self.current_epoch}) in {len(bad)} "
            f"parameter(s): {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}; the loss was finite. Stopped "
            "before the weights were updated: the last checkpoint is the last good one. Lower optim.lr or enable "
            "gradient clipping (trainer.gradient_clip_val)")

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """The optimizer step, then the EMA teacher update of that step.

        The EMA is done here rather than in `on_train_batch_end` because Lightning calls the callbacks'
        `on_train_batch_end` (where step checkpoints are written) *before* the module's: a mid-epoch checkpoint
        would hold the teacher without this step's update and a resumed run would drift from an uninterrupted
        one. `global_step` is incremented after this hook, hence `+ 1`: the momentum of the step just taken."""
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)  # runs the closure: step + backward
        with record_function("scfs/ema"):
            ema_update(self.teacher, self.student, self.teacher_momentum(self.global_step + 1))

    def before_backward(self) -> None:
        """Asks `compile_gate` for the student's backward graph (`compile_parallel_backward`: a helper process may be
        compiling it) before the step's backward builds it."""
        if self.compile_gate is not None:
            self.compile_gate("student_backward")

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.before_backward()
        with record_function("scfs/backward"):  # a named part of the step in profiles, like those of training_step
            super().backward(loss, *args, **kwargs)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Raw uint8 image batches get their multi-crop views here, on the training device, in one go; still
        encoded ones (`data.decode=gpu`, `scfs.data.encoded.EncodedImages`, left on the host by the transfer)
        are decoded here first, on this module's device.

        The generator is re-seeded from (seed, global step), so the views of a step do not depend on what
        ran before it: a resumed run sees exactly the views of an uninterrupted one.
        """
        from scfs.data.encoded import EncodedImages, decode_images

        images = batch[0] if isinstance(batch, (list, tuple)) else batch
        encoded = isinstance(images, EncodedImages)
        cropped = isinstance(images, dict) and images.get("views") and images["views"][0].dtype == torch.uint8
        if not (self.training and (encoded or cropped or isinstance(images, torch.Tensor)
                                   and images.dtype == torch.uint8)):
            return batch
        if self.batch_aug is None:
            raise RuntimeError("the loader yields uint8 images, crops or encoded files but the module has no crops "
                               "config: build it with scfs.train.build (data.batch_aug / data.colour_on_device / "
                               "data.decode=gpu pass the crops)")
        if encoded:
            with record_function("scfs/decode"):
                labels = batch[1] if isinstance(batch, (list, tuple)) and len(batch) > 1 else None
                images, labels = decode_images(images, labels, self.device)
            if labels is not None:
                batch = (batch[0], labels, *batch[2:])
        device = images[0].device if encoded else (images["views"][0] if cropped else images).device
        if self._aug_gen is None or self._aug_gen.device != device:
            self._aug_gen = torch.Generator(device=device)
        self._aug_gen.manual_seed(self.seed * 1_000_003 + self.global_step)
        # DDP: every rank draws the parameters of the whole global batch from the same seed and keeps its
        # rows (the sampler gives rank r images r*B..(r+1)*B-1 of the global batch), so 2 ranks x B get
        # exactly the views of 1 rank x 2B (tests/test_ddp.py)
        b = len(images) if encoded else (images["views"][0] if cropped else images).shape[0]
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self._trainer is not None else (0, 1)
        with record_function("scfs/views"), self._views_handoff_step():
            if cropped:  # data.colour_on_device: the workers cropped, the colour ops run here for the whole batch
                sample = {**images, **self.batch_aug.colour(images["views"], generator=self._aug_gen,
                                                            global_batch=b * world, offset=rank * b)}
            else:  # a uint8 batch, or the decoded images of different sizes (data.decode=gpu)
                sample = self.batch_aug(images, generator=self._aug_gen, global_batch=b * world, offset=rank * b)
        return (sample, *batch[1:]) if isinstance(batch, (list, tuple)) else sample

    def hand_views_to_helper(self) -> bool:
        """Leave the compile of the views' per-pixel ops (`compile_views`) to `compile_parallel`'s helper process,
        which compiles them after the teacher's call and the losses: the first batch's views are made eagerly
        (`BatchMultiCrop.eager_finish`), so the run does not compile them before its first student call, and the
        next batch asks `compile_gate` for "views" before it makes them compiled. Returns whether the views are
        made here and compiled at all (else there is nothing to hand over)."""
        if not self.makes_compiled_views:
            return False
        self.views_handoff = "eager"
        return True

    @property
    def makes_compiled_views(self) -> bool:
        """Whether this module makes its views on the device with compiled per-pixel ops (`compile_views`)."""
        return self.batch_aug is not None and self.batch_aug.finish_compiled

    def _views_handoff_step(self) -> contextlib.AbstractContextManager:
        """Where this batch's views stand in `hand_views_to_helper`'s hand-over: made eagerly, or (the next batch)
        asked of the gate first; a no-op once it is over."""
        state = self.views_handoff
        if state == "eager":
            self.views_handoff = "ask"
            return self.batch_aug.eager_finish()
        if state == "ask":
            self.views_handoff = None
            if self.compile_gate is not None:
                self.compile_gate("views")
        return contextlib.nullcontext()

    # ---- forward ---------------------------------------------------------------------------------------
    def split_student_call(self, student: torch.nn.ModuleDict, g: torch.Tensor, loc: torch.Tensor | None,
                           stages: tuple[str, ...], local_heads: bool) -> dict[str, Any]:
        """`student_forward` as three compiled graphs (`compile_student_graphs=per_view_size`): the global views'
        features, the local views' (the same code, another shape: dynamo's second graph of it) and the heads on
        both. Each is about half of the one graph's compile or less, so `compile_parallel`'s helpers can compile
        the local views' graph, the heads' and each graph's backward while this process compiles the global views'
        graph; `compile_gate` is asked for "student_local" before the local views' graph and for "student_heads"
        before the heads'. The weights' gradients from both view sizes are summed by autograd between the graphs
        instead of inside one."""
        f_g = self._features_fn(student, g, stages, True)
        f_l = None
        if loc is not None:
            if self.compile_gate is not None:
                self.compile_gate("student_local")
            f_l = self._features_fn(student, loc, stages, local_heads)
        if self.compile_gate is not None:
            self.compile_gate("student_heads")
        return student_outputs(self._heads_fn(student, f_g, f_l, stages), f_l, stages)

    def views_to_loss(self, g: torch.Tensor, loc: torch.Tensor | None, b: int, n_local: int, temp: float,
                      diagnostics: bool, eager_student: bool = False, done: Callable[[str], None] | None = None,
                      ) -> tuple[torch.Tensor, dict[str, Any], dict[str, Any]]:
        """The step from the stacked views to the loss: the student's call, the teacher's, the losses; returns
        `(loss, logs, student outputs)`. One copy for `training_step` and for the step driven without Lightning
        (`scfs.training.plain_step`), so a child compiling beside a run builds the run's graphs.

        `compile_gate(part)` is asked before the student's call, the teacher's and the losses (`compile_parallel`),
        and before the backward (`before_backward`).
        `eager_student`: the student's call of `compile_parallel`'s helper, which compiles only the rest: eager
        (`force_eager`), and cut off (`helper_student_outputs`) so the helper holds no student activations;
        `done("teacher")` is told once the teacher's call has run. `g`: the two global views of `b` images stacked,
        `loc`: the `n_local` local views stacked (None without them)."""
        # eager: each student weight cast to bf16/fp16 once for both view batches (a compiled graph does so anyway)
        casts = contextlib.nullcontext() if self.compile_nets else cached_weight_casts(g.device.type)
        eager = torch.compiler.set_stance("force_eager") if eager_student else contextlib.nullcontext()
        unsaved = discard_saved_tensors() if eager_student else contextlib.nullcontext()
        if self.compile_gate is not None:
            self.compile_gate("student")
        with record_function("scfs/student"), casts, eager, unsaved:
            st = self._student_fn(self.student, g, loc, self.stages, self._local_heads)
        if eager_student:
            st = helper_student_outputs(st)
        if self.compile_gate is not None:
            self.compile_gate("teacher")
        with torch.no_grad(), record_function("scfs/teacher"):
            te = self._teacher_fn(self.teacher, g, self.stages)
        if done is not None:
            done("teacher")
        if not self._loss_prepared:
            self.prepare_loss(st, te)
            self._loss_prepared = True
        if self.compile_gate is not None:
            self.compile_gate("loss")
        with record_function("scfs/losses"):
            loss, logs = self._loss_fn(self, st, te, b, n_local, self._temp_arg(temp, g.device),
                                       self.loss_diagnostics(diagnostics))
        return loss, logs, st

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        sample = batch[0] if isinstance(batch, (list, tuple)) else batch
        views: list[torch.Tensor] = sample["views"]
        b = views[0].shape[0]
        n_local = len(views) - 2
        temp = self.teacher_temp()

        # record_function ranges name the parts of the step in a profile (`python -m scfs.bench.step --profile`):
        # where SCFS's time goes next to DINO's; free when no profiler runs
        cl = torch.channels_last if self.channels_last else torch.contiguous_format
        g = torch.cat(views[:2]).contiguous(memory_format=cl)
        loc = torch.cat(views[2:]).contiguous(memory_format=cl) if n_local else None
        diagnostics = self._logging_step()
        loss, logs, st = self.views_to_loss(g, loc, b, n_local, temp, diagnostics)
        # for online monitors (stop-gradient linear probe): student features of global view 1 and labels
        self.last_features = st["pooled_global"][:b].detach()
        self.last_labels = batch[1] if isinstance(batch, (list, tuple)) and len(batch) > 1 else None
        logs["loss/total"] = loss
        # the per-step terms only on the steps that write them: each self.log costs about 0.4 ms of host time, a
        # dozen of them a few ms of a host-bound GPU step; the schedules' Python floats would also become device
        # tensors there (a blocking copy each)
        if diagnostics:
            logs.update({"sched/teacher_temp": temp, "sched/momentum": self.teacher_momentum(),
                         "sched/lr": self.optimizers().optimizer.param_groups[0]["lr"],
                         "sched/wd": self.optimizers().optimizer.param_groups[0]["weight_decay"]})
            self.log_dict(logs, on_step=True, on_epoch=False, batch_size=b)
        self.log("loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=b)  # every step: epoch mean
        if self.finite_every > 1:
            bad = ~torch.isfinite(loss)
            self._nonfinite = bad if self._nonfinite is None else self._nonfinite | bad
            if self._check_now() and bool(self._nonfinite):
                raise FloatingPointError(
                    f"non-finite loss in the {self.finite_every} steps up to step {self.global_step} (epoch "
                    f"{self.current_epoch}; checked every finite_check_every_n_steps={self.finite_every}): the "
                    "weights may already be non-finite, but no checkpoint with non-finite weights is ever written, "
                    "so the last checkpoint is good; lower optim.lr or enable gradient clipping "
                    "(trainer.gradient_clip_val), or set finite_check_every_n_steps=1 to stop at the first one")
        elif not torch.isfinite(loss):
            bad = [k for k, v in logs.items() if isinstance(v, torch.Tensor) and not torch.isfinite(v).all()]
            raise FloatingPointError(
                f"non-finite loss at step {self.global_step} (epoch {self.current_epoch}, batch {batch_idx}): "
                f"offending term(s) {', '.join(bad) or 'loss/total'}. Stopped before the weights were updated: the "
                "last checkpoint is the last good one; lower optim.lr or enable gradient clipping "
                "(trainer.gradient_clip_val)"
            )
        return loss

    def loss_diagnostics(self, logging_step: bool) -> bool:
        """Whether a step's loss also computes its extra statistics (the search's similarity and weight entropy):
        eagerly only on the steps whose logs are written (each op costs host time in a host-bound step); compiled on
        every step, because a flag that changes between steps makes dynamo trace and compile a second loss graph
        during the first epoch, while the statistics are a few fused kernels inside the one graph."""
        return logging_step or self._loss_fn is not step_losses

    def _temp_arg(self, temp: float, device: torch.device) -> float | torch.Tensor:
        """The teacher temperature as the loss takes it: a Python float eagerly; a 0-d device tensor, refilled only
        when its value changes, when the loss is compiled (a float would be a constant of the graph: one
        recompile per value of a warm-up schedule)."""
        if self._loss_fn is step_losses:
            return temp
        if self._temp is None or self._temp.device != device:
            self._temp = torch.tensor(temp, dtype=torch.float32, device=device)
            self._temp_value = temp
        elif self._temp_value != temp:
            self._temp.fill_(temp)
            self._temp_value = temp
        return self._temp

    def _logging_step(self) -> bool:
        """True on the steps whose logs Lightning writes (every `trainer.log_every_n_steps`), and on the last step
        of the run, whose terms the summary reads (`loss/dino`)."""
        if self._trainer is None:
            return True
        try:
            if self.trainer._logger_connector.should_update_logs:
                return True
        except AttributeError:
            return True
        return self.global_step + 1 >= self.total_steps

    # ---- helpers for evaluation ------------------------------------------------------------------------
    def backbone(self, which: str = "teacher") -> Backbone:
        if which not in ("teacher", "student"):
            raise ValueError(f"which={which!r}: allowed are teacher, student")
        return getattr(self, which)["backbone"]
