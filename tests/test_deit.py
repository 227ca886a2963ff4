"""DeiT against timm's deit models and the paper's Table 1; its distillation losses by their equations; the
teacher kept out of evaluation; --teacher's refusals; DeiT's recipe steps (common.data.augment)."""

import json

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F

from common.data import augment
from common.data.samplers import RepeatedAugmentation
from common.step import forward_loss
from common.tasks import get_task, hard_distillation, soft_distillation
from papers import get_paper
from papers.deit import from_timm
from papers.deit.model import DeiT
from tests.conftest import refusal, refused

# timm's name and its constructor's overrides: the paper's DeiT-Ti at 32x32, and hidden configurations
CONFIGS = [
    ("deit_tiny_patch16_224", dict(img_size=32)),
    ("deit_tiny_distilled_patch16_224", dict(img_size=32)),
    ("deit_tiny_patch16_224", dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=48, depth=3,
                                   num_heads=2, mlp_ratio=2.0)),
    ("deit_tiny_distilled_patch16_224", dict(img_size=(24, 16), patch_size=8, num_classes=7, embed_dim=64, depth=2,
                                             num_heads=8)),
]


def random_timm(name: str, **kwargs) -> nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **kwargs)
    with torch.no_grad():  # random everywhere: unit norms or zero biases would hide mistakes
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model.eval()


@pytest.mark.parametrize("name, kwargs", CONFIGS, ids=[f"{n.split('_')[2]}-{i}" for i, (n, _) in enumerate(CONFIGS)])
def test_logits_equal_timm(name, kwargs):
    theirs = random_timm(name, **kwargs)
    ours = from_timm(theirs).eval()
    assert ours.distilled == ("distilled" in name)
    H, W = (kwargs["img_size"],) * 2 if isinstance(kwargs["img_size"], int) else kwargs["img_size"]
    x = torch.randn(3, kwargs.get("in_chans", 3), H, W)
    with torch.no_grad():
        expected, got = theirs(x), ours(x)  # the distilled: both heads' logits averaged, in both
    assert got.shape == expected.shape == (3, kwargs.get("num_classes", 1000))
    assert (got - expected).abs().max() < 1e-5


def test_from_timm_refuses_what_does_not_map():
    kwargs = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    for extra in (dict(global_pool="avg", class_token=True), dict(no_embed_class=True), dict(reg_tokens=2),
                  dict(init_values=0.1)):
        theirs = timm.models.VisionTransformer(**kwargs, **extra)
        with pytest.raises(ValueError, match="parts DeiT has not"):
            from_timm(theirs)


@pytest.mark.parametrize("flavor, timm_name, millions", [
    ("deit_ti", "deit_tiny_patch16_224", 5), ("deit_s", "deit_small_patch16_224", 22),
    ("deit_b", "deit_base_patch16_224", 86), ("deit_ti_distilled", "deit_tiny_distilled_patch16_224", 5),
    ("deit_b_distilled", "deit_base_distilled_patch16_224", 87)])
def test_table1_parameter_counts(flavor, timm_name, millions):
    """Table 1: DeiT-Ti 5M, DeiT-S 22M, DeiT-B 86M parameters (the paper rounds down: 5.7M, 22.1M, 86.6M);
    DeiT-B⚗ 87M (Table 5); each the same count as timm's model."""
    with torch.device("meta"):
        ours = get_paper("deit").build(flavor)  # 224x224 images, 1000 classes
        theirs = timm.create_model(timm_name, pretrained=False)
    count = sum(p.numel() for p in ours.parameters())
    assert int(count / 1e6) == millions, count
    assert count == sum(p.numel() for p in theirs.parameters())


def test_distillation_token_heads_in_training_and_at_test_time():
    torch.manual_seed(0)
    model = get_paper("deit").build("tiny-distilled", img_size=8)
    x = torch.randn(4, 1, 8, 8)
    out = model.train()(x)
    assert set(out) == {"logits", "distillation"} and out["logits"].shape == out["distillation"].shape == (4, 10)
    model.eval()
    with torch.no_grad():
        z = model.forward_features(x)  # (B, 2 + N, D): class, distillation, 4 patches
        assert z.shape == (4, 6, 128)
        y_class, y_dist = model.head(z[:, 0]), model.head_dist(z[:, 1])
        assert torch.allclose(model(x), (y_class + y_dist) / 2)
        for inference, expected in (("class", y_class), ("distillation", y_dist)):
            model.inference = inference
            assert torch.allclose(model(x), expected)
    with pytest.raises(ValueError, match="inference must be one of"):
        DeiT(img_size=8, patch_size=4, dim=32, depth=1, num_heads=2, mlp_dim=64, inference="mean")


def test_stochastic_depth_grows_with_depth_and_is_off_in_eval():
    model = DeiT(img_size=8, patch_size=4, dim=32, depth=5, num_heads=2, mlp_dim=64, drop_path=0.2)
    assert [b.drop_path.p for b in model.blocks] == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])
    x = torch.randn(2, 3, 8, 8)
    model.eval()
    assert torch.equal(model(x), model(x))


def test_losses_follow_the_papers_equations():
    torch.manual_seed(0)
    Z_s, Z_d, Z_t = (torch.randn(6, 5) for _ in range(3))
    y = torch.randint(0, 5, (6,))
    y_t = Z_t.argmax(-1)
    ce = lambda Z, labels: -(Z.log_softmax(-1)[torch.arange(6), labels]).mean()
    assert torch.allclose(hard_distillation(Z_s, Z_d, Z_t, y), ce(Z_s, y) / 2 + ce(Z_d, y_t) / 2)
    tau, lam = 3.0, 0.1
    p_t, p_d = (Z_t / tau).softmax(-1), (Z_d / tau).softmax(-1)
    kl = (p_t * (p_t.log() - p_d.log())).sum(-1).mean()  # KL(psi(Z_t / tau) || psi(Z_d / tau)) per sample
    expected = (1 - lam) * ce(Z_s, y) + lam * tau ** 2 * kl
    assert torch.allclose(soft_distillation(Z_s, Z_d, Z_t, y, tau, lam), expected)
    # the task: the distillation head learns the teacher, the class head the label with its smoothing
    task = get_task("classification", {"num_classes": 5}, label_smoothing=0.1, distillation="hard",
                    teacher=nn.Identity())
    got = task.loss({"logits": Z_s, "distillation": Z_d, "teacher": Z_t}, y)
    assert torch.allclose(got, F.cross_entropy(Z_s, y, label_smoothing=0.1) / 2 + ce(Z_d, y_t) / 2)
    # without a teacher, both heads learn the labels
    plain = get_task("classification", {"num_classes": 5})
    assert torch.allclose(plain.loss({"logits": Z_s, "distillation": Z_d}, y), (ce(Z_s, y) + ce(Z_d, y)) / 2)


class Teacher(nn.Module):
    """A teacher that counts its calls and says whether it was called in eval mode without gradients."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = nn.Linear(64, 10)
        self.calls = []

    def forward(self, x):
        self.calls.append((self.training, torch.is_grad_enabled()))
        return self.fc(x.flatten(1))


def test_teacher_labels_training_batches_only():
    """The test accuracy of a DeiT run is the same whatever the teacher, for the same student weights."""
    torch.manual_seed(0)
    student = get_paper("deit").build("tiny-distilled", img_size=8)
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    scores = []
    for seed in (1, 2):
        teacher = Teacher(seed).eval()
        task = get_task("classification", {"num_classes": 10}, distillation="soft", teacher=teacher)
        out = task.taught(task.forward(student.train(), x, y), x)
        assert set(out) == {"logits", "distillation", "teacher"} and teacher.calls == [(False, False)]
        forward_loss(task, student, x, y, "fp32", torch.device("cpu")).backward()  # the trainer's step
        assert len(teacher.calls) == 2
        assert all(p.grad is None for p in teacher.parameters()) and student.head_dist.weight.grad is not None
        with torch.no_grad():
            metrics = task.build_metrics(torch.device("cpu"))
            task.update(metrics, task.forward(student.eval(), x, y), y)
        assert len(teacher.calls) == 2, "evaluation never calls the teacher"
        scores.append(task.compute(metrics))
    assert scores[0] == scores[1]


def finished_run(folder, dataset: str = "digits", paper: str = "resnet"):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"paper": paper, "dataset": dataset, "image_size": None}))
    (folder / "model.safetensors").write_bytes(b"")  # only its presence is checked before the run
    return str(folder)


def test_teacher_refusals(tmp_path):
    run = finished_run(tmp_path / "teacher")
    base = {"paper": "deit", "wandb": "disabled"}
    assert "has no distillation head" in refusal(base | {"paper": "vit", "teacher": run, "distillation": "hard"}, 1)
    assert "needs --distillation soft or hard" in refusal(base | {"teacher": run}, 1)
    assert "needs a --teacher RUN_DIR" in refusal(base | {"distillation": "soft"}, 1)
    (tmp_path / "empty").mkdir()
    assert "not a finished run" in refusal(base | {"teacher": str(tmp_path / "empty"), "distillation": "hard"}, 1)
    other = finished_run(tmp_path / "other", dataset="shapes")
    assert "trained on shapes" in refusal(base | {"teacher": other, "distillation": "hard"}, 1)
    assert "which --pp cuts" in refusal(base | {"teacher": run, "distillation": "hard", "pp": 2}, 2)
    for distilled in ({"flavor": "tiny-distilled"}, {"model_kwargs": {"distilled": True}}):
        assert "DeiT⚗ returns its two heads' logits" in refusal(base | distilled | {"pp": 2}, 2)


def test_teacher_refusal_on_the_command_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, ["--paper", "deit", "--teacher", str(tmp_path), "--distillation", "hard",
                            "--wandb", "disabled"])
    assert "--teacher" in line and "not a finished run" in line


def test_recipe_steps_parse_and_are_refused_where_they_do_not_apply():
    assert augment.parse("randaug:9-0.5,erase:0.25,mixup:0.8,cutmix:1.0,repeat:3") == [
        ("randaug", (9.0, 0.5)), ("erase", (0.25,)), ("mixup", (0.8,)), ("cutmix", (1.0,)), ("repeat", (3.0,))]
    for bad in ("repeat:1.5", "erase:2", "mixup:0", "randaug:9"):
        with pytest.raises(ValueError, match="is not one of"):
            augment.parse(bad)
    assert "classification data sets" in refusal({"paper": "detr", "dataset": "digits-detect", "augment": "mixup:0.8"}, 1)
    assert "repeat samples a data set by index" in refusal(
        {"paper": "vit", "dataset": "digits-canvas", "image_size": 16, "augment": "repeat:3", "bucketing": "size"}, 1)


def test_mixup_and_cutmix_mix_images_and_labels():
    mixup = augment.mixing("mixup:0.8,cutmix:1.0", 10, label_smoothing=0.1)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    mixed, targets = augment.mix(mixup, x.clone(), y)
    assert mixed.shape == x.shape and targets.shape == (8, 10)
    assert torch.allclose(targets.sum(-1), torch.ones(8)) and targets.min() > 0  # smoothed and mixed
    assert augment.mixing("crop:4,flip", 10) is None and augment.repeats("crop:4") == 1
    task = get_task("classification", {"num_classes": 10}, label_smoothing=0.1)
    logits = torch.randn(8, 10)
    assert torch.allclose(task.loss(logits, targets), -(targets * logits.log_softmax(-1)).sum(-1).mean())


def test_randaug_and_erasing_keep_the_image_normalised():
    torch.manual_seed(0)
    steps = augment.transform("randaug:9-0.5,erase:0.25", 28, stats=dict(scale=1 / 255, mean=[0.5], std=[0.25]))
    image = (torch.randint(0, 256, (1, 28, 28)) / 255 - 0.5) / 0.25
    out = [steps(image) for _ in range(20)]
    assert all(o.shape == (1, 28, 28) for o in out) and any(not torch.allclose(o, image) for o in out)
    # digits: 0-16 pixels (scale 16/255); an image no operation changes comes back as it went in, within
    # half a step of the 8-bit pixels it went through
    digits = dict(scale=16 / 255, mean=[4.9], std=[6.0])
    ra = augment.RandAugment(0, 0, 8, digits)
    ra.ops.num_layers = 0  # none of the operations
    image = (torch.randint(0, 17, (1, 8, 8)).float() - 4.9) / 6.0
    assert (ra(image) - image).abs().max() <= 0.5 * 16 / 255 / 6.0 + 1e-6


def test_repeated_augmentation_shows_each_image_three_times_and_resumes():
    data = list(range(512))
    ranks = [RepeatedAugmentation(data, r, 2, seed=0, repeats=3) for r in range(2)]
    for s in ranks:
        s.set_epoch(1)
    orders = [list(s) for s in ranks]
    assert len(orders[0]) == len(ranks[0]) == 256
    together = [i for pair in zip(*orders) for i in pair]  # the global order, rank 0's and 1's interleaved
    assert all(together[3 * k] == together[3 * k + 1] == together[3 * k + 2] for k in range(len(together) // 3))
    ranks[0].set_epoch(1, start=100)
    assert list(ranks[0]) == orders[0][50:] and len(ranks[0]) == 206
    other = RepeatedAugmentation(data, 0, 2, seed=1, repeats=3)
    other.set_epoch(1)
    assert list(other) != orders[0], "the run's seed changes the order"
