"""LoRA (Hu et al., 2021, https://arxiv.org/abs/2106.09685): low-rank updates of a pre-trained model's
attention weights, h = W_0 x + (alpha / r) B A x (Section 4.1). Not a model of its own, so no PAPER spec
and no registry line: `apply_lora` wraps another paper's model (papers/lora/model.py), and `from_peft`
checks the update against peft's, the reference, on GPT-2."""

import contextlib

import torch
import torch.nn as nn

from papers.lora.model import LoRALinear, apply_lora, merge_lora, trainable_parameters

__all__ = ["LoRALinear", "apply_lora", "from_peft", "merge_lora", "trainable_parameters"]

# peft's GPT-2 module names (transformers' GPT2Attention) -> ours (papers/gpt CausalSelfAttention), targets
PEFT_GPT2 = {"attn.c_attn": ("W_qkv", ("q", "k", "v")), "attn.c_proj": ("W_o", ("o",))}


@contextlib.contextmanager
def _base_layers(gpt2: nn.Module, lora_layers: dict[str, nn.Module]):
    """gpt2 with each of its peft LoRA layers swapped for the Conv1D it wraps, for the duration: papers/gpt's
    `from_hf` then reads the base weights under their own names, and copies them."""
    swapped = []
    try:
        for name, layer in lora_layers.items():
            parent_name, _, attr = name.rpartition(".")
            parent = gpt2.get_submodule(parent_name)
            setattr(parent, attr, layer.get_base_layer())
            swapped.append((parent, attr, layer))
        yield gpt2
    finally:
        for parent, attr, layer in swapped:
            setattr(parent, attr, layer)


def from_peft(peft_model: nn.Module) -> nn.Module:
    """Our GPT (papers/gpt's `from_hf` on the base weights) with the LoRA update of a peft-wrapped
    transformers.GPT2LMHeadModel: the same logits unmerged, and after `merge_lora` on ours and
    `merge_and_unload()` on theirs.

    peft's LoRA on c_attn is one pair (A, B) over the whole fused matrix: ours is `apply_lora(...,
    targets=("q", "k", "v"), fused=True)`, A (r, k) and B (3d, r) copied as they are (peft keeps them as
    nn.Linear weights even on GPT-2's transposed Conv1D). attn.c_proj, if targeted, is W_o.

    Args:
        peft_model: `get_peft_model(GPT2LMHeadModel, LoraConfig(target_modules=["c_attn"], ...))`, c_attn
            and optionally "attn.c_proj" in every block, one adapter, and nothing peft offers beyond the
            paper's update (no rsLoRA, DoRA, LoRA bias, per-layer ranks or alphas, modules to save).
    """
    from peft.tuners.lora import LoraLayer

    from papers.gpt import from_hf

    config = peft_model.peft_config[peft_model.active_adapter]
    extras = {"use_rslora": config.use_rslora, "use_dora": config.use_dora, "lora_bias": config.lora_bias,
              "bias": config.bias != "none", "rank_pattern": config.rank_pattern,
              "alpha_pattern": config.alpha_pattern, "modules_to_save": config.modules_to_save}
    if any(extras.values()) or len(peft_model.peft_config) != 1:
        raise ValueError(f"ours is the paper's update alone, of one adapter; this one has "
                         f"{', '.join(k for k, v in extras.items() if v) or 'several adapters'}")
    gpt2 = peft_model.get_base_model()  # GPT2LMHeadModel, its LoRA layers inside
    lora_layers = {name: m for name, m in gpt2.named_modules() if isinstance(m, LoraLayer)}
    kinds = {name.split(".", 3)[-1] for name in lora_layers}  # "attn.c_attn", "attn.c_proj"
    every_block = {f"transformer.h.{i}.{kind}" for i in range(gpt2.config.n_layer) for kind in kinds}
    if not kinds <= set(PEFT_GPT2) or set(lora_layers) != every_block:
        raise ValueError(f"ours adapts {' and '.join(PEFT_GPT2)} of every block; this peft model adapts "
                         f"{', '.join(sorted(lora_layers)) or 'nothing'}")

    if any(layer.merged for layer in lora_layers.values()):
        raise ValueError("this peft model's update is merged into its base weights already; unmerge_adapter() it")
    with _base_layers(gpt2, lora_layers):
        model = from_hf(gpt2)
    targets = tuple(t for kind in sorted(kinds) for t in PEFT_GPT2[kind][1])
    apply_lora(model, config.r, config.lora_alpha, targets, dropout=config.lora_dropout, fused=True)
    for name, layer in lora_layers.items():
        i, kind = int(name.split(".")[2]), name.split(".", 3)[-1]
        ours = getattr(model.blocks[i].attn, PEFT_GPT2[kind][0])
        adapter = layer.active_adapters[0]
        with torch.no_grad():
            ours.A.copy_(layer.lora_A[adapter].weight[None])  # (r, k) -> (1, r, k)
            ours.B.copy_(layer.lora_B[adapter].weight[None])  # (d, r) -> (1, d, r)
    return model
