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

import math
from functools import partial

import torch
import torch.nn as nn
from einops import rearrange
from torch._higher_order_ops.scan import scan  # torch.scan, still under a private name


def over_time(step, x_proj: torch.Tensor, state, lengths: torch.Tensor | None, reverse: bool):
    """Run one direction's `step` over the T steps of a batch, forwards or backwards: a Python loop
    in training, torch.scan when the model is exported (one graph for every length T: the loop
    becomes an ONNX Scan).

    Args:
        step: (state, (x_proj_t, t), lengths) -> (state, output_t): one step of a layer's equations
            with its recurrent weights bound (LSTMLayer.step, RNNLayer.step, papers/gru's GRULayer.step).
        x_proj: (T, B, G) the input part of every step, W_ih x_t + biases, computed beforehand.
        state: the initial state, a tensor or a tuple of tensors, each (B, H).
        lengths: (B,) valid steps of each sequence, or None when all are full length.
        reverse: read time backwards.

    Returns:
        (B, T, H) every step's output, and the final state.
    """
    T, B, _ = x_proj.shape
    if torch.compiler.is_exporting():
        lengths = torch.full((B,), T, device=x_proj.device) if lengths is None else lengths
        state, outputs = scan(partial(step, lengths=lengths), state,
                              (x_proj, torch.arange(T, device=x_proj.device)), reverse=reverse)
        return rearrange(outputs, "t b h -> b t h"), state
    outputs = [None] * T
    for t in (reversed(range(T)) if reverse else range(T)):
        state, outputs[t] = step(state, (x_proj[t], t), lengths=lengths)
    return torch.stack(outputs, dim=1), state  # (B, T, H)


class LSTMLayer(nn.Module):
    """One layer of LSTM cells, read forward and, if bidirectional, also backward.

    The weights are stacked in the gate order i, f, g, o and named as torch.nn.LSTM
    names them: weight_ih_l{k} (4H, input), weight_hh_l{k} (4H, H), bias_ih_l{k} and
    bias_hh_l{k} (4H,), with the suffix _reverse for the backward direction.

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
        super().__init__()
        self.hidden_size, self.forget_gate = hidden_size, forget_gate
        G = (4 if forget_gate else 3) * hidden_size  # rows of the stacked gates
        self.suffixes = [f"_l{layer}", f"_l{layer}_reverse"][: 2 if bidirectional else 1]
        for s in self.suffixes:
            self.register_parameter(f"weight_ih{s}", nn.Parameter(torch.empty(G, input_size)))
            self.register_parameter(f"weight_hh{s}", nn.Parameter(torch.empty(G, hidden_size)))
            self.register_parameter(f"bias_ih{s}", nn.Parameter(torch.empty(G)))
            self.register_parameter(f"bias_hh{s}", nn.Parameter(torch.empty(G)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.LSTM's initialisation: every weight and bias from U(-1/sqrt(H), 1/sqrt(H)), drawn in
        nn.LSTM's order, so that the same seed gives nn.LSTM's initial weights."""
        bound = 1 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

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

    def cells(self, x: torch.Tensor, suffix: str, lengths: torch.Tensor | None, reverse: bool,
              state: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Run one direction's cells over time.

        Args:
            x: (B, T, input) padded inputs.
            suffix: which direction's weights ("_l{k}" or "_l{k}_reverse").
            lengths: (B,) valid steps of each sequence, or None when all are full length.
            reverse: read time backwards. Steps at or past a sequence's length leave the
                state untouched (it is still the initial state when a reversed read reaches
                the last valid step), so each sequence is read from its own last step to its first.
            state: the initial (h_0, c_0), each (B, H); None: zeros.

        Returns:
            h: (B, T, H) every step's h_t, zero past each sequence's end; and (h_n, c_n), each
            (B, H), the state after each sequence's own last step.
        """
        W_ih, W_hh = getattr(self, f"weight_ih{suffix}"), getattr(self, f"weight_hh{suffix}")
        b = getattr(self, f"bias_ih{suffix}") + getattr(self, f"bias_hh{suffix}")
        B = x.shape[0]
        # the input part of all four gates, for all steps at once
        x_flat = rearrange(x, "b t d -> (b t) d")  # (B*T, input)
        x_proj = rearrange(torch.addmm(b, x_flat, W_ih.t()), "(b t) g -> t b g", b=B)  # (T, B, 4H)
        if state is None:
            state = (x.new_zeros(B, self.hidden_size), x.new_zeros(B, self.hidden_size))  # (h_0, c_0)
        step = partial(self.step, W_hh=W_hh, forget_gate=self.forget_gate)
        return over_time(step, x_proj, state, lengths, reverse)  # (B, T, H), ((B, H), (B, H))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None,
                state: tuple[torch.Tensor, torch.Tensor] | None = None):
        """(B, T, input) -> output (B, T, D*H), and (h_n, c_n) each (D, B, H) for D directions.
        `state`: the initial (h_0, c_0), each (D, B, H) as nn.LSTM takes it; None: zeros."""
        outs, h_n, c_n = [], [], []
        for d, s in enumerate(self.suffixes):
            initial = None if state is None else (state[0][d], state[1][d])  # (B, H) each
            out, (h, c) = self.cells(x, s, lengths, reverse=s.endswith("_reverse"), state=initial)
            outs.append(out)
            h_n.append(h)
            c_n.append(c)
        return torch.cat(outs, dim=-1), (torch.stack(h_n), torch.stack(c_n))


class LSTM(nn.Module):
    """A stack of LSTM layers on batch-first padded sequences, as torch.nn.LSTM(batch_first=True)
    computes it on a packed sequence.

    Args:
        input_size: features of each step.
        hidden_size: memory cells H per layer and direction.
        num_layers: stacked layers; layer k+1 reads layer k's outputs.
        bidirectional: each layer also reads every sequence backwards; D = 2 directions.
        forget_gate: nn.LSTM's forget gate (Gers et al. 2000); False: the 1997 cell without one.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False,
                 forget_gate: bool = True):
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bidirectional = bidirectional
        D = 2 if bidirectional else 1
        self.layers = nn.ModuleList(  # layer k+1 reads layer k's outputs, D*H features per step
            LSTMLayer(input_size if k == 0 else D * hidden_size, hidden_size, k, bidirectional, forget_gate)
            for k in range(num_layers)
        )

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None,
                state: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Run the stack.

        Args:
            x: (B, T, input_size), padded after each sequence's end.
            lengths: (B,) int64 number of valid steps of each sequence, 1 <= length <= T;
                None when every sequence is T steps long.
            state: the initial (h_0, c_0), each (D*num_layers, B, H), ordered as nn.LSTM takes
                them (and as h_n, c_n come back); None: zeros.

        Returns:
            output (B, T, D*H) of the last layer, zero past each sequence's end; and
            (h_n, c_n), each (D*num_layers, B, H), ordered layer by layer, forward before
            backward, holding each sequence's state after its own last step.
        """
        if lengths is not None:
            lengths = lengths.to(x.device)
        D = 2 if self.bidirectional else 1
        h_n, c_n = [], []
        for k, layer in enumerate(self.layers):
            initial = None if state is None else (state[0][k * D:(k + 1) * D], state[1][k * D:(k + 1) * D])
            x, (h, c) = layer(x, lengths, initial)  # (B, T, D*H), (D, B, H)
            h_n.append(h)
            c_n.append(c)
        return x, (torch.cat(h_n), torch.cat(c_n))


class RNNLayer(nn.Module):
    """One layer of a conventional recurrent net (Elman's, of tanh units, trained by back-propagation
    through time), read forward and, if bidirectional, also backward:

        h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)

    exactly as torch.nn.RNN(nonlinearity="tanh") computes it, with its weights' names: weight_ih_l{k}
    (H, input), weight_hh_l{k} (H, H), bias_ih_l{k} and bias_hh_l{k} (H,), with the suffix _reverse for
    the backward direction. The error sent back through h_{t-1} is multiplied at every step by
    W_hh^T diag(1 - h_t^2): the vanishing gradient that the constant error carousel avoids.

    Args:
        input_size: features of each step x_t.
        hidden_size: number of units H.
        layer: index k of the layer in the stack (it only names the weights).
        bidirectional: also run a second set of units from each sequence's end to its start.
    """

    def __init__(self, input_size: int, hidden_size: int, layer: int = 0, bidirectional: bool = False):
        super().__init__()
        self.hidden_size = hidden_size
        self.suffixes = [f"_l{layer}", f"_l{layer}_reverse"][: 2 if bidirectional else 1]
        for s in self.suffixes:
            self.register_parameter(f"weight_ih{s}", nn.Parameter(torch.empty(hidden_size, input_size)))
            self.register_parameter(f"weight_hh{s}", nn.Parameter(torch.empty(hidden_size, hidden_size)))
            self.register_parameter(f"bias_ih{s}", nn.Parameter(torch.empty(hidden_size)))
            self.register_parameter(f"bias_hh{s}", nn.Parameter(torch.empty(hidden_size)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.RNN's initialisation: every weight and bias from U(-1/sqrt(H), 1/sqrt(H)), drawn in
        nn.RNN's order, so that the same seed gives nn.RNN's initial weights."""
        bound = 1 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

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

    def cells(self, x: torch.Tensor, suffix: str, lengths: torch.Tensor | None, reverse: bool,
              h_0: torch.Tensor | None = None):
        """Run one direction's units over time.

        Args:
            x: (B, T, input) padded inputs.
            suffix: which direction's weights ("_l{k}" or "_l{k}_reverse").
            lengths: (B,) valid steps of each sequence, or None when all are full length.
            reverse: read time backwards, each sequence from its own last step to its first
                (steps past its end leave h_0 untouched).
            h_0: (B, H) the initial state; None: zeros.

        Returns:
            h: (B, T, H) every step's h_t, zero past each sequence's end; and h_n (B, H), the
            state after each sequence's own last step.
        """
        W_ih, W_hh = getattr(self, f"weight_ih{suffix}"), getattr(self, f"weight_hh{suffix}")
        b = getattr(self, f"bias_ih{suffix}") + getattr(self, f"bias_hh{suffix}")
        B = x.shape[0]
        x_flat = rearrange(x, "b t d -> (b t) d")  # (B*T, input)
        x_proj = rearrange(torch.addmm(b, x_flat, W_ih.t()), "(b t) h -> t b h", b=B)  # (T, B, H)
        h = x.new_zeros(B, self.hidden_size) if h_0 is None else h_0  # (B, H)
        return over_time(partial(self.step, W_hh=W_hh), x_proj, h, lengths, reverse)  # (B, T, H), (B, H)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None, state: torch.Tensor | None = None):
        """(B, T, input) -> output (B, T, D*H), and h_n (D, B, H) for D directions.
        `state`: the initial h_0, (D, B, H) as nn.RNN takes it; None: zeros."""
        outs, h_n = [], []
        for d, s in enumerate(self.suffixes):
            out, h = self.cells(x, s, lengths, reverse=s.endswith("_reverse"), h_0=None if state is None else state[d])
            outs.append(out)
            h_n.append(h)
        return torch.cat(outs, dim=-1), torch.stack(h_n)


class RNN(nn.Module):
    """A stack of tanh RNN layers on batch-first padded sequences, as torch.nn.RNN(batch_first=True,
    nonlinearity="tanh") computes it on a packed sequence.

    Args:
        input_size: features of each step.
        hidden_size: units H per layer and direction.
        num_layers: stacked layers; layer k+1 reads layer k's outputs.
        bidirectional: each layer also reads every sequence backwards; D = 2 directions.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False):
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bidirectional = bidirectional
        D = 2 if bidirectional else 1
        self.layers = nn.ModuleList(  # layer k+1 reads layer k's outputs, D*H features per step
            RNNLayer(input_size if k == 0 else D * hidden_size, hidden_size, k, bidirectional)
            for k in range(num_layers)
        )

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None, state: torch.Tensor | None = None):
        """Run the stack.

        Args:
            x: (B, T, input_size), padded after each sequence's end.
            lengths: (B,) int64 number of valid steps of each sequence, 1 <= length <= T;
                None when every sequence is T steps long.
            state: the initial h_0, (D*num_layers, B, H), ordered as nn.RNN takes it (and as h_n
                comes back); None: zeros.

        Returns:
            output (B, T, D*H) of the last layer, zero past each sequence's end; and h_n
            (D*num_layers, B, H), ordered layer by layer, forward before backward, holding each
            sequence's state after its own last step.
        """
        if lengths is not None:
            lengths = lengths.to(x.device)
        D = 2 if self.bidirectional else 1
        h_n = []
        for k, layer in enumerate(self.layers):
            x, h = layer(x, lengths, None if state is None else state[k * D:(k + 1) * D])  # (B, T, D*H), (D, B, H)
            h_n.append(h)
        return x, torch.cat(h_n)


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
