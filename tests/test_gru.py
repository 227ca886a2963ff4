"""GRU against torch.nn.GRU (the same weights give the same outputs and final states, on full-length
batches and on packed variable-length ones, from a given h_0 too), and the RNN Encoder-Decoder's
decoding protocol and padding."""

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from papers.gru import PAPER, from_torch
from papers.gru.model import GRU, EncoderDecoder, GRUClassifier

INPUT, HIDDEN, B, T = 5, 7, 4, 9
LENGTHS = torch.tensor([6, 9, 1, 4])  # unsorted, one full length, one of a single step


def random_torch_gru(num_layers: int, bidirectional: bool) -> nn.GRU:
    torch.manual_seed(0)
    gru = nn.GRU(INPUT, HIDDEN, num_layers=num_layers, bidirectional=bidirectional, batch_first=True)
    with torch.no_grad():  # larger than the default init, so the gates saturate differently and mistakes show
        for p in gru.parameters():
            p.normal_(0, 0.5)
    return gru.eval()


def torch_packed(gru: nn.GRU, x: torch.Tensor, lengths: torch.Tensor, h_0: torch.Tensor | None = None):
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, h_n = gru(packed, h_0)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return out, h_n


def assert_close(got, expected, tol=1e-5):
    (out, h), (out_ref, h_ref) = got, expected
    assert out.shape == out_ref.shape and h.shape == h_ref.shape
    assert (out - out_ref).abs().max() < tol and (h - h_ref).abs().max() < tol


@pytest.mark.parametrize("num_layers, bidirectional", [(1, False), (2, True)])
def test_full_length_equals_torch(num_layers, bidirectional):
    theirs = random_torch_gru(num_layers, bidirectional)
    ours = from_torch(theirs)
    x = torch.randn(B, T, INPUT)
    h_0 = torch.randn(num_layers * (2 if bidirectional else 1), B, HIDDEN)
    with torch.no_grad():
        assert_close(ours(x), theirs(x))
        assert_close(ours(x, torch.full((B,), T)), theirs(x))  # full lengths given explicitly
        assert_close(ours(x, h_0=h_0), theirs(x, h_0))


@pytest.mark.parametrize("num_layers, bidirectional", [(1, False), (1, True), (2, False), (2, True)])
def test_variable_lengths_equal_packed_torch(num_layers, bidirectional):
    theirs = random_torch_gru(num_layers, bidirectional)
    ours = from_torch(theirs)
    x = torch.randn(B, T, INPUT)
    h_0 = torch.randn(num_layers * (2 if bidirectional else 1), B, HIDDEN)
    with torch.no_grad():
        got = ours(x, LENGTHS)
        assert_close(got, torch_packed(theirs, x, LENGTHS))
        assert_close(ours(x, LENGTHS, h_0), torch_packed(theirs, x, LENGTHS, h_0))
    past_end = torch.arange(T)[None, :] >= LENGTHS[:, None]  # (B, T)
    assert got[0][past_end].abs().max() == 0  # zeros past the end, as pad_packed_sequence gives
    # the final state is not simply the last column: the test would miss a wrong mask otherwise
    assert (got[1][-1] - got[0][:, -1, :HIDDEN]).abs().max() > 1e-3


def test_padding_values_change_nothing():
    ours = from_torch(random_torch_gru(2, True))
    x = torch.randn(B, T, INPUT)
    past_end = torch.arange(T)[None, :] >= LENGTHS[:, None]
    noisy = x.clone()
    noisy[past_end] = 100 * torch.randn(int(past_end.sum()), INPUT)
    with torch.no_grad():
        assert_close(ours(noisy, LENGTHS), ours(x, LENGTHS))
        out, h = ours(x, LENGTHS)
        for b, L in enumerate(LENGTHS.tolist()):  # each sequence alone, cut to its length
            assert_close(ours(x[b:b + 1, :L]), (out[b:b + 1, :L], h[:, b:b + 1]))


def test_the_same_seed_gives_nn_grus_initial_weights():
    torch.manual_seed(7)
    ours = GRU(INPUT, HIDDEN, 2, True)
    torch.manual_seed(7)
    expected = from_torch(nn.GRU(INPUT, HIDDEN, num_layers=2, bidirectional=True, batch_first=True)).state_dict()
    assert ours.state_dict().keys() == expected.keys()
    assert all(torch.equal(v, expected[k]) for k, v in ours.state_dict().items())


def test_from_torch_rejects_what_ours_has_not():
    with pytest.raises(ValueError, match="bias=False"):
        from_torch(nn.GRU(3, 4, bias=False, batch_first=True))
    with pytest.raises(ValueError, match="batch_first"):
        from_torch(nn.GRU(3, 4))


# ------------------------------------------------------------------ the RNN Encoder-Decoder

SRC = torch.tensor([[5, 6, 7, 8, 9, 0, 0], [4, 4, 0, 0, 0, 0, 0], [9, 8, 7, 6, 5, 4, 3], [3, 0, 0, 0, 0, 0, 0]])
SRC_LENGTHS = torch.tensor([5, 2, 7, 1])  # S = 7 = max, first row not the longest
TGT = torch.tensor([[1, 5, 6, 7, 0], [1, 8, 0, 0, 0], [1, 4, 5, 6, 7], [1, 9, 9, 0, 0]])  # <s> then targets
TGT_LENGTHS = [4, 2, 5, 3]


def small_model() -> EncoderDecoder:
    torch.manual_seed(0)
    model = EncoderDecoder(src_vocab=12, tgt_vocab=11, embed_dim=6, hidden_size=8, maxout_units=5, output_rank=3)
    with torch.no_grad():  # larger than the paper's N(0, 0.01), so that differences show
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model.eval()


def test_decode_steps_give_forward_logits():
    model = small_model()
    with torch.no_grad():
        logits = model(SRC, SRC_LENGTHS, TGT)  # (B, T, V)
        memory, state, steps = model.encode(SRC, SRC_LENGTHS), None, []
        for t in range(TGT.shape[1]):
            step_logits, state = model.decode_step(memory, TGT[:, t], state)
            steps.append(step_logits)
    assert logits.shape == (4, 5, 11)
    assert (torch.stack(steps, dim=1) - logits).abs().max() < 1e-5


def test_each_pair_alone_gives_its_own_c_and_logits():
    model = small_model()
    with torch.no_grad():
        c = model.encode(SRC, SRC_LENGTHS)["c"]  # (B, H)
        logits = model(SRC, SRC_LENGTHS, TGT)
        noisy = SRC.masked_fill(torch.arange(7)[None] >= SRC_LENGTHS[:, None], 11)  # other ids in the padding
        assert (model.encode(noisy, SRC_LENGTHS)["c"] - c).abs().max() == 0
        for b, (S, T_b) in enumerate(zip(SRC_LENGTHS.tolist(), TGT_LENGTHS)):
            alone = model(SRC[b:b + 1, :S], SRC_LENGTHS[b:b + 1], TGT[b:b + 1, :T_b])
            assert (model.encode(SRC[b:b + 1, :S], SRC_LENGTHS[b:b + 1])["c"] - c[b]).abs().max() < 1e-5
            assert (alone[0] - logits[b, :T_b]).abs().max() < 1e-5
    assert (c[0] - c[1]).abs().max() > 1e-3  # sources differ, so do their summaries


def test_decoder_reads_c_at_every_step_and_the_maxout_pairs():
    model = small_model()
    with torch.no_grad():
        c = model.encode(SRC, SRC_LENGTHS)["c"]
        # the decoder's input weights hold [W'_*, C_*]: a change of c alone changes every step's gates
        assert model.decoder.layers[0].weight_ih_l0.shape == (3 * 8, 6 + 8)
        h, e, c1 = torch.randn(2, 8), torch.randn(2, 6), torch.randn(2, 8)
        s_prime = model.O_h(h) + model.O_y(e) + model.O_c(c1)  # (2, 2M)
        s = torch.maximum(s_prime[:, 0::2], s_prime[:, 1::2])  # s^<i> = max(s'^<2i-1>, s'^<2i>)
        assert (model.readout(h, e, c1) - model.G(s)).abs().max() < 1e-6
    assert c.shape == (4, 8) and c.abs().max() < 1  # c = tanh(V h_N)


def test_paper_initialisation():
    torch.manual_seed(0)
    model = EncoderDecoder(src_vocab=50, tgt_vocab=40, embed_dim=16, hidden_size=32, maxout_units=8)
    U = model.encoder.layers[0].weight_hh_l0.detach()  # (3H, H): U_r, U_z, U
    for block in U.chunk(3):
        assert (block @ block.T - torch.eye(32)).abs().max() < 1e-4  # orthogonal
    assert abs(model.e_x.weight.std().item() - 0.01) < 2e-3
    assert abs(model.decoder.layers[0].weight_ih_l0.std().item() - 0.01) < 2e-3


def test_flavors_build():
    from common.data import dates

    assert next(iter(PAPER.flavors)) == "tiny"
    model = PAPER.build_for_data("tiny", dates.facts()).eval()
    src, lengths, tgt = torch.randint(4, 60, (3, 10)), torch.tensor([10, 4, 7]), torch.randint(4, 60, (3, 6))
    with torch.no_grad():
        assert model(src, lengths, tgt).shape == (3, 6, dates.facts()["tgt_vocab"])
    with torch.device("meta"):
        paper = PAPER.build("paper")
    # embeddings 2 x 1.5M, encoder GRU 3*1000*(100+1000)+6000, V and V' 1,001,000 each, decoder GRU
    # 3*1000*(1100+1000)+6000, O_h, O_y, O_c, G_r (500 x 100) and G_l (100 x 15,000, bias)
    assert sum(p.numel() for p in paper.parameters()) == 18_280_000


def test_classifier_learns_digits_read_row_by_row():
    from common.data import get_dataset

    train, _ = get_dataset("digits-rows").read()
    torch.manual_seed(0)
    x, y = zip(*(train[i] for i in range(64)))
    x, y = torch.stack(x).float(), torch.stack([torch.as_tensor(v) for v in y])
    assert x.shape == (64, 8, 8)
    model = GRUClassifier(8, 10, 32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    lengths = torch.tensor([8, 3, 5])  # and padded, the head reads each sequence's own last state
    with torch.no_grad():
        padded = model(x[:3], lengths)
        for b, L in enumerate(lengths.tolist()):
            assert (model(x[b:b + 1, :L]) - padded[b]).abs().max() < 1e-5


def test_the_classifier_flavor_trains_on_digits_rows_beside_the_lstm(tmp_path):
    """`--flavor classifier` is the GRU as a sequence classifier: its own data set, task and defaults."""
    from common.config import resolve, validate
    from train import main

    cfg = resolve({"paper": "gru", "flavor": "classifier"})
    assert (cfg.dataset, cfg.lr, cfg.epochs) == ("digits-rows", 1e-2, 30)
    validate(cfg)
    assert isinstance(PAPER.build("classifier"), GRUClassifier)
    assert main(["--paper", "gru", "--flavor", "classifier", "--max-steps", "3", "--wandb", "disabled",
                 "--out", str(tmp_path / "run"), "--results-dir", str(tmp_path / "results")]) == 0
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert (result["task"], result["dataset"], result["steps"]) == ("classification", "digits-rows", 3)


# ------------------------------------------------------------------ the ungated tanh unit (Section 2.3)

def reference_tanh_loop(layer, x, lengths, h_0, suffix="_l0", reverse=False):
    """h = tanh(W x + U h + b) one sequence and one step at a time, each sequence read over its own
    length only (backwards from its own last step when reverse); zeros past its end."""
    W, U = getattr(layer, f"weight_ih{suffix}"), getattr(layer, f"weight_hh{suffix}")
    b = getattr(layer, f"bias_ih{suffix}") + getattr(layer, f"bias_hh{suffix}")
    out, h_n = torch.zeros(x.shape[0], x.shape[1], U.shape[0]), []
    for i, L in enumerate(lengths.tolist()):
        h = h_0[i]
        for t in (reversed(range(L)) if reverse else range(L)):
            h = torch.tanh(W @ x[i, t] + U @ h + b)
            out[i, t] = h
        h_n.append(h)
    return out, torch.stack(h_n)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_tanh_cell_equals_a_reference_loop(bidirectional):
    torch.manual_seed(0)
    gru = GRU(INPUT, HIDDEN, bidirectional=bidirectional, cell="tanh")
    with torch.no_grad():  # larger than the default init, so that mistakes show
        for p in gru.parameters():
            p.normal_(0, 0.5)
    layer = gru.layers[0]
    assert layer.weight_ih_l0.shape == (HIDDEN, INPUT) and layer.weight_hh_l0.shape == (HIDDEN, HIDDEN)  # no gates
    D = 2 if bidirectional else 1
    x, h_0 = torch.randn(B, T, INPUT), torch.randn(D, B, HIDDEN)
    noisy = x.clone()  # other values past each sequence's end
    noisy[torch.arange(T)[None, :] >= LENGTHS[:, None]] = 100.0
    with torch.no_grad():
        for lengths in (torch.full((B,), T), LENGTHS):
            expected = [reference_tanh_loop(layer, x, lengths, h_0[d], s, reverse=d == 1)
                        for d, s in enumerate(layer.suffixes)]
            expected = torch.cat([o for o, _ in expected], dim=-1), torch.stack([h for _, h in expected])
            assert_close(gru(x, lengths, h_0), expected)
        assert_close(gru(noisy, LENGTHS, h_0), gru(x, LENGTHS, h_0))  # padded steps keep the state
        assert_close(gru(x, h_0=h_0), gru(x, torch.full((B,), T), h_0))  # no lengths: all full length
        out, h_n = gru(x, LENGTHS)  # zeros as h_0
    assert (h_n[0] - out[:, -1, :HIDDEN]).abs().max() > 1e-3  # the state is not simply the last column


def test_tanh_encoder_decoder_has_a_third_of_the_recurrent_weights():
    """The tanh unit keeps only the candidate's block of each recurrent layer: H rows of weight_ih,
    weight_hh, bias_ih and bias_hh where the GRU stacks three (r, z, n). With input I, a layer loses
    2H(I + H + 2): for the encoder I = E, for the decoder I = E + H (it reads [e(y_{t-1}); c])."""
    E, H, M, R, V_src, V_tgt = 6, 8, 5, 3, 12, 11
    kwargs = dict(src_vocab=V_src, tgt_vocab=V_tgt, embed_dim=E, hidden_size=H, maxout_units=M, output_rank=R)
    count = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    gru, tanh = EncoderDecoder(**kwargs), EncoderDecoder(**kwargs, cell="tanh")
    rest = (V_src + V_tgt) * E + 2 * (H * H + H) + (H + 1) * 2 * M + (E + H) * 2 * M + M * R + R * V_tgt + V_tgt
    assert count(tanh) == rest + (H * E + H * H + 2 * H) + (H * (E + H) + H * H + 2 * H)
    assert count(gru) == rest + 3 * (H * E + H * H + 2 * H) + 3 * (H * (E + H) + H * H + 2 * H)
    assert count(gru) - count(tanh) == 2 * H * (E + H + 2) + 2 * H * (E + H + H + 2)
    # tiny on the dates (E = 64, H = 128): 285,380 against 153,284, 132,096 fewer = 2*128*(66 + 130 + 128)
    from common.data import dates

    tiny = {cell: count(PAPER.build_for_data("tiny", dates.facts(), {"cell": cell})) for cell in ("gru", "tanh")}
    assert tiny == {"gru": 285_380, "tanh": 153_284}


def test_tanh_encoder_decoder_decodes_as_it_trains_and_ignores_padding():
    torch.manual_seed(0)
    model = EncoderDecoder(src_vocab=12, tgt_vocab=11, embed_dim=6, hidden_size=8, maxout_units=5, output_rank=3,
                           cell="tanh")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
        model.eval()
        logits = model(SRC, SRC_LENGTHS, TGT)
        memory, state, steps = model.encode(SRC, SRC_LENGTHS), None, []
        for t in range(TGT.shape[1]):
            step_logits, state = model.decode_step(memory, TGT[:, t], state)
            steps.append(step_logits)
        assert (torch.stack(steps, dim=1) - logits).abs().max() < 1e-5
        noisy = SRC.masked_fill(torch.arange(7)[None] >= SRC_LENGTHS[:, None], 11)
        assert (model.encode(noisy, SRC_LENGTHS)["c"] - memory["c"]).abs().max() == 0
        for b, (S, T_b) in enumerate(zip(SRC_LENGTHS.tolist(), TGT_LENGTHS)):
            alone = model(SRC[b:b + 1, :S], SRC_LENGTHS[b:b + 1], TGT[b:b + 1, :T_b])
            assert (alone[0] - logits[b, :T_b]).abs().max() < 1e-5
    assert type(model.encoder.layers[0]).__name__ == type(model.decoder.layers[0]).__name__ == "RNNLayer"
    assert model.decoder.layers[0].weight_ih_l0.shape == (8, 6 + 8)  # [W', C]: c at every step, no gates


def test_tanh_unit_starts_as_the_grus_candidate():
    """The paper's initialisation, applied to the tanh unit as to the GRU's candidate: U orthogonal,
    W (and C) from N(0, 0.01^2)."""
    torch.manual_seed(0)
    model = EncoderDecoder(src_vocab=50, tgt_vocab=40, embed_dim=16, hidden_size=32, maxout_units=8, cell="tanh")
    for gru in (model.encoder, model.decoder):
        U = gru.layers[0].weight_hh_l0.detach()
        assert U.shape == (32, 32) and (U @ U.T - torch.eye(32)).abs().max() < 1e-4
        assert abs(gru.layers[0].weight_ih_l0.std().item() - 0.01) < 2e-3


def test_an_unknown_cell_names_the_choices():
    for build in (lambda: EncoderDecoder(12, 11, cell="lstm"), lambda: GRU(3, 4, cell="lstm"),
                  lambda: GRUClassifier(3, 2, 4, cell="lstm"), lambda: PAPER.build("tiny", cell="LSTM")):
        with pytest.raises(ValueError, match="unknown cell '(lstm|LSTM)'; choose from: gru, tanh"):
            build()


def test_gru_is_still_the_default_cell():
    kwargs = dict(src_vocab=12, tgt_vocab=11, embed_dim=6, hidden_size=8, maxout_units=5, output_rank=3)
    outputs = {}
    for name, extra in (("default", {}), ("gru", {"cell": "gru"}), ("tanh", {"cell": "tanh"})):
        torch.manual_seed(0)
        model = EncoderDecoder(**kwargs, **extra).eval()
        with torch.no_grad():
            outputs[name] = model.state_dict(), model(SRC, SRC_LENGTHS, TGT)
    (default_sd, default_out), (gru_sd, gru_out), (_, tanh_out) = outputs.values()
    assert default_sd.keys() == gru_sd.keys() and all(torch.equal(v, gru_sd[k]) for k, v in default_sd.items())
    assert torch.equal(default_out, gru_out)
    assert default_sd["encoder.layers.0.weight_hh_l0"].shape == (3 * 8, 8)  # r, z, n stacked, as before
    assert (default_out - tanh_out).abs().max() > 1e-3  # the cell is not ignored
    states = []
    for extra in ({}, {"cell": "gru"}):  # the classifier too
        torch.manual_seed(0)
        states.append(GRUClassifier(INPUT, 3, HIDDEN, 2, True, **extra).state_dict())
    assert states[0].keys() == states[1].keys() and all(torch.equal(v, states[1][k]) for k, v in states[0].items())


def test_lstm_rnn_and_gru_layers_share_one_base_and_keep_only_their_equations():
    """The weights per direction, their initialisation, the directions, the loop over time and the stack
    are common.layers' once; each paper's layer gives its step and where its biases go."""
    from common.layers import RecurrentLayer, RecurrentStack
    from papers.gru.model import GRULayer
    from papers.lstm.model import LSTM, RNN, LSTMLayer, RNNLayer

    for Layer in (LSTMLayer, RNNLayer, GRULayer):
        assert Layer.__bases__ == (RecurrentLayer,)
        assert {"step", "recurrence"} <= set(vars(Layer))
        assert not {"cells", "forward", "reset_parameters"} & set(vars(Layer))
    for Stack in (LSTM, RNN, GRU):
        assert Stack.__bases__ == (RecurrentStack,)
    shapes = {Layer.__name__: {k: tuple(v.shape) for k, v in Layer(3, 2, 1, True).state_dict().items()}
              for Layer in (LSTMLayer, RNNLayer, GRULayer)}
    for name, gates in (("LSTMLayer", 4), ("RNNLayer", 1), ("GRULayer", 3)):  # nn.LSTM's, nn.RNN's, nn.GRU's names
        assert shapes[name] == {f"{w}_l1{s}": shape for s in ("", "_reverse") for w, shape in (
            ("weight_ih", (2 * gates, 3)), ("weight_hh", (2 * gates, 2)), ("bias_ih", (2 * gates,)),
            ("bias_hh", (2 * gates,)))}
