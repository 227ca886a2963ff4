"""Checkpoints: torch.distributed.checkpoint (DCP) shards, written by every rank, read back
by any strategy and world size.

`<run>/checkpoints/step_<N>/` holds

    trainer.json      the Trainer's TrainState (common.train_state: step, epoch, sampler
                      position, metrics so far, scheduler, scaler, lr and warmup in use, wandb
                      run id, ...), and the optimizer's plain values (lr, betas, ...)
    __<rank>_0.distcp tensors only: model, optimizer state, every rank's RNG state (a LoRA run's
                      model: the parameters that train alone, and the optimizer state of those)
    .metadata         written last by DCP: a checkpoint without it is incomplete

Loading executes nothing from the files: tensors are read with
`torch.load(weights_only=True)` by DCP, `.metadata` through an unpickler that
only builds DCP's own metadata classes, and the rest is JSON.
"""

import contextlib
import json
import pickle
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.tensor import distribute_tensor

from common.errors import CheckpointError
from common.parallel import Env, unwrap
from common.tensor_parallel import is_strided

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
# a LoRA run's (common.lora): the parameters that train, alone (its frozen base is read again from --init)
TRAINABLE = StateDictOptions(flatten_optimizer_state_dict=True, ignore_frozen_params=True, strict=False)


# ---------------------------------------------------------------- finding checkpoints


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step}"


def _all(run_dir: Path) -> list[tuple[int, Path]]:
    root = Path(run_dir) / "checkpoints"
    found = []
    for path in root.glob("step_*") if root.is_dir() else []:
        suffix = path.name.removeprefix("step_")
        if suffix.isdigit():
            found.append((int(suffix), path))
    return sorted(found)


def complete(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of the checkpoints whose save finished (their `.metadata` exists), oldest first."""
    return [(step, path) for step, path in _all(run_dir) if (path / ".metadata").exists()]


def latest(run_dir: Path) -> Path | None:
    done = complete(run_dir)
    return done[-1][1] if done else None


def prune(run_dir: Path, keep: int, best_step: int | None = None) -> None:
    """Keep the newest `keep` complete checkpoints and the one of `best_step` (the best evaluation so
    far); drop older ones and unfinished ones older than them. A checkpoint loses its `.metadata`
    first, so that a deletion cut short leaves an incomplete one, which never counts."""
    done = complete(run_dir)
    if not done:
        return
    kept = {path for _, path in done[-keep:]} | {path for step, path in done if step == best_step}
    newest = done[-1][0]
    for step, path in _all(run_dir):
        if path not in kept and step <= newest:
            (path / ".metadata").unlink(missing_ok=True)
            shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- saving


@contextlib.contextmanager
def _single_process_is_intended():
    """DCP warns when it runs without a process group; for one process that is the plan."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _split(model, optimizer, trainable_only: bool = False) -> tuple[dict, dict, dict]:
    """The model and optimizer state under their DCP names, split into tensors and plain values; and
    the DTensors that DCP cannot write as shards (a tensor-parallel fused q, k, v weight, sharded
    with strides), which the tensors hold whole instead. trainable_only: the model's parameters that
    train alone (and its buffers), not the frozen ones."""
    options = TRAINABLE if trainable_only else OPTIONS
    model_sd, optim_sd = get_state_dict(unwrap(model), optimizer, options=options)
    flat = {f"model.{k}": v for k, v in model_sd.items()} | {f"optim.{k}": v for k, v in optim_sd.items()}
    tensors = {k: v for k, v in flat.items() if torch.is_tensor(v)}
    values = {k: v for k, v in flat.items() if not torch.is_tensor(v)}
    strided = {k: v for k, v in tensors.items() if is_strided(v)}
    return tensors | {k: v.full_tensor() for k, v in strided.items()}, values, strided


def _rng_state(env: Env) -> dict[str, torch.Tensor]:
    state = {f"rng.rank{env.rank}.cpu": torch.get_rng_state()}
    if env.device.type == "cuda":
        state[f"rng.rank{env.rank}.cuda"] = torch.cuda.get_rng_state(env.device)
    return state


def save(run_dir: Path, step: int, model, optimizer, trainer_state: dict, env: Env, keep: int,
         trainable_only: bool = False) -> Path:
    """Write one checkpoint (every rank its shard), then, once it is complete, prune old ones (keeping
    the best: trainer_state's `best_step`); trainer_state: a TrainState's state_dict(). Every rank must
    call it. trainable_only: the parameters that train alone, not the frozen ones (a LoRA run's)."""
    path = checkpoint_dir(run_dir, step)
    tensors, values, _ = _split(model, optimizer, trainable_only)
    if env.is_main:
        path.mkdir(parents=True, exist_ok=True)
        (path / ".metadata").unlink(missing_ok=True)  # a leftover of a crashed attempt is not complete
        state = trainer_state | {"step": step, "world_size": env.world_size, "optimizer_values": values}
        (path / "trainer.json").write_text(json.dumps(state, indent=1) + "\n")
    with _single_process_is_intended():
        dcp.save(tensors | _rng_state(env), checkpoint_id=path)  # .metadata is written last
    if env.is_main:
        prune(run_dir, keep, trainer_state.get("best_step"))
    return path


# ---------------------------------------------------------------- loading


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes and the few torch values they hold; refuses anything else."""

    ALLOWED = {
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
    }

    def find_class(self, module: str, name: str):
        if module == "torch.distributed.checkpoint.metadata" or (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from checkpoint metadata")


class SafeReader(FileSystemReader):
    """DCP's file reader, with its metadata read by `_MetadataUnpickler` instead of pickle.load."""

    def read_metadata(self, *args, **kwargs):
        rank = kwargs.get("rank")
        with self.fs.create_stream(self._get_metadata_path(rank), "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def read_trainer_state(path: Path) -> dict:
    try:
        return json.loads((Path(path) / "trainer.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable ({type(e).__name__}: {e})") from None


def load(path: Path, model, optimizer, env: Env, paper: str, flavor: str, trainable_only: bool = False) -> dict:
    """Load a checkpoint into the (wrapped) model and optimizer; returns its trainer.json (for
    TrainState.load_state_dict). trainable_only: it holds the parameters that train alone (a LoRA run's),
    which it loads; the frozen ones stay as they are.

    Raises CheckpointError, before anything is changed on disk, when the checkpoint is
    corrupted or holds another paper, flavor or shape of model.
    """
    state = read_trainer_state(path)
    if (state.get("paper"), state.get("flavor")) != (paper, flavor):
        raise CheckpointError(f"checkpoint {path} holds {state.get('paper')} {state.get('flavor')}, "
                              f"not {paper} {flavor}")
    reader = SafeReader(path)
    try:
        saved = reader.read_metadata().state_dict_metadata
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} has unreadable metadata ({type(e).__name__}: {e})") from None

    tensors, values, strided = _split(model, optimizer, trainable_only)
    for key, t in tensors.items():
        if key not in saved or tuple(saved[key].size) != tuple(t.shape):
            found = tuple(saved[key].size) if key in saved else "nothing"
            raise CheckpointError(f"checkpoint {path} holds another model: {key} is {found} there, "
                                  f"{tuple(t.shape)} here")
    rng = {k: v for k, v in _rng_state(env).items() if k in saved}
    try:
        with _single_process_is_intended():
            dcp.load(tensors | rng, storage_reader=reader)
    except (Exception, CheckpointException) as e:  # DCP's own exception is a BaseException
        cause = next(iter(e.failures.values()))[0] if isinstance(e, CheckpointException) else e
        raise CheckpointError(f"checkpoint {path} is corrupted ({type(cause).__name__}: {cause})") from None

    for key, t in strided.items():  # read whole: this rank's strided share of it
        with torch.no_grad():
            t.to_local().copy_(distribute_tensor(tensors[key], t.device_mesh, t.placements).to_local())
        tensors[key] = t
    flat = tensors | state["optimizer_values"]
    model_sd = {k.removeprefix("model."): v for k, v in flat.items() if k.startswith("model.")}
    optim_sd = {k.removeprefix("optim."): v for k, v in flat.items() if k.startswith("optim.")}
    set_state_dict(unwrap(model), optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                   options=TRAINABLE if trainable_only else OPTIONS)
    if f"rng.rank{env.rank}.cpu" in rng:
        torch.set_rng_state(rng[f"rng.rank{env.rank}.cpu"])
    if f"rng.rank{env.rank}.cuda" in rng:
        torch.cuda.set_rng_state(rng[f"rng.rank{env.rank}.cuda"], env.device)
    return state
