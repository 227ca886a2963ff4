"""GPT (Radford et al., 2018) and GPT-2 (Radford et al., 2019): the spec, and weight loading from
Hugging Face's GPT2LMHeadModel."""

import torch
import torch.nn as nn

from papers import PaperSpec, PipelineChain, ReferenceModel
from papers.gpt.model import FLAVORS, GPT, GPTClassifier

__all__ = ["GPT", "GPTClassifier", "PAPER", "from_hf", "hf_reference"]


def from_hf(hf_model: nn.Module) -> GPT:
    """Our GPT-2 flavor (pre-norm, final norm, tied embeddings) holding a transformers.GPT2LMHeadModel's
    weights; in eval mode the two give the same logits.

    Hugging Face's Conv1D keeps its weight as (in, out), the transpose of nn.Linear's; c_attn's columns are
    W_q, W_k, W_v in that order, as our W_qkv's rows. The dropout rate is taken from resid_pdrop (ours has
    one rate for embeddings, attention weights and sub-blocks).

    Args:
        hf_model: a GPT2LMHeadModel whose lm_head is tied to wte (tie_word_embeddings=True), with
            activation_function "gelu_new" (ours: "gelu", the tanh approximation) or "gelu", and no
            scaled or reordered attention (scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
            reorder_and_upcast_attn=False).
    """
    c = hf_model.config
    activation = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact", "relu": "relu"}
    if c.activation_function not in activation:
        raise ValueError(f"activation_function '{c.activation_function}' has no counterpart here; "
                         f"ours has {', '.join(activation)}")
    if not getattr(c, "tie_word_embeddings", True) or hf_model.lm_head.weight is not hf_model.transformer.wte.weight:
        raise ValueError("this GPT2LMHeadModel's lm_head is not tied to wte; ours ties them (tie_word_embeddings=True)")
    if not c.scale_attn_weights or c.scale_attn_by_inverse_layer_idx or c.reorder_and_upcast_attn:
        raise ValueError("ours scales attention by 1/sqrt(d/h) only: build GPT2Config with scale_attn_weights=True, "
                         "scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False")
    w = hf_model.transformer.wte.weight
    model = GPT(vocab_size=c.vocab_size, block_size=c.n_positions, n_layer=c.n_layer, n_head=c.n_head,
                n_embd=c.n_embd, dropout=c.resid_pdrop, activation=activation[c.activation_function]).to(
        device=w.device, dtype=w.dtype)
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            m.eps = c.layer_norm_epsilon

    theirs = hf_model.transformer.state_dict()
    state = {"W_e.weight": theirs["wte.weight"], "W_p.weight": theirs["wpe.weight"],
             "norm.weight": theirs["ln_f.weight"], "norm.bias": theirs["ln_f.bias"]}
    for i in range(c.n_layer):
        for ours, their, conv in (("attn.W_qkv", "attn.c_attn", True), ("attn.W_o", "attn.c_proj", True),
                                  ("mlp.W_1", "mlp.c_fc", True), ("mlp.W_2", "mlp.c_proj", True),
                                  ("norm1", "ln_1", False), ("norm2", "ln_2", False)):
            W = theirs[f"h.{i}.{their}.weight"]
            state[f"blocks.{i}.{ours}.weight"] = W.t() if conv else W  # Conv1D (in, out) -> Linear (out, in)
            state[f"blocks.{i}.{ours}.bias"] = theirs[f"h.{i}.{their}.bias"]
    with torch.no_grad():
        model.load_state_dict(state, strict=True)
    return model


def hf_reference(**kwargs) -> nn.Module:
    """A transformers.GPT2LMHeadModel of GPT2Config(**kwargs), randomly initialised: bench row b's reference.

    Defaults that make it the same model as `from_hf`'s, timed alike: SDPA attention (as ours),
    activation_function "gelu_pytorch_tanh" (F.gelu's tanh approximation, ours; GPT-2's "gelu_new" is the
    same function in plain PyTorch operations), no key-value cache (ours returns none unless asked), and
    bos and eos the last token when the default 50256 is outside a smaller vocabulary. transformers is
    imported here only: nothing else in the repository needs it.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    kwargs = dict(activation_function="gelu_pytorch_tanh", use_cache=False, attn_implementation="sdpa") | kwargs
    vocab_size = kwargs.get("vocab_size", 50257)
    for token in ("bos_token_id", "eos_token_id"):
        kwargs.setdefault(token, min(50256, vocab_size - 1))
    return GPT2LMHeadModel(GPT2Config(**kwargs))


# Bench row b's configurations: the tiny flavor's sizes (no dropout) on 64 samples of 128 tokens, and
# GPT-2-124M's (GPT2Config's defaults, dropout 0.1 everywhere as ours) on one sample of 256 tokens.
TINY_HF = dict(vocab_size=128, n_positions=128, n_layer=4, n_head=4, n_embd=128, embd_pdrop=0.0, attn_pdrop=0.0,
               resid_pdrop=0.0)

def readout(gpt: GPT, h: torch.Tensor) -> torch.Tensor:
    """The pipeline's last stage: the final norm (GPT-2), then h_n W_e^T (the tied embedding)."""
    return gpt.forward_head(gpt.norm(h))


PAPER = PaperSpec(
    name="gpt",
    family="transformer",
    title="Improving Language Understanding by Generative Pre-Training; "
          "Language Models are Unsupervised Multitask Learners (GPT-2)",
    authors="Radford, Narasimhan, Salimans, Sutskever; Radford, Wu, Child, Luan, Amodei, Sutskever",
    year=2018,
    url="https://cdn.openai.com/research-covers/language-unsupervised/language_understanding_paper.pdf",
    model=GPT,
    flavors=FLAVORS,
    inputs="tokens",
    task="language-modeling",
    defaults=dict(dataset="pydoc", epochs=20, batch_size=64, lr=2e-3, warmup_steps=100, weight_decay=0.1,
                  clip_grad=1.0),
    reference="transformers.GPT2LMHeadModel (the same logits from the same weights, `from_hf`; "
              "the same parameter counts for GPT-2's four sizes)",
    data_kwargs=("vocab_size",),
    shard_blocks="blocks",
    # Megatron-LM's split of a Transformer block: the attention's heads and the MLP's hidden units
    tp_plan={"attn.W_qkv": "colwise-qkv", "attn.W_o": "rowwise", "mlp.W_1": "colwise", "mlp.W_2": "rowwise",
             "norm1": "norm", "norm2": "norm"},
    pipeline=PipelineChain(embed=lambda gpt, idx: gpt.embed(idx), readout=readout, first=("W_e", "W_p", "dropout"),
                           last=("norm", "head", "W_e")),
    padded_batches=False,
    reference_models=(ReferenceModel("transformers:GPT2LMHeadModel", (64, 128), TINY_HF, hf_reference, from_hf),
                      ReferenceModel("transformers:GPT2LMHeadModel", (1, 256), {}, hf_reference, from_hf)),
    # `--flavor tiny-classifier`: GPT's fine-tuning (Section 3.2) on pydoc's passages labelled by topic, from
    # scratch, or from a pre-trained run with `--init RUN_DIR`; the paper's fine-tuning batch (32), L2 weight
    # (0.01) and classifier dropout (0.1, in the flavor); its lr 6.25e-5 and 3 epochs suit 117M parameters
    # pre-trained on BooksCorpus, not 0.8M trained from scratch on 384 passages: see claims/pre-training.yaml
    variants={"tiny-classifier": dict(
        model=GPTClassifier, task="classification", data_kwargs=("vocab_size", "num_classes"), pipeline=None,
        reference_models=(),
        defaults=dict(dataset="pydoc-topics", epochs=40, batch_size=32, lr=1e-3, warmup_steps=20, weight_decay=0.01,
                      clip_grad=1.0))},
)
