"""DETR: the matcher against brute force, the loss terms against a direct computation, Table 1's
parameter counts, padded batches, training, and export of the detections."""

import itertools
import math

import pytest
import torch
import torch.nn as nn
from torch.export import Dim
from torchvision.ops import box_convert

from papers.detr import PAPER
from papers.detr.loss import SetCriterion
from papers.detr.matcher import HungarianMatcher
from papers.detr.model import BACKBONE_DIR, DETR, FLAVORS, FrozenBatchNorm2d, PositionEmbeddingSine, image_sizes
from tests.conftest import pad_batch

# A small DETR for speed: stride 8, 2 + 2 layers of width 32, 8 queries, no dropout.
SMALL = dict(num_classes=3, backbone=dict(block="basic", layers=(1, 1), widths=(8, 16), stem="imagenet"),
             frozen_bn=False, trainable_stages=None, d_model=32, num_heads=4, num_encoder_layers=2,
             num_decoder_layers=2, dim_feedforward=64, dropout=0.0, num_queries=8)
# The paper's backbone set-up at toy size: bottlenecks striding the 3x3, frozen batch norm, the stem
# and the first stage frozen.
SMALL_FROZEN = {**SMALL, "backbone": dict(block="bottleneck", layers=(1, 1), widths=(4, 8), stem="imagenet",
                                          stride_on="3x3"), "frozen_bn": True, "trainable_stages": 1}


@pytest.fixture(autouse=True)
def _one_thread():
    """Tensors this small gain nothing from threads, which only wait on each other on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small(seed: int = 0, **overrides) -> DETR:
    """A small DETR with random batch-norm statistics (trainable or frozen), so that padding mistakes show."""
    torch.manual_seed(seed)
    model = DETR(**{**SMALL, **overrides})
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, FrozenBatchNorm2d)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.2)
                m.running_mean.normal_(0, 0.2)
                m.running_var.uniform_(0.5, 2.0)
    return model


def random_boxes(g: torch.Generator, n: int) -> torch.Tensor:
    """n normalised (cx, cy, w, h) boxes inside the unit square."""
    wh = 0.05 + 0.4 * torch.rand(n, 2, generator=g)
    c = wh / 2 + (1 - wh) * torch.rand(n, 2, generator=g)
    return torch.cat([c, wh], dim=1)


def giou(a: torch.Tensor, b: torch.Tensor) -> float:
    """Generalized IoU of two (cx, cy, w, h) boxes, written out (Rezatofighi et al., 2019)."""
    ax1, ay1, ax2, ay2 = a[0] - a[2] / 2, a[1] - a[3] / 2, a[0] + a[2] / 2, a[1] + a[3] / 2
    bx1, by1, bx2, by2 = b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2
    inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
    union = a[2] * a[3] + b[2] * b[3] - inter
    hull = (max(ax2, bx2) - min(ax1, bx1)) * (max(ay2, by2) - min(ay1, by1))
    return float(inter / union - (hull - union) / hull)


def pair_cost(logits: torch.Tensor, box: torch.Tensor, label: int, target: torch.Tensor) -> float:
    """Eq. 1 for one prediction and one object: -p(c) + 5 L1 - 2 GIoU."""
    return float(-logits.softmax(-1)[label] + 5 * (box - target).abs().sum()) - 2 * giou(box, target)


def brute_force(logits, boxes, labels, targets) -> tuple[float, tuple[int, ...]]:
    """The cheapest assignment of the n objects to distinct predictions, over all of them."""
    N, n = len(boxes), len(labels)
    cost = [[pair_cost(logits[i], boxes[i], int(labels[j]), targets[j]) for j in range(n)] for i in range(N)]
    return min((sum(cost[p[j]][j] for j in range(n)), p) for p in itertools.permutations(range(N), n))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_matcher_equals_brute_force(seed, n):
    g = torch.Generator().manual_seed(seed)
    N, K = 5, 4
    logits, boxes = 2 * torch.randn(1, N, K + 1, generator=g), random_boxes(g, N)[None]
    target = {"labels": torch.randint(0, K, (n,), generator=g), "boxes": random_boxes(g, n)}
    [(rows, cols)] = HungarianMatcher()(logits, boxes, [target])
    assert len(rows) == len(cols) == n and len(set(rows.tolist())) == n and sorted(cols.tolist()) == list(range(n))
    best, _ = brute_force(logits[0], boxes[0], target["labels"], target["boxes"])
    got = sum(pair_cost(logits[0, i], boxes[0, i], int(target["labels"][j]), target["boxes"][j])
              for i, j in zip(rows.tolist(), cols.tolist()))
    assert abs(got - best) < 1e-5


def test_loss_terms_equal_a_direct_computation():
    """Cross-entropy with no-object weighted 0.1 (a weighted mean), L1 x 5 and (1 - GIoU) x 2 over the
    matched pairs divided by the number of objects, each summed over the decoder layers; matched by
    brute force here; boxes normalised by each image's own size; one image without objects."""
    g = torch.Generator().manual_seed(0)
    L, B, N, K = 2, 3, 5, 4
    logits, boxes = torch.randn(L, B, N, K + 1, generator=g), torch.stack([random_boxes(g, N) for _ in range(L * B)])
    boxes = boxes.view(L, B, N, 4)
    sizes = torch.tensor([[40, 60], [50, 30], [64, 64]])  # (h, w)
    counts = [2, 0, 3]
    normalised = [random_boxes(g, n) for n in counts]
    targets = [{"labels": torch.randint(0, K, (n,), generator=g),
                "boxes": box_convert(t * torch.tensor([w, h, w, h]), "cxcywh", "xyxy")}  # pixels, x1 y1 x2 y2
               for n, t, (h, w) in zip(counts, normalised, sizes.tolist())]
    terms = SetCriterion(K, HungarianMatcher(), eos_coef=0.1)(logits, boxes, targets, sizes)

    ce = l1 = gi = 0.0
    for l in range(L):
        ce_sum = weight_sum = 0.0
        for b in range(B):
            _, match = brute_force(logits[l, b], boxes[l, b], targets[b]["labels"], normalised[b])
            classes = [K] * N
            for j, i in enumerate(match):
                classes[i] = int(targets[b]["labels"][j])
                l1 += float((boxes[l, b, i] - normalised[b][j]).abs().sum())
                gi += 1 - giou(boxes[l, b, i], normalised[b][j])
            for i, c in enumerate(classes):
                w = 0.1 if c == K else 1.0
                ce_sum += -w * float(logits[l, b, i].log_softmax(-1)[c])
                weight_sum += w
        ce += ce_sum / weight_sum
    assert set(terms) == {"loss_ce", "loss_bbox", "loss_giou"}
    assert terms["loss_ce"].item() == pytest.approx(ce, rel=1e-5)
    assert terms["loss_bbox"].item() == pytest.approx(5 * l1 / 5, rel=1e-5)  # 5 objects in the batch
    assert terms["loss_giou"].item() == pytest.approx(2 * gi / 5, rel=1e-5)


def test_targets_without_boxes_give_only_the_no_object_loss():
    logits, boxes = torch.randn(1, 2, 4, 3), torch.rand(1, 2, 4, 4) * 0.5 + 0.25
    empty = {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)}
    terms = SetCriterion(2, HungarianMatcher())(logits, boxes, [empty, empty], torch.tensor([[20, 30], [30, 20]]))
    assert terms["loss_bbox"].item() == terms["loss_giou"].item() == 0
    assert terms["loss_ce"].item() == pytest.approx(-logits.log_softmax(-1)[..., -1].mean().item(), rel=1e-6)


@pytest.mark.parametrize("flavor, millions", [("DETR", 41), ("DETR-R101", 60)])
def test_parameter_counts_of_table1(flavor, millions):
    """The reference counts the parameters that train (main.py's n_parameters: requires_grad): frozen
    batch norm holds buffers only, and the stem and layer1 are frozen. That count is 41,302,368 for
    DETR-R50 with 91 classes, which ours equals exactly."""
    with torch.device("meta"):
        model = PAPER.build(flavor)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert abs(trained - millions * 1e6) / (millions * 1e6) < 0.015
    assert trained == {"DETR": 41_302_368, "DETR-R101": 60_242_272}[flavor]
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert not any(p.requires_grad for part in (model.backbone.stem, model.backbone.stages[0])
                   for p in part.parameters())
    assert all(p.requires_grad for p in model.backbone.stages[1].parameters())
    assert model.backbone.stride == 32 and model.backbone.num_channels == 2048


def test_the_tiny_flavor_is_small_and_strides_8():
    model = PAPER.build("tiny")
    assert 2e5 < sum(p.numel() for p in model.parameters()) < 2e6
    assert model.backbone.stride == 8 and isinstance(model.get_submodule(PAPER.shard_blocks), nn.ModuleList)


def test_positional_encodings_are_the_sines_of_each_images_own_positions():
    """Channel 2k of the y half is sin(y / 10000^(2k/F)), 2k+1 its cos, with y = 2 pi (row + 1) / h_i;
    then the x half; the padding leaves the valid positions as they are alone."""
    F_, h, w = 8, 3, 5
    mask = torch.zeros(2, 4, 7, dtype=torch.bool)
    mask[0, :h, :w] = True
    mask[1] = True
    pos = PositionEmbeddingSine(F_)(mask)  # (2, 4, 7, 2F)
    alone = PositionEmbeddingSine(F_)(torch.ones(1, h, w, dtype=torch.bool))
    assert (pos[0, :h, :w] - alone[0]).abs().max() < 1e-6
    for i, j in [(0, 0), (2, 4), (1, 3)]:
        y, x = 2 * math.pi * (i + 1) / h, 2 * math.pi * (j + 1) / w
        for k in range(F_):
            f = (math.sin if k % 2 == 0 else math.cos)
            t = 10000 ** (2 * (k // 2) / F_)
            assert pos[0, i, j, k].item() == pytest.approx(f(y / t), abs=1e-5)
            assert pos[0, i, j, F_ + k].item() == pytest.approx(f(x / t), abs=1e-5)


def pair():
    """One image, and a batch of it padded beside a larger one."""
    g = torch.Generator().manual_seed(1)
    small_image, large_image = torch.rand(3, 40, 56, generator=g), torch.rand(3, 72, 48, generator=g)
    images, mask = pad_batch([small_image, large_image])
    return small_image[None], images, mask


@pytest.mark.parametrize("config", [{}, SMALL_FROZEN], ids=["batch-norm", "frozen"])
def test_an_image_alone_gives_what_it_gives_padded_in_a_batch(config):
    model = small(**config).eval()
    alone, images, mask = pair()
    with torch.no_grad():
        logits_a, boxes_a = model.forward_heads(alone)
        logits_b, boxes_b = model.forward_heads(images, mask)
        det_a, det_b = model(alone)[0], model(images, mask)[0]
    assert (logits_a[:, 0] - logits_b[:, 0]).abs().max() < 1e-5  # every decoder layer
    assert (boxes_a[:, 0] - boxes_b[:, 0]).abs().max() < 1e-5  # normalised by the image's own size
    assert (det_a["scores"] - det_b["scores"]).abs().max() < 1e-5 and torch.equal(det_a["labels"], det_b["labels"])
    assert ((det_a["boxes"] - det_b["boxes"]) / torch.tensor([56, 40, 56, 40])).abs().max() < 1e-5
    assert logits_b[:, 0].std() > 0.1  # the outputs differ enough to tell


def test_padding_changes_nothing_in_the_encoders_valid_positions():
    model = small().eval()
    alone, images, mask = pair()
    with torch.no_grad():
        memory_a, pos_a, valid_a = model.encode(alone)
        memory_b, pos_b, valid_b = model.encode(images, mask)
    assert valid_a.all() and valid_b[0].sum() == valid_a.shape[1] < valid_b.shape[1]
    assert (memory_b[0][valid_b[0]] - memory_a[0]).abs().max() < 1e-5
    assert (pos_b[0][valid_b[0]] - pos_a[0]).abs().max() < 1e-6


def test_the_decoder_returns_every_layer_normalised_by_the_shared_layernorm():
    model = small().eval()
    with torch.no_grad():
        hs = model.decode(*model.encode(torch.rand(2, 3, 32, 40)))
    assert hs.shape == (2, 2, 8, 32)  # (L, B, N, d)
    assert hs.mean(-1).abs().max() < 1e-5 and (hs.var(-1, unbiased=False) - 1).abs().max() < 1e-3


def test_eval_gives_every_query_as_pixel_boxes_clipped_to_each_image():
    model = small().eval()
    _, images, mask = pair()
    with torch.no_grad():
        detections = model(images, mask)
    for det, (h, w) in zip(detections, [(40, 56), (72, 48)]):
        assert det["boxes"].shape == (8, 4) and det["scores"].shape == det["labels"].shape == (8,)
        assert det["labels"].dtype == torch.int64 and 0 <= det["labels"].min() and det["labels"].max() < 3
        x1, y1, x2, y2 = det["boxes"].unbind(-1)
        assert (x1 >= 0).all() and (y1 >= 0).all() and (x2 <= w).all() and (y2 <= h).all()
        assert ((x1 <= x2) & (y1 <= y2)).all() and ((det["scores"] > 0) & (det["scores"] < 1)).all()


def synthetic(n: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """n images of different sizes, each with one or two bright squares of class 0, 1 or 2 (the
    brightness tells the class), padded into a batch."""
    g = torch.Generator().manual_seed(seed)
    images, targets = [], []
    for i in range(n):
        h, w = 40 + 8 * i, 56 - 4 * i
        image, boxes, labels = 0.1 * torch.rand(3, h, w, generator=g), [], []
        for _ in range(1 + i % 2):
            s = int(torch.randint(8, 16, (1,), generator=g))
            y, x = (int(torch.randint(0, side - s, (1,), generator=g)) for side in (h, w))
            c = int(torch.randint(0, 3, (1,), generator=g))
            image[:, y:y + s, x:x + s] = 0.4 + 0.3 * c
            boxes.append([x, y, x + s, y + s])
            labels.append(c)
        images.append(image)
        targets.append({"boxes": torch.tensor(boxes, dtype=torch.float32), "labels": torch.tensor(labels)})
    return *pad_batch(images), targets


def test_training_returns_finite_terms_and_the_loss_falls():
    model = small().train()
    images, mask, targets = synthetic()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    losses = []
    for _ in range(30):
        terms = model(images, mask, targets)
        assert set(terms) == {"loss_ce", "loss_bbox", "loss_giou"} and all(t.isfinite() for t in terms.values())
        loss = sum(terms.values())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)  # the paper's clipping
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5


def test_aux_loss_adds_every_decoder_layers_terms():
    """Each decoder layer's terms with its own matching, summed; only the last's without aux_loss."""
    images, mask, targets = synthetic(2)
    with_aux, last_only = small().eval(), small(aux_loss=False).eval()  # the same weights
    terms, last = with_aux.losses(images, mask, targets), last_only.losses(images, mask, targets)
    logits, boxes = with_aux.forward_heads(images, mask)
    per_layer = [with_aux.criterion(logits[l:l + 1], boxes[l:l + 1], targets, image_sizes(images, mask))
                 for l in range(2)]
    for k in terms:
        assert terms[k].item() == pytest.approx(sum(p[k].item() for p in per_layer), rel=1e-5)
        assert last[k].item() == pytest.approx(per_layer[1][k].item(), rel=1e-5)
    assert per_layer[0]["loss_ce"].item() != pytest.approx(per_layer[1]["loss_ce"].item(), rel=1e-3)


@pytest.mark.parametrize("config", [{}, SMALL_FROZEN], ids=["batch-norm", "frozen"])
def test_images_without_boxes_train(config):
    model = small(**config).train()
    images, mask, targets = synthetic(2)
    targets[0] = {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)}
    for batch in [(images, mask, targets), (images[:1], mask[:1], targets[:1])]:  # one empty among others; all empty
        model.zero_grad()
        terms = model(*batch)
        sum(terms.values()).backward()
        assert all(t.isfinite() for t in terms.values())
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and g.isfinite().all() for g in grads)
        assert model.class_embed.weight.grad.abs().sum() > 0


@pytest.mark.slow  # trains, exports or compiles: the whole suite's, not the everyday lane's
def test_detections_export_for_any_batch_and_image_size():
    """`detect` (fixed-shape tensors, no data-dependent control flow) under torch.export with a dynamic
    batch, height and width; the program then runs other batch sizes and odd image sizes."""
    model = small().eval()

    class Detect(nn.Module):
        def __init__(self, detr):
            super().__init__()
            self.detr = detr

        def forward(self, images):
            return self.detr.detect(images)

    dims = {"images": {0: Dim("batch", min=1, max=256), 2: Dim("height", min=16, max=2048),
                       3: Dim("width", min=16, max=2048)}}
    program = torch.export.export(Detect(model), (torch.rand(2, 3, 48, 64),), dynamic_shapes=dims)
    for shape in [(1, 3, 37, 53), (3, 3, 80, 61)]:
        x = torch.rand(shape)
        with torch.no_grad():
            got, expected = program.module()(x), model.detect(x)
        assert all((a.float() - b.float()).abs().max() < 1e-5 for a, b in zip(got, expected))
        assert got[0].shape == (shape[0], 8, 4)


def test_tiny_starts_from_the_pretrained_backbone_with_frozen_batch_norm(tmp_path):
    """The tiny flavor's backbone holds papers/detr/tiny_backbone.safetensors (pretrain.py's), batch norm
    frozen on its statistics; pretrain.py writes a file of the same keys and shapes."""
    from safetensors.torch import load_file

    from papers.detr import pretrain

    model = PAPER.build("tiny")
    weights = load_file(BACKBONE_DIR / FLAVORS["tiny"]["backbone_weights"])
    state = model.backbone.state_dict()
    assert {k for k in weights if not k.endswith("num_batches_tracked")} == set(state)
    assert all(torch.equal(state[k], weights[k]) for k in state)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.backbone.modules())
    assert any(isinstance(m, FrozenBatchNorm2d) for m in model.backbone.modules())

    pretrain.main(["--steps", "2", "--out", str(tmp_path / "backbone.safetensors")])
    written = load_file(tmp_path / "backbone.safetensors")
    assert {k: v.shape for k, v in written.items()} == {k: v.shape for k, v in weights.items()}
    assert not all(torch.equal(written[k], weights[k]) for k in weights)  # two steps are not 3,000
