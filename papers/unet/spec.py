"""U-Net: Ronneberger, Fischer and Brox, 2015. The spec; there is no reference implementation to load from.

The model (model.py), the overlap-tile strategy (tiling.py), the weight map of equation 2 (weights.py), which
the trainer adds to every training canvas's targets (`--pixel-weights none`: without it), and the elastic
deformation (augment.py)."""

from papers import PaperSpec
from papers.unet.model import FLAVORS, UNet
from papers.unet.weights import target_weights

PAPER = PaperSpec(
    name="unet",
    family="cnn",
    title="U-Net: Convolutional Networks for Biomedical Image Segmentation",
    authors="Ronneberger, Fischer, Brox",
    year=2015,
    url="https://arxiv.org/abs/1505.04597",
    model=UNet,
    flavors=FLAVORS,
    inputs="image",
    task="segmentation",
    data_kwargs=("num_classes", "in_chans"),
    padded_batches=True,
    # equation 2's weights w0 = 10, sigma = 5 pixels from each training canvas's items and classes (Section 3)
    pixel_weights=target_weights,
    # the repo's recipe: AdamW with warmup and cosine decay, FCN's batch on the canvases bucketed by size. Epochs
    # from a probe of 40 steps (torchrun, 2 processes on this 2-core machine, shared with other runs): 23 to 34
    # canvases a second, so an epoch of fashion-canvas's 5,000 takes about 2.5 to 3.5 minutes and 5 epochs
    # about 12 to 18.
    defaults=dict(dataset="fashion-canvas", epochs=5, batch_size=16, lr=1e-3, weight_decay=0.0, warmup_steps=50,
                  bucketing="size", clip_grad=1.0),
    # The paper's recipe (Section 3): Caffe's stochastic gradient descent, one input tile a batch ("we favor
    # large input tiles over a large batch size and hence reduce the batch to a single image"), momentum 0.99
    # ("a large number of the previously seen training samples determine the update in the current
    # optimization step"). Not stated: the learning rate (the defaults' is kept), its schedule (constant here:
    # the paper names no decay), weight decay (none here) and the length of training (10 hours on a Titan GPU;
    # the defaults' epochs are kept).
    # Its elastic deformations, as Section 3.1 draws them (`--augment elastic:10`: 3x3 vectors of 10 pixels std,
    # the image and its target maps warped together before the weight map). Not expressible: its shift,
    # rotation and grey-value augmentation, and its tiles (572 x 572 from larger images; the canvases are
    # smaller than a tile and are read whole).
    recipe=dict(optimizer="sgd", momentum=0.99, nesterov=False, weight_decay=0.0, batch_size=1, schedule="constant",
                warmup_steps=0, label_smoothing=0.0, clip_grad=0.0, augment="elastic:10"),
    reference="none: Figure 1's shapes at every layer and its parameter count (31,030,658, counted from the "
              "figure), a hand-unrolled forward, the overlap-tile strategy against the net on the whole mirrored "
              "image (tests/test_unet.py)",
)
