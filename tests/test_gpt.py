"""GPT and GPT-2 against Hugging Face's models (the same weights give the same logits, with and without
padding; the same parameter counts), the key-value cache against the full forward, padding, the papers'
initialisation, and torch.compile."""

import math

import pytest
import torch
import torch.nn as nn
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    OpenAIGPTConfig,
    OpenAIGPTLMHeadModel,
)

from papers.gpt import PAPER, from_hf
from papers.gpt.model import GPT

V = 101
LENGTHS = torch.tensor([10, 7, 1, 4])  # real tokens per sample; T = 10


def hf_gpt2(n_layer: int, n_head: int, n_embd: int, n_positions: int = 64) -> GPT2LMHeadModel:
    """A random GPT2LMHeadModel, its weights moved off their initial values (LayerNorms included) so that
    a mapping mistake shows."""
    torch.manual_seed(0)
    config = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=n_positions, vocab_size=V,
                        bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def tokens(B: int = 4, T: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def padding_mask(T: int = 10, left: bool = False) -> torch.Tensor:
    """(B, T) long, 1 on the real tokens: at the start of each row (right padding) or its end (left)."""
    t = torch.arange(T)
    return (t >= T - LENGTHS[:, None] if left else t < LENGTHS[:, None]).long()


@pytest.mark.parametrize("n_layer, n_head, n_embd", [(2, 2, 32), (3, 4, 48)])
def test_from_hf_gives_gpt2lmheadmodels_logits_with_and_without_padding(n_layer, n_head, n_embd):
    theirs = hf_gpt2(n_layer, n_head, n_embd)
    ours = from_hf(theirs).eval()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    idx = tokens()
    with torch.no_grad():
        assert (ours(idx) - theirs(idx).logits).abs().max() < 1e-5
        for left in (False, True):
            mask = padding_mask(left=left)
            positions = torch.arange(idx.shape[1]).expand_as(idx)  # plain positions, as ours
            expected = theirs(idx, attention_mask=mask, position_ids=positions).logits
            got = ours(idx, attention_mask=mask)
            assert torch.isfinite(got).all()  # padded queries too
            assert (got - expected)[mask.bool()].abs().max() < 1e-5  # every real position


def test_from_hf_refuses_what_ours_has_not():
    config = dict(n_layer=1, n_head=2, n_embd=16, n_positions=8, vocab_size=V, bos_token_id=0, eos_token_id=0)
    with pytest.raises(ValueError, match="activation_function"):
        from_hf(GPT2LMHeadModel(GPT2Config(**config, activation_function="silu")))
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx=False"):
        from_hf(GPT2LMHeadModel(GPT2Config(**config, scale_attn_by_inverse_layer_idx=True)))


def test_the_gpt_flavor_is_post_norm_as_openai_gpt():
    """GPT (2018) blocks, LN(x + Attn(x)) then LN(h + MLP(h)) and no final norm, give Hugging Face's
    OpenAIGPTLMHeadModel's logits from the same weights."""
    torch.manual_seed(0)
    theirs = OpenAIGPTLMHeadModel(OpenAIGPTConfig(n_layer=2, n_head=4, n_embd=32, n_positions=16, vocab_size=V))
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.05 * torch.randn_like(p))
    theirs.eval()
    flavor = {**PAPER.flavors["GPT"], "vocab_size": V, "block_size": 16, "n_layer": 2, "n_head": 4, "n_embd": 32}
    ours = GPT(**flavor).eval()
    sd = theirs.transformer.state_dict()
    state = {"W_e.weight": sd["tokens_embed.weight"], "W_p.weight": sd["positions_embed.weight"]}
    for i in range(2):
        for o, t, conv in (("attn.W_qkv", "attn.c_attn", True), ("attn.W_o", "attn.c_proj", True),
                           ("mlp.W_1", "mlp.c_fc", True), ("mlp.W_2", "mlp.c_proj", True),
                           ("norm1", "ln_1", False), ("norm2", "ln_2", False)):
            W = sd[f"h.{i}.{t}.weight"]
            state[f"blocks.{i}.{o}.weight"] = W.t() if conv else W
            state[f"blocks.{i}.{o}.bias"] = sd[f"h.{i}.{t}.bias"]
    ours.load_state_dict(state)
    idx = tokens(T=12)
    with torch.no_grad():
        assert (ours(idx) - theirs(idx).logits).abs().max() < 1e-5


@pytest.mark.parametrize("name, sizes", [("GPT-2-124M", (12, 12, 768)), ("GPT-2-355M", (24, 16, 1024)),
                                         ("GPT-2-774M", (36, 20, 1280)), ("GPT-2-1558M", (48, 25, 1600))])
def test_gpt2_parameter_counts_equal_hugging_faces(name, sizes):
    n_layer, n_head, n_embd = sizes
    with torch.device("meta"):
        theirs = GPT2LMHeadModel(GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd))  # 1024, 50,257
        ours = PAPER.build(name)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


def test_gpt_parameter_count_is_the_released_models():
    with torch.device("meta"):
        theirs = OpenAIGPTLMHeadModel(OpenAIGPTConfig())  # 40,478 tokens, 512 positions, 12 x 768
        ours = PAPER.build("GPT")
    n = sum(p.numel() for p in ours.parameters())
    assert n == sum(p.numel() for p in theirs.parameters()) == 116_534_784  # the paper's "117M" (GPT-2 Table 2)


def small(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(**{**dict(vocab_size=V, block_size=32, n_layer=2, n_head=4, n_embd=32, dropout=0.1), **overrides}).eval()


@pytest.mark.parametrize("pre_norm", [True, False])
def test_the_cache_gives_the_full_forwards_logits_one_position_a_step(pre_norm):
    model = small(pre_norm=pre_norm, final_norm=pre_norm)
    idx = tokens(B=2, T=12)
    with torch.no_grad():
        full = model(idx)  # (B, T, V)
        logits, past = model(idx[:, :5], use_cache=True)  # the prompt
        steps = [logits]
        for t in range(5, 9):  # then one token a step
            logits, past = model(idx[:, t:t + 1], past=past, use_cache=True)
            assert logits.shape == (2, 1, V)
            assert len(past) == 2 and all(k.shape == v.shape == (2, 4, t + 1, 8) for k, v in past)
            steps.append(logits)
        logits, past = model(idx[:, 9:], past=past, use_cache=True)  # several positions after a past
        steps.append(logits)
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5


def test_the_cache_with_left_padding_gives_the_full_forwards_logits():
    model = small()
    idx, mask = tokens(T=10), padding_mask(left=True)
    with torch.no_grad():
        full = model(idx, attention_mask=mask)
        logits, past = model(idx[:, :6], attention_mask=mask[:, :6], use_cache=True)
        steps = [logits]
        for t in range(6, 10):
            logits, past = model(idx[:, t:t + 1], attention_mask=mask[:, :t + 1], past=past, use_cache=True)
            steps.append(logits)
    assert ((torch.cat(steps, dim=1) - full)[mask.bool()]).abs().max() < 1e-5


def test_each_right_padded_sample_gets_what_it_gets_alone_whatever_the_padding():
    model = small()
    idx, mask = tokens(), padding_mask()
    noisy = idx.masked_fill(~mask.bool(), 7)
    with torch.no_grad():
        batch = model(noisy, attention_mask=mask.bool())
        for b, n in enumerate(LENGTHS.tolist()):
            assert (batch[b, :n] - model(idx[b:b + 1, :n])[0]).abs().max() < 1e-5


def test_initialisation_tying_and_flavors():
    torch.manual_seed(0)
    model = GPT(vocab_size=4000, block_size=64, n_layer=4, n_head=4, n_embd=256)
    assert abs(model.W_e.weight.std().item() - 0.02) < 0.001  # N(0, 0.02)
    assert abs(model.blocks[0].mlp.W_1.weight.std().item() - 0.02) < 0.001
    for W in (model.blocks[0].attn.W_o, model.blocks[3].mlp.W_2):  # GPT-2: 0.02 / sqrt(2 n_layer)
        assert abs(W.weight.std().item() - 0.02 / math.sqrt(8)) < 0.0005
        assert torch.equal(W.bias, torch.zeros_like(W.bias))
    names = {n for n, _ in model.named_parameters()}
    assert "W_e.weight" in names and not any(n.startswith("head") for n in names)  # output layer = W_e^T
    h = torch.randn(1, 3, 256)
    assert torch.allclose(model.forward_head(h), h @ model.W_e.weight.T)
    untied = GPT(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16, tie_embeddings=False)
    assert untied.head.weight is not untied.W_e.weight
    gpt = PAPER.flavors["GPT"]
    assert (gpt["pre_norm"], gpt["final_norm"], gpt["scale_residual_init"]) == (False, False, False)
    post = GPT(**{**gpt, "vocab_size": 50, "block_size": 8, "n_layer": 2, "n_embd": 24, "n_head": 2})
    assert isinstance(post.norm, nn.Identity) and not post.blocks[0].pre_norm
    assert abs(post.blocks[1].attn.W_o.weight.std().item() - 0.02) < 0.003  # unscaled
    assert PAPER.build_for_data("tiny", {"vocab_size": 77}).W_e.weight.shape == (77, 128)
    assert isinstance(PAPER.build("tiny").blocks, nn.ModuleList) and PAPER.shard_blocks == "blocks"
    with pytest.raises(ValueError, match="activation"):
        GPT(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16, activation="swish")
    with pytest.raises(ValueError, match="exceed"):
        small()(tokens(B=1, T=33))


def test_compile_matches_eager():
    model = small()
    idx = tokens(B=2, T=9)
    with torch.no_grad():
        expected = model(idx)
        got = torch.compile(model, backend="eager", fullgraph=True)(idx)
    assert (got - expected).abs().max() < 1e-6


def test_training_reaches_every_parameter():
    model = small().train()
    idx = tokens(B=2, T=9)
    model(idx).logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
