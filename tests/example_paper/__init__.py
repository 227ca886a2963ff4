"""All-CNN: Springenberg et al., 2014. The spec."""

from papers import PaperSpec
from papers.allconv.model import FLAVORS, AllConvNet

PAPER = PaperSpec(
    name="allconv",
    family="cnn",
    title="Striving for Simplicity: The All Convolutional Net",
    authors="Springenberg, Dosovitskiy, Brox, Riedmiller",
    year=2014,
    url="https://arxiv.org/abs/1412.6806",
    model=AllConvNet,
    flavors=FLAVORS,
    inputs="image",
    task="classification",
    data_kwargs=("num_classes", "in_chans"),
    defaults=dict(dataset="digits", epochs=20, batch_size=64, lr=1e-3, weight_decay=1e-3),
    reference="none: Table 2's layers",
)
