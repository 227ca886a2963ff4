"""LSTM against torch.nn.LSTM, and the plain tanh RNN against torch.nn.RNN: the same weights give the
same outputs and final states, on full-length batches and on packed variable-length ones."""

import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from papers.lstm import PAPER, from_torch, from_torch_rnn
from papers.lstm.model import LSTM, RNN, LSTMClassifier

INPUT, HIDDEN, B, T = 5, 7, 4, 9
LENGTHS = torch.tensor([6, 9, 1, 4])  # unsorted, one full length, one of a single step


def random_torch_lstm(num_layers: int, bidirectional: bool) -> nn.LSTM:
    torch.manual_seed(0)
    lstm = nn.LSTM(INPUT, HIDDEN, num_layers=num_layers, bidirectional=bidirectional, batch_first=True)
    with torch.no_grad():  # larger than the default init, so the gates saturate differently and mistakes show
        for p in lstm.parameters():
            p.normal_(0, 0.5)
    return lstm.eval()


def torch_packed(net: nn.LSTM | nn.RNN, x: torch.Tensor, lengths: torch.Tensor, state=None):
    """nn.LSTM's or nn.RNN's padded outputs on a packed batch, and its final state."""
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, final = net(packed, state)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return out, final


def assert_close(got, expected):
    (out, (h, c)), (out_ref, (h_ref, c_ref)) = got, expected
    assert out.shape == out_ref.shape and h.shape == h_ref.shape and c.shape == c_ref.shape
    for ours, theirs in ((out, out_ref), (h, h_ref), (c, c_ref)):
        assert (ours - theirs).abs().max() < 1e-5


@pytest.mark.parametrize("num_layers, bidirectional", [(1, False), (2, True), (3, False)])
def test_full_length_equals_torch(num_layers, bidirectional):
    theirs = random_torch_lstm(num_layers, bidirectional)
    ours = from_torch(theirs)
    x = torch.randn(B, T, INPUT)
    with torch.no_grad():
        expected = theirs(x)
        assert_close(ours(x), expected)
        assert_close(ours(x, torch.full((B,), T)), expected)  # full lengths given explicitly


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_variable_lengths_equal_packed_torch(bidirectional):
    theirs = random_torch_lstm(2, bidirectional)
    ours = from_torch(theirs)
    x = torch.randn(B, T, INPUT)
    with torch.no_grad():
        expected = torch_packed(theirs, x, LENGTHS)
        got = ours(x, LENGTHS)
    assert_close(got, expected)
    # the padded outputs are zeros, as pad_packed_sequence gives
    past_end = torch.arange(T)[None, :] >= LENGTHS[:, None]  # (B, T)
    assert got[0][past_end].abs().max() == 0
    # and the final state is not simply the last column: the test would miss a wrong mask otherwise
    assert (got[1][0][-1] - got[0][:, -1, :HIDDEN]).abs().max() > 1e-3


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_padding_values_change_nothing(bidirectional):
    ours = from_torch(random_torch_lstm(2, bidirectional))
    x = torch.randn(B, T, INPUT)
    past_end = torch.arange(T)[None, :] >= LENGTHS[:, None]  # (B, T)
    noisy = x.clone()
    noisy[past_end] = 100 * torch.randn(int(past_end.sum()), INPUT)
    with torch.no_grad():
        assert_close(ours(noisy, LENGTHS), ours(x, LENGTHS))
        # each sequence alone, cut to its length, gives the same
        out, (h, c) = ours(x, LENGTHS)
        for b, L in enumerate(LENGTHS.tolist()):
            out_b, (h_b, c_b) = ours(x[b:b + 1, :L])
            assert_close((out_b, (h_b, c_b)), (out[b:b + 1, :L], (h[:, b:b + 1], c[:, b:b + 1])))


@pytest.mark.parametrize("num_layers, bidirectional", [(1, False), (2, True), (3, False)])
def test_an_initial_state_gives_what_nn_lstm_gives(num_layers, bidirectional):
    """(h_0, c_0), each (D*num_layers, B, H) as nn.LSTM takes them, on full-length and packed batches;
    a padded step leaves the initial state untouched, so a reversed read starts from it too."""
    theirs = random_torch_lstm(num_layers, bidirectional)
    ours = from_torch(theirs)
    D = 2 if bidirectional else 1
    x = torch.randn(B, T, INPUT)
    h_0, c_0 = torch.randn(D * num_layers, B, HIDDEN), torch.randn(D * num_layers, B, HIDDEN)
    with torch.no_grad():
        assert_close(ours(x, state=(h_0, c_0)), theirs(x, (h_0, c_0)))
        assert_close(ours(x, LENGTHS, (h_0, c_0)), torch_packed(theirs, x, LENGTHS, (h_0, c_0)))
        # and the state matters: zeros give something else
        assert (ours(x, state=(h_0, c_0))[0] - ours(x)[0]).abs().max() > 1e-3


def test_gradients_reach_every_parameter():
    model = LSTMClassifier(INPUT, 3, HIDDEN, num_layers=2, bidirectional=True)
    x = torch.randn(B, T, INPUT, requires_grad=True)
    model(x, LENGTHS).square().sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad[0, 0].abs().sum() > 0  # the first step of a sequence reaches the head across the recurrence
    past_end = torch.arange(T)[None, :] >= LENGTHS[:, None]
    assert x.grad[past_end].abs().max() == 0  # padding never feeds forward


def test_classifier_head_reads_last_layers_final_states():
    model = LSTMClassifier(INPUT, 3, HIDDEN, num_layers=2, bidirectional=True).eval()
    x = torch.randn(B, T, INPUT)
    with torch.no_grad():
        _, (h_n, _) = model.lstm(x, LENGTHS)
        expected = model.head(torch.cat([h_n[2], h_n[3]], dim=1))  # layer 1: forward, backward
        assert (model(x, LENGTHS) - expected).abs().max() < 1e-6


@pytest.mark.parametrize("num_layers, bidirectional", [(1, False), (2, True)])
def test_the_same_seed_gives_nn_lstms_initial_weights(num_layers, bidirectional):
    """nn.LSTM's initialisation, U(-1/sqrt(H), 1/sqrt(H)) for every weight and bias, drawn in its order."""
    from papers.lstm.model import LSTM

    torch.manual_seed(7)
    ours = LSTM(INPUT, HIDDEN, num_layers, bidirectional)
    torch.manual_seed(7)
    theirs = nn.LSTM(INPUT, HIDDEN, num_layers=num_layers, bidirectional=bidirectional, batch_first=True)
    expected = from_torch(theirs).state_dict()
    assert ours.state_dict().keys() == expected.keys()
    assert all(torch.equal(v, expected[k]) for k, v in ours.state_dict().items())


def test_from_torch_rejects_what_the_paper_has_not():
    with pytest.raises(ValueError, match="proj_size"):
        from_torch(nn.LSTM(3, 4, proj_size=2, batch_first=True))
    with pytest.raises(ValueError, match="bias=False"):
        from_torch(nn.LSTM(3, 4, bias=False, batch_first=True))
    with pytest.raises(ValueError, match="batch_first"):
        from_torch(nn.LSTM(3, 4))


def test_flavors_build_and_run():
    spec = PAPER
    assert next(iter(spec.flavors)) == "tiny"
    tiny = spec.build("tiny")
    assert tiny(torch.randn(2, 8, 8)).shape == (2, 10)  # digits read row by row
    assert sum(p.numel() for p in tiny.parameters()) == 71_946
    adding = spec.build("exp4-adding")
    assert adding(torch.randn(3, 12, 2), torch.tensor([12, 5, 9])).shape == (3, 1)
    # 4 cells with 4 gate rows each over 2 inputs + 4 recurrent, two bias vectors, and a 4 -> 1 head
    assert sum(p.numel() for p in adding.parameters()) == 4 * 4 * (2 + 4) + 2 * 16 + 5


# ---------------------------------------------------------------- the plain tanh RNN against torch.nn.RNN


def random_torch_rnn(num_layers: int, bidirectional: bool) -> nn.RNN:
    torch.manual_seed(0)
    rnn = nn.RNN(INPUT, HIDDEN, num_layers=num_layers, bidirectional=bidirectional, batch_first=True)
    with torch.no_grad():  # larger than the default init, so that tanh saturates in places and mistakes show
        for p in rnn.parameters():
            p.normal_(0, 0.5)
    return rnn.eval()


def assert_rnn_close(got, expected):
    (out, h), (out_ref, h_ref) = got, expected
    assert out.shape == out_ref.shape and h.shape == h_ref.shape
    assert (out - out_ref).abs().max() < 1e-5 and (h - h_ref).abs().max() < 1e-5


RNN_SHAPES = [(1, False), (1, True), (2, False), (2, True)]


@pytest.mark.parametrize("num_layers, bidirectional", RNN_SHAPES)
def test_rnn_full_length_equals_torch(num_layers, bidirectional):
    theirs = random_torch_rnn(num_layers, bidirectional)
    ours = from_torch_rnn(theirs)
    x = torch.randn(B, T, INPUT)
    with torch.no_grad():
        expected = theirs(x)
        assert_rnn_close(ours(x), expected)
        assert_rnn_close(ours(x, torch.full((B,), T)), expected)  # full lengths given explicitly
    assert expected[0].std() > 0.2  # outputs that differ between steps, units and sequences


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_rnn_variable_lengths_equal_packed_torch(bidirectional):
    theirs = random_torch_rnn(2, bidirectional)
    ours = from_torch_rnn(theirs)
    x = torch.randn(B, T, INPUT)
    with torch.no_grad():
        expected = torch_packed(theirs, x, LENGTHS)
        got = ours(x, LENGTHS)
    assert_rnn_close(got, expected)
    past_end = torch.arange(T)[None, :] >= LENGTHS[:, None]  # (B, T)
    assert got[0][past_end].abs().max() == 0  # zeros past the end, as pad_packed_sequence gives
    assert (got[1][-1] - got[0][:, -1, :HIDDEN]).abs().max() > 1e-3  # h_n is each sequence's own last step


@pytest.mark.parametrize("num_layers, bidirectional", RNN_SHAPES)
def test_rnn_initial_state_gives_what_nn_rnn_gives(num_layers, bidirectional):
    """h_0 (D*num_layers, B, H) as nn.RNN takes it, on full-length and packed batches."""
    theirs = random_torch_rnn(num_layers, bidirectional)
    ours = from_torch_rnn(theirs)
    D = 2 if bidirectional else 1
    x, h_0 = torch.randn(B, T, INPUT), torch.randn(D * num_layers, B, HIDDEN)
    with torch.no_grad():
        assert_rnn_close(ours(x, state=h_0), theirs(x, h_0))
        assert_rnn_close(ours(x, LENGTHS, h_0), torch_packed(theirs, x, LENGTHS, h_0))
        assert (ours(x, state=h_0)[0] - ours(x)[0]).abs().max() > 1e-3  # the state matters


@pytest.mark.parametrize("num_layers, bidirectional", [(1, False), (2, True)])
def test_the_same_seed_gives_nn_rnns_initial_weights(num_layers, bidirectional):
    torch.manual_seed(7)
    ours = RNN(INPUT, HIDDEN, num_layers, bidirectional)
    torch.manual_seed(7)
    theirs = nn.RNN(INPUT, HIDDEN, num_layers=num_layers, bidirectional=bidirectional, batch_first=True)
    expected = from_torch_rnn(theirs).state_dict()
    assert ours.state_dict().keys() == expected.keys()
    assert all(torch.equal(v, expected[k]) for k, v in ours.state_dict().items())


def test_from_torch_rnn_rejects_what_ours_has_not():
    with pytest.raises(ValueError, match="nonlinearity='tanh'"):
        from_torch_rnn(nn.RNN(3, 4, nonlinearity="relu", batch_first=True))
    with pytest.raises(ValueError, match="bias=True"):
        from_torch_rnn(nn.RNN(3, 4, bias=False, batch_first=True))
    with pytest.raises(ValueError, match="batch_first=True"):
        from_torch_rnn(nn.RNN(3, 4))


def test_rnn_gradients_reach_every_parameter():
    model = LSTMClassifier(INPUT, 3, HIDDEN, num_layers=2, bidirectional=True, cell="rnn")
    x = torch.randn(B, T, INPUT, requires_grad=True)
    model(x, LENGTHS).square().sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad[0, 0].abs().sum() > 0
    past_end = torch.arange(T)[None, :] >= LENGTHS[:, None]
    assert x.grad[past_end].abs().max() == 0


def test_classifier_cells():
    """cell="rnn" puts the plain RNN under the same head; the LSTM's weight names stay as they were."""
    lstm = LSTMClassifier(INPUT, 3, HIDDEN, num_layers=2, bidirectional=True)
    assert all(k.startswith(("lstm.layers.", "head.")) for k in lstm.state_dict())
    model = LSTMClassifier(INPUT, 3, HIDDEN, num_layers=2, bidirectional=True, cell="rnn").eval()
    assert all(k.startswith(("rnn.layers.", "head.")) for k in model.state_dict())
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in lstm.parameters()) / 3
    x = torch.randn(B, T, INPUT)
    with torch.no_grad():
        _, h_n = model.rnn(x, LENGTHS)
        expected = model.head(torch.cat([h_n[2], h_n[3]], dim=1))  # layer 1: forward, backward
        assert (model(x, LENGTHS) - expected).abs().max() < 1e-6
    adding = PAPER.build("exp4-adding", cell="rnn")
    assert adding(torch.randn(3, 12, 2), torch.tensor([12, 5, 9])).shape == (3, 1)
    assert sum(p.numel() for p in adding.parameters()) == 4 * (2 + 4) + 2 * 4 + 5
    with pytest.raises(ValueError, match="choose from: lstm, rnn"):
        LSTMClassifier(INPUT, 3, HIDDEN, cell="gru")


@pytest.mark.slow  # trains, exports or compiles: the whole suite's, not the everyday lane's
def test_rnn_exports_to_onnx_for_any_length(tmp_path):
    """The RNN's loop becomes an ONNX Scan, as the LSTM's does: onnxruntime agrees on other lengths too."""
    from common import export

    torch.manual_seed(0)
    model = export.randomize(LSTMClassifier(2, 1, 4, num_layers=2, bidirectional=True, cell="rnn"))
    facts = dict(num_classes=1, input_size=2)
    path = export.export(model, "sequence", facts, tmp_path / "model.onnx", {})
    report = export.check(path, model, "sequence", facts)  # raises where onnxruntime differs
    assert len({what.split(",")[1] for what, _ in report}) == 2  # two lengths T through one graph


def test_the_1997_cell_has_no_forget_gate():
    """forget_gate=False: c_t = c_{t-1} + i_t * g_t (the carousel of weight 1.0), three gate blocks, and the
    LSTM with a forget gate held open (f_t = 1) gives the same outputs from the same i, g, o weights."""
    torch.manual_seed(0)
    cec = LSTM(3, 5, forget_gate=False)
    gated = LSTM(3, 5)
    assert cec.layers[0].weight_hh_l0.shape == (15, 5) and gated.layers[0].weight_hh_l0.shape == (20, 5)
    with torch.no_grad():  # i, g, o from the 1997 cell; the forget gate's bias so large that f_t = 1
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            i, g, o = getattr(cec.layers[0], name).chunk(3)
            forget = torch.full_like(i, 1e4) if name.startswith("bias") else torch.zeros_like(i)
            getattr(gated.layers[0], name).copy_(torch.cat([i, forget, g, o]))
    x, lengths = torch.randn(4, 9, 3), torch.tensor([9, 4, 7, 1])
    out_cec, (h_cec, c_cec) = cec(x, lengths)
    out_gated, (h_gated, c_gated) = gated(x, lengths)
    assert torch.allclose(out_cec, out_gated, atol=1e-6) and torch.allclose(c_cec, c_gated, atol=1e-6)
    assert out_cec.std() > 0.05
    model = LSTMClassifier(2, 1, 32, forget_gate=False)
    assert sum(p.numel() for p in model.parameters()) == 3 * 32 * (2 + 32) + 2 * 3 * 32 + 33
    with pytest.raises(ValueError, match="no gates"):
        LSTMClassifier(2, 1, 8, cell="rnn", forget_gate=False)
