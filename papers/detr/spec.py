"""DETR: Carion et al., 2020. The spec."""

from papers import PaperSpec
from papers.detr.model import DETR, FLAVORS

PAPER = PaperSpec(
    name="detr",
    family="transformer",
    title="End-to-End Object Detection with Transformers",
    authors="Carion, Massa, Synnaeve, Usunier, Kirillov, Zagoruyko",
    year=2020,
    url="https://arxiv.org/abs/2005.12872",
    model=DETR,
    flavors=FLAVORS,
    inputs="image",
    task="detection",
    data_kwargs=("num_classes",),
    defaults=dict(dataset="digits-detect", epochs=8, batch_size=16, lr=3e-4, weight_decay=1e-4, warmup_steps=100,
                  clip_grad=0.1, bucketing="size", schedule="step", milestones="0.8", gamma=0.1),
    reference="facebookresearch/detr (models/detr.py, transformer.py, matcher.py); parameter counts of Table 1",
    shard_blocks="decoder",
    padded_batches=True,
    # Section 4 and Table 1: AdamW, lr 1e-4 (the backbone's 1e-5 is not expressible: one lr here), weight
    # decay 1e-4, batch 64, gradient clipping 0.1, 500 epochs with the lr divided by 10 after 400; no
    # warmup. The paper's scale augmentation and random crops move boxes, which --augment does not.
    recipe=dict(optimizer="adamw", lr=1e-4, weight_decay=1e-4, batch_size=64, epochs=500, schedule="step",
                milestones="0.8", gamma=0.1, clip_grad=0.1, warmup_steps=0, augment="none", label_smoothing=0.0),
)
