"""Sequence to sequence (Sutskever et al. 2014): the reversed source, the decoder started from the encoder's
final states, step-by-step decoding against teacher forcing, padding, the initialisation and the sizes."""

import torch

from common import decode
from common.config import TrainConfig
from common.optim import schedule
from papers.seq2seq import PAPER
from papers.seq2seq.model import Seq2Seq, reverse_within_lengths

V, PAD = 11, 0
SRC = torch.tensor([[5, 6, 7, 8, 0, 0, 0],  # unsorted lengths, S beyond the longest, one of a single word
                    [4, 9, 3, 10, 6, 7, 0],
                    [8, 0, 0, 0, 0, 0, 0],
                    [3, 4, 5, 0, 0, 0, 0]])
SRC_LENGTHS = torch.tensor([4, 6, 1, 3])
TGT = torch.tensor([[1, 5, 5, 9, 0],  # <s>, then the target but its last word, padded at the end
                    [1, 4, 0, 0, 0],
                    [1, 7, 8, 6, 3],
                    [1, 0, 0, 0, 0]])
TGT_LENGTHS = [4, 2, 5, 1]


def small_model(**kwargs) -> Seq2Seq:
    torch.manual_seed(0)
    kwargs = dict(src_vocab=V, tgt_vocab=V, pad_id=PAD, embed_dim=6, hidden_size=8, num_layers=3) | kwargs
    return Seq2Seq(**kwargs).eval()


def test_each_source_is_reversed_within_its_own_length():
    assert reverse_within_lengths(SRC, SRC_LENGTHS).tolist() == [[8, 7, 6, 5, 0, 0, 0],
                                                                 [7, 6, 10, 3, 9, 4, 0],
                                                                 [8, 0, 0, 0, 0, 0, 0],
                                                                 [5, 4, 3, 0, 0, 0, 0]]
    # the model reads it so: reversing inside equals a forward reader given the reversed sources
    reversed_reader, forward_reader = small_model(), small_model(reverse_source=False)
    with torch.no_grad():
        ours = reversed_reader.encode(SRC, SRC_LENGTHS)
        theirs = forward_reader.encode(reverse_within_lengths(SRC, SRC_LENGTHS), SRC_LENGTHS)
        assert all(torch.equal(ours[k], theirs[k]) for k in ("h", "c"))
        # and the order matters
        assert (forward_reader.encode(SRC, SRC_LENGTHS)["h"] - ours["h"]).abs().max() > 1e-3


def test_the_decoder_starts_from_every_encoder_layers_final_state():
    model = small_model()
    with torch.no_grad():
        v = model.encode(SRC, SRC_LENGTHS)
        assert v["h"].shape == v["c"].shape == (4, 3, 8)  # (B, layers, H), batch first for beam search
        _, (h_n, c_n) = model.encoder(model.src_embed(reverse_within_lengths(SRC, SRC_LENGTHS)), SRC_LENGTHS)
        assert torch.equal(v["h"], h_n.transpose(0, 1)) and torch.equal(v["c"], c_n.transpose(0, 1))
        s, _ = model.decoder(model.tgt_embed(TGT), state=(h_n, c_n))
        assert torch.equal(model(SRC, SRC_LENGTHS, TGT), model.W_out(s))
        # a different source gives different logits for the same target input: the state carries the source
        other = model(SRC.flip(0), SRC_LENGTHS.flip(0), TGT)
        assert (other - model(SRC, SRC_LENGTHS, TGT)).abs().max() > 1e-3


def test_decode_step_one_token_at_a_time_gives_forwards_logits():
    model = small_model()
    with torch.no_grad():
        expected = model(SRC, SRC_LENGTHS, TGT)  # (B, T, V)
        memory, state, steps = model.encode(SRC, SRC_LENGTHS), None, []
        for t in range(TGT.shape[1]):
            logits, state = model.decode_step(memory, TGT[:, t], state)
            assert state["h"].shape == state["c"].shape == (4, 3, 8)
            steps.append(logits)
    assert (torch.stack(steps, 1) - expected).abs().max() < 1e-5


def test_a_padded_batch_gives_each_pair_what_it_gets_alone():
    model = small_model()
    noisy = SRC.clone()
    past_end = torch.arange(SRC.shape[1])[None, :] >= SRC_LENGTHS[:, None]
    noisy[past_end] = torch.randint(3, V, (int(past_end.sum()),))  # whatever the padding holds
    with torch.no_grad():
        v, logits = model.encode(noisy, SRC_LENGTHS), model(noisy, SRC_LENGTHS, TGT)
        for b, (S, T) in enumerate(zip(SRC_LENGTHS.tolist(), TGT_LENGTHS)):
            src_b, lengths_b, tgt_b = SRC[b:b + 1, :S], torch.tensor([S]), TGT[b:b + 1, :T]
            alone = model.encode(src_b, lengths_b)
            assert all((alone[k] - v[k][b:b + 1]).abs().max() < 1e-5 for k in ("h", "c"))
            assert (model(src_b, lengths_b, tgt_b) - logits[b:b + 1, :T]).abs().max() < 1e-5


def test_beam_search_and_greedy_run_on_it_and_a_beam_of_one_is_greedy():
    model = small_model()
    greedy = decode.greedy(model, SRC, SRC_LENGTHS, max_len=6, bos_id=1, eos_id=2)
    beam_1 = decode.beam_search(model, SRC, SRC_LENGTHS, max_len=6, bos_id=1, eos_id=2, beam=1)
    L = max(greedy.shape[1], beam_1.shape[1])
    pad = lambda t: torch.cat([t, t.new_zeros(t.shape[0], L - t.shape[1])], 1)
    assert torch.equal(pad(beam_1), pad(greedy))
    assert decode.beam_search(model, SRC, SRC_LENGTHS, max_len=6, bos_id=1, eos_id=2, beam=3).shape[0] == 4


def test_every_parameter_starts_uniform_in_plus_minus_0_08():
    model = PAPER.build("tiny-paper-init")  # Section 3.4: embeddings, LSTMs and softmax alike, as the paper flavor
    tiny = PAPER.build("tiny")  # the same, but for its embeddings (N(0, 1): see the model's embed_std)
    for name, p in tiny.named_parameters():
        if "embed" in name:
            assert abs(p.std().item() - 1) < 0.05, name
        else:
            assert p.abs().max() <= 0.08, name
    for name, p in model.named_parameters():
        assert p.abs().max() <= 0.08 and p.abs().max() > 0.07, name
        if p.numel() > 1000:  # spread over the interval: a uniform's standard deviation is 0.08 / sqrt(3)
            assert abs(p.std().item() - 0.08 / 3 ** 0.5) < 0.003, name


def test_the_paper_flavor_has_384m_parameters():
    """Section 3.4: "The resulting LSTM has 384M parameters of which 64M are pure recurrent connections
    (32M for the "encoder" LSTM and 32M for the "decoder" LSTM)"."""
    with torch.device("meta"):
        model = PAPER.build("paper")
    count = lambda module: sum(p.numel() for p in module.parameters())
    assert count(model) == 384_144_000 and abs(count(model) - 384e6) < 0.01 * 384e6
    assert count(model.encoder) == count(model.decoder) == 32_032_000  # 4 * (4*1000*2000 weights + 8000 biases)
    assert len(model.get_submodule(PAPER.shard_blocks)) == 4


def test_the_papers_recipe_halves_the_rate_every_half_epoch_after_the_fifth():
    cfg = TrainConfig.from_dict({**PAPER.defaults, **PAPER.recipe, "paper": "seq2seq"})
    assert (cfg.optimizer, cfg.lr, cfg.momentum, cfg.batch_size, cfg.clip_grad) == ("sgd", 0.7, 0.0, 128, 5.0)
    steps_per_epoch = 100
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.lr)
    lr_at = schedule(opt, cfg.epochs * steps_per_epoch, cfg.warmup_steps, cfg.schedule, cfg.milestones, cfg.gamma,
                     steps_per_epoch).lr_lambdas[0]
    half_epochs = [lr_at(int(e * steps_per_epoch)) for e in (0, 4.9, 5, 5.5, 6, 6.5, 7, 7.4)]
    assert half_epochs == [1, 1, 1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 32]
