"""ONNX export checked against PyTorch with onnxruntime, for every paper; prediction without torch."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from PIL import Image

from common import export
from common.data import get_dataset
from common.predict import PredictError, Predictor, predict
from papers import get_paper, list_papers
from tests.conftest import ROOT, launch_env
from train import main as train_main

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`


def dims(path: Path, outputs: bool = False) -> dict[str, list]:
    """Each graph input's (or output's) dimensions: an int where fixed, a name where dynamic."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in (graph.output if outputs else graph.input)}


@pytest.mark.parametrize("paper", list_papers())
def test_every_paper_exports_and_onnxruntime_agrees(paper, tmp_path, capsys, monkeypatch):
    spec = get_paper(paper)
    refusal = getattr(spec.model, "onnx_refusal", None)
    if refusal:  # a model torch.onnx cannot take says why, in one line, and nothing is written
        assert export.main(["--paper", paper, "--out", str(tmp_path / "model.onnx")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: {paper} does not export to ONNX: {refusal}"] and not (tmp_path / "model.onnx").exists()
        with pytest.raises(Exception, match="data-dependent"):  # and torch.export does fail on it
            torch.export.export(spec.build("tiny").eval(), (torch.rand(1, 3, 48, 64),), strict=False)
        return
    reports = []  # what export.main's check of its file found (each (what, max |diff|))
    check = export.check
    monkeypatch.setattr(export, "check", lambda *a, **k: reports.append(check(*a, **k)) or reports[-1])
    assert export.main(["--paper", paper, "--out", str(tmp_path / "model.onnx")]) == 0
    out = capsys.readouterr().out
    assert "largest" in out and ("<= 0.0001" in out or "within 0.0001 times the largest output" in out)
    shapes, padded, detection = dims(tmp_path / "model.onnx"), spec.padded_batches, spec.task == "detection"
    if spec.inputs == "image":  # the batch is dynamic; height and width too where the paper reads padded batches
        assert list(shapes) == (["images", "mask"] if detection else ["images"])
        batch, channels, height, width = shapes["images"]
        assert isinstance(batch, str) and isinstance(channels, int)
        assert all(isinstance(d, str) if padded else isinstance(d, int) for d in (height, width))
        if detection:  # the mask of the images' valid pixels, and each image's N detections
            assert shapes["mask"] == [batch, height, width]
            outputs = dims(tmp_path / "model.onnx", outputs=True)
            assert list(outputs) == ["boxes", "scores", "labels"]
            assert outputs["boxes"][0] == outputs["scores"][0] == outputs["labels"][0] == batch
            assert outputs["boxes"][1:] == [outputs["scores"][1], 4] and isinstance(outputs["scores"][1], int)
    elif spec.inputs == "tokens":  # a language model: batch and length dynamic
        assert list(shapes) == ["idx"] and all(isinstance(d, str) for d in shapes["idx"])
    elif spec.inputs == "pairs":  # the batch, the source's and the target's lengths are dynamic
        assert list(shapes) == ["src", "src_lengths", "tgt"]
        (batch, source), (target_batch, target) = shapes["src"], shapes["tgt"]
        assert all(isinstance(d, str) for d in (batch, source, target)) and source != target
        assert shapes["src_lengths"] == [batch] and target_batch == batch
    else:  # the batch is dynamic; the length too, with lengths, where the paper reads padded batches
        assert list(shapes) == (["x", "lengths"] if padded else ["x"])
        batch, steps, _ = shapes["x"]
        assert isinstance(batch, str) and (isinstance(steps, str) if padded else isinstance(steps, int))
        assert not padded or isinstance(shapes["lengths"][0], str)

    # the check itself: batches of 1 and 5 (at two sizes where they vary; for detection, images of
    # different sizes within a padded batch) within 1e-4, and not trivially (outputs differ by input)
    data = get_dataset(spec.defaults["dataset"])
    facts = data.facts(image_size=spec.defaults.get("image_size"))  # a paper built for a larger input reads it resized
    torch.manual_seed(0)
    model = export.randomize(spec.build_for_data("tiny", facts).eval())
    multiple = export.size_multiple(model, data.preprocess() if data.preprocess else None)
    [report] = reports
    sizes = 2 if padded or spec.inputs == "tokens" else 1  # a language model reads any length
    assert len(report) == 2 * sizes  # check raises where onnxruntime differs
    assert len({what.split(",")[1] for what, _ in report}) == sizes, "two sizes where they vary"
    a, b = (export.example(spec.inputs, facts, multiple, 3, False, seed=s, padded=padded, detection=detection)
            for s in (1, 2))
    if detection:  # images of three sizes in each padded batch
        assert not a["mask"].all() and len({int(m.sum()) for m in a["mask"]}) == 3
    graph = export.graph(model, spec.task)  # for detection, `detect(images, mask)`: boxes first
    first = lambda out: out[0] if isinstance(out, tuple) else out
    with torch.no_grad():
        assert (first(graph(*a.values())) - first(graph(*b.values()))).abs().max() > 1e-3
    if detection:
        check_detections_from_the_file(tmp_path, model, data)
    if spec.task == "segmentation":
        assert list(dims(tmp_path / "model.onnx", outputs=True)) == ["scores"]
        check_segmentations_from_the_file(tmp_path, model, data)


def check_detections_from_the_file(tmp_path: Path, model: torch.nn.Module, data) -> None:
    """common.predict on a detection model's file: test images of different sizes, padded into one
    batch, get the detections PyTorch gives each alone; the command line draws them, without torch."""
    samples = export.write_samples(tmp_path / "samples", data.load()[1], data.preprocess(), 3)
    sizes = {Image.open(p).size for p in samples}
    assert len(sizes) > 1, "images of different sizes share the batch"
    found = Predictor(tmp_path / "model.onnx").detect(samples, threshold=0)
    with pytest.raises(PredictError, match="gives boxes, not one label per image"):
        predict(tmp_path / "model.onnx", samples)
    for path, boxes in zip(samples, found):
        x = torch.from_numpy(np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255).permute(2, 0, 1)
        with torch.no_grad():
            alone = model(x[None])[0]  # unpadded, no mask
        order = alone["scores"].argsort(descending=True, stable=True)
        assert len(boxes) == len(order)
        assert np.allclose([s for _, s, _ in boxes], alone["scores"][order].numpy(), rtol=0, atol=1e-4)
        for label, score, box in boxes:  # a detection of that score (an untrained model's scores nearly tie)
            near = ((alone["scores"] - score).abs() < 1e-4).nonzero()[:, 0].tolist()
            assert any(np.abs(np.array(box) - alone["boxes"][j].numpy()).max() <= 0.06  # boxes rounded to 0.1 px
                       and label == str(int(alone["labels"][j])) for j in near), (path, label, score, box)
    lines = predict_without_torch(tmp_path, samples, "--threshold", "0")
    for path, line, boxes in zip(samples, lines, found):
        assert line.startswith(f"{path}: ") and line.count(" at [") == len(boxes)
        drawn, image = Image.open(tmp_path / "drawn" / path.name), Image.open(path)
        zoom = drawn.size[0] // image.size[0]
        assert drawn.size == (zoom * image.size[0], zoom * image.size[1]) and zoom >= 2  # enlarged to be read


def predict_without_torch(tmp_path: Path, samples: list[Path], *flags: str) -> list[str]:
    """The lines `python -m common.predict --onnx` prints for the samples, run where torch cannot be imported
    (it draws them into tmp_path/drawn); the last says where it drew them."""
    no_torch = tmp_path / "no_torch"
    (no_torch / "torch").mkdir(parents=True)
    (no_torch / "torch/__init__.py").write_text("raise ImportError('torch is not allowed here')\n")
    proc = subprocess.run([sys.executable, "-m", "common.predict", "--onnx", str(tmp_path / "model.onnx"),
                           *map(str, samples), "--out", str(tmp_path / "drawn"), *flags],
                          env=launch_env() | {"PYTHONPATH": f"{no_torch}:{ROOT}"}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == f"drew them into {tmp_path / 'drawn'}/" and len(lines) == len(samples) + 1
    return lines


def check_segmentations_from_the_file(tmp_path: Path, model: torch.nn.Module, data) -> None:
    """common.predict on a segmentation model's file: each test image's class of every pixel is PyTorch's on
    the image alone; the command line paints them over the images and gives their shares, without torch."""
    samples = export.write_samples(tmp_path / "samples", data.load()[1], data.preprocess(), 3)
    assert len({Image.open(p).size for p in samples}) > 1, "images of different sizes"
    found = Predictor(tmp_path / "model.onnx").segment(samples)
    with pytest.raises(PredictError, match="gives a class per pixel, not one label per image"):
        predict(tmp_path / "model.onnx", samples)
    for path, labels in zip(samples, found):
        image = Image.open(path)
        x = torch.from_numpy(Predictor(tmp_path / "model.onnx").preprocess(image))
        with torch.no_grad():
            expected = export.graph(model, "segmentation")(x[None])[0].argmax(0).numpy()
        assert labels.shape == (image.height, image.width) and (labels == expected).mean() > 0.999
    lines = predict_without_torch(tmp_path, samples)
    for path, line in zip(samples, lines):
        assert line.startswith(f"{path}: ") and ("%" in line or line.endswith(" only"))
        drawn, image = Image.open(tmp_path / "drawn" / path.name), Image.open(path)
        assert drawn.width >= 2 * image.width  # enlarged to be read


def test_a_mismatch_is_an_error_and_the_file_is_removed(tmp_path, capsys, monkeypatch):
    spec, facts = get_paper("vit"), get_dataset("digits").facts()
    model = export.randomize(spec.build_for_data("tiny", facts).eval())
    path = export.export(model, "image", facts, tmp_path / "m.onnx", {}, multiple=2)
    with torch.no_grad():
        model.head.bias.add_(1e-3)  # PyTorch's model is no longer the exported one
    with pytest.raises(export.ExportError, match="differs from PyTorch by"):
        export.check(path, model, "image", facts, multiple=2)

    real_export = export.export

    def export_then_change(model, *args, **kwargs):
        path = real_export(model, *args, **kwargs)
        with torch.no_grad():
            model.head.bias.add_(1e-3)
        return path

    monkeypatch.setattr(export, "export", export_then_change)
    assert export.main(["--paper", "vit", "--out", str(tmp_path / "bad.onnx")]) == 1
    assert "differs from PyTorch" in capsys.readouterr().err
    assert not (tmp_path / "bad.onnx").exists()


def test_every_output_is_compared_and_integers_exactly():
    """A detection file's three outputs: float outputs within 1e-4 (times their largest magnitude
    above 1: boxes in pixels), labels equal, and a missing or misshapen output never passes."""
    boxes = np.array([[[10.0, 20.0, 150.0, 90.0]]], dtype=np.float32)
    assert export.difference(boxes + 1e-3, boxes) == pytest.approx((1e-3, 150 * 1e-4), rel=1e-2)  # float32 at 150
    assert export.difference(boxes + 0.02, boxes)[0] > export.difference(boxes + 0.02, boxes)[1]
    scores = np.array([[0.25, 0.5]], dtype=np.float32)
    assert export.difference(scores + 2e-4, scores)[1] == pytest.approx(1e-4)
    labels = np.array([[3, 7]])
    assert export.difference(labels, labels) == (0.0, 0.0) and export.difference(labels + 1, labels) == (1.0, 0.0)
    assert export.difference(labels.astype(np.float32), labels)[0] == float("inf")
    assert export.difference(scores[:, :1], scores)[0] == float("inf")


def test_a_vit_for_images_of_varying_size_exports_with_their_size_multiple(tmp_path):
    """ViT on digits-canvas: E_pos is interpolated inside the graph, so sizes other than the training
    grid agree with PyTorch (which uses E_pos as it is on its own grid)."""
    assert export.main(["--paper", "vit", "--flavor", "tiny/4", "--dataset", "digits-canvas",
                        "--out", str(tmp_path / "m.onnx")]) == 0
    meta = json.loads(onnx.load(str(tmp_path / "m.onnx")).metadata_props[0].value)
    assert meta["size_multiple"] == 4 and meta["preprocess"]["size"] is None


def test_export_of_a_finished_run_and_prediction_without_torch(tmp_path, capsys):
    assert train_main(["--paper", "lstm", "--max-steps", "30", "--wandb", "disabled", "--out", str(tmp_path / "run"),
                       "--results-dir", str(tmp_path / "results")]) == 0
    assert export.main(["--run", str(tmp_path / "run"), "--samples", "6"]) == 0
    onnx_path, samples = tmp_path / "run/model.onnx", sorted((tmp_path / "run/samples").glob("*.png"))
    assert len(samples) == 6
    meta = json.loads(onnx.load(str(onnx_path)).metadata_props[0].value)
    assert (meta["paper"], meta["dataset"], meta["run_id"]) == ("lstm", "digits-rows", "run")
    assert meta["preprocess"]["layout"] == "rows" and meta["preprocess"]["labels"] == [str(d) for d in range(10)]

    # predict's preprocessing gives back the test samples (up to 8-bit pixels), and its probabilities
    # are the trained PyTorch model's
    model, _ = export.load_run(tmp_path / "run")
    _, test_set = get_dataset("digits-rows").load()
    predictor = Predictor(onnx_path)
    for i, path in enumerate(samples):
        x = predictor.preprocess(Image.open(path))  # (1, 8, 8)
        pixel_step = predictor.pre["scale"] / predictor.pre["std"][0]
        assert np.abs(x[0] - test_set[i][0].numpy()).max() <= pixel_step
        with torch.no_grad():
            expected = torch.softmax(model(torch.from_numpy(x)), dim=1)[0]
        label, probability = predict(onnx_path, [path])[0]
        assert label == str(int(expected.argmax())) and abs(probability - float(expected.max())) < 1e-4

    # the command line, in a Python where importing torch fails
    no_torch = tmp_path / "no_torch"
    (no_torch / "torch").mkdir(parents=True)
    (no_torch / "torch/__init__.py").write_text("raise ImportError('torch is not allowed here')\n")
    env = launch_env() | {"PYTHONPATH": f"{no_torch}:{ROOT}"}
    proc = subprocess.run([sys.executable, "-m", "common.predict", "--onnx", str(onnx_path), *map(str, samples)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 6
    for line, path in zip(lines, samples):
        label, probability = predict(onnx_path, [path])[0]
        assert line == f"{path}: {label} ({probability:.3f})"


def test_prediction_on_images_of_any_size_for_a_model_of_varying_sizes(tmp_path):
    assert export.main(["--paper", "resnet", "--dataset", "digits-canvas", "--out", str(tmp_path / "m.onnx"),
                        "--samples", "3"]) == 0
    predictor = Predictor(tmp_path / "m.onnx")
    odd = tmp_path / "odd.png"
    Image.open(sorted((tmp_path / "samples").glob("*.png"))[0]).resize((30, 18)).save(odd)
    assert predictor.preprocess(Image.open(odd)).shape == (1, 16, 32)  # sides rounded to multiples of 4
    results = predictor([*sorted((tmp_path / "samples").glob("*.png")), odd])
    assert len(results) == 4 and all(label in predictor.pre["labels"] and 0 < p <= 1 for label, p in results)


def test_clear_errors(tmp_path, capsys):
    assert export.main(["--run", str(tmp_path / "nowhere")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert export.main(["--paper", "vit", "--flavor", "huge"]) == 2
    assert "unknown flavor 'huge'" in capsys.readouterr().err
    assert export.main(["--paper", "vit", "--dataset", "adding"]) == 2
    assert "reads image inputs but dataset adding has sequence" in capsys.readouterr().err

    assert export.main(["--paper", "lstm", "--dataset", "adding", "--flavor", "exp4-adding",
                        "--out", str(tmp_path / "adding.onnx")]) == 0
    with pytest.raises(PredictError, match="regression model of adding"):
        Predictor(tmp_path / "adding.onnx")
    assert export.main(["--paper", "lenet", "--out", str(tmp_path / "lenet.onnx")]) == 0  # an image model
    with pytest.raises(PredictError, match="missing.png: no such file"):
        predict(tmp_path / "lenet.onnx", [tmp_path / "missing.png"])
    (tmp_path / "notes.png").write_text("not an image")
    with pytest.raises(PredictError, match="not an image"):
        predict(tmp_path / "lenet.onnx", [tmp_path / "notes.png"])
    plain = onnx.load(str(tmp_path / "lenet.onnx"))
    del plain.metadata_props[:]
    onnx.save(plain, str(tmp_path / "plain.onnx"))
    with pytest.raises(PredictError, match="no 'paper_study' metadata"):
        Predictor(tmp_path / "plain.onnx")
