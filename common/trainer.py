"""The training loop shared by every paper, on one process or many.

`train(cfg)` runs a `Trainer`, whose methods are the steps of a run:

    build_model, build_data, adapt, parallelize, build_optimizer, build_tracker   what the run needs
    train_step        one optimizer step: micro-steps, accumulation, clipping, scaler
    evaluate          the task's metrics on the test split, over all ranks
    save, resume      DCP checkpoints of every rank
    finish            final weights, result.json, the results store, the summary

It trains with AdamW and warmup-then-cosine, evaluates after every epoch,
checkpoints, and leaves a run directory: config.json, result.json,
model.safetensors, metrics.jsonl, checkpoints/. A resumed run (`--resume`, or a
torchrun restart after a crash) continues from its latest complete checkpoint.
The task (common.tasks) owns the loss and the metrics, so nothing here depends
on what the targets are.
"""

import contextlib
import dataclasses
import json
import math
import os
import re
import secrets
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from common import lora, mesh, parallel
from common.batchsize import MIN_STEPS_PER_EPOCH, WARMUP_EPOCHS, find_micro_batch, scaled_lr, steps_limit
from common.config import TrainConfig, save as save_config
from common.data import PixelWeights, Share, augment, dataset_for, eval_loader, options, train_loader
from common.data.collate import element_counts, to_device
from common.errors import EXIT_NONFINITE, ConfigError, NonFinite
from common.export import load_run
from common.monitor import DeviceMonitor, short_bytes
from common.optim import build_optimizer, schedule
from common.parallelize import Options, lay_out, parallelize
from common.preemption import EXIT_PREEMPTED, REASONS, STOPPED, Preempted, StopSignals, parse_time_limit
from common.pretrained import build_model, is_run, load_from_run, reference_model
from common.profiling import WARMUP_STEPS, StepProfiler
from common.step import autocast, forward_loss
from common.tasks import flip_tta, get_task
from common.throughput import Meter, peak_flops, training_flops
from common.train_state import TrainState
from common.tracking import (NullTracker, Tracker, command_line, device_name, find_wandb_id, git_commit,
                             provenance, resolve_mode, store_result, sweep_tag, write_json)
from papers import get_paper

# Per-step features that common.bench's row a switches off in turn, to time what each costs (a comma list
# of agree, activations, train-metric); never set by a user.
BENCH_SKIP = "_PAPER_STUDY_BENCH_SKIP"

# The ranks agree on a stop request (SIGTERM, SIGUSR1, --time-limit) at least this often: every k steps,
# with k agreed along (see Trainer.agree). A collective every step costs a small model about 10% of it.
AGREE_SECONDS = 0.25


def restart_count() -> int:
    """How many times torchrun has restarted this launch's workers after a failure."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def default_run_dir(paper: str) -> Path:
    """runs/<paper>-<UTC time>-<id>. Under torchrun the id is the rendezvous run id, the same
    for every attempt of one launch, so restarted workers find the folder of the first."""
    rdzv = re.sub(r"[^A-Za-z0-9_]", "", os.environ.get("TORCHELASTIC_RUN_ID", ""))[:12]
    if rdzv and restart_count() > 0:
        earlier = sorted(Path("runs").glob(f"{paper}-*-{rdzv}"))
        if earlier:
            return earlier[-1]
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{paper}-{stamp}-{rdzv or secrets.token_hex(3)}"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The run's newest complete checkpoint (common.checkpoint, which imports torch.distributed.checkpoint:
    imported only where a checkpoint is written or read)."""
    from common import checkpoint

    return checkpoint.latest(run_dir)


def unpadded(inputs):
    """The inputs without their masks and lengths: what a device computes on (for FLOP counts,
    since data-dependent mask code cannot run on the meta device)."""
    return {k: v for k, v in inputs.items() if k not in ("mask", "lengths")} if isinstance(inputs, dict) else inputs


def untied(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights as safetensors stores them: a tensor shared under two names (the Transformer's tied
    embeddings and pre-softmax weights) written once under each, so that the file loads strictly."""
    seen, out = set(), {}
    for name, t in weights.items():
        t = t.contiguous()
        out[name] = t.clone() if t.data_ptr() in seen else t
        seen.add(t.data_ptr())
    return out


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled so far in this process (a recompile adds one)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def train(cfg: TrainConfig, argv: list[str] | None = None, resume: bool = False) -> dict:
    """Train as `cfg` says; returns the result (also written to result.json on rank 0).

    Args:
        resume: continue the run in cfg.out from its latest complete checkpoint.
    """
    env = parallel.setup()
    try:
        trainer = Trainer(cfg, env, argv if argv is not None else sys.argv[1:], resume or restart_count() > 0)
        with trainer.stop:  # SIGTERM and SIGUSR1 stop it after a step, with a checkpoint (Preempted)
            return trainer.fit()
    finally:
        parallel.teardown()


class Trainer:
    """One run of one paper on one data set, on this process's share of the data.

    Args:
        cfg: the resolved and validated config.
        env: this process's rank, world size and device (common.parallel.setup).
        argv: the command line, recorded in result.json.
        resuming: continue the run in cfg.out (or, under a torchrun restart, the launch's run
            directory) from its latest complete checkpoint.
    """

    def __init__(self, cfg: TrainConfig, env: parallel.Env, argv: list[str], resuming: bool):
        self.started = time.perf_counter()  # wall time counts from here, and again after each save
        self.cfg, self.env, self.argv, self.resuming = cfg, env, argv, resuming
        self.spec, self.data = get_paper(cfg.paper).for_flavor(cfg.flavor), dataset_for(cfg)
        # --augment auto: the data set's own, written into config.json as what the run did
        self.cfg = cfg = dataclasses.replace(cfg, augment=self.data.training_augment(cfg.augment))
        # the processes as a mesh (common.mesh; ddp and fsdp are its common layouts, and need none)
        self.strategy, self.layout, self.mesh = lay_out(cfg, env)
        self.dp_group = mesh.data_parallel_group(self.mesh, self.layout)  # None: every process's
        self.dp_rank, self.dp_size = self.layout.dp_rank(env.rank), self.layout.dp  # the ranks reading different data
        self.facts = self.data.facts(**options(cfg))
        decoding = dict(beam=cfg.beam, length_penalty=cfg.length_penalty) if self.data.task == "seq2seq" else {}
        # --teacher: the distillation loss (common.tasks); the teacher itself is loaded in build_teacher
        distilling = (dict(distillation=cfg.distillation, tau=cfg.distillation_tau, lam=cfg.distillation_lambda)
                      if cfg.teacher else {})
        self.task = get_task(self.data.task, self.facts, label_smoothing=cfg.label_smoothing, **decoding, **distilling)
        # --augment mixup:A, cutmix:A: timm's Mixup on each training batch (None without them)
        self.mixup = augment.mixing(cfg.augment, self.facts.get("num_classes"), cfg.label_smoothing)
        # what the run remembers across a resume (saved as each checkpoint's trainer.json)
        self.state = TrainState(cfg.paper, cfg.flavor, commits=[git_commit()])  # the commit it started at
        # built by the methods named, called from here (build_model, build_data) or from fit
        self.model = self.n_params = None  # build_model
        self.n_trainable = None  # adapt: the parameters that train (--lora: the update, and a new head)
        self.train_set = self.test_set = self.collate = self.loader = self.test_loader = None  # build_data
        self.auto_batch, self.micro_batch, self.steps_per_epoch, self.total_steps = False, 0, 0, 0  # build_data
        self.epochs = self.ckpt_every = 0  # build_data
        self.flops_per_element = self.flops_per_sample = self.peak = self.peak_source = None  # measure_flops
        self.parallelized = self.eval_model = self.saved = None  # parallelize
        self.optimizer = self.scheduler = self.scaler = None  # build_optimizer
        self.tracker = None  # build_tracker
        self.meter = self.monitor = self.profiler = self.progress = None  # fit
        self.plain_log = False  # fit: a plain line per logged step instead of a progress bar
        self.epoch_rate = 0.0  # samples per second of the last epoch (train_epoch)
        self.devices = None  # every rank's device use (finish)
        self.build_model()
        self.build_data()
        self.run_dir = Path(cfg.out) if cfg.out else parallel.broadcast_object(default_run_dir(cfg.paper))
        self.last_saved, self.memory, self.graphs_after_first_step = 0, None, None
        self.saved_bytes = 0  # what the last step's largest micro-step kept for backward
        self.stop = StopSignals(parse_time_limit(cfg.time_limit) if cfg.time_limit else None)
        self.step_seconds = self.save_seconds = 0.0  # recent ones, for --time-limit
        self.stop_reason = ""  # what the ranks agreed ends the run after this step (see agree)
        self.next_agreement = 0  # the step at which the ranks next agree on a stop request
        # per-step features a bench run switches off to time each one (common.bench row a); never a user's
        self.skipped = set(filter(None, os.environ.get(BENCH_SKIP, "").split(",")))
        # (hits, samples) of the task's training metric since the last log line, and in this epoch
        self.window_counts = torch.zeros(2, dtype=torch.float64, device=env.device)
        self.epoch_counts = torch.zeros_like(self.window_counts)

    # ------------------------------------------------------------ build

    def new_model(self, adapted: bool = False) -> torch.nn.Module:
        """A fresh model of the config's flavor (or --init's architecture), built for the data set's facts;
        adapted: with --lora, wrapped as the run trains it (what its FLOPs and memory are counted on)."""
        model = build_model(self.spec, self.cfg.flavor, self.cfg.init, self.facts, self.cfg.model_kwargs)
        return lora.apply(model, self.cfg) if adapted and self.cfg.lora is not None else model

    def build_model(self) -> None:
        torch.manual_seed(self.cfg.seed)  # the same initial weights on every rank and every run
        self.model = self.new_model()
        self.n_params = sum(p.numel() for p in self.model.parameters())

    def load_pretrained(self) -> set[str]:
        """--init: the reference's pretrained weights, adapted to the data set. Rank 0 fetches them first
        (into timm's or torchvision's cache), then the other ranks read them; a failure stops every rank.
        --init RUN_DIR: every rank reads the run's tensors that fit into the model it built. Returns the
        names of the parameters it left new (a new head), which --lora trains with its update."""
        fresh = set()
        if is_run(self.cfg.init):
            notes = load_from_run(self.model, self.spec, self.cfg.init, self.cfg.init_tensors, fresh)
            if self.env.is_main:
                print(*notes, sep="\n", flush=True)
            return fresh
        error, notes = None, []
        if self.env.is_main:
            try:
                self.model, notes = reference_model(self.spec, self.cfg.init, self.facts, fresh=fresh)
            except ConfigError as e:
                error = str(e)
        error = parallel.broadcast_object(error)
        if error is not None:
            raise ConfigError(error)
        if not self.env.is_main:
            self.model, _ = reference_model(self.spec, self.cfg.init, self.facts, fresh=fresh)
        for note in notes:
            print(note, flush=True)
        return fresh

    def adapt(self, fresh: set[str]) -> None:
        """--lora RANK (common.lora): the attention projections --lora-targets names wrapped in their low-rank
        update, every other parameter frozen but those --init left new (`fresh`: a new head, which must train),
        so that the optimizer holds the update (and that head) alone. Counts the parameters, and those that train."""
        if self.cfg.lora is not None:
            lora.apply(self.model, self.cfg, fresh)
            if self.env.is_main:
                print(lora.describe(self.model, self.cfg), flush=True)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.n_trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def forward_loss(self, model, inputs, targets, counts: torch.Tensor | None = None) -> torch.Tensor:
        """The training loss of a batch; with `counts`, also adds the batch's (hits, samples) of the
        task's training metric to it."""
        return forward_loss(self.task, model, inputs, targets, self.cfg.precision, self.env.device, counts)

    def build_data(self) -> None:
        """The data sets, the global and per-device batch, the loaders, the run's length, and the
        FLOPs of a step (for MFU)."""
        cfg, data = self.cfg, self.data
        self.train_set, self.test_set = data.read(**options(cfg))  # ConfigError if unreadable
        if cfg.train_fraction < 1:
            self.train_set = Share(self.train_set, cfg.train_fraction)
        self.train_set = augment.warped(cfg.augment, self.train_set)  # elastic:STD, before the weight map
        if self.spec.pixel_weights is not None and cfg.pixel_weights == "paper":  # the paper's weight of each pixel
            self.train_set = PixelWeights(self.train_set, self.spec.pixel_weights)
        if cfg.eval_samples is not None and cfg.eval_samples < len(self.test_set):
            if self.env.is_main:
                print(f"evaluating on {cfg.eval_samples} of the test split's {len(self.test_set)} samples "
                      f"(--eval-samples): not a result for the leaderboard", flush=True)
            self.test_set = Share(self.test_set, count=cfg.eval_samples)
        stats = data.preprocess(**options(cfg)) if data.preprocess else None  # the normalisation (randaug)
        transform = augment.transform(cfg.augment, self.facts.get("img_size", 0), self.train_set, stats)
        if transform is not None:  # training images only
            self.train_set = augment.Augmented(self.train_set, transform)
        self.collate = data.collate(math.lcm(cfg.pad_multiple, getattr(self.model, "input_multiple", 1)),
                                    cfg.image_size)
        self.auto_batch = cfg.batch_size == "auto"
        if self.auto_batch:
            self.cfg = cfg = dataclasses.replace(cfg, batch_size=self.auto_batch_size())
        self.micro_batch = cfg.batch_size // (self.dp_size * cfg.grad_accum)
        if self.mixup is not None and self.micro_batch % 2:
            raise ConfigError(f"--augment {cfg.augment}: timm's Mixup mixes pairs of images, and each micro-batch "
                              f"holds {self.micro_batch}; choose a batch size that gives an even one")
        self.measure_flops()
        self.loader = train_loader(self.train_set, cfg.batch_size, self.micro_batch, self.dp_rank, self.dp_size,
                                   cfg.seed, cfg.num_workers, self.collate, cfg.bucketing, augment.repeats(cfg.augment))
        self.steps_per_epoch = len(self.loader) // cfg.grad_accum
        if self.steps_per_epoch == 0:
            raise ConfigError(f"batch size {cfg.batch_size} is larger than the {len(self.train_set)} training "
                              f"samples of {data.name}")
        epochs_steps = self.steps_per_epoch * cfg.epochs
        self.total_steps = epochs_steps if cfg.max_steps is None else min(cfg.max_steps, epochs_steps)
        self.epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        self.ckpt_every = cfg.ckpt_every or self.steps_per_epoch
        self.scale_learning_rate()
        if cfg.profile and WARMUP_STEPS + cfg.profile > self.total_steps:
            raise ConfigError(f"--profile {cfg.profile} records steps {WARMUP_STEPS + 1} to {WARMUP_STEPS + cfg.profile}, "
                              f"but this run has {self.total_steps} steps")
        self.test_loader = eval_loader(self.test_set, max(256, self.micro_batch), self.dp_rank, self.dp_size,
                                       self.collate)

    def batch_of(self, n: int):
        """The first n training samples (repeated as needed) as one batch, on the host."""
        return self.collate([self.train_set[i % len(self.train_set)] for i in range(n)])

    def auto_batch_size(self) -> int:
        """--batch-size auto: the largest micro-batch that fits on every rank and leaves every epoch
        MIN_STEPS_PER_EPOCH optimizer steps, times ranks and micro-steps."""
        cfg, env = self.cfg, self.env
        share = steps_limit(len(self.train_set), self.dp_size * cfg.grad_accum)
        micro, how = find_micro_batch(lambda: self.new_model(adapted=True),
                                      lambda n: to_device(self.batch_of(n), env.device), self.forward_loss, env.device,
                                      share)
        micro = min(parallel.all_gather_object(micro))  # every rank trains the same global batch
        if env.is_main:
            print(f"batch size auto: {micro} per device and micro-step, "
                  f"{micro * self.dp_size * cfg.grad_accum} in all ({how}; up to {share} leaves every epoch "
                  f"of {len(self.train_set)} samples {MIN_STEPS_PER_EPOCH} optimizer steps)", flush=True)
        return micro * self.dp_size * cfg.grad_accum

    def scale_learning_rate(self) -> None:
        """--lr-scaling: the learning rate for the batch in use (lr is given for lr_batch, the paper's
        default batch), and, when it grows, Goyal et al.'s gradual warmup of at least WARMUP_EPOCHS
        epochs; printed, and kept in the training state (lr, warmup_steps) and result.json."""
        cfg = self.cfg
        lr, why = scaled_lr(cfg.lr, cfg.batch_size, cfg.lr_batch, cfg.lr_scaling)
        warmup = cfg.warmup_steps
        if lr > cfg.lr and WARMUP_EPOCHS * self.steps_per_epoch > warmup:
            warmup = WARMUP_EPOCHS * self.steps_per_epoch
            why += f"; warmup {warmup} steps ({WARMUP_EPOCHS} epochs of {self.steps_per_epoch}, Goyal et al.)"
            if cfg.max_steps is not None and cfg.max_steps < warmup:
                raise ConfigError(f"--max-steps {cfg.max_steps} ends before the {warmup}-step warmup that the "
                                  f"learning rate scaled to batch {cfg.batch_size} needs ({WARMUP_EPOCHS} epochs); "
                                  f"give more steps, a batch of {cfg.lr_batch}, or --lr-scaling none")
        self.state.lr, self.state.warmup_steps = lr, warmup
        if self.env.is_main and (self.auto_batch or cfg.batch_size != cfg.lr_batch):
            print(f"batch {cfg.batch_size}, lr {lr:.4g} ({why})", flush=True)

    def measure_flops(self) -> None:
        """Training FLOPs per sample and per input element, counted on the meta device on one
        micro-batch, and the device's peak (for MFU)."""
        inputs, targets = self.batch_of(self.micro_batch)
        flops = training_flops(lambda: self.new_model(adapted=True), unpadded(inputs), targets,
                               lambda m, x, y: self.task.loss(self.task.forward(m, x, y), y))
        # this rank's share of them: a tensor- or pipeline-parallel group computes each sample together
        self.flops_per_element = flops / element_counts(inputs)[1] / (self.layout.tp * self.layout.pp)
        self.flops_per_sample = flops / self.micro_batch
        self.peak, self.peak_source = peak_flops(self.env.device, self.cfg.precision)

    def parallelize(self) -> None:
        """This rank's model made ready for the strategy, in common.parallelize's one order (pipeline stages,
        tensor parallel, activation checkpointing, compile, data-parallel wrapping); self.parallelized is how
        a step then runs on it (common.step: whole on every rank, or through the pipeline's stages)."""
        self.parallelized = parallelize(self.model, self.spec, self.env, self.strategy, self.layout, self.mesh,
                                        Options.of(self.cfg), self.task)
        self.model, self.eval_model = self.parallelized.model, self.parallelized.eval_model
        self.saved = self.parallelized.saved  # counts the bytes a forward keeps for backward

    def build_teacher(self) -> None:
        """--teacher: the finished run's model on this rank's device, in eval mode and without gradients, which the
        task's distillation loss reads on each training batch (never on the test split)."""
        if self.cfg.teacher is not None:
            teacher, _ = load_run(Path(self.cfg.teacher))  # its config's model, its final weights, in eval mode
            self.task.teacher = teacher.requires_grad_(False).to(self.env.device)

    def build_optimizer(self) -> None:
        """The optimizer, its schedule, the (fp16) scaler."""
        cfg = self.cfg
        self.optimizer = build_optimizer(parallel.unwrap(self.model), self.state.lr, cfg.weight_decay, cfg.optimizer,
                                         cfg.momentum, cfg.nesterov)
        self.scheduler = schedule(self.optimizer, self.total_steps, self.state.warmup_steps, cfg.schedule,
                                  cfg.milestones, cfg.gamma, self.steps_per_epoch, cfg.gammas)
        self.scaler = torch.amp.GradScaler(self.env.device.type, enabled=cfg.precision == "fp16")

    def build_tracker(self, resumed_from: Path | None) -> None:
        """The run directory (config.json first), the printed config, wandb on rank 0."""
        cfg, env, run_dir = self.cfg, self.env, self.run_dir
        wandb_id = (self.state.wandb_run_id or find_wandb_id(run_dir)) if self.resuming else None
        if env.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            if not (run_dir / "config.json").exists():  # a resumed run keeps the config it started with
                save_config(cfg, run_dir / "config.json")
            if "tokenizer" in self.facts:  # a tokenizer trained for this run (BPE): what reads its tokens
                (run_dir / "tokenizer.json").write_text(self.facts["tokenizer"])
            where = f"resumed at step {self.state.step} from {resumed_from}" if resumed_from else "new run"
            layout = f": {self.layout.describe()}" if self.layout.tp > 1 or self.strategy == "hsdp" else ""
            print(f"{where}; config ({self.strategy}{layout}, {env.world_size} process(es), {env.device}):", flush=True)
            for key, value in cfg.to_dict().items():
                print(f"  {key:16s} {value}", flush=True)
            print(f"speed: {self.flops_per_sample / 1e9:.4g} GFLOP per sample per training step (counted on one "
                  f"batch); peak {self.peak_source}", flush=True)
        self.tracker = (Tracker(resolve_mode(cfg.wandb), cfg.wandb_project, run_dir, run_dir.name, cfg.to_dict(),
                                resume_id=wandb_id, group=(sweep_tag() or {}).get("name"))
                        if env.is_main else NullTracker())
        self.tracker.summary({"params": self.n_params, "trainable_params": self.n_trainable,
                              "flops_per_sample": self.flops_per_sample, "peak_flops": self.peak})
        self.state.wandb_run_id = parallel.broadcast_object(self.tracker.run_id)

    # ------------------------------------------------------------ the run

    def fit(self) -> dict:
        """Train to the end (or on from a checkpoint), evaluating after every epoch; returns the result."""
        if self.resuming and (self.run_dir / "result.json").exists():  # a restart after the run had finished
            if self.env.is_main:
                print(f"run {self.run_dir} has already finished; its result.json stands", flush=True)
            return json.loads((self.run_dir / "result.json").read_text())
        resume_from = parallel.broadcast_object(latest_checkpoint(self.run_dir) if self.resuming else None)
        fresh = set()
        if self.cfg.init and (resume_from is None or self.cfg.lora is not None):  # a LoRA checkpoint: no base
            fresh = self.load_pretrained()
        self.adapt(fresh)
        self.parallelize()
        self.build_teacher()
        self.build_optimizer()
        if resume_from is not None:
            self.resume(resume_from)  # raises CheckpointError before anything is written
        if self.resuming:
            self.unmark_stopped()  # the stopped run is resumed: it waits no more
        self.build_tracker(resume_from)  # from here on the run directory is written
        self.meter = Meter(self.cfg.batch_size, self.flops_per_element, self.peak)
        self.monitor = DeviceMonitor(self.env.device)
        self.profiler = (StepProfiler(self.cfg.profile, self.run_dir / "profile", self.env.rank, self.env.device)
                         if self.cfg.profile else None)
        # a bar on a terminal; in a log file (CI, SLURM) a plain line per logged step instead of its frames
        self.plain_log = self.env.is_main and not sys.stderr.isatty()
        self.progress = tqdm(total=self.total_steps, initial=self.state.step,
                             disable=not self.env.is_main or self.plain_log,
                             desc=f"{self.cfg.paper} {self.cfg.flavor}", unit="step")
        for epoch in range(self.state.epoch, self.epochs):
            padding, seconds = self.train_epoch(epoch)
            self.end_epoch(epoch, padding, seconds)
        self.progress.close()
        return self.finish()

    def train_epoch(self, epoch: int) -> tuple[list[int], float]:
        """This epoch's optimizer steps (from where a resumed run stands); returns this rank's
        (padded, all) input elements and the seconds it took."""
        cfg, state = self.cfg, self.state
        self.loader.epoch_sampler.set_epoch(epoch, start=state.samples_in_epoch)
        batches, padding = iter(self.loader), [0, 0]
        start, first_step = time.perf_counter(), state.step
        done_in_epoch = state.samples_in_epoch // cfg.batch_size
        for _ in range(min(self.steps_per_epoch - done_in_epoch, self.total_steps - state.step)):
            step_start = time.perf_counter()
            loss = self.train_step(batches, padding)
            if self.profiler is not None:
                self.profiler.step()
            state.step += 1
            state.samples_in_epoch += cfg.batch_size
            self.meter.step()
            self.progress.update(1)
            if state.step % cfg.log_every == 0 or state.step == self.total_steps:
                self.log_step(loss)
            mid_epoch = state.samples_in_epoch < self.steps_per_epoch * cfg.batch_size
            if state.step % self.ckpt_every == 0 and mid_epoch:
                self.save()  # the epoch's end saves after its evaluation
            self.step_seconds = 0.5 * (self.step_seconds + time.perf_counter() - step_start)
            if self.stop_reason:
                self.stop_now()
        seconds = time.perf_counter() - start
        self.epoch_rate = (state.step - first_step) * cfg.batch_size / seconds
        return padding, seconds

    def stop_now(self) -> None:
        """After the step at which the ranks agreed to stop (a rank got SIGTERM or SIGUSR1, or --time-limit
        is near): every rank saves a checkpoint of this step and the run ends (Preempted, whose message is
        the line to print)."""
        reason = self.stop_reason
        self.save()  # complete on rank 0 once it returns: its .metadata is written last, by rank 0
        self.progress.close()
        from common import checkpoint

        path = checkpoint.checkpoint_dir(self.run_dir, self.state.step)
        self.mark_stopped(reason, self.state.step, path, EXIT_PREEMPTED)
        raise Preempted(f"stopped by {reason} after step {self.state.step} of {self.total_steps}; checkpoint "
                        f"{path}; resume with: {self.resume_command()}")

    def resume_command(self) -> str:
        """The command line that resumes this run, with as many processes on this machine."""
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        launcher = (f"torchrun --nproc_per_node {local}" + (" ..." if local < self.env.world_size else "")
                    if self.env.world_size > 1 else "python")
        return f"{launcher} train.py --resume {self.run_dir}"

    def mark_stopped(self, reason: str, step: int, path: Path | None, exit_code: int) -> None:
        """Rank 0 writes the run directory's stopped.json (common.preemption.STOPPED), atomically: why the
        run stopped, at which step, the checkpoint to resume from (complete by now; None where there is
        none), the ranks' exit code and the command that resumes it. A crash never calls it."""
        if self.env.is_main:
            write_json(self.run_dir / STOPPED, {"reason": reason, "step": step,
                                                "checkpoint": str(path) if path is not None else None,
                                                "exit_code": exit_code, "resume": self.resume_command()})

    def unmark_stopped(self) -> None:
        """Rank 0 removes stopped.json: the run is resumed, or finished."""
        if self.env.is_main:
            (self.run_dir / STOPPED).unlink(missing_ok=True)

    def next_batch(self, batches, padding: list[int]):
        """The next micro-batch on the device; counts its wait, its input elements and its padding."""
        waiting = time.perf_counter()
        inputs, targets = next(batches)
        valid, total = element_counts(inputs)
        self.meter.add(total, time.perf_counter() - waiting)
        padding[0], padding[1] = padding[0] + total - valid, padding[1] + total
        inputs, targets = to_device((inputs, targets), self.env.device)
        if self.mixup is not None:  # --augment mixup:A, cutmix:A: mixed images, targets (B, classes)
            inputs, targets = augment.mix(self.mixup, inputs, targets)
        return inputs, targets

    def train_step(self, batches, padding: list[int]) -> torch.Tensor:
        """One optimizer step: grad_accum micro-steps (gradients synchronised on the last only),
        clipping to the global norm, the (fp16) scaler's step, the schedule's step. Returns the
        mean loss of its micro-steps on this rank."""
        cfg = self.cfg
        loss = torch.zeros((), device=self.env.device)
        self.saved_bytes = 0
        counted = self.counts_activations()
        for micro in range(cfg.grad_accum):
            inputs, targets = self.next_batch(batches, padding)
            counts = (torch.zeros_like(self.window_counts)
                      if self.task.train_metric and "train-metric" not in self.skipped else None)
            with parallel.gradient_sync(self.model, enabled=micro == cfg.grad_accum - 1):
                loss += self.forward_backward(inputs, targets, counts, counted)
            if counted:
                self.saved_bytes = max(self.saved_bytes, self.saved.bytes)
            if counts is not None:
                self.window_counts += counts
                self.epoch_counts += counts
        # where the gradients are replicated, their norm (which clipping needs too) says on every rank alike
        # whether the step is finite: a non-finite loss on any rank made them NaN (forward_backward)
        norm = parallel.grad_norm(self.model.parameters()) if self.replicated else None
        if not self.agree(loss, norm):  # on every rank alike: --nonfinite skip leaves out this update
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()
            return loss
        self.parallelized.sync_shared_gradients()  # (a weight that two pipeline stages hold)
        if cfg.clip_grad > 0:
            self.scaler.unscale_(self.optimizer)
            self.parallelized.clip_grad_norm_(cfg.clip_grad, norm)  # the norm of the whole model's gradients
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.memory is None:  # gradients and optimizer state both exist now
            self.memory = parallel.memory_per_rank(self.model, self.optimizer) | {"activations": self.saved_bytes}
            self.graphs_after_first_step = compiled_graphs()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return loss

    @property
    def replicated(self) -> bool:
        """Whether every rank holds the whole model and, after the step's all-reduce, the same gradients
        (one process, dp, ddp; not with fp16's scaler, whose skipped steps have infinite gradients)."""
        return self.parallelized.replicated

    def counts_activations(self) -> bool:
        """Whether this step counts the bytes its forwards keep for backward (saved-tensor hooks, a
        Python call per saved tensor): on the first step, whose figure result.json's memory keeps, and on
        each logged step, whose figure is logged; the figures read are thus counted exactly, and the
        other steps run without hooks."""
        step = self.state.step + 1
        logged = step % self.cfg.log_every == 0 or step == self.total_steps
        return "activations" not in self.skipped and (self.memory is None or logged)

    def forward_backward(self, inputs, targets, counts: torch.Tensor | None, counted: bool = True) -> torch.Tensor:
        """One micro-step's forward and backward (through the pipeline's stages, with --pp); returns its
        loss divided by the micro-steps (0 on a pipeline's ranks before the last stage), and adds the
        batch's (hits, samples) of the training metric to `counts`; `counted`: the saved activations'
        bytes are counted (self.saved)."""
        saved = self.saved if counted else contextlib.nullcontext()
        return self.parallelized.forward_backward(inputs, targets, counts, saved, self.scaler.scale)

    def agree(self, loss: torch.Tensor, norm: torch.Tensor | None = None) -> bool:
        """What every rank must decide alike at a step: whether its loss is finite on every rank, and
        whether any rank was asked to stop (SIGTERM, SIGUSR1, or --time-limit near), which then ends the
        run after this step on every rank (self.stop_reason). Returns whether to apply this step's update:
        where a loss is not finite, --nonfinite stop (or --nonfinite-patience skipped steps in a row) ends
        the run with NonFinite; skip counts it and returns False, on every rank.

        Where the gradients are replicated (`norm` given), the finite check is theirs, on every rank
        alike without a collective, and the stop request is agreed every k steps only, in one
        all-reduce that also agrees the next k (about AGREE_SECONDS of steps; a signal stops the run
        at most that late, at the same step on every rank). Elsewhere one all-reduce a step agrees both."""
        state, replicated = self.state, norm is not None
        step = state.step + 1
        gap = max(1, min(100, int(AGREE_SECONDS / self.step_seconds))) if replicated and self.step_seconds else 1
        last = step == self.total_steps  # the run ends after it anyway, with its own checkpoint
        stop = REASONS.index("" if last else self.stop.reason(self.step_seconds * gap, self.save_seconds))
        nonfinite = int(not torch.isfinite(norm if replicated else loss).all())  # this rank's (alike if replicated)
        if "agree" in self.skipped:
            pass  # common.bench's row a, timing what the agreement costs: each rank decides alone
        elif not replicated or step >= self.next_agreement:  # one all-reduce; -gap: the fewest steps proposed win
            nonfinite, stop, fewest = parallel.all_reduce_max_ints([nonfinite, stop, -gap])
            self.next_agreement = step - fewest
        else:
            stop = 0  # a request waits for the next agreement
        self.stop_reason = REASONS[stop]
        if not nonfinite:
            state.nonfinite_in_row = 0
            return True
        state.skipped_steps += 1
        state.nonfinite_in_row += 1
        if self.cfg.nonfinite == "skip" and state.nonfinite_in_row < self.cfg.nonfinite_patience:
            return False
        value = next((f"the loss is {v}" for v in parallel.all_gather_object(loss.item()) if not math.isfinite(v)),
                     "the gradients are not finite")
        last = latest_checkpoint(self.run_dir)
        patience = self.cfg.nonfinite_patience
        why = "" if self.cfg.nonfinite == "stop" else f" ({patience} steps in a row, --nonfinite-patience {patience})"
        self.progress.close()
        self.mark_stopped("nonfinite", state.step + 1, last, EXIT_NONFINITE)  # a requeue would stop here again
        raise NonFinite(f"{value} at step {state.step + 1}{why}; the run stops; last good checkpoint: "
                        + (f"{last} (resume with --resume {self.run_dir}, after a fix)" if last else "none yet"))

    def log_step(self, loss: torch.Tensor) -> None:
        """The loss averaged over ranks, the learning rate, the speed and every rank's memory and device
        use, to wandb, metrics.jsonl and the progress bar."""
        loss = (parallel.all_reduce_sum(loss) / (self.env.world_size // self.layout.pp)).item()  # last stages
        speed, lr = self.meter.read(), self.scheduler.get_last_lr()[0]
        devices = parallel.all_gather_object(self.monitor.read())
        elements = "pixels_per_s" if self.data.inputs == "image" else "tokens_per_s"
        row = {"train/loss": loss, "train/lr": lr, "train/samples_per_s": speed["samples_per_s"],
               f"train/{elements}": speed["elements_per_s"], "train/data_wait": speed["data_wait"],
               "train/mfu": speed["mfu"], "memory/saved_activation_bytes": self.saved_bytes,
               "train/skipped_steps": self.state.skipped_steps}
        row |= {f"device/rank{r}/{k}": v for r, values in enumerate(devices) for k, v in values.items()}
        if self.cfg.compile:
            row["compile/recompiles"] = compiled_graphs() - self.graphs_after_first_step
        row |= self.train_score(self.window_counts, "")
        self.log(row)
        mine = devices[0]
        bar = dict(mem=short_bytes(mine.get("peak_allocated_bytes", mine["peak_rss_bytes"])))
        if "utilization" in mine:
            bar["gpu"] = f"{mine['utilization']:.0f}%"
        if self.plain_log:
            print(f"step {self.state.step}/{self.total_steps}: loss {loss:.4f}, lr {lr:.2e}, "
                  f"{speed['samples_per_s']:.0f} samples/s, mfu {speed['mfu']:.1%}, mem {bar['mem']}", flush=True)
        self.progress.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", samples_s=f"{speed['samples_per_s']:.0f}",
                                  mfu=f"{speed['mfu']:.1%}", **bar)

    def log(self, row: dict) -> None:
        """A row of this step to wandb and metrics.jsonl (rank 0), and to the run's curves (every rank): the
        training loss, the task's training metric, the evaluated metrics and the wall time at each evaluation,
        which result.json keeps."""
        step, metric = self.state.step, self.task.train_metric
        for key, value in row.items():
            if key.startswith("eval/") or key in ("train/loss", f"train/{metric}", f"train/epoch_{metric}",
                                                  "time/wall_s"):
                self.state.curves.setdefault(key, []).append([step, value])
        self.tracker.log(row, step=step)

    def train_score(self, counts: torch.Tensor, scope: str) -> dict[str, float]:
        """{"train/<scope><metric>": hits / samples} over every rank's training batches since `counts` was
        last read, which it then clears; {} for a task without a training metric."""
        if not self.task.train_metric:
            return {}
        hits, samples = parallel.all_reduce_sum(counts.clone()).tolist()
        counts.zero_()
        return {f"train/{scope}{self.task.train_metric}": hits / samples} if samples else {}

    def end_epoch(self, epoch: int, padding: list[int], seconds: float) -> None:
        """Evaluate, keep the best, log the epoch and save its checkpoint."""
        state = self.state
        state.train_seconds += seconds
        state.elements += padding[1]
        state.data_wait_seconds += self.meter.waiting_total
        self.meter.waiting_total = 0.0
        metrics = self.evaluate()
        value = metrics[self.task.metric]
        best = state.best
        if best is None or (value > best[0] if self.task.higher_is_better else value < best[0]):
            state.best, state.best_step = [value, epoch + 1], state.step  # --keep-ckpts keeps its checkpoint
        state.history.append(value)
        state.metrics = metrics  # the last evaluation's every metric
        padding = parallel.all_reduce_sum(torch.tensor(padding, dtype=torch.float64, device=self.env.device)).tolist()
        state.padding = [a + b for a, b in zip(state.padding, padding)]
        state.epoch, state.samples_in_epoch = epoch + 1, 0
        self.log({f"eval/{k}": v for k, v in metrics.items()} | self.train_score(self.epoch_counts, "epoch_")
                 | {"epoch": epoch + 1, "train/padding_waste": padding[0] / padding[1] if padding[1] else 0.0,
                    "train/epoch_samples_per_s": self.epoch_rate, "time/train_s": state.train_seconds,
                    "time/wall_s": state.wall_seconds + time.perf_counter() - self.started})
        self.meter.restart()  # evaluation time is not training time
        if self.env.is_main:
            self.progress.write(f"epoch {epoch + 1}/{self.epochs}: {self.task.describe(metrics)}")
        if state.step % self.ckpt_every == 0 or epoch + 1 == self.epochs or self.cfg.ckpt_every is None:
            self.save()

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The task's metrics over the whole test split: each rank updates them with its share,
        and the metrics sum (or gather) every rank's states before computing them.

        A rank whose share has fewer batches repeats a forward whose result it drops, so
        that sharded models (fsdp) keep their collective gathers in step across ranks. With --pp
        each batch runs through the stages, the last stage's ranks score it, and the first of them
        gives its metrics to every rank.
        """
        model, device = self.eval_model, self.env.device
        model.eval()
        metrics = self.task.build_metrics(device)
        if self.dp_size < self.env.world_size:  # tensor or pipeline parallel: a group's ranks see the same batches
            for metric in metrics.values():
                metric.sync_on_compute, metric.process_group = self.dp_size > 1, self.dp_group
        batches, first = iter(self.test_loader), None
        for _ in range(parallel.all_reduce_max(len(self.test_loader))):
            batch = next(batches, None)
            first = first if first is not None else batch
            inputs, targets = to_device(batch if batch is not None else first, device)
            with autocast(self.cfg.precision, device):
                if self.cfg.tta == "flip":
                    outputs = flip_tta(lambda x: self.parallelized.forward(x, targets), inputs)
                else:
                    outputs = self.parallelized.forward(inputs, targets)  # None before a pipeline's last stage
            if batch is not None and outputs is not None:
                self.task.update(metrics, outputs, targets)
        model.train()
        return self.parallelized.scores(metrics)

    # ------------------------------------------------------------ checkpoints

    def save(self) -> None:
        """A checkpoint of this step (every rank writes its shard), unless this step has one."""
        if self.last_saved == self.state.step:
            return
        now = time.perf_counter()
        self.state.wall_seconds += now - self.started
        self.started = now
        self.state.scheduler, self.state.scaler = self.scheduler.state_dict(), self.scaler.state_dict()
        from common import checkpoint  # torch.distributed.checkpoint: imported when a checkpoint is written or read

        checkpoint.save(self.run_dir, self.state.step, self.model, self.optimizer, self.state.state_dict(), self.env,
                        self.cfg.keep_ckpts, trainable_only=self.cfg.lora is not None)
        self.last_saved = self.state.step
        self.save_seconds = time.perf_counter() - now

    def resume(self, path: Path) -> None:
        """Model, optimizer, schedule, scaler, RNG and trainer state from a checkpoint (any strategy's). The
        learning rate and warmup in use stay the ones recomputed from the config, which built the optimizer."""
        from common import checkpoint

        state, in_use = self.state, (self.state.lr, self.state.warmup_steps)
        state.load_state_dict(checkpoint.load(path, self.model, self.optimizer, self.env, self.cfg.paper,
                                              self.cfg.flavor, trainable_only=self.cfg.lora is not None))
        state.lr, state.warmup_steps = in_use
        self.scheduler.load_state_dict(state.scheduler)
        self.scaler.load_state_dict(state.scaler)
        self.last_saved = state.step
        state.commits = state.commits or [None]  # (None: saved before runs recorded it)
        if state.commits[-1] != (now := git_commit()):
            state.commits.append(now)

    # ------------------------------------------------------------ the end

    def finish(self) -> dict:
        """The final weights (model.safetensors), result.json, the results store and the wandb summary."""
        # every rank takes part in gathering fsdp shards (and, with --pp, every stage's weights); a LoRA run's
        # weights are its update (and new head) alone, which common.export.load_run reads onto --init's
        weights = self.parallelized.full_state_dict(trainable_only=self.cfg.lora is not None)
        self.memory = parallel.all_gather_object(self.memory)
        self.devices = parallel.all_gather_object(self.monitor.summary())
        result = self.result()
        if not self.env.is_main:
            return result
        self.unmark_stopped()  # a finished run has none (one left by a run that wrote into this folder before)
        save_file(untied(weights), self.run_dir / "model.safetensors")
        write_json(self.run_dir / "result.json", result)
        store_result(result, Path(self.cfg.results_dir))
        metric = self.task.metric
        per_rank = {f"{what}/rank{r}/{k}": v for what, ranks in (("memory", self.memory), ("device", self.devices))
                    for r, m in enumerate(ranks) if m for k, v in m.items()}
        self.tracker.summary({f"final/{metric}": result["final"], f"best/{metric}": result["best"]} | per_rank
                             | {k: v for k, v in result.items() if k not in ("memory_per_rank", "device_per_rank",
                                                                              "config", "curves")})
        where = self.tracker.finish()
        if self.profiler is not None and self.profiler.done:
            print(f"profile of steps {WARMUP_STEPS + 1} to {WARMUP_STEPS + self.cfg.profile}, operators by self time:\n"
                  f"{self.profiler.table}\ntraces: {self.profiler.trace.parent}/trace_rank<r>.json "
                  f"(open in https://ui.perfetto.dev)")
        print(f"test {metric}: {result['final']:.4g} (best {result['best']:.4g} at epoch {result['best_epoch']})")
        print(f"run directory: {self.run_dir}")
        if where:
            print(where)
        return result

    def result(self) -> dict:
        """What result.json records: the metric, the model, how it ran, how fast, where and when."""
        cfg, state, seconds = self.cfg, self.state, self.state.train_seconds
        elements = "pixels_per_s" if self.data.inputs == "image" else "tokens_per_s"
        padded, total = state.padding
        return {
            "run_id": self.run_dir.name, "paper": cfg.paper, "flavor": cfg.flavor, "dataset": cfg.dataset,
            "task": self.task.kind, "metric": self.task.metric, "higher_is_better": self.task.higher_is_better,
            "final": state.history[-1], "best": state.best[0], "best_epoch": state.best[1],
            "final_metrics": state.metrics, "params": self.n_params, "trainable_params": self.n_trainable,
            "epochs": self.epochs,
            "steps": state.step, "steps_per_epoch": self.steps_per_epoch, "batch_size": cfg.batch_size,
            "strategy": self.strategy, "world_size": self.env.world_size, "precision": cfg.precision,
            "compile": cfg.compile, "ac": cfg.ac,
            "samples_per_s": state.step * cfg.batch_size / seconds,
            elements: state.elements / seconds,
            "mfu": self.flops_per_element * state.elements / seconds / self.peak,
            "flops_per_sample": self.flops_per_sample, "peak_flops": self.peak, "peak_source": self.peak_source,
            "data_wait": state.data_wait_seconds / seconds,
            "recompiles": (compiled_graphs() - self.graphs_after_first_step
                           if cfg.compile and self.graphs_after_first_step else 0),
            "padding_waste": padded / total if total else 0.0, "bucketing": cfg.bucketing,
            "skipped_steps": state.skipped_steps, "lr": state.lr, "warmup_steps": state.warmup_steps,
            "memory_per_rank": self.memory, "device_per_rank": self.devices,
            "wall_s": state.wall_seconds + time.perf_counter() - self.started,
            "device": device_name(self.env.device), "torch": torch.__version__,
            **provenance(state.commits, git_commit()),
            "wandb_run_id": state.wandb_run_id, "command": command_line(self.argv), "run_dir": str(self.run_dir),
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "config": cfg.to_dict(),
            "sweep": sweep_tag(), "curves": state.curves,
        }
