"""--init REF: our model from a reference implementation's pretrained weights, adapted to a data set.

Nothing is downloaded: the weights are random, seeded, saved here from reference models built
without weights (timm's registered `test_vit`, a 0.4M-parameter ViT at 160x160, and torchvision's
`resnet18`); the download itself is replaced by a stand-in where a test needs one.
"""

import os
import urllib.error

import pytest
import timm
import torch
import torchvision
from safetensors.torch import save_file

from common.errors import ConfigError
from common.pretrained import SOURCES, parse_init, reference_model
from papers import get_paper, list_papers
from papers.resnet import from_torchvision
from papers.vit import from_timm

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

VIT, RESNET = get_paper("vit"), get_paper("resnet")
VIT_FACTS = dict(num_classes=1000, in_chans=3, img_size=160)  # test_vit's own: nothing to adapt
RESNET_FACTS = dict(num_classes=1000, in_chans=3, img_size=64)


def shapes(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(t.shape)) for name, t in model.state_dict().items()]


@pytest.fixture(scope="module")
def vit_weights(tmp_path_factory):
    """A random timm test_vit in eval mode, and its weights as safetensors and as torch.save({"state_dict": ...})."""
    torch.manual_seed(0)
    reference = timm.create_model("test_vit", pretrained=False)
    with torch.no_grad():  # random everywhere: a zero head or unit norms would hide mistakes
        for p in reference.parameters():
            p.normal_(0, 0.1)
    folder = tmp_path_factory.mktemp("vit")
    save_file(reference.state_dict(), folder / "test_vit.safetensors")
    torch.save({"state_dict": reference.state_dict(), "epoch": 3}, folder / "test_vit.pth")
    return reference.eval(), folder


@pytest.fixture(scope="module")
def resnet_weights(tmp_path_factory):
    """A random torchvision resnet18 in eval mode (random batch-norm statistics too), its weights
    as safetensors and as a plain torch.save state dict."""
    torch.manual_seed(0)
    reference = torchvision.models.resnet18(weights=None)
    with torch.no_grad():
        for m in reference.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5), m.bias.normal_(0, 0.2)
                m.running_mean.normal_(0, 0.2), m.running_var.uniform_(0.5, 2.0)
    folder = tmp_path_factory.mktemp("resnet")
    save_file(reference.state_dict(), folder / "resnet18.safetensors")
    torch.save(reference.state_dict(), folder / "resnet18.pth")
    return reference.eval(), folder


@pytest.fixture
def no_download(monkeypatch):
    """Fail a test that asks timm or torchvision for pretrained weights."""
    create_model, get_model = timm.create_model, torchvision.models.get_model

    def timm_create(name, pretrained=False, **kwargs):
        assert not pretrained, "timm was asked to download"
        return create_model(name, pretrained=False, **kwargs)

    def torchvision_get(name, weights=None, **kwargs):
        assert weights is None, "torchvision was asked to download"
        return get_model(name, weights=None, **kwargs)

    monkeypatch.setattr(timm, "create_model", timm_create)
    monkeypatch.setattr(torchvision.models, "get_model", torchvision_get)


# ------------------------------------------------------------------ parsing


def test_parse_init_reads_the_three_forms():
    assert parse_init("timm:vit_base_patch16_224") == ("timm", "vit_base_patch16_224", None)
    assert parse_init("torchvision:resnet50") == ("torchvision", "resnet50", None)
    source, name, file = parse_init("timm:vit_base_patch16_224.augreg2_in21k_ft_in1k@/w/vit b.safetensors")
    assert (source, name, str(file)) == ("timm", "vit_base_patch16_224.augreg2_in21k_ft_in1k", "/w/vit b.safetensors")


@pytest.mark.parametrize("text", ["vit_base_patch16_224", "timm:", ":resnet50", "timm:vit@", "timm:vit b", ""])
def test_malformed_init_names_the_accepted_forms(text):
    with pytest.raises(ConfigError, match="names no reference model; use timm:NAME, torchvision:NAME"):
        parse_init(text)


def test_unknown_source_is_refused():
    with pytest.raises(ConfigError, match="unknown source 'hf'; use timm:NAME, torchvision:NAME"):
        parse_init("hf:google/vit-base-patch16-224")


def test_every_paper_loads_from_known_sources():
    for name in list_papers():
        spec = get_paper(name)
        assert set(spec.pretrained) <= set(SOURCES) and all(map(callable, spec.pretrained.values())), name
    assert VIT.pretrained == {"timm": from_timm} and RESNET.pretrained == {"torchvision": from_torchvision}
    assert get_paper("lstm").pretrained == {}


# ------------------------------------------------------------------ the same outputs


@pytest.mark.parametrize("file", ["test_vit.safetensors", "test_vit.pth"])
def test_vit_from_a_file_gives_the_reference_outputs(vit_weights, file, no_download):
    reference, folder = vit_weights
    model, notes = reference_model(VIT, f"timm:test_vit@{folder / file}", VIT_FACTS)
    x = torch.randn(2, 3, 160, 160)
    with torch.no_grad():
        expected, got = reference(x), model.eval()(x)
    assert notes == []
    assert got.shape == (2, 1000) and expected.std() > 0.1
    assert (got - expected).abs().max() < 1e-5


@pytest.mark.parametrize("file", ["resnet18.safetensors", "resnet18.pth"])
def test_resnet_from_a_file_gives_the_reference_outputs(resnet_weights, file, no_download):
    reference, folder = resnet_weights
    model, notes = reference_model(RESNET, f"torchvision:resnet18@{folder / file}", RESNET_FACTS)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected, got = reference(x), model.eval()(x)
    assert notes == []
    assert expected.std() > 0.1
    assert (got - expected).abs().max() < 1e-5


def test_without_a_file_the_weights_come_from_the_sources_own_download(vit_weights, resnet_weights, monkeypatch):
    asked = []

    def timm_create(name, pretrained=False, **kwargs):  # what timm's download and cache would give
        asked.append(("timm", name, pretrained))
        return vit_weights[0]

    def torchvision_get(name, weights=None, **kwargs):
        asked.append(("torchvision", name, weights))
        return resnet_weights[0]

    monkeypatch.setattr(timm, "create_model", timm_create)
    monkeypatch.setattr(torchvision.models, "get_model", torchvision_get)
    vit, _ = reference_model(VIT, "timm:test_vit", VIT_FACTS)
    resnet, _ = reference_model(RESNET, "torchvision:resnet18", RESNET_FACTS)
    assert asked == [("timm", "test_vit", True), ("torchvision", "resnet18", "DEFAULT")]
    assert torch.equal(vit.E_pos, vit_weights[0].pos_embed)
    assert torch.equal(resnet.stem.conv.weight, resnet_weights[0].conv1.weight)


# ------------------------------------------------------------------ adapted to the data set


def test_vit_head_of_other_classes_is_a_zero_head(vit_weights, no_download):
    reference, folder = vit_weights
    model, notes = reference_model(VIT, f"timm:test_vit@{folder / 'test_vit.safetensors'}",
                                   {**VIT_FACTS, "num_classes": 10})
    assert len(notes) == 1 and "head of 1000 classes replaced by a new one of 10" in notes[0]
    assert model.head.weight.shape == (10, 64)
    assert not model.head.weight.any() and not model.head.bias.any()  # Section 3.2's zero-initialised head
    unadapted = from_timm(reference).state_dict()
    rest = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
    assert rest.keys() == unadapted.keys() - {"head.weight", "head.bias"}
    assert all(torch.equal(v, unadapted[k]) for k, v in rest.items())


def test_resnet_head_of_other_classes_is_a_default_linear(resnet_weights, no_download):
    reference, folder = resnet_weights
    model, notes = reference_model(RESNET, f"torchvision:resnet18@{folder / 'resnet18.pth'}",
                                   {**RESNET_FACTS, "num_classes": 7})
    assert len(notes) == 1 and "head of 1000 classes replaced by a new one of 7" in notes[0]
    bound = 512 ** -0.5  # nn.Linear's default (the paper's and torchvision's): U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    for p in (model.fc.weight, model.fc.bias):
        assert p.abs().max() <= bound and abs(p.std() / (bound / 3 ** 0.5) - 1) < 0.35
    assert model.fc.weight.shape == (7, 512) and abs(model.fc.weight.std() * 3 ** 0.5 / bound - 1) < 0.05
    unadapted = from_torchvision(reference).state_dict()
    rest = {k: v for k, v in model.state_dict().items() if not k.startswith("fc.")}
    assert len(rest) == len(unadapted) - 2 and all(torch.equal(v, unadapted[k]) for k, v in rest.items())


def test_a_reference_without_a_head_gets_a_new_one_even_of_the_same_size(vit_weights, monkeypatch):
    torch.manual_seed(0)
    headless = timm.create_model("test_vit", pretrained=False, num_classes=0)  # as timm's *.orig_in21k weights
    monkeypatch.setattr(timm, "create_model", lambda name, pretrained=False, **kwargs: headless)
    model, notes = reference_model(VIT, "timm:test_vit", VIT_FACTS)
    assert notes == [("--init timm:test_vit: it has no head (pre-training weights): a new one of 1000 classes, "
                      "initialised as the paper's")]
    assert model.head.weight.shape == (1000, 64) and not model.head.weight.any() and not model.head.bias.any()
    assert torch.equal(model.E_pos, headless.pos_embed)


@pytest.mark.parametrize("spec, init, facts", [
    (VIT, "timm:test_vit@{vit}/test_vit.safetensors", {**VIT_FACTS, "in_chans": 1}),
    (RESNET, "torchvision:resnet18@{resnet}/resnet18.pth", {**RESNET_FACTS, "in_chans": 1}),
], ids=["vit", "resnet"])
def test_other_input_channels_are_refused_naming_both(vit_weights, resnet_weights, spec, init, facts, no_download):
    init = init.format(vit=vit_weights[1], resnet=resnet_weights[1])
    with pytest.raises(ConfigError, match="reads 3 input channels, the data set has 1$"):
        reference_model(spec, init, facts)


@pytest.mark.parametrize("size", [64, 224])  # a 4x4 and a 14x14 grid from test_vit's 10x10
def test_vit_at_another_size_interpolates_e_pos_once_as_timm_does(vit_weights, size, no_download):
    from timm.layers import resample_abs_pos_embed

    reference, folder = vit_weights
    init = f"timm:test_vit@{folder / 'test_vit.safetensors'}"
    model, notes = reference_model(VIT, init, {**VIT_FACTS, "img_size": size})
    g = size // 16
    assert notes == [(f"--init {init}: position embeddings learned on 160x160 images interpolated to "
                      f"{size}x{size} (once, 2D bicubic)")]
    assert model.E_pos.shape == (1, 1 + g * g, 64) and model.grid_size == (g, g)
    assert model.img_size == (size, size)
    assert torch.equal(model.E_pos[:, 0], reference.pos_embed[:, 0])  # the class token's is kept

    # timm at that size: a test_vit built for it, holding pos_embed resampled by timm's own function
    # (bicubic, antialias=False as ours; timm's default antialias uses another kernel, see test_vit.py)
    resized = timm.create_model("test_vit", pretrained=False, img_size=size)
    state = reference.state_dict()
    state["pos_embed"] = resample_abs_pos_embed(state["pos_embed"], new_size=[g, g], old_size=[10, 10],
                                                num_prefix_tokens=1, antialias=False)
    resized.load_state_dict(state)
    on_the_fly = from_timm(reference).eval()  # E_pos interpolated at every forward
    x = torch.randn(2, 3, size, size)
    model.eval().E_pos_grid = None  # at its new size the model uses E_pos as it is, interpolating nothing
    with torch.no_grad():
        got, expected, each_time = model(x), resized.eval()(x), on_the_fly(x)
    assert (got - expected).abs().max() < 1e-5
    assert (got - each_time).abs().max() < 1e-5


def test_vit_at_a_size_that_does_not_divide_into_patches_is_refused(vit_weights, no_download):
    init = f"timm:test_vit@{vit_weights[1] / 'test_vit.safetensors'}"
    with pytest.raises(ConfigError, match="cannot fine-tune at 28x28: image size 28x28 is not a multiple of the "
                                          "patch size 16"):
        reference_model(VIT, init, {**VIT_FACTS, "img_size": 28})


# ------------------------------------------------------------------ the architecture alone


@pytest.mark.parametrize("spec, init, facts", [
    (VIT, "timm:test_vit@{vit}/test_vit.safetensors", {**VIT_FACTS, "num_classes": 10, "img_size": 64}),
    (VIT, "timm:test_vit@{vit}/test_vit.pth", VIT_FACTS),
    (RESNET, "torchvision:resnet18@{resnet}/resnet18.safetensors", {**RESNET_FACTS, "num_classes": 10}),
], ids=["vit-adapted", "vit", "resnet-adapted"])
def test_weights_false_builds_the_same_architecture_reading_nothing(vit_weights, resnet_weights, spec, init, facts,
                                                                     no_download):
    init = init.format(vit=vit_weights[1], resnet=resnet_weights[1])
    loaded, notes = reference_model(spec, init, facts)
    bare, bare_notes = reference_model(spec, init, facts, weights=False)
    assert shapes(bare) == shapes(loaded) and bare_notes == notes
    gone, _ = reference_model(spec, init.split("@")[0] + "@/no/such/file.pt", facts, weights=False)  # not read
    assert shapes(gone) == shapes(loaded)
    source_only, _ = reference_model(spec, init.split("@")[0], facts, weights=False)  # no download (no_download)
    assert shapes(source_only) == shapes(loaded)


# ------------------------------------------------------------------ mistakes, one line each


def test_a_missing_file_is_named(tmp_path, no_download):
    missing = tmp_path / "vit.safetensors"
    with pytest.raises(ConfigError, match=f"weights file {missing} does not exist"):
        reference_model(VIT, f"timm:test_vit@{missing}", VIT_FACTS)
    with pytest.raises(ConfigError, match=f"weights file {tmp_path} is not a file"):
        reference_model(VIT, f"timm:test_vit@{tmp_path}", VIT_FACTS)


@pytest.mark.parametrize("name, content, error", [
    ("broken.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json", "cannot read {file} as safetensors"),
    ("broken.pth", b"not a pickle at all", "cannot read {file} as a PyTorch file"),
    ("list.pth", [torch.zeros(2)], "{file} holds no state dict"),
])
def test_an_unreadable_file_is_named(tmp_path, name, content, error, no_download):
    file = tmp_path / name
    file.write_bytes(content) if isinstance(content, bytes) else torch.save(content, file)
    with pytest.raises(ConfigError, match=error.format(file=file)) as info:
        reference_model(VIT, f"timm:test_vit@{file}", VIT_FACTS)
    assert "\n" not in str(info.value)


def test_a_file_of_another_model_is_named(vit_weights, resnet_weights, tmp_path, no_download):
    resnet_file = resnet_weights[1] / "resnet18.safetensors"
    with pytest.raises(ConfigError, match=f"{resnet_file} does not hold the weights of timm:test_vit: "
                                          r"\d+ tensors missing \(.*\), \d+ unexpected"):
        reference_model(VIT, f"timm:test_vit@{resnet_file}", VIT_FACTS)
    state = vit_weights[0].state_dict()
    state["blocks.0.norm1.weight"] = torch.ones(65)
    save_file(state, tmp_path / "wider.safetensors")
    with pytest.raises(ConfigError, match=r"1 of another shape \(blocks.0.norm1.weight: 65 in the file, 64 in "
                                          r"timm:test_vit\)$"):
        reference_model(VIT, f"timm:test_vit@{tmp_path / 'wider.safetensors'}", VIT_FACTS)


def test_a_file_fine_tuned_for_other_classes_loads_without_its_head(vit_weights, tmp_path, no_download):
    state = vit_weights[0].state_dict()
    state["head.weight"], state["head.bias"] = torch.ones(10, 64), torch.ones(10)  # fine-tuned elsewhere
    save_file(state, tmp_path / "ten.safetensors")
    init = f"timm:test_vit@{tmp_path / 'ten.safetensors'}"
    for classes in (1000, 7):  # the reference's own number of classes, and another
        model, notes = reference_model(VIT, init, {**VIT_FACTS, "num_classes": classes})
        assert notes == [f"--init {init}: the file's head of 10 classes not used: a new one of {classes} classes, "
                         f"initialised as the paper's"]
        assert model.head.weight.shape == (classes, 64) and not model.head.weight.any()
        assert torch.equal(model.E_pos, vit_weights[0].pos_embed)


def test_unknown_model_names_suggest_close_ones(no_download):
    with pytest.raises(ConfigError, match="unknown timm model 'test_vitt'; did you mean test_vit"):
        reference_model(VIT, "timm:test_vitt", VIT_FACTS)
    with pytest.raises(ConfigError, match="unknown torchvision model 'resnet19'; did you mean resnet18"):
        reference_model(RESNET, "torchvision:resnet19", RESNET_FACTS)


def test_a_paper_without_a_loader_for_the_source_names_the_ones_it_has():
    with pytest.raises(ConfigError, match=r"paper vit has no loader for torchvision weights \(it has: timm:NAME\)"):
        reference_model(VIT, "torchvision:resnet18", VIT_FACTS)
    with pytest.raises(ConfigError, match=r"paper lstm has no loader for timm weights \(it has: none"):
        reference_model(get_paper("lstm"), "timm:test_vit", dict(input_size=8, num_classes=10))


def test_a_reference_the_paper_cannot_map_is_refused(no_download):
    with pytest.raises(ConfigError, match="--init timm:test_vit2: this timm ViT has parts the paper's ViT has not"):
        reference_model(VIT, "timm:test_vit2", VIT_FACTS, weights=False)


def test_offline_is_one_line_suggesting_a_file(monkeypatch):
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline_timm(name, pretrained=False, **kwargs):  # what timm raises with no network and no cache
        raise LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub and we cannot "
                                      "find the requested files in the local cache.\nPlease check your connection")

    def offline_torchvision(name, weights=None, **kwargs):  # torch.hub's urllib, with no network
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(timm, "create_model", offline_timm)
    monkeypatch.setattr(torchvision.models, "get_model", offline_torchvision)
    for spec, init, facts in [(VIT, "timm:test_vit", VIT_FACTS), (RESNET, "torchvision:resnet18", RESNET_FACTS)]:
        with pytest.raises(ConfigError) as info:
            reference_model(spec, init, facts)
        message = str(info.value)
        assert "\n" not in message
        assert f"cannot fetch the {init.split(':')[0]} weights of {init.split(':')[1]}" in message
        assert message.endswith(f"pass a local copy: --init {init}@FILE")


# ------------------------------------------------------------------ through train.py


def test_fine_tuning_from_a_file_trains_resumes_and_exports(vit_weights, no_download, tmp_path, capsys, monkeypatch):
    """`--init timm:test_vit@FILE` on CIFAR-10-format files (32x32, 10 classes): the notes are printed,
    the architecture stands in the flavor's place in result.json, the first weights are the file's
    (adapted), a run resumed from a checkpoint ends bitwise equal (the reference rebuilt without
    weights, then the checkpoint read), and the finished run exports."""
    import torchvision.datasets.cifar as cifar

    from common import export
    from tests.conftest import bitwise_equal, interrupted_copy, load_json, max_difference, weights
    from tests.test_datasets import write_cifar10
    from train import main

    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: os.path.isfile(path))  # small files
    write_cifar10(tmp_path / "data", n=32)
    init = f"timm:test_vit@{vit_weights[1] / 'test_vit.safetensors'}"
    base = ["--paper", "vit", "--init", init, "--dataset", "cifar10", "--data-dir", str(tmp_path / "data"),
            "--batch-size", "16", "--wandb", "disabled"]
    assert main(base + ["--max-steps", "6", "--ckpt-every", "2", "--keep-ckpts", "5", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "interpolated to 32x32" in out and "head of 1000 classes replaced by a new one of 10 classes" in out
    result = load_json(tmp_path / "run" / "result.json")
    assert result["flavor"] == "timm:test_vit" and result["config"]["init"] == init
    expected, _ = reference_model(VIT, init, dict(num_classes=10, in_chans=3, img_size=32))
    assert result["params"] == sum(p.numel() for p in expected.parameters())
    assert main(base + ["--max-steps", "1", "--lr", "1e-12", "--out", str(tmp_path / "still")]) == 0  # moves nothing
    assert max_difference(weights(tmp_path / "still"), expected.state_dict()) < 1e-8

    run = interrupted_copy(tmp_path / "run", 2, tmp_path / "resumed")
    assert main(["--resume", str(run)]) == 0
    assert bitwise_equal(weights(run), weights(tmp_path / "run"))
    assert export.main(["--run", str(tmp_path / "run")]) == 0

    assert main(["--paper", "vit", "--init", init, "--flavor", "tiny", "--wandb", "disabled"]) == 2
    assert "leave out --flavor tiny" in capsys.readouterr().err
