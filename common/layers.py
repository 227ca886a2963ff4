"""The few layers that several papers share: what a CNN needs to read padded batches.

A paper that sets `padded_batches=True` gets images zero-padded at the bottom
and right, with a mask (B, H, W) that is True on each image's valid pixels (a
top-left rectangle), and must give every image the output it has alone. For a
CNN that means three things, all here:

- after a layer that mixes in the padding (a convolution at the edge, a pool),
  set the padding back to zero: `masked(x, mask)`;
- after a strided layer, the valid pixels are `downsample_mask(mask, stride)`;
- batch norm counts only the valid pixels (`MaskedBatchNorm2d`), and global
  average pooling averages only them (`masked_mean`).

With mask=None each of them is the plain layer, so a model written with them
reads unpadded batches exactly as without them.

Two more things several papers share:

- the classifier interface of timm's models (`no_weight_decay`, `get_classifier`,
  `reset_classifier`) of a CNN whose last layer is one nn.Linear: `ClassifierMixin`;
- the mechanics of torch.nn.RNN, LSTM and GRU (weights per direction with
  torch.nn's names, their initialisation, the loop over directions, over time and
  over stacked layers, padded sequences read within their lengths):
  `RecurrentLayer`, `RecurrentStack` and `over_time`. A paper's layer gives only
  its equations: one time step (`step`) and where its biases go (`recurrence`).
"""

import math
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange, reduce
from torch._higher_order_ops.scan import scan  # torch.scan, still under a private name


def downsample_mask(mask: torch.Tensor | None, stride: int) -> torch.Tensor | None:
    """The valid pixels after a layer with this stride.

    A top-left h x w rectangle becomes ceil(h/s) x ceil(w/s), which is the valid output of
    a k x k convolution or pool with stride s and padding (k - 1) / 2 (3x3/s with padding 1,
    7x7/2 with padding 3, 3x3/2 max pool with padding 1), of a strided 1x1 convolution and
    of subsampling by s.
    """
    return None if mask is None else mask[:, ::stride, ::stride]


def masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """x (B, C, H, W) with the padding set back to zero."""
    return x if mask is None else x * mask[:, None]


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Global average pooling (B, C, H, W) -> (B, C) over each image's valid pixels."""
    if mask is None:
        return F.adaptive_avg_pool2d(x, 1).flatten(1)  # as torchvision's models pool
    m = mask[:, None].to(x.dtype)  # (B, 1, H, W)
    return reduce(x * m, "b c h w -> b c", "sum") / reduce(m, "b c h w -> b c", "sum")


class MaskedBatchNorm2d(nn.BatchNorm2d):
    """Batch norm over the valid pixels only; the output is zero on the padding.

    In training, the mean and biased variance of the valid pixels normalise, and the
    running estimates take the unbiased variance with the momentum, as nn.BatchNorm2d.
    In eval mode, the running estimates normalise. With mask=None it is nn.BatchNorm2d.
    """

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None:
            return super().forward(x)
        if not (self.training or self.running_mean is None):  # running estimates, as nn.BatchNorm2d decides
            return masked(super().forward(x), mask)
        x32, m = x.float(), mask[:, None].float()  # statistics in fp32, also under autocast; m: (B, 1, H, W)
        n = m.sum()  # valid pixels per channel
        mean = reduce(x32 * m, "b c h w -> c", "sum") / n  # (C,)
        var = reduce((x32 - mean[:, None, None]) ** 2 * m, "b c h w -> c", "sum") / n  # biased, (C,)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = 1 / self.num_batches_tracked.item() if self.momentum is None else self.momentum
                self.running_mean.lerp_(mean, momentum)
                self.running_var.lerp_(var * n / (n - 1), momentum)  # unbiased
        y = (x32 - mean[:, None, None]) * torch.rsqrt(var[:, None, None] + self.eps)
        if self.affine:
            y = y * self.weight[:, None, None] + self.bias[:, None, None]
        return (y * m).to(x.dtype)


class ClassifierMixin:
    """timm's classifier interface, for a model whose last layer is one nn.Linear named `classifier_name`
    (common.pretrained fine-tunes through it). A paper whose last layer starts otherwise than nn.Linear's
    default says how in `init_classifier`."""

    classifier_name = "fc"

    def no_weight_decay(self) -> set[str]:
        """Nothing beyond the biases and batch-norm parameters that never get weight decay."""
        return set()

    def get_classifier(self) -> nn.Linear:
        return getattr(self, self.classifier_name)

    def reset_classifier(self, num_classes: int) -> None:
        """A new last layer for num_classes (`new_classifier`)."""
        setattr(self, self.classifier_name, self.new_classifier(self.get_classifier(), num_classes))

    def new_classifier(self, old: nn.Linear, num_classes: int) -> nn.Linear:
        """A layer for num_classes that reads what `old` read, on its device and in its dtype,
        initialised by `init_classifier`."""
        layer = nn.Linear(old.in_features, num_classes, device=old.weight.device, dtype=old.weight.dtype)
        self.init_classifier(layer)
        return layer

    def init_classifier(self, layer: nn.Linear) -> None:
        """How a new last layer starts: nn.Linear's default initialisation, kept as it is."""


def over_time(step, x_proj: torch.Tensor, state, lengths: torch.Tensor | None, reverse: bool):
    """Run one direction's `step` over the T steps of a batch, forwards or backwards: a Python loop
    in training, torch.scan when the model is exported (one graph for every length T: the loop
    becomes an ONNX Scan).

    Args:
        step: (state, (x_proj_t, t), lengths) -> (state, output_t): one step of a layer's equations
            with its recurrent weights bound (papers/lstm's LSTMLayer.step and RNNLayer.step,
            papers/gru's GRULayer.step).
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


def _take(state, index):
    """state[index] of a state tensor, or of each tensor of a tuple of them (the LSTM's (h, c))."""
    return tuple(s[index] for s in state) if isinstance(state, tuple) else state[index]


def _join(join, states: list):
    """torch.stack or torch.cat of a list of states, tensor by tensor when each is a tuple."""
    return tuple(map(join, zip(*states))) if isinstance(states[0], tuple) else join(states)


class RecurrentLayer(nn.Module):
    """One layer of recurrent units, read forward and, if bidirectional, also backward: what
    torch.nn.RNN, LSTM and GRU share. A subclass gives its equations: `step`, one time step for
    `over_time`, and `recurrence`, which binds the step's weights and says which bias goes into the
    input part computed for all steps at once.

    The weights are named as torch.nn names them: weight_ih_l{k} (G H, input), weight_hh_l{k}
    (G H, H), bias_ih_l{k} and bias_hh_l{k} (G H,), G blocks of H rows stacked (one per gate), with
    the suffix _reverse for the backward direction.

    Args:
        input_size: features of each step x_t.
        hidden_size: number of units H.
        gates: blocks of H rows stacked in each weight (1 for tanh units, 3 for the GRU, 4 for the LSTM).
        layer: index k of the layer in the stack (it only names the weights).
        bidirectional: also run a second set of units from each sequence's end to its start.
    """

    def __init__(self, input_size: int, hidden_size: int, gates: int, layer: int = 0, bidirectional: bool = False):
        super().__init__()
        self.hidden_size = hidden_size
        G = gates * hidden_size  # rows of the stacked gates
        self.suffixes = [f"_l{layer}", f"_l{layer}_reverse"][: 2 if bidirectional else 1]
        for s in self.suffixes:
            self.register_parameter(f"weight_ih{s}", nn.Parameter(torch.empty(G, input_size)))
            self.register_parameter(f"weight_hh{s}", nn.Parameter(torch.empty(G, hidden_size)))
            self.register_parameter(f"bias_ih{s}", nn.Parameter(torch.empty(G)))
            self.register_parameter(f"bias_hh{s}", nn.Parameter(torch.empty(G)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.RNN's, LSTM's and GRU's initialisation: every weight and bias from
        U(-1/sqrt(H), 1/sqrt(H)), drawn in their order, so that the same seed gives their initial weights."""
        bound = 1 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def recurrence(self, W_hh: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor):
        """The bias added to W_ih x_t in the input part, and the step with its recurrent weights bound."""
        raise NotImplementedError

    def zero_state(self, x: torch.Tensor):
        """The initial state when none is given: h_0 = 0, (B, H)."""
        return x.new_zeros(x.shape[0], self.hidden_size)

    def cells(self, x: torch.Tensor, suffix: str, lengths: torch.Tensor | None, reverse: bool, state=None):
        """Run one direction's units over time.

        Args:
            x: (B, T, input) padded inputs.
            suffix: which direction's weights ("_l{k}" or "_l{k}_reverse").
            lengths: (B,) valid steps of each sequence, or None when all are full length.
            reverse: read time backwards. Steps at or past a sequence's length leave the state
                untouched (it is still the initial state when a reversed read reaches the last
                valid step), so each sequence is read from its own last step to its first.
            state: the initial state, (B, H) or a tuple of them; None: `zero_state`.

        Returns:
            (B, T, H) every step's h_t, zero past each sequence's end; and the state after each
            sequence's own last step.
        """
        W_ih, W_hh = getattr(self, f"weight_ih{suffix}"), getattr(self, f"weight_hh{suffix}")
        b, step = self.recurrence(W_hh, getattr(self, f"bias_ih{suffix}"), getattr(self, f"bias_hh{suffix}"))
        B = x.shape[0]
        # the input part of all the gates, for all steps at once
        x_flat = rearrange(x, "b t d -> (b t) d")  # (B*T, input)
        x_proj = rearrange(torch.addmm(b, x_flat, W_ih.t()), "(b t) g -> t b g", b=B)  # (T, B, G H)
        return over_time(step, x_proj, self.zero_state(x) if state is None else state, lengths, reverse)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None, state=None):
        """(B, T, input) -> output (B, T, D*H), and the final state, (D, B, H) or a tuple of them, for D
        directions. `state`: the initial one, shaped as the final one (as torch.nn takes it); None: zeros."""
        outs, finals = [], []
        for d, s in enumerate(self.suffixes):
            initial = None if state is None else _take(state, d)  # (B, H) each
            out, final = self.cells(x, s, lengths, reverse=s.endswith("_reverse"), state=initial)
            outs.append(out)
            finals.append(final)
        return torch.cat(outs, dim=-1), _join(torch.stack, finals)


class RecurrentStack(nn.Module):
    """A stack of recurrent layers on batch-first padded sequences, as torch.nn.RNN, LSTM and GRU
    (batch_first=True) compute it on a packed sequence.

    Args:
        Layer: the layers' class, a RecurrentLayer, built as
            Layer(input, hidden_size, k, bidirectional, **layer_kwargs) for layer k.
        input_size: features of each step.
        hidden_size: units H per layer and direction.
        num_layers: stacked layers; layer k+1 reads layer k's outputs.
        bidirectional: each layer also reads every sequence backwards; D = 2 directions.
    """

    def __init__(self, Layer: type[RecurrentLayer], input_size: int, hidden_size: int, num_layers: int = 1,
                 bidirectional: bool = False, **layer_kwargs):
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bidirectional = bidirectional
        self.D = 2 if bidirectional else 1
        self.layers = nn.ModuleList(  # layer k+1 reads layer k's outputs, D*H features per step
            Layer(input_size if k == 0 else self.D * hidden_size, hidden_size, k, bidirectional, **layer_kwargs)
            for k in range(num_layers)
        )

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None, state=None):
        """Run the stack.

        Args:
            x: (B, T, input_size), padded after each sequence's end.
            lengths: (B,) int64 number of valid steps of each sequence, 1 <= length <= T;
                None when every sequence is T steps long.
            state: the initial state, (D*num_layers, B, H) or a tuple of them, ordered as torch.nn
                takes it (layer by layer, forward before backward); None: zeros.

        Returns:
            output (B, T, D*H) of the last layer, zero past each sequence's end; and the final
            state, ordered as `state`, holding each sequence's state after its own last step.
        """
        if lengths is not None:
            lengths = lengths.to(x.device)
        D, finals = self.D, []
        for k, layer in enumerate(self.layers):
            initial = None if state is None else _take(state, slice(k * D, (k + 1) * D))  # (D, B, H) each
            x, final = layer(x, lengths, initial)  # (B, T, D*H), (D, B, H) each
            finals.append(final)
        return x, _join(torch.cat, finals)
