"""A kind of task that common/ does not know, trained and evaluated by the unchanged trainer.

Multi-label classification: each digit image has a set of attributes (even, prime, above four,
round), from none (a 1) to three (a 2 is even and prime, an 8 is even, above four and round),
and its target is a dict with the indices of its attributes, so a batch's targets are a list
with one dict per sample. The task, its data set and its model are all defined in this file,
with common/ unchanged: `register_all()` adds them to the registries. Run as a script
(`torchrun --nproc_per_node 2 tests/test_new_task_kind.py FLAGS`), this file registers them
and then does what train.py does.
"""

import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from torchmetrics import MeanMetric, Metric, MetricCollection
from torchmetrics.classification import MultilabelExactMatch, MultilabelF1Score

from common.tasks import Task

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

ATTRIBUTES = {"even": {0, 2, 4, 6, 8}, "prime": {2, 3, 5, 7}, "above four": {5, 6, 7, 8, 9}, "round": {0, 6, 8, 9}}


# ---------------------------------------------------------------- the task, its data and its model


class MultiLabel(Task):
    """Independent yes/no per label: binary cross-entropy on logits (B, labels); scored by micro F1
    (the headline), exact match of the whole set, and the loss."""

    kind = "multi-label"
    metric = "f1"
    higher_is_better = True

    @staticmethod
    def multi_hot(targets: list[dict], logits: torch.Tensor) -> torch.Tensor:
        hot = torch.zeros_like(logits, dtype=torch.float32)  # (B, labels)
        for i, target in enumerate(targets):
            hot[i, target["labels"]] = 1.0
        return hot

    def loss(self, logits: torch.Tensor, targets: list[dict]) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(logits.float(), self.multi_hot(targets, logits))

    def metrics(self) -> dict[str, Metric]:
        labels = self.facts["num_classes"]
        return {"f1": MultilabelF1Score(labels, average="micro"), "exact_match": MultilabelExactMatch(labels),
                "loss": MeanMetric()}

    def update(self, metrics: MetricCollection, logits: torch.Tensor, targets: list[dict]) -> None:
        hot = self.multi_hot(targets, logits).long()
        metrics["f1"].update(logits.float().sigmoid(), hot)
        metrics["exact_match"].update(logits.float().sigmoid(), hot)
        metrics["loss"].update(F.binary_cross_entropy_with_logits(logits.float(), hot.float(), reduction="none"))


class DigitAttributes(Dataset):
    """The built-in digits, each with {"labels": indices of its attributes} (0 to 3 of them)."""

    def __init__(self, images: torch.Tensor, digits: torch.Tensor):
        self.images = images
        self.targets = [{"labels": torch.tensor([k for k, has in enumerate(ATTRIBUTES.values()) if int(d) in has],
                                                dtype=torch.long)} for d in digits]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict]:
        return self.images[i], self.targets[i]


def load_attributes(**_) -> tuple[DigitAttributes, DigitAttributes]:
    from common.data import digits

    return tuple(DigitAttributes(*split.tensors) for split in digits.load())


class AttributeNet(nn.Module):
    """A 3x3 convolution, a strided one, and a linear layer giving one logit per attribute."""

    def __init__(self, num_classes: int, in_chans: int = 1, img_size: int = 8, width: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(in_chans, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, width, 3, stride=2, padding=1)
        self.head = nn.Linear(width * (img_size // 2) ** 2, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv2(F.relu(self.conv1(images))))  # (B, width, H/2, W/2)
        return self.head(x.flatten(1))  # (B, labels)


def specs():
    from common.data import DatasetSpec
    from papers import PaperSpec

    data = DatasetSpec("digit-attributes", "multi-label", "image",
                       lambda **_: dict(num_classes=len(ATTRIBUTES), in_chans=1, img_size=8), load_attributes,
                       description="the digits with their attributes (even, prime, above four, round)")
    paper = PaperSpec(name="attribute-net", family="cnn", title="A test's multi-label CNN", authors="the tests",
                      year=2026, url="https://example.org", model=AttributeNet,
                      flavors={"tiny": {}, "wide": {"width": 64}},
                      inputs="image", task="multi-label", data_kwargs=("num_classes", "in_chans", "img_size"),
                      defaults=dict(dataset="digit-attributes", epochs=4, batch_size=64, lr=3e-3, weight_decay=0.0))
    return MultiLabel, data, paper


def register_all() -> None:
    import common.data
    import common.tasks
    import papers

    task, data, paper = specs()
    common.tasks.register(task)
    common.data.register(data)
    papers.register(paper)


if __name__ == "__main__":  # under torchrun: register, then train as train.py does
    register_all()
    from train import main

    sys.exit(main())


# ---------------------------------------------------------------- the tests

from tests.conftest import ROOT, launch_env, load_json, max_difference, torchrun_command, weights  # noqa: E402

FLAGS = ["--paper", "attribute-net", "--wandb", "disabled"]


@pytest.fixture
def registered(monkeypatch):
    """The task, data set and paper in this process's registries, for this test only."""
    import common.data
    import common.tasks
    import papers

    task, data, paper = specs()
    monkeypatch.setitem(common.tasks.TASKS, task.kind, task)
    monkeypatch.setitem(common.data.DATASETS, data.name, data)
    monkeypatch.setitem(papers._PAPERS, paper.name, paper)


def f1_of_the_saved_weights(run_dir) -> float:
    """Micro F1 over the whole test split, counted here without torchmetrics."""
    from safetensors.torch import load_file

    model = AttributeNet(num_classes=len(ATTRIBUTES))
    model.load_state_dict(load_file(run_dir / "model.safetensors"))
    _, test = load_attributes()
    with torch.no_grad():
        predicted = model.eval()(test.images) > 0  # (N, labels)
    truth = MultiLabel.multi_hot(test.targets, predicted.float()).bool()
    tp, fp, fn = (predicted & truth).sum(), (predicted & ~truth).sum(), (~predicted & truth).sum()
    return float(2 * tp / (2 * tp + fp + fn))


def test_targets_are_a_list_of_dicts_and_the_task_trains_on_them(registered):
    from common.data import get_dataset, train_loader
    from common.tasks import get_task

    data = get_dataset("digit-attributes")
    train_set, _ = data.load()
    inputs, targets = next(iter(train_loader(train_set, 16, 16, 0, 1, seed=0, collate=data.collate())))
    assert inputs.shape == (16, 1, 8, 8) and isinstance(targets, list) and len(targets) == 16
    assert len({len(t["labels"]) for t in targets}) > 1, "a different number of labels per sample"
    task = get_task("multi-label", data.facts())
    logits = torch.zeros(16, len(ATTRIBUTES), requires_grad=True)
    task.loss(logits, targets).backward()
    assert logits.grad.abs().sum() > 0


def test_a_data_set_may_batch_its_targets_itself_into_a_dict_of_tensors():
    """Targets that the built-in stacking cannot batch: the data set's collate_fn does, and the
    batch reaches the device whole."""
    from common.data import DatasetSpec
    from common.data.collate import stack, to_device

    def multi_hot(samples, pad_multiple=1):
        images, _ = stack([(x, 0) for x, _ in samples])
        hot = MultiLabel.multi_hot([t for _, t in samples], torch.zeros(len(samples), len(ATTRIBUTES)))
        return images, {"hot": hot, "count": hot.sum(dim=1)}

    spec = DatasetSpec("digit-attributes-hot", "multi-label", "image", lambda **_: {}, load_attributes,
                       collate_fn=multi_hot)
    train_set, _ = load_attributes()
    inputs, targets = to_device(spec.collate(pad_multiple=4)([train_set[i] for i in range(6)]), torch.device("cpu"))
    assert inputs.shape == (6, 1, 8, 8) and targets["hot"].shape == (6, len(ATTRIBUTES))
    assert torch.equal(targets["count"], torch.tensor([float(len(t["labels"])) for t in train_set.targets[:6]]))


def test_a_new_task_kind_trains_under_ddp_with_two_processes_and_scores_the_whole_test_split(
        registered, tmp_path):
    import subprocess

    from train import main

    cmd = [*torchrun_command(2), __file__, *FLAGS,
           "--out", str(tmp_path / "ddp"), "--results-dir", str(tmp_path / "results")]
    env = launch_env() | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ddp = load_json(tmp_path / "ddp" / "result.json")
    assert (ddp["task"], ddp["metric"], ddp["strategy"], ddp["world_size"]) == ("multi-label", "f1", "ddp", 2)
    assert ddp["final"] > 0.85, "it learned the attributes"
    # both ranks' halves of the test split are in the metric, synchronised by torchmetrics
    assert ddp["final"] == pytest.approx(f1_of_the_saved_weights(tmp_path / "ddp"), abs=1e-6)

    assert main(FLAGS + ["--out", str(tmp_path / "single"), "--results-dir", str(tmp_path / "results")]) == 0
    single = load_json(tmp_path / "single" / "result.json")
    assert max_difference(weights(tmp_path / "ddp"), weights(tmp_path / "single")) < 1e-5
    assert single["final"] == pytest.approx(ddp["final"], abs=1e-6)


def test_auxiliary_classifiers_add_their_weighted_losses():
    """GoogLeNet's auxiliary classifiers: in training the model returns them with their weights."""
    from common.tasks import get_task

    task = get_task("classification", dict(num_classes=3))
    targets = torch.tensor([0, 2])
    main, aux = torch.randn(2, 3), torch.randn(2, 3)
    expected = F.cross_entropy(main, targets) + 0.3 * F.cross_entropy(aux, targets)
    assert torch.allclose(task.loss({"logits": main, "aux": [(aux, 0.3)]}, targets), expected)
