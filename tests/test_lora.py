"""LoRA (papers/lora): a wrapped model starts as the model (B = 0), only A and B train and they number
r (k + d) per adapted matrix, merging changes no output and leaves plain nn.Linear layers, W_q and W_v
alone inside a fused W_qkv leave W_k's rows as they were, and peft's LoRA on a GPT-2 gives the same
logits as ours from the same weights, unmerged and merged."""

import copy

import pytest
import torch
import torch.nn as nn
from peft import LoraConfig, get_peft_model

from papers.gpt import from_hf
from papers.gpt.model import GPT
from papers.lora import LoRALinear, apply_lora, from_peft, merge_lora, trainable_parameters
from papers.transformer.model import MultiHeadAttention
from papers.vit.model import VisionTransformer
from tests.test_gpt import V, hf_gpt2, tokens

R, ALPHA = 4, 8.0  # a scale alpha / r of 2, so that a scaling mistake shows


def gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=V, block_size=16, n_layer=2, n_head=4, n_embd=32).eval()


def vit() -> VisionTransformer:
    torch.manual_seed(0)
    model = VisionTransformer(img_size=8, patch_size=2, in_chans=1, num_classes=10, dim=32, depth=2, num_heads=4,
                              mlp_dim=64).eval()
    nn.init.normal_(model.head.weight)  # ViT's head starts at zero (Section 3.2), which would hide every change
    return model


MODELS = {"gpt": (gpt, lambda: tokens(B=2, T=8)), "vit": (vit, lambda: torch.randn(2, 1, 8, 8))}


def randomise_B(model: nn.Module, seed: int = 1) -> None:
    """B is zero at the start (Section 4.1): give it values, so that the update shows."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                nn.init.normal_(m.B, std=0.1)


@pytest.mark.parametrize("name", MODELS)
def test_b_is_zero_at_the_start_so_the_wrapped_model_is_the_model(name):
    build, inputs = MODELS[name]
    model, x = build(), inputs()
    wrapped = apply_lora(copy.deepcopy(model), R, ALPHA, targets=("q", "k", "v", "o"))
    layers = [m for m in wrapped.modules() if isinstance(m, LoRALinear)]
    assert len(layers) == 2 * 2  # W_qkv and W_o of 2 blocks
    assert all((m.B == 0).all() and (m.A != 0).all() for m in layers)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))


def lora_names(model: nn.Module, attention: str, matrices: tuple[str, ...]) -> set[str]:
    return {f"blocks.{i}.{attention}.{W}.{p}" for i in range(2) for W in matrices for p in ("A", "B")}


@pytest.mark.parametrize("name, attention", [("gpt", "attn"), ("vit", "msa")])
@pytest.mark.parametrize("targets, fused, matrices, outs", [
    (("q", "v"), False, ("W_qkv",), (32, 32)),  # a pair for W_q, one for W_v: r (k + d) each
    (("q", "k", "v", "o"), False, ("W_qkv", "W_o"), (32, 32, 32, 32)),
    (("q", "k", "v"), True, ("W_qkv",), (96,)),  # one pair over the fused (3d x d) matrix, as peft's
])
def test_only_a_and_b_of_the_targets_train_and_they_number_r_times_k_plus_d(name, attention, targets, fused,
                                                                             matrices, outs):
    model = apply_lora(MODELS[name][0](), R, ALPHA, targets=targets, fused=fused)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == lora_names(model, attention, matrices)
    assert trainable_parameters(model) == 2 * sum(R * (32 + d) for d in outs)  # 2 blocks, k = 32


def test_a_training_step_changes_only_a_and_b():
    model = apply_lora(gpt(), R, ALPHA)  # W_q and W_v
    randomise_B(model)  # with B = 0, A's gradient (alpha / r) B^T dL/dh x^T is zero
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    idx = tokens(B=2, T=8)
    model(idx).logsumexp(-1).mean().backward()
    optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == lora_names(model, "attn", ("W_qkv",))


def test_the_transformers_separate_projections_are_wrapped_one_by_one():
    """A layer of three matrices W_q, W_k, W_v (the Transformer's) gets a LoRALinear on each target."""
    attention = apply_lora(MultiHeadAttention(32, 4), R, ALPHA, targets=("q", "v"))
    assert {n for n, p in attention.named_parameters() if p.requires_grad} == {"W_q.A", "W_q.B", "W_v.A", "W_v.B"}
    assert type(attention.W_k) is nn.Linear and type(attention.W_o) is nn.Linear
    assert trainable_parameters(attention) == 2 * R * (32 + 32)


@pytest.mark.parametrize("name", MODELS)
def test_merged_outputs_equal_unmerged_and_the_merged_model_is_plain(name):
    build, inputs = MODELS[name]
    plain, x = build(), inputs()
    model = apply_lora(copy.deepcopy(plain), R, ALPHA, targets=("q", "v", "o"))
    randomise_B(model)
    with torch.no_grad():
        unmerged = model(x)
        assert (unmerged - plain(x)).abs().max() > 1e-3  # the update changes the outputs
        merged = merge_lora(model)(x)
    assert (merged - unmerged).abs().max() < 1e-5
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert all(type(m) in (nn.Linear,) for n, m in model.named_modules() if n.endswith(("W_qkv", "W_o")))
    assert model.state_dict().keys() == plain.state_dict().keys()  # no A, no B, no W_0 prefix


def test_merge_is_applied_once_and_unmerge_gives_w_0_back():
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(16, 48), R, ALPHA, slices=(True, False, True))
    nn.init.normal_(layer.B)
    W_0, x = layer.W_0.weight.detach().clone(), torch.randn(5, 16)
    with torch.no_grad():
        unmerged = layer(x)
        layer.merge()
        layer.merge()  # a second merge adds nothing
        assert (layer(x) - unmerged).abs().max() < 1e-5  # W_0 x alone, W_0 holding the update
        assert (layer.W_0(x) - unmerged).abs().max() < 1e-5
        layer.unmerge()
        assert (layer.W_0.weight - W_0).abs().max() < 1e-6
        assert (layer(x) - unmerged).abs().max() < 1e-5


def test_w_q_and_w_v_alone_leave_the_k_rows_of_a_fused_projection_as_they_were():
    model = apply_lora(gpt(), R, ALPHA, targets=("q", "v"))
    randomise_B(model)
    d, x = 32, torch.randn(2, 8, 32)
    for block in model.blocks:
        W_qkv = block.attn.W_qkv
        assert W_qkv.slices == (True, False, True) and W_qkv.A.shape == (2, R, d) and W_qkv.B.shape == (2, d, R)
        with torch.no_grad():
            h, h_0 = W_qkv(x), W_qkv.W_0(x)  # (B, T, 3d): q, k, v
        q, k, v = (slice(0, d), slice(d, 2 * d), slice(2 * d, 3 * d))
        assert torch.equal(h[..., k], h_0[..., k])
        assert (h[..., q] - h_0[..., q]).abs().max() > 1e-3 and (h[..., v] - h_0[..., v]).abs().max() > 1e-3
        assert (W_qkv.delta_weight()[k] == 0).all()


def test_a_target_that_is_not_q_k_v_or_o_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"'W_q'.*choose from: q, k, v, o"):
        apply_lora(gpt(), R, ALPHA, targets=("W_q", "v"))
    with pytest.raises(ValueError, match="choose from: q, k, v, o"):
        apply_lora(gpt(), R, ALPHA, targets="qv")
    with pytest.raises(ValueError, match="must hold q, k and v"):
        apply_lora(gpt(), R, ALPHA, targets=("q", "v"), fused=True)  # one pair over W_qkv updates all three
    with pytest.raises(ValueError, match="LoRA already"):
        apply_lora(apply_lora(gpt(), R, ALPHA), R, ALPHA)


def test_a_is_initialised_as_the_paper_or_as_the_released_code():
    torch.manual_seed(0)
    k = 256
    gaussian = LoRALinear(nn.Linear(k, 64), 8, 16.0).A  # the paper's Gaussian: peft's "gaussian", N(0, 1/r^2)
    assert abs(gaussian.std().item() - 1 / 8) < 0.01 and gaussian.abs().max() > 1 / k ** 0.5
    kaiming = LoRALinear(nn.Linear(k, 64), 8, 16.0, init="kaiming").A  # loralib's, peft's default
    assert kaiming.abs().max() <= 1 / k ** 0.5 and abs(kaiming.std().item() - 1 / (3 * k) ** 0.5) < 0.005
    with pytest.raises(ValueError, match="choose from: gaussian, kaiming"):
        LoRALinear(nn.Linear(4, 4), 2, 2.0, init="zeros")


@pytest.mark.parametrize("target_modules", [["c_attn"], ["c_attn", "attn.c_proj"]])
def test_from_peft_gives_peft_gpt2s_logits_unmerged_and_merged(target_modules):
    """A GPT-2 of sizes of its own, peft's LoRA on c_attn (one pair over the fused matrix), B random."""
    theirs = get_peft_model(hf_gpt2(n_layer=3, n_head=2, n_embd=24), LoraConfig(
        r=R, lora_alpha=ALPHA, target_modules=target_modules, fan_in_fan_out=True, lora_dropout=0.1)).eval()
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "lora_B" in name:
                nn.init.normal_(p, std=0.1)
    ours = from_peft(theirs).eval()
    assert trainable_parameters(ours) == sum(p.numel() for p in theirs.parameters() if p.requires_grad)
    idx = tokens()
    with torch.no_grad():
        expected = theirs(input_ids=idx).logits
        assert (ours(idx) - expected).abs().max() < 1e-5
        with theirs.disable_adapter():
            assert (ours(idx) - theirs(input_ids=idx).logits).abs().max() > 1e-3  # the update matters
        merge_lora(ours)
        merged = theirs.merge_and_unload()
        assert (ours(idx) - merged(idx).logits).abs().max() < 1e-5
        assert (ours(idx) - from_hf(merged).eval()(idx)).abs().max() < 1e-5  # the same weights, as from_hf reads them


def test_from_peft_refuses_what_the_paper_has_not():
    for config, match in ((dict(target_modules=["c_attn"], use_rslora=True), "use_rslora"),
                          (dict(target_modules=["c_fc"]), "mlp.c_fc")):
        config = LoraConfig(r=2, fan_in_fan_out=True, **config)
        peft_model = get_peft_model(hf_gpt2(n_layer=1, n_head=2, n_embd=8), config)
        with pytest.raises(ValueError, match=match):
            from_peft(peft_model)


def test_a_reference_models_new_head_trains_with_the_update(tmp_path):
    """--init timm:test_vit@FILE (timm's 0.4M-parameter ViT, random weights, nothing downloaded) fine-tuned on 10
    classes with --lora: the 1000-class head is replaced, and the new head and the update are all that trains."""
    import timm
    from safetensors.torch import save_file

    from common import lora
    from common.config import TrainConfig
    from papers import get_paper

    torch.manual_seed(0)
    save_file(timm.create_model("test_vit", pretrained=False).state_dict(), tmp_path / "test_vit.safetensors")
    cfg = TrainConfig(paper="vit", init=f"timm:test_vit@{tmp_path / 'test_vit.safetensors'}", lora=R,
                      lora_targets="q,k,v,o")
    model, fresh = lora.base_model(get_paper("vit"), cfg, dict(num_classes=10, in_chans=3, img_size=160))
    assert fresh == {"head.weight", "head.bias"} and model.head.out_features == 10
    lora.apply(model, cfg, fresh)
    update = {f"blocks.{i}.msa.{W}.{p}" for i in range(len(model.blocks)) for W in ("W_qkv", "W_o") for p in "AB"}
    assert {n for n, p in model.named_parameters() if p.requires_grad} == update | fresh
