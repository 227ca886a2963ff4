"""Every registered paper, tested without paper-specific code: add a paper and it is covered."""

import pytest
import torch

from common.config import TrainConfig
from common.data import DATASETS, eval_loader, get_dataset
from common.tasks import TASKS, get_task
from common.tasks import call
from papers import get_paper, list_papers

PAPERS = list_papers()


def default_batch(spec, n=16):
    """A real batch of the paper's default dataset, and the model built for it."""
    data = get_dataset(spec.defaults["dataset"])
    size = spec.defaults.get("image_size")  # a paper built for a larger input reads its data resized
    train, _ = data.load(image_size=size)
    x, y = next(iter(eval_loader(train, n, rank=0, world_size=1, collate=data.collate(image_size=size))))
    torch.manual_seed(0)
    return spec.build_for_data("tiny", data.facts(image_size=size)), x, y, data


def test_registry_lists_every_paper_and_rejects_unknown_names():
    assert "vit" in PAPERS
    with pytest.raises(ValueError, match="choose from: .*vit"):
        get_paper("no-such-paper")


@pytest.mark.parametrize("name", PAPERS)
def test_spec_is_complete(name):
    spec = get_paper(name)
    assert spec.family in ("cnn", "rnn", "transformer")
    assert "tiny" in spec.flavors and len(spec.flavors) > 1, "a tiny flavor and the paper's own"
    assert spec.task in TASKS
    data = get_dataset(spec.defaults["dataset"])
    assert data.name in DATASETS and data.inputs == spec.inputs and data.task == spec.task
    assert spec.padded_batches or not data.variable_size, "a paper of one size trains on a data set of one size"
    assert spec.title and spec.authors and spec.year and spec.url.startswith("https://")
    with pytest.raises(ValueError, match="choose from"):
        spec.build("no-such-flavor")
    if spec.shard_blocks is not None:  # fsdp shards each of these blocks
        with torch.device("meta"):
            blocks = spec.build("tiny").get_submodule(spec.shard_blocks)
        assert isinstance(blocks, torch.nn.ModuleList) and len(blocks) > 0


@pytest.mark.parametrize("name", PAPERS)
def test_every_flavor_builds_on_meta(name):
    spec = get_paper(name)
    for flavor in spec.flavors:
        with torch.device("meta"):
            model = spec.build(flavor)
        assert sum(p.numel() for p in model.parameters()) > 0


def check_detections(found: list[dict], n: int, classes: int) -> None:
    """Eval-mode detections: one dict per image, k boxes x1 y1 x2 y2 with their scores and labels."""
    assert len(found) == n
    for d in found:
        k = len(d["scores"])
        assert d["boxes"].shape == (k, 4) and d["labels"].shape == (k,) and d["labels"].dtype == torch.int64
        assert torch.isfinite(d["boxes"]).all() and ((d["labels"] >= 0) & (d["labels"] < classes)).all()
        assert (d["boxes"][:, 2:] >= d["boxes"][:, :2]).all()


@pytest.mark.parametrize("name", PAPERS)
def test_forward_shape_no_nan_and_every_parameter_gets_a_gradient(name):
    model, x, y, data = default_batch(get_paper(name))
    task = get_task(data.task, data.facts())
    out = task.forward(model, x, y)
    if data.task == "detection":  # in training, the named loss terms; in eval mode, the detections
        assert out and all(v.ndim == 0 and torch.isfinite(v) for v in out.values())
        with torch.no_grad():
            check_detections(task.forward(model.eval(), x, y), len(y), data.facts()["num_classes"])
        model.train()
    elif data.task == "segmentation":  # class scores for every pixel (torchvision's dict: "out", and "aux")
        images = x["images"] if isinstance(x, dict) else x
        for scores in out.values() if isinstance(out, dict) else [out]:
            assert scores.shape == (images.shape[0], data.facts()["num_classes"], *images.shape[2:])
            assert torch.isfinite(scores).all()
    else:
        if isinstance(out, dict):  # in training, auxiliary classifiers' outputs beside the logits
            assert all(a.shape == out["logits"].shape for a, _ in out["aux"])
            out = out["logits"]
        n = len(next(iter(y.values()))) if isinstance(y, dict) else len(y)  # targets, or a dict of them (BERT's)
        heads = out if isinstance(out, tuple) else (out,)  # several heads' outputs (BERT's MLM and NSP logits)
        assert all(h.shape[0] == n and torch.isfinite(h).all() for h in heads if h is not None) and heads[0] is not None
        if data.task == "classification":
            assert out.shape == (n, data.facts()["num_classes"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):  # after one update, since a zero-initialised head blocks gradients at first
        opt.zero_grad()
        task.loss(task.forward(model, x, y), y).backward()
        opt.step()
    dead = [n for n, p in model.named_parameters() if p.grad is None or not (p.grad.abs().sum() > 0)]
    assert not dead, f"no gradient reaches {dead}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.slow  # trains, exports or compiles: the whole suite's, not the everyday lane's
@pytest.mark.parametrize("name", PAPERS)
def test_compile_runs_and_matches_eager(name):
    model, x, _, _ = default_batch(get_paper(name))
    model.eval()
    compiled = torch.compile(model, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(call(compiled, x), call(model, x), rtol=1e-5, atol=1e-5)


FIT_STEPS = 300


@torch.no_grad()
def fit_loss(task, model, x, y) -> float:
    """The loss on a batch without randomness: in eval mode, or, for detection models (whose loss
    exists in training only), in training mode with the same random draws (sampled anchors and
    proposals, dropout) every time."""
    if task.kind != "detection":  # the model's outputs alone (a seq2seq task would also decode in eval mode)
        return task.loss(call(model.eval(), x), y).item()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return task.loss(task.forward(model.train(), x, y), y).item()


@pytest.mark.slow
@pytest.mark.parametrize("name", PAPERS)
def test_it_fits_a_small_fixed_batch_at_its_own_learning_rate(name):
    """Learning, tested so that every faithful model passes: the tiny flavor, initialised as the paper
    says, trained on 16 samples of its default data set (4 for segmentation and language modeling) with AdamW at the paper's own default learning
    rate (no weight decay, smoothing or warmup), brings its loss on them, in eval mode (no dropout,
    batch norm's running statistics; see fit_loss for detection), below a quarter of the first within
    FIT_STEPS steps."""
    spec = get_paper(name)
    # a segmentation sample holds a target per pixel (thousands a canvas), a language model's one per position (GPT's
    # 128): 4 of them are as much to fit (GPT's 16 took 93 steps and 23 s of the suite, its 4 take 44 steps)
    model, x, y, data = default_batch(spec, n=4 if spec.task in ("segmentation", "language-modeling") else 16)
    task = get_task(data.task, data.facts())
    lr = spec.defaults.get("lr", TrainConfig.lr)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0)
    first = fit_loss(task, model, x, y) if task.kind == "detection" else task.loss(task.forward(model, x, y), y).item()
    for step in range(FIT_STEPS + 1):
        fitted = fit_loss(task, model, x, y)
        if fitted < first / 4:
            break
        loss = task.loss(task.forward(model.train(), x, y), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert fitted < first / 4, f"loss {first:.4g} -> {fitted:.4g} after {FIT_STEPS} steps at lr {lr:g}"
