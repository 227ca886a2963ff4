"""Sequence to Sequence Learning with Neural Networks.

Sutskever, Vinyals, Le, NIPS 2014. https://arxiv.org/abs/1409.3215

One deep LSTM reads the source sentence, reversed, into its final state v (every layer's h and c);
a second deep LSTM, started from v, is a language model of the target sentence conditioned on
the source: a softmax over the target vocabulary at every step (Eq. 1). Reversing the source puts
its first words next to the target's first words, so the optimisation starts from short-term
dependencies (Section 3.3).

    p(y_1, ..., y_T' | x_1, ..., x_T) = prod_t p(y_t | v, y_1, ..., y_{t-1})     (Eq. 1)

The LSTM layers are papers/lstm's (nn.LSTM's equations, without the peephole connections of the
Graves 2013 formulation the paper cites).
"""

import torch
import torch.nn as nn
from einops import rearrange

from papers.lstm.model import LSTM


def reverse_within_lengths(src: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each sequence reversed within its own length, padding left at the end (Section 3.3: "a, b, c" is
    read as "c, b, a"). One gather with an index computed from the lengths, no loop over the batch, so
    that an exported graph keeps the batch and S dynamic.

    Args:
        src: (B, S) ids padded at the end.
        lengths: (B,) valid ids of each row, 1 <= length <= S.
    """
    position = torch.arange(src.shape[1], device=src.device)[None, :]  # (1, S)
    L = lengths.to(src.device)[:, None]  # (B, 1)
    index = torch.where(position < L, L - 1 - position, position)  # (B, S): t -> L-1-t inside, t past the end
    return src.gather(1, index)  # (B, S)


class Seq2Seq(nn.Module):
    """The encoder-decoder of Section 2 and 3.4: two deep LSTMs, separate embeddings for the two
    languages, and a softmax over the target vocabulary.

    Args:
        src_vocab: source words (160,000 in the paper).
        tgt_vocab: target words (80,000), the size of the softmax.
        pad_id: the padding id of sources and targets.
        embed_dim: word embedding size (1000).
        hidden_size: LSTM cells per layer (1000).
        num_layers: layers of each LSTM (4: "deep LSTMs significantly outperformed shallow LSTMs").
        init_range: every parameter from U(-init_range, init_range) (0.08, Section 3.4).
        reverse_source: read each source backwards (Section 3.3); False gives the paper's "forward LSTM".
        embed_std: None, the paper's init for the embeddings too; else the embeddings from N(0, embed_std^2)
            (the tiny flavors' 1.0, PyTorch's nn.Embedding default: at 64 dimensions the paper's
            U(-0.08, 0.08) gives each word a vector of norm 0.37, against 1.5 at the paper's 1000, and
            the run did not start; see README.md, "Our results").
    """

    def __init__(self, src_vocab: int = 160_000, tgt_vocab: int = 80_000, pad_id: int = 0, embed_dim: int = 1000,
                 hidden_size: int = 1000, num_layers: int = 4, init_range: float = 0.08, reverse_source: bool = True,
                 embed_std: float | None = None):
        super().__init__()
        self.pad_id, self.init_range, self.reverse_source = pad_id, init_range, reverse_source
        self.embed_std = embed_std
        self.src_embed = nn.Embedding(src_vocab, embed_dim)  # source word embeddings, (V_src, E)
        self.tgt_embed = nn.Embedding(tgt_vocab, embed_dim)  # target word embeddings, (V_tgt, E)
        self.encoder = LSTM(embed_dim, hidden_size, num_layers)  # reads the (reversed) source
        self.decoder = LSTM(embed_dim, hidden_size, num_layers)  # "another LSTM", started from v
        self.W_out = nn.Linear(hidden_size, tgt_vocab)  # the softmax's logits over the target words
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Section 3.4: "We initialized all of the LSTM's parameters with the uniform distribution between
        -0.08 and 0.08": every weight and bias here, embeddings and softmax included."""
        for p in self.parameters():
            nn.init.uniform_(p, -self.init_range, self.init_range)
        if self.embed_std is not None:
            for embedding in (self.src_embed, self.tgt_embed):
                nn.init.normal_(embedding.weight, 0, self.embed_std)

    def no_weight_decay(self) -> set[str]:
        """Nothing beyond biases (the paper uses no weight decay at all)."""
        return set()

    def encode(self, src: torch.Tensor, src_lengths: torch.Tensor) -> dict[str, torch.Tensor]:
        """Read the sources into v: the final state of every encoder layer, batch first.

        Args:
            src: (B, S) ids padded at the end with pad_id.
            src_lengths: (B,) int64, 1 <= length <= S.

        Returns:
            {"h": (B, layers, H), "c": (B, layers, H)}, each source's state after its own last
            (reversed: its first) word; padding never reaches it.
        """
        src_lengths = src_lengths.to(src.device)
        if self.reverse_source:
            src = reverse_within_lengths(src, src_lengths)  # (B, S): x_T, ..., x_1, then padding
        _, (h_n, c_n) = self.encoder(self.src_embed(src), src_lengths)  # (layers, B, H) each
        return {"h": rearrange(h_n, "l b h -> b l h"), "c": rearrange(c_n, "l b h -> b l h")}

    def decoder_state(self, state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """{"h", "c"} batch first -> (h, c), each (layers, B, H), as the LSTM takes it."""
        return (rearrange(state["h"], "b l h -> l b h").contiguous(),
                rearrange(state["c"], "b l h -> l b h").contiguous())

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: the logits of every target word given the source and the words before it.

        Args:
            src: (B, S) source ids padded at the end; src_lengths (B,).
            tgt: (B, T) the decoder's input, <s> then the target words but the last, padded at the end
                (the decoder is causal, so its padding only reaches positions the loss ignores).

        Returns:
            logits (B, T, tgt_vocab): position t scores y_t (Eq. 1's factors before the softmax).
        """
        v = self.encode(src, src_lengths)
        s, _ = self.decoder(self.tgt_embed(tgt), state=self.decoder_state(v))  # (B, T, H), started from v
        return self.W_out(s)  # (B, T, V_tgt)

    def decode_step(self, memory: dict[str, torch.Tensor], tokens: torch.Tensor,
                    state: dict[str, torch.Tensor] | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One decoder step through every layer, from the previous word (<s> first, when state is None).

        Args:
            memory: what `encode` returned, {"h", "c"} each (B, layers, H).
            tokens: (B,) the previous output word.
            state: {"h", "c"} each (B, layers, H), or None at the first step (then v).

        Returns:
            logits (B, tgt_vocab) of the next word, and the new state {"h", "c"}, batch first.
        """
        x = self.tgt_embed(tokens)[:, None, :]  # (B, 1, E)
        s, (h, c) = self.decoder(x, state=self.decoder_state(memory if state is None else state))  # (B, 1, H)
        return self.W_out(s[:, 0]), {"h": rearrange(h, "l b h -> b l h"), "c": rearrange(c, "l b h -> b l h")}


# tiny: the repo's CPU flavor for the dates data set (character level); its vocabularies come from the data;
#   its embeddings start from N(0, 1), everything else as the paper (embed_std above).
# tiny-forward: tiny reading each source in its own order, the "forward LSTM" of Section 3.3 and Table 1.
# paper: Section 3.4, 4 layers of 1000 cells, 1000-dim embeddings, 160,000 source and 80,000 target words;
#   384,144,000 parameters ("384M"): embeddings 160M + 80M, two LSTMs of 4 * (4*1000*(1000+1000) + 2*4000)
#   = 32,032,000 each ("32M" each, "64M are pure recurrent connections"), the softmax 80M + 80,000 biases.
FLAVORS = {
    "tiny": dict(src_vocab=128, tgt_vocab=128, embed_dim=64, hidden_size=128, num_layers=2, embed_std=1.0),
    "tiny-forward": dict(src_vocab=128, tgt_vocab=128, embed_dim=64, hidden_size=128, num_layers=2,
                         reverse_source=False, embed_std=1.0),
    # tiny with the paper's initialisation everywhere, embeddings included: what the default run was at 5f06bda
    "tiny-paper-init": dict(src_vocab=128, tgt_vocab=128, embed_dim=64, hidden_size=128, num_layers=2),
    "paper": dict(src_vocab=160_000, tgt_vocab=80_000, embed_dim=1000, hidden_size=1000, num_layers=4),
}
