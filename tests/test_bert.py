"""BERT against Hugging Face's models (the same weights give the same MLM and NSP logits, hidden states and
pooled output, with padding and both segments; the same parameter counts), the tied MLM decoder, padding,
the causal switch, the "No NSP" switch and the classifier's names for --init."""

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForPreTraining, BertForSequenceClassification, BertModel

from papers.bert.model import BERT, FLAVORS, BERTClassifier, BERTEncoder, from_hf

LENGTHS = torch.tensor([12, 7, 3])  # real tokens per sample; T = 12
# configurations other than the flavors': widths, heads, layers, vocabularies, positions, segments and epsilons
CONFIGS = [dict(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=192,
                max_position_embeddings=40, type_vocab_size=3, layer_norm_eps=1e-6),
           dict(vocab_size=61, hidden_size=40, num_hidden_layers=3, num_attention_heads=5, intermediate_size=160,
                max_position_embeddings=24, type_vocab_size=2, layer_norm_eps=1e-12)]


def hf(cls, attn_implementation: str = "eager", **config):
    """A random Hugging Face model, every weight moved off its initial value (LayerNorms and biases
    included) so that a mapping mistake shows."""
    torch.manual_seed(0)
    model = cls(BertConfig(**config, attn_implementation=attn_implementation))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def batch(V: int, T: int = 12, seed: int = 0):
    """Token ids (B, T), segments (sentence A on the first half, B on the rest) and a right-padding mask."""
    idx = torch.randint(0, V, (len(LENGTHS), T), generator=torch.Generator().manual_seed(seed))
    segments = (torch.arange(T) >= T // 2).long().expand_as(idx).clone()
    mask = (torch.arange(T) < LENGTHS[:, None]).long()
    return idx, segments, mask


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied matrix once


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("is_decoder", [False, True])
def test_from_hf_gives_bertforpretrainings_outputs(config, is_decoder):
    theirs = hf(BertForPreTraining, **config, is_decoder=is_decoder)
    ours = from_hf(theirs).eval()
    assert isinstance(ours, BERT) and ours.causal == is_decoder
    assert count(ours) == count(theirs)
    idx, segments, mask = batch(config["vocab_size"])
    real = mask.bool()
    with torch.no_grad():
        out = theirs(idx, attention_mask=mask, token_type_ids=segments, output_hidden_states=True)
        pooled = theirs.bert(idx, attention_mask=mask, token_type_ids=segments).pooler_output
        mlm, nsp = ours(idx, segments, mask)
        h = ours.forward_features(idx, segments, mask)
    assert torch.isfinite(mlm).all() and torch.isfinite(h).all()  # padded positions too
    assert (mlm - out.prediction_logits)[real].abs().max() < 1e-5  # every real position
    assert (h - out.hidden_states[-1])[real].abs().max() < 1e-5
    assert (nsp - out.seq_relationship_logits).abs().max() < 1e-5
    assert (ours.pool(h) - pooled).abs().max() < 1e-5
    assert pooled.abs().max() > 0.1 and nsp.abs().max() > 0.1  # not trivially equal


@pytest.mark.parametrize("config", CONFIGS)
def test_from_hf_gives_bertmodels_outputs(config):
    theirs = hf(BertModel, "sdpa", **config)
    ours = from_hf(theirs).eval()
    assert type(ours) is BERTEncoder and count(ours) == count(theirs)
    idx, segments, mask = batch(config["vocab_size"], seed=1)
    with torch.no_grad():
        out = theirs(idx, attention_mask=mask, token_type_ids=segments)
        h, C = ours(idx, segments, mask)
    assert (h - out.last_hidden_state)[mask.bool()].abs().max() < 1e-5
    assert (C - out.pooler_output).abs().max() < 1e-5
    headless = from_hf(BertModel(BertConfig(**config), add_pooling_layer=False))
    assert headless.pooler is None and headless(idx)[1] is None


def test_from_hf_gives_bertforsequenceclassifications_logits():
    theirs = hf(BertForSequenceClassification, **CONFIGS[1], num_labels=3)
    ours = from_hf(theirs).eval()
    assert isinstance(ours, BERTClassifier) and count(ours) == count(theirs)
    idx, segments, mask = batch(CONFIGS[1]["vocab_size"], seed=2)
    with torch.no_grad():
        expected = theirs(idx, attention_mask=mask, token_type_ids=segments).logits
        assert (ours(idx, segments, mask) - expected).abs().max() < 1e-5


def test_from_hf_refuses_what_ours_has_not():
    config = dict(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                  max_position_embeddings=8)
    for change, words in ((dict(hidden_act="relu"), "hidden_act 'relu'"),
                          (dict(intermediate_size=48), "intermediate_size 48 is not 4 x hidden_size 16"),
                          (dict(position_embedding_type="relative_key"), "position_embedding_type")):
        with pytest.raises(ValueError, match=words):
            from_hf(BertForPreTraining(BertConfig(**config | change)))
    with pytest.raises(ValueError, match="hidden_act 'silu'.*intermediate_size"):  # every problem in one error
        from_hf(BertModel(BertConfig(**config | dict(hidden_act="silu", intermediate_size=32))))
    from transformers import BertForMaskedLM
    with pytest.raises(ValueError, match="BertForMaskedLM is none of"):
        from_hf(BertForMaskedLM(BertConfig(**config)))


def small(**overrides) -> BERT:
    torch.manual_seed(0)
    return BERT(**dict(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=32) | overrides).eval()


def test_the_mlm_decoder_is_the_token_embedding():
    model = small().train()
    E = model.embeddings.token.weight  # (V, H)
    square = [n for n, p in model.named_parameters() if p.shape == E.shape]
    assert square == ["embeddings.token.weight"]  # no decoder matrix of its own
    assert [k for k, t in model.state_dict().items() if t.shape == E.shape] == ["embeddings.token.weight"]
    idx = torch.randint(0, 25, (2, 9), generator=torch.Generator().manual_seed(0))  # tokens 25..49 never read
    targets = torch.randint(25, 50, (2, 9), generator=torch.Generator().manual_seed(1))  # only predicted
    F.cross_entropy(model(idx)[0].flatten(0, 1), targets.flatten()).backward()
    unread = E.grad[25:]  # reaches these rows through the decoder only
    assert unread.abs().sum(dim=1).min() > 0
    before = E.detach().clone()
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    assert not torch.equal(E[25:], before[25:])  # the step moved the decoder's rows in the embedding
    model.eval()
    with torch.no_grad():
        h = model.forward_features(idx)
        head = model.mlm
        expected = head.norm(F.gelu(head.dense(h))) @ E.T + head.bias  # the stepped embedding, transposed
        assert (model(idx)[0] - expected).abs().max() < 1e-5
        E.mul_(2)  # and the decoder reads the embedding's storage itself
        assert (model.mlm(h, model.embeddings.token.weight) - expected).abs().max() > 1e-3


@pytest.mark.parametrize("name, layers, hf_count, paper, tolerance", [
    ("BERT-base", dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
     110_106_428, 110e6, 0.005),  # 110.1M: +0.1%
    ("BERT-large", dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096),
     336_226_108, 340e6, 0.015)])  # 336.2M: -1.1%
def test_parameter_counts_are_hugging_faces_and_the_papers(name, layers, hf_count, paper, tolerance):
    """With the MLM and NSP heads and the pooler, the tied decoder counted once, as BertForPreTraining."""
    with torch.device("meta"):
        theirs = BertForPreTraining(BertConfig(**layers))  # 30,522 tokens, 512 positions, 2 segments
        ours = BERT(**FLAVORS[name])
    assert count(ours) == count(theirs) == hf_count
    assert abs(count(ours) / paper - 1) < tolerance


def test_a_padded_sample_gets_what_it_gets_alone_whatever_the_padding():
    model = small(dropout=0.1)
    idx, segments, mask = batch(50)
    noisy = idx.masked_fill(~mask.bool(), 7)  # what the padding holds must not matter either
    with torch.no_grad():
        for T in (12, 16):  # 0..13 padded positions per row
            pad = T - idx.shape[1]
            x, s, m = (F.pad(t, (0, pad), value=v) for t, v in ((noisy, 3), (segments, 1), (mask, 0)))
            mlm, nsp = model(x, s, m)
            assert torch.isfinite(mlm).all()
            for b, n in enumerate(LENGTHS.tolist()):
                alone_mlm, alone_nsp = model(idx[b:b + 1, :n], segments[b:b + 1, :n])
                assert (mlm[b, :n] - alone_mlm[0]).abs().max() < 1e-5
                assert (nsp[b] - alone_nsp[0]).abs().max() < 1e-5
        empty = torch.cat([mask[:1], torch.zeros_like(mask[:1])])  # a row of padding only stays finite
        assert torch.isfinite(model(idx[:2], mask=empty)[0]).all()
        assert (model(idx[:2], mask=empty)[0][0] - model(idx[:1])[0][0]).abs().max() < 1e-5


@pytest.mark.parametrize("causal", [True, False])
def test_causal_reads_no_later_token_and_bert_does(causal):
    model = small(causal=causal)
    idx, _, mask = batch(50)
    later = idx.clone()
    later[:, 6:] = (later[:, 6:] + 1) % 50  # change every token after position 5
    with torch.no_grad():
        for m in (None, mask):
            h, h_later = model.forward_features(idx, mask=m), model.forward_features(later, mask=m)
            upto = (h - h_later)[:, :6].abs().max()
            assert upto < 1e-6 if causal else upto > 1e-3  # bidirectional: earlier positions read later ones


def test_no_nsp_has_no_nsp_head():
    model = small(nsp=False)
    names = [n for n, _ in model.named_parameters()]
    assert model.nsp_head is None and model.pooler is None
    assert not any(n.startswith(("nsp_head", "pooler")) for n in names)
    assert count(small()) - count(model) == (32 * 2 + 2) + (32 * 32 + 32)  # the NSP layer and the pooler
    mlm, nsp = model(batch(50)[0])
    assert mlm.shape == (3, 12, 50) and nsp is None


def test_the_classifiers_body_has_berts_names_and_shapes():
    sizes = dict(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=32)
    bert, classifier = small(), BERTClassifier(num_classes=5, **sizes).eval()
    pre_trained = bert.state_dict()
    body = {k: t for k, t in classifier.state_dict().items() if not k.startswith("W.")}
    assert body and all(pre_trained[k].shape == t.shape for k, t in body.items())  # a KeyError names a stray one
    assert set(classifier.state_dict()) - set(pre_trained) == {"W.weight", "W.bias"}
    missing, unexpected = classifier.load_state_dict(pre_trained, strict=False)  # as --init RUN_DIR copies
    assert set(missing) == {"W.weight", "W.bias"} and all(k.startswith(("mlm.", "nsp_head.")) for k in unexpected)
    idx, segments, mask = batch(50)
    with torch.no_grad():
        logits = classifier(idx, segments, mask)
        assert logits.shape == (3, 5)
        C = bert.pool(bert.forward_features(idx, segments, mask))  # the pre-trained C, through the new W
        assert (logits - classifier.W(C)).abs().max() < 1e-6
    assert classifier.get_classifier() is classifier.W
    classifier.reset_classifier(2)
    assert classifier(idx).shape == (3, 2)


def test_a_causal_classifier_reads_the_last_real_token_and_bert_reads_cls():
    """Left-only at fine-tuning (Section 5.1, "LTR & No NSP"): [CLS] sees only itself, so C pools the last
    real token's state, and padding after it changes nothing. Bidirectional, C pools [CLS] as before."""
    sizes = dict(num_classes=5, vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=32)
    torch.manual_seed(0)
    causal = BERTClassifier(**sizes, causal=True).eval()
    bidirectional = BERTClassifier(**sizes).eval()
    bidirectional.load_state_dict(causal.state_dict())
    idx, segments, mask = batch(50)
    with torch.no_grad():
        for model, reads_last in ((causal, True), (bidirectional, False)):
            logits, h = model(idx, segments, mask), model.forward_features(idx, segments, mask)
            for b, n in enumerate(LENGTHS.tolist()):
                C = torch.tanh(model.pooler(h[b, n - 1 if reads_last else 0]))
                assert (logits[b] - model.W(C)).abs().max() < 1e-5
                alone = model(idx[b:b + 1, :n], segments[b:b + 1, :n])  # no padding at all
                assert (logits[b] - alone[0]).abs().max() < 1e-5
        first = causal.W(torch.tanh(causal.pooler(h[:, 0])))
        assert (causal(idx, segments, mask) - first).abs().max() > 1e-3  # not [CLS]'s


def test_flavors_initialisation_and_every_parameter_trains():
    tiny = BERT(**FLAVORS["tiny"] | dict(vocab_size=77))
    assert tiny.embeddings.token.weight.shape == (77, 64) and len(tiny.blocks) == 2
    assert tiny.blocks[0].mlp.W_1.out_features == 256 and tiny.blocks[0].attn.n_head == 2  # 4H, A
    assert not tiny.blocks[0].pre_norm and tiny.blocks[0].norm1.eps == 1e-12  # post-LN, the released epsilon
    W = tiny.blocks[1].mlp.W_2.weight
    assert abs(W.std().item() - 0.0176) < 0.001 and W.abs().max() <= 0.04  # N(0, 0.02) truncated at 2 std
    assert torch.equal(tiny.mlm.bias, torch.zeros(77))
    model = small(dropout=0.1).train()
    idx, segments, mask = batch(50)
    mlm, nsp = model(idx, segments, mask)
    (mlm.logsumexp(-1).mean() + nsp.logsumexp(-1).mean()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    with pytest.raises(ValueError, match="exceed"):
        small()(torch.zeros(1, 33, dtype=torch.long))


def test_compile_matches_eager():
    model = small()
    idx, segments, mask = batch(50)
    with torch.no_grad():
        expected = model(idx, segments, mask)
        got = torch.compile(model, backend="eager", fullgraph=True)(idx, segments, mask)
    assert all((g - e).abs().max() < 1e-6 for g, e in zip(got, expected))
