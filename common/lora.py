"""LoRA fine-tuning (`--lora RANK`, papers/lora: Hu et al., 2021, https://arxiv.org/abs/2106.09685) for every paper
whose attention projections are linear layers (GPT, ViT, DeiT, Swin, the Transformer): the update
W_0 + (alpha / r) B A of the matrices --lora-targets names, every other weight frozen.

    check       the flags' checks (common.config.validate asks them): a model to start from (--init), a paper
                whose attention has the matrices named, a rank they can hold, a strategy that takes it; one line
    apply       wrap the matrices in papers.lora's LoRALinear and freeze the rest but what --init left new (a new
                head): the trainer calls it once --init's weights are in the model, common.export.load_run too
    base_model  the model as --init gives it (a finished run's tensors, or a reference's weights), and the names
                of the parameters it left new: what a LoRA run's model.safetensors is read onto
    describe    the line a run prints: rank, alpha, targets, trainable and total parameters

What a LoRA run keeps, in its checkpoints and its model.safetensors, is what trains, alone (the update and the new
head, and the optimizer's state of those); its base weights are read again from --init, which config.json records.
"""

import torch
import torch.nn as nn

from common.errors import ConfigError
from papers.lora import LoRALinear, apply_lora
from papers.lora.model import attention_projections

PART_NAMES = {"q": "W_q", "k": "W_k", "v": "W_v", "o": "W_o"}


def targets_of(text: str) -> tuple[tuple[str, ...], bool]:
    """--lora-targets as apply_lora takes them: ("q", "v"), unfused, for "q,v"; ("q", "k", "v", "o"), fused, for
    "qkv,o" (one update over a fused W_qkv)."""
    names = [t.strip() for t in text.split(",")]
    fused = "qkv" in names
    parts = [p for t in names for p in (("q", "k", "v") if t == "qkv" else (t,))]
    return tuple(parts), fused


def check(cfg, spec, model: nn.Module) -> None:
    """--lora's checks, on the model the config builds (on the meta device): a ConfigError naming what is wrong."""
    if cfg.lora is None:
        return
    found = attention_projections(model)
    if not found:
        raise ConfigError(f"--lora adapts the linear projections of attention (W_qkv, or W_q, W_k, W_v); {spec.name} "
                          f"{cfg.flavor} has no such layer")
    targets, fused = targets_of(cfg.lora_targets)
    has = {part for _, _, parts in found for part in parts}
    missing = [t for t in targets if t not in has]
    if missing:
        raise ConfigError(f"--lora-targets {cfg.lora_targets}: the attention of {spec.name} {cfg.flavor} has no "
                          f"{', '.join(PART_NAMES[t] for t in missing)}; it has "
                          f"{', '.join(PART_NAMES[p] for p in 'qkvo' if p in has)}")
    if fused and not any(parts == "qkv" for _, _, parts in found):
        raise ConfigError(f"--lora-targets {cfg.lora_targets}: qkv is one update over a fused W_qkv, and the attention "
                          f"of {spec.name} {cfg.flavor} has W_q, W_k and W_v apart; name them: q,k,v")
    for module, name, parts in found:
        d, k = getattr(module, name).out_features // (1 if fused else len(parts)), getattr(module, name).in_features
        if any(p in targets for p in parts) and cfg.lora > min(d, k):
            raise ConfigError(f"--lora {cfg.lora}: a rank above {min(d, k)}, the smaller side of the {d} x {k} "
                              f"matrices it adapts in {spec.name} {cfg.flavor}, is no low-rank update")
    if cfg.init is None:
        raise ConfigError(f"--lora {cfg.lora} adapts a pre-trained model; give the model to start from: --init RUN_DIR "
                          f"(a finished run of {spec.name}) or --init SOURCE:NAME (a reference's weights)")
    for flag, value in (("--tp", cfg.tp), ("--pp", cfg.pp)):
        if value > 1:
            raise ConfigError(f"--lora does not go with {flag} {value} yet (its wrapped projections are not the plain "
                              f"linear layers the split takes); train with ddp or fsdp")


def apply(model: nn.Module, cfg, fresh=()) -> nn.Module:
    """The config's LoRA on `model`, in place: the targets wrapped in LoRALinear (A drawn from a generator seeded
    by --seed, the same on every rank, whatever the run drew before), every parameter frozen but A and B and
    those named in `fresh` (what --init left new: a new head, which must train)."""
    targets, fused = targets_of(cfg.lora_targets)
    with torch.random.fork_rng(devices=[]):  # the run's own random draws stay as they were
        torch.manual_seed(cfg.seed)
        apply_lora(model, cfg.lora, cfg.lora_alpha, targets, fused=fused)
    for name, p in model.named_parameters():
        if name in fresh:
            p.requires_grad_(True)
    return model


def base_model(spec, cfg, facts: dict) -> tuple[nn.Module, set[str]]:
    """The model as --init gives it before the update (in one process): the flavor's with a finished run's tensors
    (--init RUN_DIR), or the reference's architecture with its weights (--init SOURCE:NAME, from the library's
    cache or FILE); and the names of the parameters --init left new."""
    from common.pretrained import build_model, is_run, load_from_run, reference_model

    fresh = set()
    if is_run(cfg.init):
        torch.manual_seed(cfg.seed)  # a new head as the trainer drew it (model.safetensors holds it anyway)
        model = build_model(spec, cfg.flavor, cfg.init, facts, cfg.model_kwargs)
        load_from_run(model, spec, cfg.init, cfg.init_tensors, fresh)
    else:
        model, _ = reference_model(spec, cfg.init, facts, fresh=fresh)
    return model, fresh


def load_update(model: nn.Module, state: dict[str, torch.Tensor], where) -> nn.Module:
    """A LoRA run's saved update (and new head) into a model that `apply` wrapped: exactly its trainable
    parameters, else a ConfigError naming what differs."""
    own = {name: p for name, p in model.named_parameters() if p.requires_grad}
    missing, unexpected = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
    wrong = sorted(k for k in own.keys() & state.keys() if own[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        raise ConfigError(f"{where} does not hold this run's update: missing {missing[:3]}, unexpected "
                          f"{unexpected[:3]}, of another shape {wrong[:3]}")
    with torch.no_grad():
        for name, p in own.items():
            p.copy_(state[name])
    return model


def describe(model: nn.Module, cfg) -> str:
    """"LoRA r=4, alpha 8 on q,v: 8,192 of 808,960 parameters train (1.01%): the update (8 matrices), ..."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    update = sum(m.A.numel() + m.B.numel() for m in layers)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    rest = f", and {trainable - update:,} that --init left new" if trainable > update else ""
    return (f"LoRA r={cfg.lora}, alpha {cfg.lora_alpha:g} on {cfg.lora_targets}: {trainable:,} of {total:,} parameters "
            f"train ({trainable / total:.2%}): the update in {len(layers)} layers ({update:,}){rest}; the rest is frozen")
