"""Evaluate a finished run's final weights on its test split, for any task.

    python -m common.evaluate --run RUN_DIR [--batch-size N] [--draw N] [--model-kwargs K=V ...] [--areas S L]

Prints the task's metrics (what the trainer logged at the last epoch, recomputed
from model.safetensors). `--model-kwargs` changes the model's arguments for this
evaluation only, where the trained weights still fit: a detector's proposals at
test time (`"rpn_post_nms_top_n=(150, 10)"`), say. For detection it also writes, into the run directory,
the test split's ground truth and the model's detections in COCO's JSON format
(`gt.json`, `detections.json`: boxes as [x, y, width, height], category ids
1..K), so that any COCO tool (pycocotools, faster_coco_eval) scores them, and
with `--draw N` the first N test images with their true boxes (left) and the
detections scoring at least `--threshold` (right) as PNG files in `RUN_DIR/eval/`;
`--areas S L` scores small, medium and large objects with the thresholds S and L
(box areas in pixels) instead of COCO's 32 x 32 and 96 x 96, which fit COCO's
640 x 480 photographs rather than small canvases.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from common.config import parse_model_kwargs
from common.errors import ConfigError
from common.export import load_run
from common.sections import TTA

# Nothing above imports torch: --help and a mistyped flag are answered at once. evaluate_run and draw
# import torch, the data sets and the tasks where they use them.
if TYPE_CHECKING:
    import torch

ZOOM = 4  # drawn test images are enlarged this many times


def _xywh(box) -> list[float]:
    return [float(box[0]), float(box[1]), float(box[2] - box[0]), float(box[3] - box[1])]


def coco_ground_truth(images: list[tuple[int, int]], targets: list[dict], names: list[str]) -> dict:
    """COCO's ground-truth file for images (height, width) and their targets. Image ids are 1..N in
    the order given; category id k + 1 is label k."""
    annotations = []
    for i, t in enumerate(targets):
        for box, label in zip(t["boxes"], t["labels"]):
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": int(label) + 1,
                                "bbox": _xywh(box), "area": float((box[2] - box[0]) * (box[3] - box[1])),
                                "iscrowd": 0})
    return {"images": [{"id": i + 1, "height": h, "width": w, "file_name": f"{i + 1}.png"}
                       for i, (h, w) in enumerate(images)],
            "annotations": annotations,
            "categories": [{"id": k + 1, "name": name} for k, name in enumerate(names)]}


def coco_results(detections: list[dict]) -> list[dict]:
    """COCO's results list of the detections of images 1..N, as `coco_ground_truth` numbers them."""
    return [{"image_id": i + 1, "category_id": int(label) + 1, "bbox": _xywh(box), "score": float(score)}
            for i, d in enumerate(detections)
            for box, score, label in zip(d["boxes"], d["scores"], d["labels"])]


def ap_by_area(gt: dict, results: list[dict], small: float, large: float) -> dict[str, float]:
    """COCO's AP and AR of `results` against `gt` (the two files' contents) with objects under `small`
    pixels of area called small and over `large` called large (COCO: 32 ** 2 and 96 ** 2), by
    faster_coco_eval's COCOeval: map, map_50, map_75, map_small, map_medium, map_large, mar_100 and
    mar_small, mar_medium, mar_large; -1 where no object of a size exists (COCO's convention)."""
    from faster_coco_eval import COCO, COCOeval_faster

    if not 0 < small < large:
        raise ValueError(f"areas must be 0 < small < large, got {small} and {large}")
    truth = COCO()
    truth.dataset = gt
    truth.createIndex()
    found = truth.loadRes(results) if results else COCO()
    evaluation = COCOeval_faster(truth, found, iouType="bbox", print_function=lambda *a: None,
                                 ranges={"small": [0, small], "medium": [small, large], "large": [large, 1e10]})
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    s = evaluation.stats  # AP, AP50, AP75, AP s/m/l, AR@1, AR@10, AR@100, AR s/m/l
    names = ("map", "map_50", "map_75", "map_small", "map_medium", "map_large", "mar_1", "mar_10", "mar_100",
             "mar_small", "mar_medium", "mar_large")
    return {name: float(v) for name, v in zip(names, s)}


def draw(image: torch.Tensor, boxes: torch.Tensor, labels: list[str], colour: str = "lime", zoom: int = 1
         ) -> torch.Tensor:
    """An image (3, H, W) in [0, 1] with its boxes and their labels drawn on, as uint8, enlarged zoom
    times (nearest pixel) so that the labels of small images can be read."""
    import torch
    from torchvision.utils import draw_bounding_boxes

    image = torch.nn.functional.interpolate(image[None], scale_factor=zoom, mode="nearest")[0] if zoom > 1 else image
    boxes = boxes * zoom
    picture = (image.clamp(0, 1) * 255).to(torch.uint8)
    if len(boxes) == 0:
        return picture
    return draw_bounding_boxes(picture, boxes, labels=labels, colors=colour, width=1)


def evaluate_run(run_dir: Path, batch_size: int = 32, draw_n: int = 0, threshold: float = 0.5,
                 model_kwargs: dict | None = None, areas: tuple[float, float] | None = None,
                 tta: str | None = None) -> dict[str, float]:
    import torch

    from common.data import dataset_for, eval_loader, options
    from common.data.checks import check_tta
    from common.data.collate import to_device
    from common.tasks import flip_tta, get_task

    model, cfg = load_run(run_dir, model_kwargs)
    tta = cfg.tta if tta is None else tta
    data = dataset_for(cfg)
    if areas and data.task != "detection":
        raise ConfigError(f"--areas scores detections by object size; {run_dir} trained {cfg.paper} on {cfg.dataset}")
    check_tta(tta, data, data.is_variable(cfg.image_size))
    facts = data.facts(**options(cfg))
    task = get_task(data.task, facts)
    _, test_set = data.read(**options(cfg))
    loader = eval_loader(test_set, batch_size, rank=0, world_size=1,
                         collate=data.collate(cfg.pad_multiple, image_size=cfg.image_size))
    metrics = task.build_metrics(torch.device("cpu"))
    kept = []  # detection: (image, its size, target, detections) in test-split order
    with torch.no_grad():
        for batch in loader:
            inputs, targets = to_device(batch, torch.device("cpu"))
            if tta == "flip":
                outputs = flip_tta(lambda x: task.forward(model, x, targets), inputs)
            else:
                outputs = task.forward(model, inputs, targets)
            task.update(metrics, outputs, targets)
            if data.task == "detection":
                mask = inputs["mask"] if isinstance(inputs, dict) else None
                images = inputs["images"] if isinstance(inputs, dict) else inputs
                for k, (t, d) in enumerate(zip(targets, outputs)):
                    h, w = ((int(mask[k].any(1).sum()), int(mask[k].any(0).sum())) if mask is not None
                            else tuple(images.shape[2:]))
                    kept.append((images[k, :, :h, :w], (h, w), t, d))
    results = task.compute(metrics)
    if data.task == "detection":
        names = data.preprocess(**options(cfg))["labels"]
        sizes, targets, detections = [k[1] for k in kept], [k[2] for k in kept], [k[3] for k in kept]
        gt, found = coco_ground_truth(sizes, targets, names), coco_results(detections)
        (run_dir / "gt.json").write_text(json.dumps(gt))
        (run_dir / "detections.json").write_text(json.dumps(found))
        if areas:
            results.update(ap_by_area(gt, found, *areas))
        if draw_n:
            from torchvision.io import write_png

            (run_dir / "eval").mkdir(exist_ok=True)
            for n, (image, _, t, d) in enumerate(kept[:draw_n]):
                shown = d["scores"] >= threshold
                truth = draw(image, t["boxes"], [names[int(c)] for c in t["labels"]], zoom=ZOOM)
                found = draw(image, d["boxes"][shown], [f"{names[int(c)]} {float(s):.2f}" for c, s in
                                                        zip(d["labels"][shown], d["scores"][shown])], "orange", ZOOM)
                gap = torch.full((3, truth.shape[1], 8), 255, dtype=torch.uint8)
                write_png(torch.cat([truth, gap, found], dim=2), str(run_dir / "eval" / f"test-{n}.png"))
    return results


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m common.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, type=Path, help="a finished run directory")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--draw", type=int, default=0, help="detection: draw the first N test images with their boxes")
    p.add_argument("--threshold", type=float, default=0.5, help="with --draw: the lowest score drawn")
    p.add_argument("--model-kwargs", nargs="+", default=[], metavar="KEY=VALUE",
                   help="the model's arguments changed for this evaluation (the weights must still fit), "
                        "e.g. \"rpn_post_nms_top_n=(150, 10)\"")
    p.add_argument("--tta", choices=TTA, help="image classification: none, or flip (the mean of the logits of each "
                                              "image and its mirror image); default: the run's own --tta")
    p.add_argument("--areas", nargs=2, type=float, metavar=("SMALL", "LARGE"),
                   help="detection: objects under SMALL pixels of area are small, over LARGE large "
                        "(COCO: 1024 and 9216)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        kwargs = parse_model_kwargs(args.model_kwargs)
    except ValueError as e:
        p.error(str(e))
    try:
        results = evaluate_run(args.run, args.batch_size, args.draw, args.threshold, kwargs, args.areas, args.tta)
    except (ConfigError, ValueError) as e:
        print(f"evaluate: error: {e}", file=sys.stderr)
        return 2
    for name, value in results.items():
        print(f"{name}: {value:.4f}")
    if (args.run / "detections.json").is_file():
        print(f"wrote {args.run / 'gt.json'} and {args.run / 'detections.json'} (COCO format)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
