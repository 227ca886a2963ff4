"""The papers' own recipes: optimizers, learning-rate schedules and augmentation, and `--recipe paper`."""

import dataclasses

import pytest
import torch
import torch.nn as nn

from common.config import build_parser, resolve, validate
from common.data import augment, get_dataset
from common.errors import ConfigError
from common.optim import build_optimizer, schedule
from tests.conftest import bitwise_equal, interrupted_copy, load_json, weights
from train import main


def factors(kind: str, total: int = 100, **kwargs) -> list[float]:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = schedule(optimizer, total, kind=kind, **kwargs)
    out = []
    for _ in range(total):
        out.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return out


def test_schedules_follow_their_definitions():
    step = factors("step", milestones="0.5,0.75", gamma=0.1)
    assert step[49] == 1.0 and step[50] == pytest.approx(0.1) and step[74] == pytest.approx(0.1)
    assert step[75] == pytest.approx(0.01)
    exponential = factors("exponential", gamma=0.5, steps_per_epoch=10)
    assert exponential[9] == 1.0 and exponential[10] == 0.5 and exponential[25] == 0.25
    assert set(factors("constant")) == {1.0}
    cosine = factors("cosine", warmup_steps=10)
    assert cosine[0] == pytest.approx(1 / 11) and cosine[9] == pytest.approx(10 / 11) and cosine[10] == 1.0
    assert cosine[55] == pytest.approx(0.5) and cosine[-1] < 0.001
    with pytest.raises(ValueError, match="increasing fractions"):
        factors("step", milestones="0.75,0.5")
    own = factors("step", milestones="0.5,0.75", gammas="0.4,0.5")  # a factor of its own at each milestone
    assert own[49] == 1.0 and own[50] == pytest.approx(0.4) and own[75] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="2 positive factors, one per milestone"):
        factors("step", milestones="0.5,0.75", gammas="0.4")
    # Vaswani et al.'s eq. 3 for d_model 512 and 4,000 warmup steps, over the factor's peak lr
    d, warmup, peak = 512, 4000, 512 ** -0.5 * 4000 ** -0.5
    noam = factors("noam", warmup_steps=warmup, total=3 * warmup)
    for step in (1, 100, warmup, 2 * warmup, 3 * warmup):  # the paper counts steps from 1
        assert noam[step - 1] * peak == pytest.approx(d ** -0.5 * min(step ** -0.5, step * warmup ** -1.5))
    assert max(noam) == noam[warmup - 1] == pytest.approx(1.0)


def test_optimizers_take_the_papers_settings():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    sgd = build_optimizer(model, 0.1, 1e-4, "sgd", momentum=0.9, nesterov=True)
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == 0.9 and sgd.defaults["nesterov"]
    assert [g["weight_decay"] for g in sgd.param_groups] == [1e-4, 0.0], "no decay on biases and norms"
    rmsprop = build_optimizer(model, 0.045, 4e-5, "rmsprop", momentum=0.9)
    assert isinstance(rmsprop, torch.optim.RMSprop) and rmsprop.defaults["alpha"] == 0.9
    assert isinstance(build_optimizer(model, 1e-3, 0.05), torch.optim.AdamW)


def test_augmentation_steps():
    torch.manual_seed(0)
    image = torch.randn(3, 16, 16)
    assert augment.parse("crop:4,flip") == [("crop", (4.0,)), ("flip", ())] and augment.parse("none") == []
    for bad in ("rot:3", "crop", "scale:2-1", "rrc:1.5", "flip:2"):
        with pytest.raises(ValueError, match="is not one of"):
            augment.parse(bad)
    for text in ("scale:1-2", "rrc:0.08", "crop:4", "flip"):
        out = augment.transform(text, 16)(image)
        assert out.shape == image.shape and not torch.equal(out, image) or text == "flip"
    flips = {augment.transform("flip", 16)(image)[0, 0, 0].item() for _ in range(20)}
    assert flips == {image[0, 0, 0].item(), image[0, 0, -1].item()}, "as it is, or mirrored"
    shifted = augment.transform("crop:2", 16)(image)
    assert any(torch.equal(shifted[:, 2:-2, 2:-2], image[:, 2 - dy:14 - dy, 2 - dx:14 - dx])
               for dy in range(-2, 3) for dx in range(-2, 3)), "a shifted copy"
    data = get_dataset("shapes").load()[0]
    lit = augment.transform("lighting:0.1", 32, data)
    x = data[0][0]
    shift = lit(x) - x
    assert torch.allclose(shift, shift[:, :1, :1].expand_as(shift), atol=1e-6), "one colour shift per image"
    torch.manual_seed(1)
    first = augment.transform("scale:1-1.5,flip", 16)(image)
    torch.manual_seed(1)
    assert torch.equal(augment.transform("scale:1-1.5,flip", 16)(image), first), "torch's generator decides"


def with_recipe(monkeypatch, recipe: dict):
    import papers

    spec = dataclasses.replace(papers.get_paper("vit"), recipe=recipe)
    monkeypatch.setitem(papers._PAPERS, "vit", spec)


def test_recipe_paper_applies_the_papers_recipe_under_the_flags(monkeypatch, tmp_path, capsys):
    with_recipe(monkeypatch, dict(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-4, batch_size=32,
                                  schedule="step", milestones="0.5,0.75", augment="crop:1,flip"))
    flags = lambda *f: vars(build_parser().parse_args(["--paper", "vit", *f]))
    cfg = resolve(flags("--recipe", "paper", "--lr", "0.05"))
    assert (cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.batch_size, cfg.schedule) == ("sgd", 0.05, 1e-4, 32, "step")
    assert cfg.epochs == 30 and cfg.label_smoothing == 0.1, "the paper's repo defaults stay where the recipe is silent"
    assert resolve(flags()).optimizer == "adamw", "the repo's recipe by default"

    assert main(["--paper", "vit", "--recipe", "paper", "--max-steps", "12", "--ckpt-every", "4", "--keep-ckpts", "5",
                 "--wandb", "disabled", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "recipe           paper" in out and "optimizer        sgd" in out and "augment          crop:1,flip" in out
    config = load_json(tmp_path / "run" / "config.json")
    assert (config["recipe"], config["optimizer"], config["milestones"]) == ("paper", "sgd", "0.5,0.75")
    run = interrupted_copy(tmp_path / "run", 4, tmp_path / "resumed")  # augmentation draws resume too
    assert main(["--resume", str(run)]) == 0
    assert bitwise_equal(weights(run), weights(tmp_path / "run"))


def test_recipe_mistakes_are_one_line(monkeypatch):
    flags = lambda *f: vars(build_parser().parse_args(["--paper", "vit", *f]))
    with pytest.raises(ConfigError, match="vit has no recipe"):
        resolve(flags("--recipe", "paper"))
    with pytest.raises(ConfigError, match="invalid choice"):
        build_parser().parse_args(["--paper", "vit", "--schedule", "linear"])
    with pytest.raises(ConfigError, match="gammas must be 2 positive factors"):
        validate(resolve(flags("--schedule", "step", "--milestones", "0.5,0.75", "--gammas", "0.1,0.1,0.1")))
    with pytest.raises(ConfigError, match="--gammas goes with the step schedule"):
        validate(resolve(flags("--gammas", "0.1")))
