"""LeNet-5: LeCun, Bottou, Bengio, Haffner, 1998. The spec; there is no reference implementation to load from."""

from papers import PaperSpec
from papers.lenet.model import FLAVORS, LeNet5

PAPER = PaperSpec(
    name="lenet",
    family="cnn",
    title="Gradient-Based Learning Applied to Document Recognition",
    authors="LeCun, Bottou, Bengio, Haffner",
    year=1998,
    url="https://yann.lecun.com/exdb/publis/pdf/lecun-01a.pdf",
    model=LeNet5,
    flavors=FLAVORS,
    inputs="image",
    task="classification",
    data_kwargs=("num_classes", "in_chans", "img_size"),
    # the repo's recipe: AdamW with warmup and cosine decay, on the digits resized to LeNet-5's 32x32 (MNIST and
    # Fashion-MNIST at --image-size 28 keep their size: the model pads them to 32x32 as the paper pads MNIST)
    defaults=dict(dataset="digits", image_size=32, epochs=20, batch_size=64, lr=3e-3, weight_decay=0.0,
                  warmup_steps=20, label_smoothing=0.0, clip_grad=1.0),
    # The paper's recipe (Section III.B / Appendix C): 20 passes over the training set, one sample per
    # update, with the stochastic diagonal Levenberg-Marquardt method: each weight's step is a global
    # rate eta divided by (mu + its diagonal Hessian estimate). Nothing here estimates the Hessian, so
    # this is plain SGD, without momentum, at the global rate eta. The paper lowers eta from 0.0005 to
    # 0.00001 in steps: 0.0005 for the first two passes, 0.0002 for the next three, 0.0001 for the
    # next three, 0.00005 for the next four, 0.00001 thereafter (passes 2, 5, 8 and 12 of 20).
    recipe=dict(optimizer="sgd", lr=5e-4, momentum=0.0, nesterov=False, weight_decay=0.0, batch_size=1, epochs=20,
                schedule="step", milestones="0.1,0.25,0.4,0.6", gammas="0.4,0.5,0.5,0.2", warmup_steps=0,
                label_smoothing=0.0, clip_grad=0.0, augment="none"),
    reference="none: checked against the paper's own counts (Section II.B, Table I)",
    shard_blocks=None,
    padded_batches=False,
)
