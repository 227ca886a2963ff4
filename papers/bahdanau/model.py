"""Neural Machine Translation by Jointly Learning to Align and Translate.

Bahdanau, Cho, Bengio, 2014 (ICLR 2015). https://arxiv.org/abs/1409.0473

The encoder no longer squeezes a source sentence into one fixed-length vector: a bidirectional
RNN keeps one annotation h_j per source word, and at every target step the decoder computes a
soft alignment alpha_ij over them and reads their weighted sum c_i. The alignment model is a
small feed-forward network trained jointly with the rest, by back-propagation alone (RNNsearch).

The equations, as Appendix A writes them (A.1.2 the alignment model, A.2.1 the encoder, A.2.2 the
decoder; biases are omitted there, and here each gate and layer has one, zero at the start, B.1):

    h_j = [fwd h_j ; bwd h_j]                                    (B, S, 2n) annotations (Section 3.2)
    e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j)                     alignment model a(s_{i-1}, h_j)
    alpha_ij = exp(e_ij) / sum_k exp(e_ik)                       (6)
    c_i = sum_j alpha_ij h_j                                     (5)
    s_0 = tanh(W_s bwd h_1)
    z_i = sigma(W_z E y_{i-1} + U_z s_{i-1} + C_z c_i)           update gate
    r_i = sigma(W_r E y_{i-1} + U_r s_{i-1} + C_r c_i)           reset gate
    s~_i = tanh(W E y_{i-1} + U [r_i o s_{i-1}] + C c_i)         reset before U, as the paper writes it
    s_i = (1 - z_i) o s_{i-1} + z_i o s~_i
    t~_i = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i                 deep output (A.2.2)
    t_i = [max(t~_{i,2j-1}, t~_{i,2j})]_{j=1..l}                 maxout
    p(y_i | s_i, y_{i-1}, c_i) = softmax(W_o t_i)

The encoder is the GRU of papers/gru (torch.nn.GRU's equations: reset applied after the recurrent
product, h = (1 - z) n + z h); the decoder's GRU is written here in the paper's form above.
"""

from functools import partial

import torch
import torch.nn as nn
from einops import rearrange
from torch._higher_order_ops.scan import scan  # torch.scan, still under a private name

from papers.gru.model import GRU


class Encoder(nn.Module):
    """The bidirectional RNN of Section 3.2: every source word's annotation h_j = [fwd h_j; bwd h_j].

    Args:
        src_vocab: source vocabulary size K_x.
        embed_dim: word embedding size m.
        hidden_size: GRU units n per direction.
    """

    def __init__(self, src_vocab: int, embed_dim: int, hidden_size: int):
        super().__init__()
        self.E = nn.Embedding(src_vocab, embed_dim)  # the source word embedding matrix E
        self.gru = GRU(embed_dim, hidden_size, bidirectional=True)

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor) -> torch.Tensor:
        """Source ids (B, S) with lengths (B,) -> annotations (B, S, 2n), zero past each source's end.
        Each direction starts at its own sequence's first or last word, so padding never reaches them."""
        x = self.E(src)  # (B, S, m)
        h, _ = self.gru(x, src_lengths)  # (B, S, 2n): forward states, then backward states
        return h


class AdditiveAttention(nn.Module):
    """The alignment model a(s_{i-1}, h_j) = v_a^T tanh(W_a s_{i-1} + U_a h_j), its softmax over the
    source (6) and the context vector (5).

    Args:
        hidden_size: decoder state size n.
        annotation_size: annotation size 2n.
        align_dim: hidden units n' of the alignment model.
    """

    def __init__(self, hidden_size: int, annotation_size: int, align_dim: int):
        super().__init__()
        self.W_a = nn.Linear(hidden_size, align_dim, bias=False)  # W_a (n' x n)
        self.U_a = nn.Linear(annotation_size, align_dim)  # U_a (n' x 2n), with the alignment model's bias
        self.v_a = nn.Parameter(torch.empty(align_dim))  # v_a (n',)

    def keys(self, h: torch.Tensor) -> torch.Tensor:
        """U_a h_j for every source position, computed once per sentence: (B, S, 2n) -> (B, S, n')."""
        return self.U_a(h)

    def forward(self, s_prev: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor):
        """Attend from the previous decoder state.

        Args:
            s_prev: (B, n) the decoder state s_{i-1}.
            keys: (B, S, n') U_a h_j, from `keys`.
            h: (B, S, 2n) the annotations h_j.
            mask: (B, S) True on real source positions.

        Returns:
            c_i (B, 2n), and alpha_i (B, S), exactly 0 on padded positions.
        """
        # Batched products (bmm) rather than sums or matmul: the ONNX exporter traces scan's gradient,
        # and the backward of a sum or of matmul's reshapes would carry the symbolic sizes B and S out of
        # the scanned step, which scan cannot stack.
        A = torch.tanh(self.W_a(s_prev).unsqueeze(1) + keys)  # (B, S, n'): tanh(W_a s_{i-1} + U_a h_j)
        v_a = self.v_a.expand(A.shape[0], -1).unsqueeze(-1)  # (B, n', 1)
        e = torch.bmm(A, v_a).squeeze(-1)  # (B, S): e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j)
        e = e.masked_fill(~mask, float("-inf"))  # padding gets exp(-inf) = 0 weight
        alpha = torch.softmax(e, dim=-1)  # (B, S): alpha_ij, eq. (6)
        c = torch.bmm(alpha.unsqueeze(1), h).squeeze(1)  # (B, 2n): c_i = sum_j alpha_ij h_j, eq. (5)
        return c, alpha


class Decoder(nn.Module):
    """The decoder of Appendix A.2.2: a GRU reading the previous word and the context c_i in every gate,
    the alignment model, and the deep output with a maxout hidden layer.

    Args:
        tgt_vocab: target vocabulary size K_y.
        embed_dim: target word embedding size m.
        hidden_size: decoder GRU units n (the encoder's per direction).
        align_dim: alignment model units n'.
        maxout_dim: maxout units l (the deep output has 2l pieces).
    """

    def __init__(self, tgt_vocab: int, embed_dim: int, hidden_size: int, align_dim: int, maxout_dim: int):
        super().__init__()
        n, m, l = hidden_size, embed_dim, maxout_dim
        self.E = nn.Embedding(tgt_vocab, m)  # the target word embedding matrix E
        self.W_s = nn.Linear(n, n)  # s_0 = tanh(W_s bwd h_1)
        self.attention = AdditiveAttention(n, 2 * n, align_dim)
        self.W = nn.Linear(m, 3 * n)  # [W_z; W_r; W] E y_{i-1}, with the gates' biases
        self.U_zr = nn.Linear(n, 2 * n, bias=False)  # [U_z; U_r] s_{i-1}
        self.U = nn.Linear(n, n, bias=False)  # U [r_i o s_{i-1}]
        self.C = nn.Linear(2 * n, 3 * n, bias=False)  # [C_z; C_r; C] c_i
        self.U_o = nn.Linear(n, 2 * l)  # U_o s_{i-1}, with the deep output's bias
        self.V_o = nn.Linear(m, 2 * l, bias=False)  # V_o E y_{i-1}
        self.C_o = nn.Linear(2 * n, 2 * l, bias=False)  # C_o c_i
        self.W_o = nn.Linear(l, tgt_vocab)  # W_o t_i: the logits

    def inputs(self, y_prev: torch.Tensor):
        """What the previous words give every step, computed for all steps at once:
        ids (...,) -> W_* E y_{i-1} + b (..., 3n) and V_o E y_{i-1} (..., 2l)."""
        Ey = self.E(y_prev)  # (..., m)
        return self.W(Ey), self.V_o(Ey)

    def step(self, s_prev: torch.Tensor, inputs, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor):
        """One target step i of the equations above, for the whole batch.

        Args:
            s_prev: (B, n) s_{i-1}.
            inputs: (x_i, v_i) from `inputs`: (B, 3n) the gates' W_* E y_{i-1} + b, (B, 2l) V_o E y_{i-1}.
            keys, h, mask: (B, S, n') U_a h_j, (B, S, 2n) the annotations, (B, S) real positions.

        Returns:
            s_i (B, n), and this step's (t~_i (B, 2l), alpha_i (B, S)). The maxout over t~_i is left to
            `output`, outside the scanned step: the backward of its strided pairs would carry the symbolic
            batch size out of an exported scan.
        """
        x_i, v_i = inputs
        c_i, alpha_i = self.attention(s_prev, keys, h, mask)  # (B, 2n), (B, S)
        t_tilde = self.U_o(s_prev) + v_i + self.C_o(c_i)  # (B, 2l): t~_i = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i
        x_z, x_r, x_s = x_i.chunk(3, dim=-1)  # (B, n) each
        c_z, c_r, c_s = self.C(c_i).chunk(3, dim=-1)  # (B, n) each
        u_z, u_r = self.U_zr(s_prev).chunk(2, dim=-1)  # (B, n) each
        z_i = torch.sigmoid(x_z + u_z + c_z)  # update gate
        r_i = torch.sigmoid(x_r + u_r + c_r)  # reset gate
        s_tilde = torch.tanh(x_s + self.U(r_i * s_prev) + c_s)  # s~_i = tanh(W E y + U [r o s] + C c)
        s_i = (1 - z_i) * s_prev + z_i * s_tilde  # s_i = (1 - z_i) o s_{i-1} + z_i o s~_i
        return s_i, (t_tilde, alpha_i)

    def output(self, t_tilde: torch.Tensor) -> torch.Tensor:
        """The maxout layer and the logits: t~ (..., 2l) -> W_o t (..., K_y)."""
        t = rearrange(t_tilde, "... (l two) -> ... l two", two=2).amax(-1)  # (..., l): max(t~_{2j-1}, t~_{2j})
        return self.W_o(t)  # (..., K_y): softmax(W_o t_i) is p(y_i | s_{i-1}, y_{i-1}, c_i)

    def forward(self, memory: dict, tgt: torch.Tensor):
        """Teacher forcing: tgt (B, T) -> logits (B, T, K_y) and alpha (B, T, S). The steps run one after
        another (c_i reads s_{i-1}): a Python loop, or one scan when exporting, so that any T works."""
        x, v = self.inputs(tgt)  # (B, T, 3n), (B, T, 2l)
        x, v = rearrange(x, "b t g -> t b g"), rearrange(v, "b t g -> t b g")  # time first
        step = partial(self.step, keys=memory["keys"], h=memory["annotations"], mask=memory["mask"])
        s = memory["s0"]  # (B, n)
        if torch.compiler.is_exporting():  # one graph for every length T: the loop becomes an ONNX Scan
            _, (t_tilde, alpha) = scan(step, s, (x, v))  # (T, B, 2l), (T, B, S)
        else:
            t_tilde, alpha = [], []
            for i in range(x.shape[0]):
                s, (t_tilde_i, alpha_i) = step(s, (x[i], v[i]))
                t_tilde.append(t_tilde_i)
                alpha.append(alpha_i)
            t_tilde, alpha = torch.stack(t_tilde), torch.stack(alpha)  # (T, B, 2l), (T, B, S)
        logits = self.output(rearrange(t_tilde, "t b g -> b t g"))  # (B, T, K_y)
        return logits, rearrange(alpha, "t b s -> b t s")


class RNNsearch(nn.Module):
    """The encoder-decoder with the alignment model (RNNsearch), in the repo's seq2seq interface.

    Args:
        src_vocab: source vocabulary size K_x.
        tgt_vocab: target vocabulary size K_y.
        pad_id: the padding id (sources are masked by their lengths; kept for the interface).
        embed_dim: word embedding size m (620 in the paper), source and target.
        hidden_size: GRU units n (1000): per direction in the encoder, and the decoder's.
        align_dim: alignment model units n' (1000).
        maxout_dim: maxout units l of the deep output (500).
        init: "paper", Appendix B.1's initialisation (reset_parameters), or "torch", each layer's
            PyTorch default (and v_a uniform in +-1/sqrt(n'), as a Linear's weight): the tiny flavor's,
            since at its width the paper's scales (0.01, and v_a = 0) do not train in our budget (the note,
            "Our results").
    """

    def __init__(self, src_vocab: int, tgt_vocab: int, pad_id: int = 0, embed_dim: int = 620,
                 hidden_size: int = 1000, align_dim: int = 1000, maxout_dim: int = 500, init: str = "paper"):
        super().__init__()
        if init not in ("paper", "torch"):
            raise ValueError(f"init must be 'paper' or 'torch', got {init!r}")
        self.pad_id, self.hidden_size = pad_id, hidden_size
        self.encoder = Encoder(src_vocab, embed_dim, hidden_size)
        self.decoder = Decoder(tgt_vocab, embed_dim, hidden_size, align_dim, maxout_dim)
        if init == "paper":
            self.reset_parameters()
        else:
            nn.init.uniform_(self.decoder.attention.v_a, -align_dim ** -0.5, align_dim ** -0.5)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Appendix B.1: the recurrent matrices (U, U_z, U_r of both encoder directions and of the decoder)
        random orthogonal, each n x n block on its own; W_a and U_a from N(0, 0.001^2); v_a and every
        bias zero; every other weight matrix (embeddings included) from N(0, 0.01^2)."""
        attention = self.decoder.attention
        recurrent = [p for name, p in self.encoder.gru.named_parameters() if "weight_hh" in name]
        recurrent += [self.decoder.U_zr.weight, self.decoder.U.weight]
        for name, p in self.named_parameters():
            if any(p is q for q in recurrent):
                for block in p.split(self.hidden_size, dim=0):  # (n, n) each: r, z, n or z, r or U
                    if not block.is_meta:  # (QR has no meta kernel)
                        nn.init.orthogonal_(block)
            elif p is attention.W_a.weight or p is attention.U_a.weight:
                nn.init.normal_(p, 0, 0.001)
            elif p is attention.v_a or "bias" in name:
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0, 0.01)

    def no_weight_decay(self) -> set[str]:
        """Nothing beyond biases and v_a (1-D tensors never get weight decay)."""
        return set()

    def encode(self, src: torch.Tensor, src_lengths: torch.Tensor) -> dict:
        """Source ids (B, S) and lengths (B,) -> what the decoder reads, batch first:
        annotations h (B, S, 2n), keys U_a h (B, S, n'), mask (B, S) and s_0 (B, n)."""
        src_lengths = src_lengths.to(src.device)
        h = self.encoder(src, src_lengths)  # (B, S, 2n)
        mask = torch.arange(src.shape[1], device=src.device) < src_lengths.unsqueeze(1)  # (B, S)
        s0 = torch.tanh(self.decoder.W_s(h[:, 0, self.hidden_size:]))  # (B, n): s_0 = tanh(W_s bwd h_1)
        return {"annotations": h, "keys": self.decoder.attention.keys(h), "mask": mask, "s0": s0}

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt: torch.Tensor,
                return_attention: bool = False):
        """Teacher forcing: src (B, S), src_lengths (B,), tgt (B, T) (<s> then the target but its last
        word) -> logits (B, T, K_y); with return_attention also alpha (B, T, S), the soft alignment."""
        logits, alpha = self.decoder(self.encode(src, src_lengths), tgt)  # (B, T, K_y), (B, T, S)
        return (logits, alpha) if return_attention else logits

    def decode_step(self, memory: dict, tokens: torch.Tensor, state: dict | None):
        """One step from the previous word tokens (B,) (<s> first, with state None) -> logits (B, K_y) and
        the state {"s": s_i (B, n), "alpha": alpha_i (B, S), this step's alignment}."""
        s_prev = memory["s0"] if state is None else state["s"]  # (B, n)
        s_i, (t_tilde, alpha_i) = self.decoder.step(s_prev, self.decoder.inputs(tokens), memory["keys"],
                                                    memory["annotations"], memory["mask"])
        return self.decoder.output(t_tilde), {"s": s_i, "alpha": alpha_i}  # (B, K_y)


# tiny: the repo's CPU flavor for dates (character level, 68 symbols: 457,924 parameters); a bidirectional
#   128-unit encoder, a 128-unit decoder, an alignment model of 128 units, 64 maxout units; PyTorch's
#   initialisation (init="torch"), under which it trains here and the paper's does not.
#   Built alone it takes the paper's 30,000-word vocabularies.
# RNNsearch-50: the paper's model (Section 4.2, Appendix A.2): 620-dimensional embeddings, 1000 hidden
#   units, n' = 1000, l = 500, 30,000-word shortlists: 80,449,000 parameters. RNNsearch-30 is the same
#   network trained on sentences of up to 30 words.
FLAVORS = {
    "tiny": dict(src_vocab=30_000, tgt_vocab=30_000, embed_dim=64, hidden_size=128, align_dim=128, maxout_dim=64,
                 init="torch"),
    "RNNsearch-50": dict(src_vocab=30_000, tgt_vocab=30_000, embed_dim=620, hidden_size=1000, align_dim=1000,
                         maxout_dim=500),
}
