"""Long Short-Term Memory.

Hochreiter and Schmidhuber, Neural Computation 9(8), 1997. https://doi.org/10.1162/neco.1997.9.8.1735
The forget gate is that of Gers, Schmidhuber and Cummins, "Learning to Forget", 2000.

A memory cell keeps its state c_t on a self-connection of weight one, the
"constant error carousel", so error flows back through it without vanishing or
exploding. Multiplicative input and output gates learn when to write to the
cell and when to show it; the later forget gate learns when to clear it.

The equations, exactly as torch.nn.LSTM computes them (sigma is the logistic sigmoid):

    i_t = sigma(W_ii x_t + b_ii + W_hi h_{t-1} + b_hi)    input gate
    f_t = sigma(W_if x_t + b_if + W_hf h_{t-1} + b_hf)    forget gate (Gers et al. 2000)
    g_t = tanh(W_ig x_t + b_ig + W_hg h_{t-1} + b_hg)     cell input
    o_t = sigma(W_io x_t + b_io + W_ho h_{t-1} + b_ho)    output gate
    c_t = f_t * c_{t-1} + i_t * g_t                       the carousel
    h_t = o_t * tanh(c_t)

The 1997 cell has no forget gate: its carousel keeps c_t = c_{t-1} + i_t * g_t, a self-connection of
weight 1.0 (forget_gate=False; the gate order is then i, g, o).

For comparison, the kind of net the paper's experiments set LSTM against, a conventional recurrent
net trained by back-propagation through time, as torch.nn.RNN(nonlinearity="tanh") computes it
(RNNLayer, RNN):

    h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)
"""

from functools import partial

import torch
import torch.nn as nn
from einops import rearrange

from common.layers import RecurrentLayer, RecurrentStack


class LSTMLayer(RecurrentLayer):
    """One layer of LSTM cells, read forward and, if bidirectional, also backward (the directions, the
    loop over time and nn.LSTM's initialisation are common.layers.RecurrentLayer's).

    The weights are stacked in the gate order i, f, g, o and named as torch.nn.LSTM
    names them: weight_ih_l{k} (4H, input), weight_hh_l{k} (4H, H), bias_ih_l{k} and
    bias_hh_l{k} (4H,), with the suffix _reverse for the backward direction. The state is
    (h_t, c_t); `forward` takes and returns (h, c), each (D, B, H), as nn.LSTM does.

    Args:
        input_size: features of each step x_t.
        hidden_size: number of memory cells H.
        layer: index k of the layer in the stack (it only names the weights).
        bidirectional: also run a second set of cells from each sequence's end to its start.
        forget_gate: Gers et al.'s forget gate (nn.LSTM's); False: the 1997 cell, whose carousel
            keeps its state with weight 1.0 (three gate blocks, i, g, o: 3H rows).
    """

    def __init__(self, input_size: int, hidden_size: int, layer: int = 0, bidirectional: bool = False,
                 forget_gate: bool = True):
        gates = 4 if forget_gate else 3  # i, f, g, o; the 1997 cell: i, g, o
        super().__init__(input_size, hidden_size, gates, layer, bidirectional)
        self.forget_gate = forget_gate

    def zero_state(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h_0, c_0) = (0, 0), each (B, H)."""
        return super().zero_state(x), super().zero_state(x)

    def recurrence(self, W_hh: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor):
        """Both biases b_i* + b_h* go into the input part W_i* x_t + b_i* + b_h*; `step` reads W_hh."""
        return b_ih + b_hh, partial(self.step, W_hh=W_hh, forget_gate=self.forget_gate)

    @staticmethod
    def step(state, inputs, W_hh: torch.Tensor, lengths: torch.Tensor | None, forget_gate: bool = True):
        """One time step t of the equations above, for the whole batch.

        Args:
            state: (h_{t-1}, c_{t-1}), each (B, H).
            inputs: (x_proj_t, t): the input part of the gates W_i* x_t + b_i* + b_h*, (B, 4H),
                and the step index t (an int, or a 0-d tensor under scan).
            W_hh: (4H, H) the recurrent weights of the gates.
            lengths: (B,) valid steps per sequence, or None when all are full length.
            forget_gate: False: the 1997 cell, f_t = 1 (three gate blocks, (B, 3H) and (3H, H)).

        Returns:
            (h_t, c_t), and this step's output: h_t, or zero where t is past a sequence's end
            (there the state is left untouched).
        """
        (h_prev, c_prev), (x_proj_t, t) = state, inputs
        gates = torch.addmm(x_proj_t, h_prev, W_hh.t())  # (B, 4H): W_i* x_t + b_i* + W_h* h_{t-1} + b_h*
        if forget_gate:
            i, f, g, o = gates.chunk(4, dim=1)  # (B, H) each
            f = torch.sigmoid(f)
        else:  # 1997: no forget gate; the carousel's self-connection has weight 1
            i, g, o = gates.chunk(3, dim=1)  # (B, H) each
            f = 1.0
        i, g, o = torch.sigmoid(i), torch.tanh(g), torch.sigmoid(o)
        c_t = f * c_prev + i * g  # c_t = f_t * c_{t-1} + i_t * g_t
        h_t = o * torch.tanh(c_t)  # h_t = o_t * tanh(c_t)
        if lengths is None:
            return (h_t, c_t), h_t
        valid = (lengths > t).unsqueeze(1)  # (B, 1): step t lies inside the sequence
        return ((torch.where(valid, h_t, h_prev), torch.where(valid, c_t, c_prev)),
                torch.where(valid, h_t, torch.zeros_like(h_t)))


class LSTM(RecurrentStack):
    """A stack of LSTM layers on batch-first padded sequences, as torch.nn.LSTM(batch_first=True)
    computes it on a packed sequence. `forward(x, lengths=None, state=None)` takes the initial
    (h_0, c_0), each (D*num_layers, B, H), ordered as nn.LSTM takes them, or None for zeros, and
    returns the last layer's output (B, T, D*H), zero past each sequence's end, and (h_n, c_n), each
    (D*num_layers, B, H), ordered layer by layer, forward before backward, holding each sequence's
    state after its own last step (common.layers.RecurrentStack).

    Args:
        input_size: features of each step.
        hidden_size: memory cells H per layer and direction.
        num_layers: stacked layers; layer k+1 reads layer k's outputs.
        bidirectional: each layer also reads every sequence backwards; D = 2 directions.
        forget_gate: nn.LSTM's forget gate (Gers et al. 2000); False: the 1997 cell without one.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False,
                 forget_gate: bool = True):
        super().__init__(LSTMLayer, input_size, hidden_size, num_layers, bidirectional, forget_gate=forget_gate)


class RNNLayer(RecurrentLayer):
    """One layer of a conventional recurrent net (Elman's, of tanh units, trained by back-propagation
    through time), read forward and, if bidirectional, also backward:

        h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)

    exactly as torch.nn.RNN(nonlinearity="tanh") computes it, with its weights' names: weight_ih_l{k}
    (H, input), weight_hh_l{k} (H, H), bias_ih_l{k} and bias_hh_l{k} (H,), with the suffix _reverse for
    the backward direction. The error sent back through h_{t-1} is multiplied at every step by
    W_hh^T diag(1 - h_t^2): the vanishing gradient that the constant error carousel avoids.

    The directions, the loop over time and nn.RNN's initialisation are common.layers.RecurrentLayer's.

    Args:
        input_size: features of each step x_t.
        hidden_size: number of units H.
        layer: index k of the layer in the stack (it only names the weights).
        bidirectional: also run a second set of units from each sequence's end to its start.
    """

    def __init__(self, input_size: int, hidden_size: int, layer: int = 0, bidirectional: bool = False):
        super().__init__(input_size, hidden_size, 1, layer, bidirectional)  # one block: no gates

    def recurrence(self, W_hh: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor):
        """Both biases b_ih + b_hh go into the input part W_ih x_t + b_ih + b_hh; `step` reads W_hh."""
        return b_ih + b_hh, partial(self.step, W_hh=W_hh)

    @staticmethod
    def step(h_prev: torch.Tensor, inputs, W_hh: torch.Tensor, lengths: torch.Tensor | None):
        """One time step t, for the whole batch.

        Args:
            h_prev: (B, H) h_{t-1}.
            inputs: (x_proj_t, t): the input part W_ih x_t + b_ih + b_hh, (B, H), and the step
                index t (an int, or a 0-d tensor under scan).
            W_hh: (H, H) the recurrent weights.
            lengths: (B,) valid steps per sequence, or None when all are full length.

        Returns:
            h_t, and this step's output: h_t, or zero where t is past a sequence's end (there
            the state is left untouched, h_t = h_{t-1}).
        """
        x_proj_t, t = inputs
        h_t = torch.tanh(torch.addmm(x_proj_t, h_prev, W_hh.t()))  # (B, H): tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)
        if lengths is None:
            return h_t, h_t
        valid = (lengths > t).unsqueeze(1)  # (B, 1): step t lies inside the sequence
        return torch.where(valid, h_t, h_prev), torch.where(valid, h_t, torch.zeros_like(h_t))


class RNN(RecurrentStack):
    """A stack of tanh RNN layers on batch-first padded sequences, as torch.nn.RNN(batch_first=True,
    nonlinearity="tanh") computes it on a packed sequence. `forward(x, lengths=None, state=None)`
    takes the initial h_0, (D*num_layers, B, H), ordered as nn.RNN takes it, or None for zeros, and
    returns the last layer's output (B, T, D*H) and h_n (D*num_layers, B, H), ordered as h_0
    (common.layers.RecurrentStack).

    Args:
        input_size: features of each step.
        hidden_size: units H per layer and direction.
        num_layers: stacked layers; layer k+1 reads layer k's outputs.
        bidirectional: each layer also reads every sequence backwards; D = 2 directions.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False):
        super().__init__(RNNLayer, input_size, hidden_size, num_layers, bidirectional)


class LSTMClassifier(nn.Module):
    """An LSTM (or, for comparison, a plain tanh RNN) that reads a sequence and a linear head on its
    final hidden state.

    Args:
        input_size: features of each step (8 for digits read row by row, 2 for the adding problem).
        num_classes: outputs of the head (10 digit classes; 1 for a scalar regression target).
        hidden_size: memory cells (or RNN units) per layer and direction.
        num_layers: stacked recurrent layers.
        bidirectional: read each sequence both ways; the head sees both final states.
        cell: "lstm", the LSTM (in `self.lstm`), or "rnn", the conventional recurrent net of tanh
            units the paper compares against (in `self.rnn`).
        forget_gate: the LSTM's forget gate (nn.LSTM's, Gers et al. 2000); False: the 1997 cell.
    """

    CELLS = ("lstm", "rnn")

    def __init__(self, input_size: int, num_classes: int, hidden_size: int, num_layers: int = 1,
                 bidirectional: bool = False, cell: str = "lstm", forget_gate: bool = True):
        super().__init__()
        if cell not in self.CELLS:
            raise ValueError(f"unknown cell '{cell}'; choose from: {', '.join(self.CELLS)}")
        if cell == "rnn" and not forget_gate:
            raise ValueError("forget_gate is the LSTM's; the plain RNN (cell=rnn) has no gates")
        self.cell = cell
        if cell == "lstm":
            self.lstm = LSTM(input_size, hidden_size, num_layers, bidirectional, forget_gate)
        else:
            self.rnn = RNN(input_size, hidden_size, num_layers, bidirectional)
        self.D = 2 if bidirectional else 1
        self.head = nn.Linear(self.D * hidden_size, num_classes)

    def no_weight_decay(self) -> set[str]:
        """Nothing beyond biases (which never get weight decay)."""
        return set()

    @property
    def layers(self) -> nn.ModuleList:
        """The recurrent layers, whichever the cell (the blocks fsdp shards: PaperSpec.shard_blocks)."""
        return (self.lstm if self.cell == "lstm" else self.rnn).layers

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Sequences (B, T, input_size) with lengths (B,) or None -> outputs (B, num_classes)."""
        if self.cell == "lstm":
            _, (h_n, _) = self.lstm(x, lengths)  # (D*layers, B, H); the cell states c_n are not read
        else:
            _, h_n = self.rnn(x, lengths)  # (D*layers, B, H)
        h_last = rearrange(h_n[-self.D:], "d b h -> b (d h)")  # last layer, forward then backward
        return self.head(h_last)


# tiny: the repo's flavor for digits read row by row (8 steps of 8 pixels, 10 classes);
#   71,946 parameters: 4*128*(8+128) weights, 2*4*128 biases, a 128 -> 10 head.
# exp4-adding: Experiment 4 of the paper (the adding problem, Table 7): its 4 memory cells
#   (2 blocks of 2) and one output. 133 parameters against the paper's 93: here every cell
#   has its own input, forget and output gate, gates read the cells' outputs h_{t-1} (not
#   the other gates), and nn.LSTM's two bias vectors are kept: 4*4*(2+4) + 2*16 + (4+1).
FLAVORS = {
    "tiny": dict(input_size=8, num_classes=10, hidden_size=128),
    "exp4-adding": dict(input_size=2, num_classes=1, hidden_size=4),
}
