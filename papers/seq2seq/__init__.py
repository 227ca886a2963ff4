"""Sequence to sequence: Sutskever, Vinyals, Le, 2014. A deep LSTM reads the reversed source into its
final state, a second deep LSTM started from that state writes the target. The spec."""

from papers import PaperSpec
from papers.seq2seq.model import FLAVORS, Seq2Seq

PAPER = PaperSpec(
    name="seq2seq",
    family="rnn",
    title="Sequence to Sequence Learning with Neural Networks",
    authors="Sutskever, Vinyals, Le",
    year=2014,
    url="https://arxiv.org/abs/1409.3215",
    model=Seq2Seq,
    flavors=FLAVORS,
    inputs="pairs",
    task="seq2seq",
    defaults=dict(dataset="dates", epochs=12, batch_size=64, lr=3e-3, optimizer="adamw", weight_decay=0.0,
                  warmup_steps=100, clip_grad=5.0, bucketing="size"),
    # Section 3.4: plain SGD (no momentum) at a fixed 0.7, halved every half epoch after the 5th, 7.5 epochs,
    # batches of 128 sentences of roughly one length, the gradient's norm scaled down to 5 when above it
    # (the paper's gradient is a sum over each sentence's words, ours a mean over the batch's words: see
    # README.md). Epochs are whole here: 8,
    # with the halvings at 5, 5.5, 6, 6.5, 7 and 7.5 epochs (the paper stopped at 7.5; its last half epoch
    # here runs at 0.7 / 64).
    recipe=dict(optimizer="sgd", lr=0.7, momentum=0.0, nesterov=False, weight_decay=0.0, batch_size=128, epochs=8,
                schedule="step", milestones="0.625,0.6875,0.75,0.8125,0.875,0.9375", gamma=0.5, warmup_steps=0,
                clip_grad=5.0, label_smoothing=0.0, bucketing="size"),
    reference="the paper (Section 3.4); LSTM layers checked against torch.nn.LSTM in tests/test_lstm.py",
    data_kwargs=("src_vocab", "tgt_vocab", "pad_id"),
    shard_blocks="decoder.layers",
    padded_batches=True,
)
