"""BERT (Devlin et al., 2019): the spec, and the reference for bench row b (Hugging Face's BertForPreTraining,
whose weights `from_hf` in model.py loads)."""

import torch.nn as nn

from papers import PaperSpec, ReferenceModel
from papers.bert.model import BERT, FLAVORS, BERTClassifier, BERTEncoder, from_hf

__all__ = ["BERT", "BERTClassifier", "BERTEncoder", "PAPER", "from_hf", "hf_reference"]


def hf_reference(**kwargs) -> nn.Module:
    """A transformers.BertForPreTraining of BertConfig(**kwargs), randomly initialised, with SDPA attention as
    ours: bench row b's reference. transformers is imported here only."""
    from transformers import BertConfig, BertForPreTraining

    return BertForPreTraining(BertConfig(**({"attn_implementation": "sdpa"} | kwargs)))


# Bench row b's configurations: the tiny flavor's sizes (no dropout) on 64 samples of 128 tokens, and
# BERT-base's (BertConfig's defaults, dropout 0.1 as ours) on 8 samples of 128 tokens.
TINY_HF = dict(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
               max_position_embeddings=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

PAPER = PaperSpec(
    name="bert",
    family="transformer",
    title="BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding",
    authors="Devlin, Chang, Lee, Toutanova",
    year=2019,
    url="https://arxiv.org/abs/1810.04805",
    model=BERT,
    flavors=FLAVORS,
    inputs="tokens",
    task="masked-lm",
    # the paper's Adam with L2 weight decay 0.01, warmup, dropout 0.1 and gradient clipping at 1 (the released
    # optimizer's); its lr 1e-4 suits 110M parameters over 1M steps, not 0.2M for a few hundred steps. Three
    # epochs (279 steps of 64), each reading the text 10 times over (the data's dupe_factor): at 2 epochs and lr
    # 1e-3 the tiny model scored the unigram model's MLM accuracy (0.0639 against 0.0636), at these 0.0927
    defaults=dict(dataset="pydoc-pairs", tokenizer="wordpiece", epochs=3, batch_size=64, lr=3e-3, warmup_steps=40,
                  weight_decay=0.01, clip_grad=1.0),
    reference="transformers.BertForPreTraining, BertModel and BertForSequenceClassification (the same outputs "
              "from the same weights, `from_hf`; the same parameter counts for BERT-base and BERT-large)",
    # nsp: the data's pairs have NSP labels (pydoc-pairs), or not (pydoc-segments, pydoc-ltr); causal: the data is
    # labelled for a left-to-right LM (pydoc-ltr), which BERT reads left-only
    data_kwargs=("vocab_size", "nsp", "causal"),
    shard_blocks="blocks",
    # Megatron-LM's split of a Transformer block, as GPT's (BERT's blocks are GPT's); post-norm: no
    # --sequence-parallel, whose plan splits the positions at a block's pre-norms
    tp_plan={"attn.W_qkv": "colwise-qkv", "attn.W_o": "rowwise", "mlp.W_1": "colwise", "mlp.W_2": "rowwise"},
    pipeline=None,  # the blocks read the padding mask beside the running tensor: no chain of one input
    padded_batches=True,
    reference_models=(ReferenceModel("transformers:BertForPreTraining", (64, 128), TINY_HF, hf_reference, from_hf),
                      ReferenceModel("transformers:BertForPreTraining", (8, 128), {}, hf_reference, from_hf)),
    # `--flavor tiny-classifier`: fine-tuning (Section 3.2, Figure 1 right) on pydoc's passages labelled by topic,
    # "[CLS] passage [SEP]" of 32 WordPiece tokens (the eight topics hold 80 passages each at that length, not
    # at 128), from scratch or from a pre-training run with `--init RUN_DIR`; the paper's fine-tuning batch
    # (32), weight decay and warmup (Appendix A.3); its lr (2e-5 to 5e-5) and 2 to 4 epochs suit a model
    # pre-trained for 1M steps, not a tiny one
    variants={"tiny-classifier": dict(
        model=BERTClassifier, task="classification", data_kwargs=("vocab_size", "num_classes"), reference_models=(),
        defaults=dict(dataset="pydoc-topics", tokenizer="wordpiece", block_size=32, epochs=20, batch_size=32,
                      lr=1e-3, warmup_steps=20, weight_decay=0.01, clip_grad=1.0))},
)
