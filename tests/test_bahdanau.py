"""RNNsearch (Bahdanau et al. 2014): the soft alignment is a distribution over each source's own words,
a padded batch gives every pair what it gets alone, decoding step by step gives the teacher-forced
logits, and the initialisation is Appendix B.1's."""

import pytest
import torch

from papers.bahdanau import PAPER
from papers.bahdanau.model import RNNsearch

SRC_VOCAB, TGT_VOCAB, PAD = 13, 11, 0
SIZES = dict(embed_dim=6, hidden_size=8, align_dim=7, maxout_dim=5)
SRC_LENGTHS = torch.tensor([5, 9, 1, 7])  # unsorted, one of a single word; S = 11 exceeds the longest
TGT_LENGTHS = torch.tensor([4, 6, 2, 5])
S, T = 11, 6


def assert_close(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def random_model(seed: int = 0) -> RNNsearch:
    """A small model with weights far larger than the paper's initial ones: at N(0, 0.01^2) every logit is
    its bias to within 1e-5, so the comparisons below would pass even for a wrong mask."""
    torch.manual_seed(seed)
    model = RNNsearch(SRC_VOCAB, TGT_VOCAB, PAD, **SIZES)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model.eval()


def padded_batch(seed: int = 1):
    """Sources padded with pad ids at the end, and teacher inputs (<s> = 1, then words, then padding)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, SRC_VOCAB, (len(SRC_LENGTHS), S), generator=g)
    tgt = torch.randint(3, TGT_VOCAB, (len(TGT_LENGTHS), T), generator=g)
    tgt[:, 0] = 1
    src[torch.arange(S) >= SRC_LENGTHS[:, None]] = PAD
    tgt[torch.arange(T) >= TGT_LENGTHS[:, None]] = PAD
    return src, tgt


@torch.no_grad()
def test_attention_sums_to_one_over_the_source_and_is_zero_on_padding():
    model = random_model()
    src, tgt = padded_batch()
    logits, alpha = model(src, SRC_LENGTHS, tgt, return_attention=True)
    assert logits.shape == (4, T, TGT_VOCAB) and alpha.shape == (4, T, S)
    padding = (torch.arange(S) >= SRC_LENGTHS[:, None])[:, None, :].expand_as(alpha)  # (B, T, S)
    assert alpha[padding].abs().max() == 0  # exactly zero, not merely small
    assert_close(alpha.sum(-1), torch.ones(4, T))
    assert (alpha[~padding] > 0).all()
    assert (alpha[2, :, 0] == 1).all()  # a one-word source: all the weight on it
    assert alpha[1].std(-1).min() > 1e-3  # the weights are not uniform: the test would miss a wrong mask otherwise


@torch.no_grad()
def test_padded_batch_gives_each_pair_its_own_annotations_and_logits():
    model = random_model()
    src, tgt = padded_batch()
    memory = model.encode(src, SRC_LENGTHS)
    logits = model(src, SRC_LENGTHS, tgt)
    noisy = src.clone()  # other ids in the padding change nothing
    noisy[torch.arange(S) >= SRC_LENGTHS[:, None]] = 5
    assert_close(model(noisy, SRC_LENGTHS, tgt), logits)
    for b, (L, M) in enumerate(zip(SRC_LENGTHS.tolist(), TGT_LENGTHS.tolist())):
        alone = model.encode(src[b:b + 1, :L], SRC_LENGTHS[b:b + 1])
        assert_close(alone["annotations"], memory["annotations"][b:b + 1, :L])
        assert_close(alone["s0"], memory["s0"][b:b + 1])
        assert_close(model(src[b:b + 1, :L], SRC_LENGTHS[b:b + 1], tgt[b:b + 1, :M]), logits[b:b + 1, :M])
    assert memory["annotations"][torch.arange(S) >= SRC_LENGTHS[:, None]].abs().max() == 0
    # s_0 reads the backward state at the first word, which has read the whole source: changing the last
    # real word changes it, and the first word's backward half, but not its forward half
    changed = src.clone()
    changed[1, SRC_LENGTHS[1] - 1] = 4 if src[1, SRC_LENGTHS[1] - 1] != 4 else 5
    other = model.encode(changed, SRC_LENGTHS)
    n = SIZES["hidden_size"]
    assert_close(other["annotations"][1, 0, :n], memory["annotations"][1, 0, :n])
    assert (other["annotations"][1, 0, n:] - memory["annotations"][1, 0, n:]).abs().max() > 1e-4
    assert (other["s0"][1] - memory["s0"][1]).abs().max() > 1e-4


@torch.no_grad()
def test_decode_step_by_step_equals_teacher_forcing():
    model = random_model()
    src, tgt = padded_batch()
    logits, alpha = model(src, SRC_LENGTHS, tgt, return_attention=True)
    memory, state, steps = model.encode(src, SRC_LENGTHS), None, []
    for i in range(T):
        step_logits, state = model.decode_step(memory, tgt[:, i], state)
        assert_close(state["alpha"], alpha[:, i])
        steps.append(step_logits)
    assert_close(torch.stack(steps, dim=1), logits)


@torch.no_grad()
def test_initialisation_is_appendix_b1():
    torch.manual_seed(0)
    model = RNNsearch(50, 40, PAD, embed_dim=32, hidden_size=64, align_dim=48, maxout_dim=16)
    n, eye = 64, torch.eye(64)
    recurrent = {"decoder.U_zr.weight", "decoder.U.weight", "encoder.gru.layers.0.weight_hh_l0",
                 "encoder.gru.layers.0.weight_hh_l0_reverse"}
    alignment = {"decoder.attention.W_a.weight", "decoder.attention.U_a.weight"}
    for name, p in model.named_parameters():
        if name in recurrent:  # U, U_z, U_r (and the encoder's, both directions): each block orthogonal
            for block in p.split(n):
                torch.testing.assert_close(block @ block.T, eye, rtol=0, atol=1e-5)
        elif name in alignment:  # W_a, U_a ~ N(0, 0.001^2)
            assert abs(p.std().item() - 0.001) < 1e-4 and abs(p.mean().item()) < 1e-4, name
        elif name == "decoder.attention.v_a" or "bias" in name:  # v_a and every bias zero
            assert p.abs().max() == 0, name
        else:  # every other weight matrix, embeddings included, ~ N(0, 0.01^2)
            assert abs(p.std().item() - 0.01) < 1e-3 and abs(p.mean().item()) < 1e-3, name
    assert {"decoder.W_s.weight", "decoder.C_o.weight", "encoder.E.weight"} <= dict(model.named_parameters()).keys()
    # v_a = 0: the alignment starts uniform over each source's own words
    src, tgt = padded_batch()
    src = src.clamp(max=49)
    _, alpha = model(src, SRC_LENGTHS, tgt.clamp(max=39), return_attention=True)
    assert_close(alpha.sum(-1), torch.ones(4, T))
    assert_close(alpha[1, :, :9], torch.full((T, 9), 1 / 9))


def test_the_papers_flavor_has_the_papers_sizes():
    with torch.device("meta"):
        model = PAPER.build("RNNsearch-50")
    K, m, n, n_a, l = 30_000, 620, 1000, 1000, 500
    encoder = K * m + 2 * (3 * n * (m + n) + 6 * n)  # E, and per direction nn.GRU's W, U and two biases
    attention = n_a * n + n_a * 2 * n + n_a + n_a  # W_a, U_a and its bias, v_a
    decoder = (K * m + n * n + n + 3 * n * (m + 1) + 3 * n * n + 3 * n * 2 * n  # E, W_s, W, U_z U_r U, C
               + 2 * l * (n + 1 + m + 2 * n) + K * (l + 1))  # U_o, V_o, C_o, W_o
    assert sum(p.numel() for p in model.parameters()) == encoder + attention + decoder == 80_449_000
