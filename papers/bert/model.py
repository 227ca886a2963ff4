"""BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding.

Devlin, Chang, Lee, Toutanova, NAACL 2019. https://arxiv.org/abs/1810.04805

A Transformer encoder pre-trained on unlabeled text with two tasks: a masked language model that
predicts randomly masked tokens from their left and right context at once (Section 3.1, "Task #1:
Masked LM"), and next sentence prediction, whether sentence B follows sentence A ("Task #2: NSP").
Fine-tuning adds one output layer on C, the final hidden state of the [CLS] token (Section 3.2, Figure 4).

The layers are GPT's post-norm blocks (papers/gpt), as the paper chose them: "BERT_BASE was chosen to
have the same model size as OpenAI GPT for comparison purposes. Critically, however, the BERT
Transformer uses bidirectional self-attention, while the GPT Transformer uses constrained
self-attention where every token can only attend to context to its left" (Section 3). That difference
is the attention mask here: `causal=False` (BERT) or True (the "LTR" rows of Table 5).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.layers import ClassifierMixin
from papers.gpt.model import Block


def init_weights_(module: nn.Module) -> None:
    """BERT's released initialisation: weights and embeddings from N(0, 0.02) truncated at two standard
    deviations (truncated_normal_initializer(0.02)), biases zero, LayerNorm gains one and offsets zero."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(m.weight, std=0.02, a=-0.04, b=0.04)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def attention_mask_for(mask: torch.Tensor | None, T: int, causal: bool,
                       device: torch.device) -> torch.Tensor | None:
    """Which keys each query reads, as SDPA takes it: (B or 1, 1, T or 1, T) bool, True where query i
    may attend to key j; None for SDPA's own is_causal (GPT's blocks read None as causal).

    Padded keys are masked out: every real token reads every real token (bidirectional), or those at or
    before it (causal). Every query keeps its own key, so that a padded query (whose output no real
    position ever reads) has something to attend to and stays finite, even in a row of padding only.

    Args:
        mask: (B, T) bool or 0/1, 1 on real tokens, 0 on padding (Hugging Face's attention_mask); None: no
            padding.
    """
    if mask is None:
        return None if causal else torch.ones(1, 1, 1, T, dtype=torch.bool, device=device)
    i = torch.arange(T, device=device)  # (T,) the queries' and the keys' positions
    allowed = mask.to(torch.bool)[:, None, None, :] | (i[:, None] == i)  # (B, 1, T, T)
    return allowed & (i <= i[:, None]) if causal else allowed  # causal: key j <= query i


class BertEmbeddings(nn.Module):
    """The input representation (Section 3.1 "Input/Output Representations", Figure 2): the sum of each
    token's WordPiece embedding, its segment embedding (E_A for sentence A, E_B for sentence B) and its
    learned position embedding (E_0, E_1, ...), then LayerNorm and dropout, as the released code's.

    Args:
        vocab_size: the WordPiece tokens (30,522 in the released vocabulary, "30,000" in Section 3.1).
        block_size: the positions learned (512, Appendix A.2).
        type_vocab_size: the segments (2: A and B).
        n_embd: H.
        dropout: after the LayerNorm.
        layer_norm_eps: the LayerNorm's epsilon (1e-12 in the released code).
    """

    def __init__(self, vocab_size: int, block_size: int, type_vocab_size: int, n_embd: int, dropout: float = 0.1,
                 layer_norm_eps: float = 1e-12):
        super().__init__()
        self.token = nn.Embedding(vocab_size, n_embd)  # word_embeddings, also the MLM's output weights
        self.segment = nn.Embedding(type_vocab_size, n_embd)  # token_type_embeddings: E_A, E_B
        self.position = nn.Embedding(block_size, n_embd)  # position_embeddings: E_0, E_1, ...
        self.norm = nn.LayerNorm(n_embd, eps=layer_norm_eps)  # LayerNorm
        self.dropout = nn.Dropout(dropout)

    def forward(self, idx: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) token ids, segments (B, T) 0 for A and 1 for B (None: all A) -> (B, T, H)."""
        segments = torch.zeros_like(idx) if segments is None else segments
        positions = torch.arange(idx.shape[1], device=idx.device)  # (T,)
        E = self.token(idx) + self.segment(segments) + self.position(positions)  # (B, T, H), Figure 2
        return self.dropout(self.norm(E))


class BERTEncoder(nn.Module):
    """BERT's body (Hugging Face's BertModel): the embeddings, L Transformer blocks and the pooler.

    Each block is the original Transformer's encoder layer with GPT's GELU (GPT's post-norm Block):
    h = LN(x + Dropout(Attn(x))), LN(h + Dropout(FFN(h))), the FFN of 4H units ("we set the
    feed-forward/filter size to be 4H", Section 3) with the exact erf GELU ("a gelu activation rather
    than the standard relu, following OpenAI GPT", Appendix A.2; the released code's `gelu`). The
    pooler is the released code's: C, the [CLS] token's final hidden state, through a dense layer and tanh.

    Args:
        vocab_size, block_size, type_vocab_size, layer_norm_eps: the embeddings' (BertEmbeddings).
        n_layer, n_head, n_embd: L, A and H (BERT-base: 12, 12, 768; BERT-large: 24, 16, 1024).
        dropout: on the embeddings, the attention weights and each sub-block's output ("a dropout
            probability of 0.1 on all layers", Appendix A.2).
        causal: every token reads only those at or before it (a left-to-right model, as GPT's).
        pooler: the pooler (BERT without NSP has none: nothing would train it).
    """

    def __init__(self, vocab_size: int = 30522, block_size: int = 512, type_vocab_size: int = 2, n_layer: int = 12,
                 n_head: int = 12, n_embd: int = 768, dropout: float = 0.1, layer_norm_eps: float = 1e-12,
                 causal: bool = False, pooler: bool = True):
        super().__init__()
        self.vocab_size, self.block_size, self.causal = vocab_size, block_size, causal
        self.embeddings = BertEmbeddings(vocab_size, block_size, type_vocab_size, n_embd, dropout, layer_norm_eps)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, pre_norm=False, activation="gelu_exact")
                                    for _ in range(n_layer))  # attention.self.{query,key,value} = attn.W_qkv
        for m in self.blocks.modules():
            if isinstance(m, nn.LayerNorm):
                m.eps = layer_norm_eps
        self.pooler = nn.Linear(n_embd, n_embd) if pooler else None  # pooler.dense
        init_weights_(self)

    def no_weight_decay(self) -> set[str]:
        """Nothing beyond biases and LayerNorm parameters, which the released optimizer exempts as ours does."""
        return set()

    def forward_features(self, idx: torch.Tensor, segments: torch.Tensor | None = None,
                         mask: torch.Tensor | None = None) -> torch.Tensor:
        """The final hidden vectors T_i (Section 3.1), (B, T, H); those of padded positions mean nothing."""
        T = idx.shape[1]
        if not torch.compiler.is_compiling() and T > self.block_size:
            raise ValueError(f"{T} positions exceed the {self.block_size} that the position embeddings learned")
        h = self.embeddings(idx, segments)  # (B, T, H)
        allowed = attention_mask_for(mask, T, self.causal, idx.device)
        for block in self.blocks:
            h, _ = block(h, allowed)  # (B, T, H)
        return h

    def pool(self, h: torch.Tensor) -> torch.Tensor:
        """C = tanh(W h_[CLS] + b), (B, T, H) -> (B, H): the first token's final state, through the pooler."""
        return torch.tanh(self.pooler(h[:, 0]))

    def forward(self, idx: torch.Tensor, segments: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The final hidden vectors (B, T, H) and C (B, H) (None without a pooler) of idx (B, T).

        Args:
            segments: (B, T) 0 on sentence A's tokens, 1 on B's (Hugging Face's token_type_ids); None: all A.
            mask: (B, T) bool or 0/1, 1 on real tokens, 0 on padding (Hugging Face's attention_mask); None:
                no padding.
        """
        h = self.forward_features(idx, segments, mask)
        return h, (None if self.pooler is None else self.pool(h))


class MaskedLMHead(nn.Module):
    """Task #1's output (Section 3.1): "the final hidden vectors corresponding to the mask tokens are fed
    into an output softmax over the vocabulary". As the released code: a dense layer, GELU and LayerNorm,
    then the token embedding matrix transposed (tied, one matrix, as GPT's), plus a bias for each token."""

    def __init__(self, n_embd: int, vocab_size: int, layer_norm_eps: float = 1e-12):
        super().__init__()
        self.dense = nn.Linear(n_embd, n_embd)  # cls.predictions.transform.dense
        self.norm = nn.LayerNorm(n_embd, eps=layer_norm_eps)  # cls.predictions.transform.LayerNorm
        self.bias = nn.Parameter(torch.zeros(vocab_size))  # cls.predictions.bias: output-only

    def forward(self, h: torch.Tensor, E: torch.Tensor) -> torch.Tensor:
        """h (B, T, H) and the token embeddings E (V, H) -> logits (B, T, V)."""
        return F.linear(self.norm(F.gelu(self.dense(h))), E, self.bias)


class BERT(BERTEncoder):
    """BERT pre-trained (Hugging Face's BertForPreTraining): the body, the masked-LM head on every final
    hidden vector and the NSP head on C, "C is used for next sentence prediction" (Section 3.1, Figure 1).

    Args:
        nsp: the NSP head, a linear layer from C to IsNext / NotNext; False: no NSP head nor pooler (the
            "No NSP" rows of Table 5), and forward's NSP logits are None.
        vocab_size, block_size, type_vocab_size, n_layer, n_head, n_embd, dropout, layer_norm_eps, causal:
            BERTEncoder's.
    """

    def __init__(self, vocab_size: int = 30522, block_size: int = 512, type_vocab_size: int = 2, n_layer: int = 12,
                 n_head: int = 12, n_embd: int = 768, dropout: float = 0.1, layer_norm_eps: float = 1e-12,
                 causal: bool = False, nsp: bool = True):
        super().__init__(vocab_size, block_size, type_vocab_size, n_layer, n_head, n_embd, dropout, layer_norm_eps,
                         causal, pooler=nsp)
        self.mlm = MaskedLMHead(n_embd, vocab_size, layer_norm_eps)
        self.nsp_head = nn.Linear(n_embd, 2) if nsp else None  # cls.seq_relationship
        init_weights_(self.mlm)  # its bias stays zero
        if nsp:
            init_weights_(self.nsp_head)

    def forward(self, idx: torch.Tensor, segments: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """MLM logits (B, T, V) at every position, and NSP logits (B, 2) (None without the NSP head), of the
        pairs idx (B, T) "[CLS] A [SEP] B [SEP]"; segments and mask as BERTEncoder's."""
        h = self.forward_features(idx, segments, mask)  # (B, T, H)
        mlm = self.mlm(h, self.embeddings.token.weight)  # (B, T, V)
        return mlm, (None if self.nsp_head is None else self.nsp_head(self.pool(h)))  # (B, 2)


class BERTClassifier(ClassifierMixin, BERTEncoder):
    """BERT fine-tuned for a sequence-level task (Section 4.1, Figure 4 (a), (b)): "the only new parameters
    introduced during fine-tuning are classification layer weights W in R^{K x H}", and the loss is that of
    softmax(C W^T), C the pooled [CLS] state; dropout on C first, as the released run_classifier.py.

    Causal (the "LTR & No NSP" row of Table 5: "the left-only constraint was also applied at fine-tuning"),
    [CLS] at position 0 reads only itself, so C pools the last real token's final state instead, as GPT's
    classifier reads the last token's (GPT's eq. 3), through the same pooler.

    The body's parameters keep BERT's names (embeddings.*, blocks.*, pooler.*), so that a pre-trained BERT
    loads by name and shape (--init RUN_DIR); W is new, initialised as every other weight.

    Args:
        num_classes: K.
        vocab_size, block_size, type_vocab_size, n_layer, n_head, n_embd, layer_norm_eps: BERTEncoder's.
        causal: BERTEncoder's; True also pools the last real token rather than [CLS].
        dropout: BERTEncoder's, and on C before W (0.1, Appendix A.3).
    """

    classifier_name = "W"  # get_classifier, reset_classifier: common.layers.ClassifierMixin

    def __init__(self, num_classes: int = 2, vocab_size: int = 30522, block_size: int = 512, type_vocab_size: int = 2,
                 n_layer: int = 12, n_head: int = 12, n_embd: int = 768, dropout: float = 0.1,
                 layer_norm_eps: float = 1e-12, causal: bool = False):
        super().__init__(vocab_size, block_size, type_vocab_size, n_layer, n_head, n_embd, dropout, layer_norm_eps,
                         causal)
        self.dropout = nn.Dropout(dropout)
        self.W = nn.Linear(n_embd, num_classes)  # classifier
        self.init_classifier(self.W)

    def init_classifier(self, layer: nn.Linear) -> None:
        """A new W starts as BERT's other weights (run_classifier.py: truncated normal 0.02, bias zero)."""
        init_weights_(layer)

    def forward(self, idx: torch.Tensor, segments: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Class logits C W^T (B, K) of idx (B, T); segments and mask as BERTEncoder's."""
        h = self.forward_features(idx, segments, mask)  # (B, T, H)
        if self.causal:  # the last real token's state: the only one that has read the whole sequence
            last = (idx.shape[1] if mask is None else mask.long().sum(1)) - 1  # (B,) or a number
            h = h[torch.arange(h.shape[0], device=h.device), last][:, None]  # (B, 1, H)
        C = self.pool(h)  # (B, H)
        return self.W(self.dropout(C))


def from_hf(hf_model: nn.Module) -> BERTEncoder:
    """Ours holding a transformers BertForPreTraining's (BERT), BertModel's (BERTEncoder) or
    BertForSequenceClassification's (BERTClassifier) weights, the same outputs in eval mode. Query, key
    and value are stacked into W_qkv in that order; is_decoder=True is causal=True.

    Refused in one ValueError: another class, hidden_act other than "gelu" (the erf GELU), a
    position_embedding_type other than "absolute", intermediate_size other than 4 hidden_size (the
    paper's 4H, which GPT's blocks have), cross-attention, an MLM decoder not tied to the embeddings, and
    is_decoder on BertForSequenceClassification (its pooler reads [CLS], ours the last real token).
    The dropout rate is hidden_dropout_prob (ours has one rate for all layers, as the paper).
    """
    kind, c = type(hf_model).__name__, hf_model.config
    classes = {"BertForPreTraining": BERT, "BertModel": BERTEncoder, "BertForSequenceClassification": BERTClassifier}
    body = hf_model if kind == "BertModel" else getattr(hf_model, "bert", None)
    refused = {f"{kind} is none of {', '.join(classes)}": kind not in classes,
               f"hidden_act '{c.hidden_act}' is not 'gelu'": c.hidden_act != "gelu",
               "position_embedding_type is not 'absolute'":
                   getattr(c, "position_embedding_type", "absolute") != "absolute",
               f"intermediate_size {c.intermediate_size} is not 4 x hidden_size {c.hidden_size}":
                   c.intermediate_size != 4 * c.hidden_size,
               "add_cross_attention is set": getattr(c, "add_cross_attention", False),
               "is_decoder on a classifier (its pooler reads [CLS], ours a causal one's last token)":
                   kind == "BertForSequenceClassification" and c.is_decoder,
               "the MLM decoder is not tied to the word embeddings": kind == "BertForPreTraining" and
                   hf_model.cls.predictions.decoder.weight is not body.embeddings.word_embeddings.weight}
    if any(refused.values()):
        raise ValueError(f"from_hf: ours has no counterpart: {'; '.join(m for m, no in refused.items() if no)}")
    kwargs = dict(vocab_size=c.vocab_size, block_size=c.max_position_embeddings, type_vocab_size=c.type_vocab_size,
                  n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
                  dropout=c.hidden_dropout_prob, layer_norm_eps=c.layer_norm_eps, causal=bool(c.is_decoder))
    if kind == "BertModel":
        kwargs["pooler"] = body.pooler is not None  # add_pooling_layer
    if kind == "BertForSequenceClassification":
        kwargs["num_classes"] = c.num_labels
    w = body.embeddings.word_embeddings.weight
    model = classes[kind](**kwargs).to(device=w.device, dtype=w.dtype)

    p = "" if kind == "BertModel" else "bert."
    theirs = {"embeddings.token": "embeddings.word_embeddings", "embeddings.norm": "embeddings.LayerNorm",
              "embeddings.segment": "embeddings.token_type_embeddings",
              "embeddings.position": "embeddings.position_embeddings", "pooler": "pooler.dense"}
    theirs = {ours: p + t for ours, t in theirs.items()} | {  # the heads, outside BertModel
        "mlm.dense": "cls.predictions.transform.dense", "mlm.norm": "cls.predictions.transform.LayerNorm",
        "mlm": "cls.predictions", "nsp_head": "cls.seq_relationship", "W": "classifier"}
    for i in range(c.num_hidden_layers):
        layer = f"{p}encoder.layer.{i}."
        theirs |= {f"blocks.{i}.attn.W_o": layer + "attention.output.dense",
                   f"blocks.{i}.norm1": layer + "attention.output.LayerNorm",
                   f"blocks.{i}.mlp.W_1": layer + "intermediate.dense", f"blocks.{i}.mlp.W_2": layer + "output.dense",
                   f"blocks.{i}.norm2": layer + "output.LayerNorm"}
    sd, state = hf_model.state_dict(), {}  # ours -> their tensor
    for key in model.state_dict():
        module, _, param = key.rpartition(".")
        if module.endswith("attn.W_qkv"):  # (3H, H) or (3H,): W^Q, W^K, W^V stacked, each head's rows together
            self_attn = f"{p}encoder.layer.{key.split('.')[1]}.attention.self."
            state[key] = torch.cat([sd[f"{self_attn}{x}.{param}"] for x in ("query", "key", "value")])
        else:
            state[key] = sd[f"{theirs[module]}.{param}"]
    with torch.no_grad():
        model.load_state_dict(state, strict=True)
    return model


# The paper's two sizes (Section 3: BERT-base L=12, H=768, A=12, "110M"; BERT-large L=24, H=1024, A=16,
# "340M"; 4H feed-forward, 512 positions, 2 segments, the released 30,522 WordPiece tokens), and the repo's
# tiny one (its vocab_size is the data set's, set when the model is built).
FLAVORS = {
    "tiny": dict(vocab_size=128, block_size=128, n_layer=2, n_head=2, n_embd=64),  # FFN 256
    # BERTClassifier (papers/bert/spec.py's variant) of tiny's sizes: fine-tuning from a tiny run
    "tiny-classifier": dict(vocab_size=128, block_size=128, n_layer=2, n_head=2, n_embd=64),
    "BERT-base": dict(vocab_size=30522, block_size=512, n_layer=12, n_head=12, n_embd=768),
    "BERT-large": dict(vocab_size=30522, block_size=512, n_layer=24, n_head=16, n_embd=1024),
}
