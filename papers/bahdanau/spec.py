"""RNNsearch: Bahdanau, Cho, Bengio, 2014, neural machine translation with a jointly learned soft alignment.
The spec."""

from papers import PaperSpec
from papers.bahdanau.model import FLAVORS, RNNsearch

PAPER = PaperSpec(
    name="bahdanau",
    family="rnn",
    title="Neural Machine Translation by Jointly Learning to Align and Translate",
    authors="Bahdanau, Cho, Bengio",
    year=2014,
    url="https://arxiv.org/abs/1409.0473",
    model=RNNsearch,
    flavors=FLAVORS,
    inputs="pairs",
    task="seq2seq",
    defaults=dict(dataset="dates", epochs=4, batch_size=64, lr=1e-3, schedule="cosine", warmup_steps=100,
                  clip_grad=1.0, weight_decay=0.0, bucketing="size"),
    reference="none for the decoder (the paper's equations, Appendix A); the encoder is papers/gru's GRU, "
              "checked against torch.nn.GRU",
    data_kwargs=("src_vocab", "tgt_vocab", "pad_id"),
    shard_blocks="encoder.gru.layers",
    padded_batches=True,
)
