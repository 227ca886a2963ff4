"""Learning Phrase Representations using RNN Encoder-Decoder for Statistical Machine Translation.

Cho, van Merrienboer, Gulcehre, Bahdanau, Bougares, Schwenk, Bengio, EMNLP 2014.
https://arxiv.org/abs/1406.1078

One recurrent network reads a source phrase into a fixed-length summary vector c and a second one
writes the target phrase from c, reading c at every step (the RNN Encoder-Decoder, Section 2.2).
Both use a new hidden unit with a reset gate and an update gate (Section 2.3), since called the
gated recurrent unit (GRU).

The unit, as the paper writes it for hidden unit j (Section 2.3, phi = tanh, sigma the logistic sigmoid):

    r_j = sigma([W_r x]_j + [U_r h_{<t-1>}]_j)                  (5)  reset gate
    z_j = sigma([W_z x]_j + [U_z h_{<t-1>}]_j)                  (6)  update gate
    h_j^{<t>} = z_j h_j^{<t-1>} + (1 - z_j) h~_j^{<t>}          (7)
    h~_j^{<t>} = phi([W x]_j + [U (r (.) h_{<t-1>})]_j)         (8)  candidate

and exactly as torch.nn.GRU computes it, which is what this file computes:

    r_t = sigma(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)
    z_t = sigma(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)
    n_t = tanh(W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))
    h_t = (1 - z_t) * n_t + z_t * h_{t-1}

The one difference: equation (8) resets h_{t-1} before the recurrent product, U (r (.) h), while
nn.GRU (and cuDNN) resets after it, r * (U h + b_hn). We compute nn.GRU's form, so that our GRU
equals nn.GRU to float precision; the two are different functions of the same weights.

For the comparison Section 2.3 reports ("it is crucial to use this new unit with gates. We were not
able to get meaningful result with an oft-used tanh unit without any gating"), every GRU here can be
built of that ungated unit instead (cell="tanh"): h_t = tanh(W x_t + U h_{t-1} + b), papers/lstm's
RNNLayer, with torch.nn.RNN's two bias vectors (b = b_ih + b_hh) as the GRU keeps nn.GRU's two.
"""

from functools import partial

import torch
import torch.nn as nn
from einops import rearrange

from common.layers import RecurrentLayer, RecurrentStack
from papers.lstm.model import RNNLayer


class GRULayer(RecurrentLayer):
    """One layer of gated recurrent units, read forward and, if bidirectional, also backward (the
    directions, the loop over time and nn.GRU's initialisation are common.layers.RecurrentLayer's;
    the paper's own initialisation is applied by EncoderDecoder, which owns the choice).

    The weights are stacked in the gate order r, z, n and named as torch.nn.GRU names them:
    weight_ih_l{k} (3H, input), weight_hh_l{k} (3H, H), bias_ih_l{k} and bias_hh_l{k} (3H,),
    with the suffix _reverse for the backward direction.

    Args:
        input_size: features of each step x_t.
        hidden_size: number of units H.
        layer: index k of the layer in the stack (it only names the weights).
        bidirectional: also run a second set of units from each sequence's end to its start.
    """

    def __init__(self, input_size: int, hidden_size: int, layer: int = 0, bidirectional: bool = False):
        super().__init__(input_size, hidden_size, 3, layer, bidirectional)  # r, z, n

    def recurrence(self, W_hh: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor):
        """Only b_i* goes into the input part W_i* x_t + b_i*: `step` reads W_hh and b_hh, since the reset
        gate multiplies W_hn h_{t-1} + b_hn."""
        return b_ih, partial(self.step, W_hh=W_hh, b_hh=b_hh)

    @staticmethod
    def step(h_prev: torch.Tensor, inputs, W_hh: torch.Tensor, b_hh: torch.Tensor,
             lengths: torch.Tensor | None = None):
        """One time step t of the equations above, for the whole batch.

        Args:
            h_prev: (B, H) h_{t-1}.
            inputs: (x_proj_t, t): the input part of the gates W_i* x_t + b_i*, (B, 3H) stacked
                r, z, n, and the step index t (an int, or a 0-d tensor under scan; unused when
                lengths is None).
            W_hh: (3H, H) the recurrent weights W_hr, W_hz, W_hn stacked.
            b_hh: (3H,) the recurrent biases b_hr, b_hz, b_hn.
            lengths: (B,) valid steps per sequence, or None when all are full length.

        Returns:
            h_t, and this step's output: h_t, or zero where t is past a sequence's end (there
            the state is left untouched, h_t = h_{t-1}).
        """
        x_proj_t, t = inputs
        h_proj = torch.addmm(b_hh, h_prev, W_hh.t())  # (B, 3H): W_h* h_{t-1} + b_h*
        x_r, x_z, x_n = x_proj_t.chunk(3, dim=1)  # (B, H) each
        h_r, h_z, h_n = h_proj.chunk(3, dim=1)  # (B, H) each
        r = torch.sigmoid(x_r + h_r)  # reset gate, (5)
        z = torch.sigmoid(x_z + h_z)  # update gate, (6)
        n = torch.tanh(x_n + r * h_n)  # candidate h~, (8) with r applied after U h (nn.GRU's form)
        h_t = (1 - z) * n + z * h_prev  # (7)
        if lengths is None:
            return h_t, h_t
        valid = (lengths > t).unsqueeze(1)  # (B, 1): step t lies inside the sequence
        return torch.where(valid, h_t, h_prev), torch.where(valid, h_t, torch.zeros_like(h_t))


class GRU(RecurrentStack):
    """A stack of GRU layers on batch-first padded sequences, as torch.nn.GRU(batch_first=True)
    computes it on a packed sequence (common.layers.RecurrentStack); or, with cell="tanh", the same
    stack of ungated tanh units.

    Args:
        input_size: features of each step.
        hidden_size: units H per layer and direction.
        num_layers: stacked layers; layer k+1 reads layer k's outputs.
        bidirectional: each layer also reads every sequence backwards; D = 2 directions.
        cell: "gru", the gated unit (GRULayer); or "tanh", the "oft-used tanh unit without any
            gating" that Section 2.3 found no meaningful result with: h_t = tanh(W x_t + U h_{t-1} + b),
            papers/lstm's RNNLayer (torch.nn.RNN's unit: weights named as GRULayer's, one block of H
            rows instead of three, U(-1/sqrt(H), 1/sqrt(H)) as its own initialisation). Padding and
            lengths are handled as the GRU's: a step past a sequence's end leaves the state unchanged.
    """

    CELLS = {"gru": GRULayer, "tanh": RNNLayer}

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False,
                 cell: str = "gru"):
        if cell not in self.CELLS:
            raise ValueError(f"unknown cell '{cell}'; choose from: {', '.join(self.CELLS)}")
        super().__init__(self.CELLS[cell], input_size, hidden_size, num_layers, bidirectional)
        self.cell = cell

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None, h_0: torch.Tensor | None = None):
        """Run the stack.

        Args:
            x: (B, T, input_size), padded after each sequence's end.
            lengths: (B,) int64 number of valid steps of each sequence, 1 <= length <= T;
                None when every sequence is T steps long.
            h_0: (D*num_layers, B, H) initial states, ordered as nn.GRU orders them (layer by
                layer, forward before backward); zeros when None.

        Returns:
            output (B, T, D*H) of the last layer, zero past each sequence's end; and h_n
            (D*num_layers, B, H), ordered as h_0, holding each sequence's state after its own
            last step.
        """
        return super().forward(x, lengths, h_0)


class GRUClassifier(nn.Module):
    """A GRU that reads a sequence and a linear head on its final hidden state (beside papers/lstm's
    LSTMClassifier, for comparing the two units on the same tasks).

    Args:
        input_size: features of each step (8 for digits read row by row, 2 for the adding problem).
        num_classes: outputs of the head (10 digit classes; 1 for a scalar regression target).
        hidden_size: units per layer and direction.
        num_layers: stacked GRU layers.
        bidirectional: read each sequence both ways; the head sees both final states.
        cell: "gru", or "tanh" for ungated tanh units under the same head (GRU's `cell`).
    """

    def __init__(self, input_size: int, num_classes: int, hidden_size: int, num_layers: int = 1,
                 bidirectional: bool = False, cell: str = "gru"):
        super().__init__()
        self.gru = GRU(input_size, hidden_size, num_layers, bidirectional, cell)
        self.D = 2 if bidirectional else 1
        self.head = nn.Linear(self.D * hidden_size, num_classes)

    def no_weight_decay(self) -> set[str]:
        """Nothing beyond biases (which never get weight decay)."""
        return set()

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Sequences (B, T, input_size) with lengths (B,) or None -> outputs (B, num_classes)."""
        _, h_n = self.gru(x, lengths)  # (D*layers, B, H)
        h_last = rearrange(h_n[-self.D:], "d b h -> b (d h)")  # last layer, forward then backward
        return self.head(h_last)


class EncoderDecoder(nn.Module):
    """The RNN Encoder-Decoder of Section 2.2, with the sizes and output layer of Appendix A.

    Encoder (A.1.1): h_t = GRU(h_{t-1}, e(x_t)), h_0 = 0, and the summary c = tanh(V h_N) of the
    state after each source's own last word.
    Decoder (A.1.2): h'_0 = tanh(V' c), then

        z'  = sigma(W'_z e(y_{t-1}) + U'_z h'_{t-1} + C_z c)
        r'  = sigma(W'_r e(y_{t-1}) + U'_r h'_{t-1} + C_r c)
        h~' = tanh(W' e(y_{t-1}) + r' (.) (U' h'_{t-1}) + C c)
        h'_t = z' h'_{t-1} + (1 - z') h~'

    computed as a GRU whose input is [e(y_{t-1}); c]: its input weights [W'_*, C_*] times
    [e(y_{t-1}); c] are exactly the paper's separate W'_* e(y_{t-1}) + C_* c terms, so c reaches the
    gates and the candidate at every step. (Where the appendix's candidate puts C c inside the reset,
    r' (.) (U' h' + C c), as we recall it might, this differs: here c enters the candidate unreset.
    We are not sure of that detail.) Output (A.1.2): s'_t = O_h h'_t + O_y e(y_{t-1}) + O_c c,
    maxout over pairs s_t^<i> = max(s'_t^<2i-1>, s'_t^<2i>), and logits G s_t over the target words,
    with G = G_l G_r of rank `output_rank` when given (Section 4.1.1: the input and output matrices
    "approximated with two lower-rank matrices", rank 100).

    Args:
        src_vocab: source words (15,000 in the paper).
        tgt_vocab: target words (15,000).
        pad_id: the padding id of sources and targets (padding is masked by lengths, not by this id).
        embed_dim: word embedding size e(x), e(y) (100: the rank of the input matrices).
        hidden_size: GRU units of the encoder and of the decoder, and the size of c (1000).
        maxout_units: maxout units of s_t, each the max of 2 (500).
        output_rank: factor G (K x maxout) as G_l (K x rank) G_r (rank x maxout); None: one matrix G.
        init_std: the standard deviation of the Gaussian every non-recurrent weight starts from (0.01).
        cell: "gru", the paper's gated unit; or "tanh", Section 2.3's "oft-used tanh unit without any
            gating", h_t = tanh(W x_t + U h_{t-1} + b), in the encoder and in the decoder, which then
            reads c through the same input weights: h'_t = tanh(W' e(y_{t-1}) + U' h'_{t-1} + C c + b').
            Everything else (sizes, c = tanh(V h_N), h'_0 = tanh(V' c), the deep output) is the same.
    """

    def __init__(self, src_vocab: int = 15_000, tgt_vocab: int = 15_000, pad_id: int = 0, embed_dim: int = 100,
                 hidden_size: int = 1000, maxout_units: int = 500, output_rank: int | None = None,
                 init_std: float = 0.01, cell: str = "gru"):
        super().__init__()
        self.pad_id, self.init_std = pad_id, init_std
        H, E, M = hidden_size, embed_dim, maxout_units
        self.e_x = nn.Embedding(src_vocab, E)  # e(x_i), source word embeddings
        self.encoder = GRU(E, H, cell=cell)  # h_t = f(h_{t-1}, x_t), one layer of 1000 units
        self.V = nn.Linear(H, H)  # c = tanh(V h_N)
        self.e_y = nn.Embedding(tgt_vocab, E)  # e(y_j), target word embeddings
        self.V_prime = nn.Linear(H, H)  # h'_0 = tanh(V' c)
        self.decoder = GRU(E + H, H, cell=cell)  # reads [e(y_{t-1}); c]: weight_ih = [W'_* C_*]
        self.O_h = nn.Linear(H, 2 * M)  # s' = O_h h'_t + O_y e(y_{t-1}) + O_c c (+ one bias)
        self.O_y = nn.Linear(E, 2 * M, bias=False)
        self.O_c = nn.Linear(H, 2 * M, bias=False)
        if output_rank is None:
            self.G = nn.Linear(M, tgt_vocab)  # logits g_j s_t
        else:
            self.G = nn.Sequential(nn.Linear(M, output_rank, bias=False), nn.Linear(output_rank, tgt_vocab))  # G_r, G_l
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Section 4.1.1: every weight from N(0, 0.01^2) ("an isotropic zero-mean (white) Gaussian
        distribution with its standard deviation fixed to 0.01"; init_std), embeddings included,
        except the recurrent matrices U_r, U_z, U (and U'_*): each the left singular vectors of a
        white Gaussian matrix (Saxe et al. 2014), an orthogonal matrix. The paper does not say how
        biases start; they keep PyTorch's initialisation. The tanh unit (cell="tanh") starts as the
        GRU's candidate does: W (and C) from N(0, init_std^2), U one orthogonal matrix, biases
        PyTorch's (nn.RNN's U(-1/sqrt(H), 1/sqrt(H)), the distribution nn.GRU's biases start from)."""
        for name, p in self.named_parameters():
            if "bias" in name:
                continue
            if "weight_hh" in name:  # (3H, H): U_r, U_z, U stacked (the tanh unit's (H, H): U alone)
                with torch.no_grad():
                    for U in p.chunk(p.shape[0] // p.shape[1], dim=0):  # (H, H) views, one orthogonal each
                        U.copy_(torch.linalg.svd(torch.randn_like(U))[0])
            else:
                nn.init.normal_(p, 0.0, self.init_std)

    def no_weight_decay(self) -> set[str]:
        """Nothing beyond biases (the paper uses no weight decay)."""
        return set()

    def encode(self, src: torch.Tensor, src_lengths: torch.Tensor) -> dict[str, torch.Tensor]:
        """Read the sources into the summary vector c.

        Args:
            src: (B, S) ids padded at the end with pad_id.
            src_lengths: (B,) int64, 1 <= length <= S.

        Returns:
            {"c": (B, H)}: c = tanh(V h_N), h_N the encoder's state after each source's own last word,
            which padding never reaches.
        """
        _, h_n = self.encoder(self.e_x(src), src_lengths.to(src.device))  # (1, B, H): h_N
        return {"c": torch.tanh(self.V(h_n[0]))}  # (B, H)

    def readout(self, h: torch.Tensor, e_prev: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """The deep output: maxout over s' = O_h h'_t + O_y e(y_{t-1}) + O_c c, then G.

        Args:
            h: (..., H) the decoder's h'_t; e_prev (..., E) the embedding of y_{t-1}; c (..., H),
                broadcast against them.

        Returns:
            logits (..., tgt_vocab).
        """
        s_prime = self.O_h(h) + self.O_y(e_prev) + self.O_c(c)  # (..., 2M)
        s = rearrange(s_prime, "... (m two) -> ... m two", two=2).amax(-1)  # (..., M): max(s'^<2i-1>, s'^<2i>)
        return self.G(s)  # (..., V_tgt)

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: the logits of every target word given the source and the words before it.

        Args:
            src: (B, S) source ids padded at the end; src_lengths (B,).
            tgt: (B, T) the decoder's input, <s> then the target words but the last, padded at the end
                (the decoder is causal, so its padding only reaches positions the loss ignores).

        Returns:
            logits (B, T, tgt_vocab): position t scores y_t, p(y_t | y_{t-1}, ..., y_1, c).
        """
        c = self.encode(src, src_lengths)["c"]  # (B, H)
        e_prev = self.e_y(tgt)  # (B, T, E): e(y_{t-1})
        c_t = c[:, None, :].expand(-1, tgt.shape[1], -1)  # (B, T, H): c at every step
        h_0 = torch.tanh(self.V_prime(c))[None]  # (1, B, H): h'_0 = tanh(V' c)
        h, _ = self.decoder(torch.cat([e_prev, c_t], dim=-1), h_0=h_0)  # (B, T, H): h'_1 ... h'_T
        return self.readout(h, e_prev, c[:, None, :])  # (B, T, V_tgt)

    def decode_step(self, memory: dict[str, torch.Tensor], tokens: torch.Tensor,
                    state: dict[str, torch.Tensor] | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One decoder step from the previous word (<s> first, when state is None).

        Args:
            memory: what `encode` returned, {"c": (B, H)}.
            tokens: (B,) the previous output word y_{t-1}.
            state: {"h": (B, H)} the decoder's h'_{t-1}, or None at the first step (then tanh(V' c)).

        Returns:
            logits (B, tgt_vocab) of y_t, and the new state {"h": (B, H)}.
        """
        c = memory["c"]  # (B, H)
        h_prev = torch.tanh(self.V_prime(c)) if state is None else state["h"]  # (B, H)
        e_prev = self.e_y(tokens)  # (B, E)
        x = torch.cat([e_prev, c], dim=-1)[:, None, :]  # (B, 1, E+H)
        _, h_n = self.decoder(x, h_0=h_prev[None])  # (1, B, H)
        h = h_n[0]  # (B, H): h'_t
        return self.readout(h, e_prev, c), {"h": h}


# tiny: the repo's CPU flavor for the dates data set (character level); its vocabularies come from the data.
#   It starts its non-recurrent weights from N(0, 0.1^2), not the paper's N(0, 0.01^2): at these widths
#   (64-dim embeddings, 128 units) 0.01 left the model stuck reading too little of the source (loss 0.95
#   and no date exactly right after 600 AdamW steps at lr 3e-3, batch 64), where 0.1 reached loss 0.02
#   and 90% exact dates. The recurrent matrices are orthogonal in both, as the paper's.
# paper: Section 4.1.1 and Appendix A: 1000 units in the encoder and the decoder, rank-100 input and
#   output matrices (100-dim embeddings, G = G_l G_r), 500 maxout units of 2 pieces, and the 15,000 most
#   frequent English and French words.
FLAVORS = {
    "tiny": dict(src_vocab=128, tgt_vocab=128, embed_dim=64, hidden_size=128, maxout_units=64, init_std=0.1),
    "paper": dict(src_vocab=15_000, tgt_vocab=15_000, embed_dim=100, hidden_size=1000, maxout_units=500,
                  output_rank=100, init_std=0.01),
    # the GRU as a sequence classifier (GRUClassifier), beside the LSTM's tiny flavor: digits read row by row
    "classifier": dict(input_size=8, num_classes=10, hidden_size=128),
}
