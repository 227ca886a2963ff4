"""Tasks: how a model's outputs are trained and scored, whatever the targets are.

A task turns a model's outputs and a batch's targets into the training loss,
and scores an evaluation set: it builds its metric objects (common.metrics'
running sums, or torchmetrics' where a metric is more than sums), updates them
with every batch a rank evaluates, and reads them once their states are
summed or gathered across ranks (gloo on a CPU, nccl on GPUs). Targets are whatever the data set gives: a tensor, a dict of tensors,
or a list with one dict per sample (see common.data.collate). Data sets name
their task kind; the trainer has no special cases.

A new kind of task subclasses `Task` (kind, metric, higher_is_better, loss,
metrics, update) and is added with `register`.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.data.collate import IGNORE_INDEX
from common.data.mlm import IGNORE_INDEX as NOT_CHOSEN  # a masked-LM label not chosen (-100)
from common.metrics import BLEU, Accuracy, Mean, MeanSquaredError, Metrics, Sum

if TYPE_CHECKING:  # torchmetrics' package imports all of its metrics (torchvision, transformers): seconds, paid
    from torchmetrics import Metric  # only by the tasks that use it (detection, segmentation), when they build metrics


def call(model: nn.Module, inputs):
    """The model on a batch's inputs: `model(images, mask=...)`, `model(x, lengths=...)`,
    `model(src, src_lengths, tgt)` for pairs, `model(**inputs)` for other keyword inputs, or `model(x)`
    for a plain tensor."""
    if not isinstance(inputs, dict):
        return model(inputs)
    if "images" in inputs:
        return model(inputs["images"], mask=inputs.get("mask"))
    if "x" in inputs:
        return model(inputs["x"], lengths=inputs.get("lengths"))
    if "src" in inputs:  # a source and the decoder's teacher-forced input
        return model(inputs["src"], inputs["src_lengths"], inputs["tgt"])
    return model(**inputs)


class Task:
    """What the trainer needs of a kind of task.

    Args:
        facts: the data set's facts (num_classes, ...; see common.data.DatasetSpec).
        label_smoothing: for tasks with classes, the smoothing of the training loss.
    """

    kind = ""
    metric = ""  # the metric that ranks runs and picks the best epoch; metrics() holds it and "loss"
    higher_is_better = True
    beside: tuple[str, ...] = ()  # metrics the leaderboard shows beside the ranking one
    train_metric: str | None = None  # scored on the training batches as they are trained (train/<name>)
    teacher: nn.Module | None = None  # knowledge distillation's (--teacher): `taught` adds its outputs in training

    def __init__(self, facts: dict | None = None, label_smoothing: float = 0.0):
        self.facts, self.label_smoothing = facts or {}, label_smoothing

    def forward(self, model: nn.Module, inputs, targets):
        """The model's outputs on a batch. Models read the inputs alone; a task whose models also read
        the targets while training (teacher forcing, proposals sampled around true boxes) passes them."""
        return call(model, inputs)

    def loss(self, outputs, targets) -> torch.Tensor:
        """The scalar training loss of a batch."""
        raise NotImplementedError

    def metrics(self) -> dict:
        """Fresh metric objects (common.metrics' or torchmetrics'), on the CPU: `self.metric` and "loss", and any
        others."""
        raise NotImplementedError

    def update(self, metrics: Metrics, outputs, targets) -> None:
        """Add one evaluated batch to the metrics."""
        raise NotImplementedError

    def train_counts(self, outputs, targets) -> torch.Tensor:
        """(hits, samples) of a training batch, for `train_metric`: float64 on the outputs' device."""
        raise NotImplementedError

    def build_metrics(self, device: torch.device) -> Metrics:
        return Metrics(self.metrics()).to(device)

    def compute(self, metrics: Metrics) -> dict[str, float]:
        """Every metric over all that was evaluated, on every rank (each metric gathers its
        states from all ranks first). Every rank must call it."""
        return {name: float(value) for name, value in metrics.compute().items() if value.numel() == 1}

    def describe(self, metrics: dict[str, float]) -> str:
        """One line for the end of an epoch."""
        return f"test {self.metric} {metrics[self.metric]:.4g}, loss {metrics['loss']:.4g}"


def hard_distillation(Z_s: torch.Tensor, Z_d: torch.Tensor, Z_t: torch.Tensor, y: torch.Tensor,
                      cross_entropy=F.cross_entropy) -> torch.Tensor:
    """DeiT's hard-label distillation (Section 4): 1/2 L_CE(psi(Z_s), y) + 1/2 L_CE(psi(Z_d), y_t), where
    y_t = argmax_c Z_t(c) is the teacher's hard decision. Z_s: the class head's logits, Z_d: the
    distillation head's (the class head's again for a student without one), Z_t: the teacher's, all (B, K);
    `cross_entropy` scores the true label (with its smoothing, or Mixup's mixed targets)."""
    y_t = Z_t.argmax(dim=-1)  # (B,)
    return cross_entropy(Z_s, y) / 2 + F.cross_entropy(Z_d, y_t) / 2


def soft_distillation(Z_s: torch.Tensor, Z_d: torch.Tensor, Z_t: torch.Tensor, y: torch.Tensor, tau: float,
                      lam: float, cross_entropy=F.cross_entropy) -> torch.Tensor:
    """DeiT's Eq. 2 (Hinton et al.'s distillation): (1 - lambda) L_CE(psi(Z_s), y) + lambda tau^2
    KL(psi(Z_t / tau) || psi(Z_d / tau)), the KL divergence from the teacher's softened distribution to the
    student's, averaged over the batch. Names as in `hard_distillation`."""
    kl = F.kl_div(F.log_softmax(Z_d / tau, dim=-1), F.log_softmax(Z_t / tau, dim=-1), reduction="batchmean",
                  log_target=True)
    return (1 - lam) * cross_entropy(Z_s, y) + lam * tau ** 2 * kl


def masked_lm_sums(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """BERT's masked-LM scores as sums over the chosen positions (Section 3.1: "T_i will be used to predict
    the original token with cross entropy loss"), which add up over batches and ranks: the summed negative
    log-likelihood, the correct argmax predictions and the count of chosen positions. A position labelled
    NOT_CHOSEN (not chosen, or padding) counts in none of them, whatever its logits.

    Args:
        logits: (B, T, V) the MLM head's.
        labels: (B, T) the original ids where chosen, NOT_CHOSEN elsewhere (common.data.mlm.mask_tokens).
    """
    chosen = labels != NOT_CHOSEN  # (B, T)
    nll = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=NOT_CHOSEN,
                          reduction="sum")  # () over the chosen positions
    correct = ((logits.argmax(-1) == labels) & chosen).sum()  # ()
    return nll, correct, chosen.sum()


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The masked-LM training loss: the mean cross-entropy over the batch's chosen positions, each token
    weighing the same whichever sequence holds it (zero where none is chosen)."""
    nll, _, count = masked_lm_sums(logits, labels)
    return nll / count.clamp(min=1)


def masked_lm_metrics(nll: float, correct: float, count: float) -> dict[str, float]:
    """Loss (the mean over every chosen token), MLM accuracy and perplexity (exp of that loss) from
    masked_lm_sums summed over an evaluation set."""
    loss = nll / count
    return {"loss": loss, "mlm_accuracy": correct / count, "perplexity": math.exp(loss)}


class Classification(Task):
    """Cross-entropy with optional label smoothing on logits (B, classes); scored by top-1 accuracy
    and the cross-entropy without smoothing. Targets are labels (B,), or mixed ones (B, classes) from
    Mixup and CutMix (common.data.augment), which carry their smoothing already.

    A model with auxiliary classifiers (GoogLeNet's) returns, in training, {"logits": (B, classes),
    "aux": [(aux logits (B, classes), weight), ...]}: each auxiliary loss is added with its weight.
    A model with an auxiliary objective of its own inputs (GPT's language modelling of the passage,
    L_3 = L_2 + lambda L_1) returns its loss there instead: {"logits": ..., "aux_losses": [(scalar loss,
    weight), ...]}. A model with a distillation head (DeiT) returns {"logits": ..., "distillation":
    (B, classes)}. In eval mode each returns the logits alone.

    Args:
        teacher: knowledge distillation (--teacher): a model in eval mode whose logits on each training
            batch (`taught`: without gradients, never on evaluated batches) the `distillation` loss reads.
        distillation: "soft" or "hard" (see `soft_distillation`, `hard_distillation`), with a teacher.
        tau, lam: the soft distillation's temperature and weight.
    """

    kind = "classification"
    metric = "accuracy"
    higher_is_better = True
    train_metric = "accuracy"  # the training error of the papers' curves is 1 minus it

    def __init__(self, facts: dict | None = None, label_smoothing: float = 0.0, teacher: nn.Module | None = None,
                 distillation: str = "none", tau: float = 3.0, lam: float = 0.1):
        super().__init__(facts, label_smoothing)
        self.teacher, self.distillation, self.tau, self.lam = teacher, distillation, tau, lam

    def taught(self, outputs, inputs) -> dict:
        """A training batch's outputs with the teacher's logits beside them, {"logits", ["distillation",]
        "teacher"}: the teacher runs without gradients (common.step.forward_loss calls this in training only,
        so evaluation never sees the teacher)."""
        with torch.no_grad():
            Z_t = call(self.teacher, inputs)  # (B, classes)
        return (outputs if isinstance(outputs, dict) else {"logits": outputs}) | {"teacher": Z_t.float()}

    def cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if targets.is_floating_point():  # mixed targets (B, classes), smoothed by Mixup already
            return F.cross_entropy(logits.float(), targets)
        return F.cross_entropy(logits.float(), targets, label_smoothing=self.label_smoothing)

    def loss(self, logits, targets: torch.Tensor) -> torch.Tensor:
        if isinstance(logits, dict) and ("teacher" in logits or "distillation" in logits):
            return self.distillation_loss(logits, targets)
        if isinstance(logits, dict):  # the main classifier and the weighted auxiliary ones (or losses)
            aux = sum(w * self.loss(a, targets) for a, w in logits.get("aux", ()))
            aux = aux + sum(w * loss for loss, w in logits.get("aux_losses", ()))
            return self.loss(logits["logits"], targets) + aux
        return self.cross_entropy(logits, targets)

    def distillation_loss(self, outputs: dict, targets: torch.Tensor) -> torch.Tensor:
        """DeiT's losses (Section 4) on the class head's logits Z_s and the distillation head's Z_d (Z_s
        where the student has none); without a teacher the distillation head learns the labels too."""
        Z_s = outputs["logits"].float()
        Z_d, Z_t = outputs.get("distillation", Z_s).float(), outputs.get("teacher")
        if Z_t is None:
            return (self.cross_entropy(Z_s, targets) + self.cross_entropy(Z_d, targets)) / 2
        if self.distillation == "hard":
            return hard_distillation(Z_s, Z_d, Z_t, targets, self.cross_entropy)
        return soft_distillation(Z_s, Z_d, Z_t, targets, self.tau, self.lam, self.cross_entropy)

    @torch.no_grad()
    def train_counts(self, logits, targets: torch.Tensor) -> torch.Tensor:
        logits = logits["logits"] if isinstance(logits, dict) else logits  # the main classifier's
        labels = targets.argmax(-1) if targets.is_floating_point() else targets  # mixed: the larger share's
        hits = (logits.argmax(-1) == labels).sum()
        return torch.stack([hits, hits.new_tensor(labels.numel())]).double()

    def metrics(self) -> dict:
        return {"accuracy": Accuracy(), "loss": Mean()}  # in float64: correct / count is exact, as it is counted

    def update(self, metrics: Metrics, logits: torch.Tensor, targets: torch.Tensor) -> None:
        logits = logits.float()
        metrics["accuracy"].update(logits, targets)
        metrics["loss"].update(F.cross_entropy(logits, targets, reduction="none"))


class Regression(Task):
    """Mean squared error against a scalar target; the model's head has one output. Lower is better.
    Where a data set states a tolerance (facts["tolerance"]: the 1997 adding problem's 0.04), also the
    share of samples "processed correctly", within it ("correct")."""

    kind = "regression"
    metric = "mse"
    higher_is_better = False
    beside = ("correct",)

    @staticmethod
    def _pair(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return outputs.float().reshape(targets.shape), targets.float()  # (B, 1) -> (B,)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(*self._pair(outputs, targets))

    def metrics(self) -> dict:
        metrics = {"mse": MeanSquaredError(), "loss": MeanSquaredError()}
        if "tolerance" in self.facts:
            metrics["correct"] = Mean()
        return metrics

    def update(self, metrics: Metrics, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        pair = self._pair(outputs, targets)
        metrics["mse"].update(*pair)
        metrics["loss"].update(*pair)
        if "tolerance" in self.facts:
            metrics["correct"].update(((pair[0] - pair[1]).abs() < self.facts["tolerance"]).double())

    def describe(self, metrics: dict[str, float]) -> str:
        correct = f", correct {metrics['correct']:.4g}" if "correct" in metrics else ""
        return super().describe(metrics) + correct


class Detection(Task):
    """Object detection: every image has its own number of boxes.

    Targets are a list with one dict per image: {"boxes": (n, 4) x1 y1 x2 y2 in pixels, "labels":
    (n,) int64}, n possibly 0. A detection model computes its own loss, which is part of each paper's
    contribution: in training, `model(images, mask=mask, targets=targets)` returns named, weighted
    loss terms, whose sum is the loss; in eval mode, `model(images, mask=mask)` returns one dict per
    image, {"boxes", "scores", "labels"}. Scored by COCO's mean average precision over IoU
    thresholds .5 to .95 ("map"), at .5 ("map_50") and .75, and its mean average recall with 100
    detections per image ("mar_100"), with torchmetrics' MeanAveragePrecision (faster_coco_eval's
    implementation of the COCO evaluation). The evaluation has no loss: the models give detections.
    """

    kind = "detection"
    metric = "map"
    higher_is_better = True
    REPORTED = ("map", "map_50", "map_75", "map_small", "map_medium", "map_large", "mar_1", "mar_10", "mar_100")

    def forward(self, model: nn.Module, inputs, targets):
        images, mask = (inputs["images"], inputs.get("mask")) if isinstance(inputs, dict) else (inputs, None)
        if model.training:
            return model(images, mask=mask, targets=targets)
        return model(images, mask=mask)

    def loss(self, outputs: dict[str, torch.Tensor], targets) -> torch.Tensor:
        return sum(outputs.values())

    def metrics(self) -> dict:
        return {"map": gathered_mean_average_precision()}

    def update(self, metrics: Metrics, outputs: list[dict], targets: list[dict]) -> None:
        detections = [{k: d[k].float() if k != "labels" else d[k] for k in ("boxes", "scores", "labels")}
                      for d in outputs]
        metrics["map"].update(detections, [{"boxes": t["boxes"].float(), "labels": t["labels"]} for t in targets])

    def compute(self, metrics: Metrics) -> dict[str, float]:
        values = metrics.compute()
        return {name: float(values[name]) for name in self.REPORTED}

    def describe(self, metrics: dict[str, float]) -> str:
        return f"test map {metrics['map']:.4g}, map_50 {metrics['map_50']:.4g}, mar_100 {metrics['mar_100']:.4g}"


class Segmentation(Task):
    """Semantic segmentation: a class for every pixel.

    Inputs are images, padded with a mask where their sizes differ; targets a dict of per-pixel maps
    (common.data.collate.pad_segmentation): "labels" (B, H, W) class ids, IGNORE_INDEX (255) where a
    pixel has none (void object borders, as PASCAL VOC marks them, and the padding), and what else the
    data set gives per pixel ("instances": the object each pixel belongs to, 0 for none). The model gives
    class scores (B, classes, H, W), or torchvision's dict {"out": scores, "aux": an auxiliary head's}.

    The loss is the per-pixel cross-entropy averaged over the labelled pixels (with label smoothing), plus
    AUX_WEIGHT times the auxiliary head's (torchvision's references' 0.5); where the targets hold "weights"
    (B, H, W), each pixel's term is multiplied by its weight. Scored on the labelled pixels with
    torchmetrics: the intersection over union of each class (MulticlassJaccardIndex; "iou_<class>" for
    each class present in the labels or the predictions), their mean over those classes ("mean_iou", which
    ranks runs: the FCN paper's mean IU), the share of pixels classified right ("pixel_accuracy",
    MulticlassAccuracy, micro) and the cross-entropy per labelled pixel ("loss"). Every one is a sum over
    pixels, so a padded batch scores as its images one at a time. Facts: num_classes, and "classes", their
    names (for the per-class keys).
    """

    kind = "segmentation"
    metric = "mean_iou"
    higher_is_better = True
    beside = ("pixel_accuracy",)
    train_metric = "pixel_accuracy"
    AUX_WEIGHT = 0.5

    @staticmethod
    def scores(outputs) -> torch.Tensor:
        """The main head's class scores (B, classes, H, W), in float32."""
        return (outputs["out"] if isinstance(outputs, dict) else outputs).float()

    def pixel_losses(self, scores: torch.Tensor, targets: dict, smoothing: float = 0.0) -> torch.Tensor:
        """Each labelled pixel's cross-entropy, weighted where the targets give weights: (pixels,)."""
        labels = targets["labels"]
        losses = F.cross_entropy(scores.float(), labels, ignore_index=IGNORE_INDEX, reduction="none",
                                 label_smoothing=smoothing)  # (B, H, W), 0 where ignored
        if "weights" in targets:
            losses = losses * targets["weights"]
        return losses[labels != IGNORE_INDEX]

    def loss(self, outputs, targets: dict) -> torch.Tensor:
        loss = self.pixel_losses(self.scores(outputs), targets, self.label_smoothing).mean()
        if isinstance(outputs, dict) and outputs.get("aux") is not None:
            loss = loss + self.AUX_WEIGHT * self.pixel_losses(outputs["aux"], targets, self.label_smoothing).mean()
        return loss

    @torch.no_grad()
    def train_counts(self, outputs, targets: dict) -> torch.Tensor:
        labels = targets["labels"]
        labelled = labels != IGNORE_INDEX
        hits = ((self.scores(outputs).argmax(1) == labels) & labelled).sum()
        return torch.stack([hits, labelled.sum()]).double()

    def metrics(self) -> dict:
        from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex  # a second or two

        K = self.facts["num_classes"]
        return {"iou": MulticlassJaccardIndex(K, average="none", ignore_index=IGNORE_INDEX, zero_division=math.nan),
                "pixel_accuracy": MulticlassAccuracy(K, average="micro", ignore_index=IGNORE_INDEX),
                "loss": Mean()}

    def update(self, metrics: Metrics, outputs, targets: dict) -> None:
        scores, labels = self.scores(outputs), targets["labels"]
        predicted = scores.argmax(1)  # (B, H, W)
        metrics["iou"].update(predicted, labels)
        metrics["pixel_accuracy"].update(predicted, labels)
        metrics["loss"].update(self.pixel_losses(scores, {"labels": labels}))

    def class_names(self) -> list[str]:
        """Each class's name as a metric's key: lower case, runs of other characters as "_"."""
        names = self.facts.get("classes") or [str(k) for k in range(self.facts["num_classes"])]
        return ["_".join(re.findall(r"[a-z0-9]+", str(name).lower())) for name in names]

    def compute(self, metrics: Metrics) -> dict[str, float]:
        values = metrics.compute()
        iou = values.pop("iou").double()  # (classes,), NaN for a class neither in the labels nor predicted
        per_class = {f"iou_{name}": float(v) for name, v in zip(self.class_names(), iou) if not v.isnan()}
        return {"mean_iou": float(iou.nanmean()), **{k: float(v) for k, v in values.items()}, **per_class}

    def describe(self, metrics: dict[str, float]) -> str:
        return (f"test mean IoU {metrics['mean_iou']:.4g}, pixel accuracy {metrics['pixel_accuracy']:.4g}, "
                f"loss {metrics['loss']:.4g}")


class Seq2Seq(Task):
    """Sequence to sequence (translation): a source token sequence to a target token sequence.

    Inputs {"src": (B, S) ids, "src_lengths": (B,), "tgt": (B, T), "mask": (B, S)}; targets (B, T) ids, each
    ending with </s>, padded with pad_id (common.data.collate.pad_pairs). The model reads "tgt", the
    targets shifted right behind <s> (teacher forcing): `model(src, src_lengths, tgt)` gives logits
    (B, T, V), trained by cross-entropy over the target tokens with padding ignored (and label
    smoothing, as the Transformer's). Evaluation decodes (common.decode: greedy, or beam search with
    `beam` > 1 and the paper's length penalty) and scores corpus BLEU (common.metrics.BLEU, torchmetrics'
    SacreBLEUScore as sums: sacrebleu's algorithm, 0 to 100 as papers report it; characters as tokens on character-level data,
    sacrebleu's 13a tokenizer on words), the exact match of whole sequences, and the teacher-forced
    loss per target token with its perplexity. Facts: pad_id, bos_id, eos_id, itos (the vocabulary's
    strings), level ("char" or "word"), and where a data set states it, max_target_length (decoding
    stops there; else at twice the source's length and 10).
    """

    kind = "seq2seq"
    metric = "bleu"
    higher_is_better = True
    beside = ("exact_match",)
    REPORTED = ("bleu", "exact_match", "loss", "perplexity")

    def __init__(self, facts: dict | None = None, label_smoothing: float = 0.0, beam: int = 1,
                 length_penalty: float = 0.0):
        super().__init__(facts, label_smoothing)
        self.beam, self.length_penalty = beam, length_penalty  # alpha of Wu et al.'s penalty; 0: none

    def forward(self, model: nn.Module, inputs, targets):
        logits = call(model, inputs)  # (B, T, V), teacher-forced
        if model.training:
            return logits
        from torch.distributed.fsdp import FSDPModule

        from common import decode, parallel

        ids = dict(bos_id=self.facts["bos_id"], eos_id=self.facts["eos_id"], pad_id=self.facts["pad_id"])
        # decode up to the data set's longest target where it states one, else twice the source and 10
        max_len = self.facts.get("max_target_length", 2 * inputs["src"].shape[1] + 10)
        all_done = decode.every
        if isinstance(model, FSDPModule):  # each decode_step gathers parameters: all ranks take as many steps
            max_len = parallel.all_reduce_max(max_len)
            all_done = lambda done: parallel.all_reduce_max(int(not done.all())) == 0
        if self.beam > 1:
            penalty = decode.gnmt_penalty(self.length_penalty) if self.length_penalty else decode.no_penalty
            tokens = decode.beam_search(model, inputs["src"], inputs["src_lengths"], max_len, beam=self.beam,
                                        length_penalty=penalty, all_done=all_done, **ids)
        else:
            tokens = decode.greedy(model, inputs["src"], inputs["src_lengths"], max_len, all_done=all_done, **ids)
        return {"logits": logits, "tokens": tokens}

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=self.facts["pad_id"],
                               label_smoothing=self.label_smoothing)

    def text(self, ids) -> str:
        """The text of ids up to the first </s>: characters joined, or words with spaces."""
        itos, out = self.facts["itos"], []
        for i in (int(i) for i in ids):
            if i == self.facts["eos_id"]:
                break
            if i not in (self.facts["pad_id"], self.facts["bos_id"]):
                out.append(itos[i])
        return ("" if self.facts.get("level", "word") == "char" else " ").join(out)

    def metrics(self) -> dict:
        tokenize = "char" if self.facts.get("level") == "char" else "13a"
        return {"bleu": BLEU(tokenize=tokenize), "exact_match": Mean(), "loss": Mean()}

    def update(self, metrics: Metrics, outputs: dict, targets: torch.Tensor) -> None:
        hypotheses = [self.text(t) for t in outputs["tokens"]]
        references = [self.text(t) for t in targets]
        metrics["bleu"].update(hypotheses, [[r] for r in references])
        metrics["exact_match"].update(torch.tensor([h == r for h, r in zip(hypotheses, references)],
                                                   dtype=torch.float64))
        nll = F.cross_entropy(outputs["logits"].float().transpose(1, 2), targets, reduction="none")  # (B, T)
        valid = targets != self.facts["pad_id"]
        metrics["loss"].update(nll[valid].double())  # the mean over every target token

    def compute(self, metrics: Metrics) -> dict[str, float]:
        values = super().compute(metrics)
        values["bleu"] *= 100
        values["perplexity"] = math.exp(values["loss"])
        return values

    def describe(self, metrics: dict[str, float]) -> str:
        return (f"test bleu {metrics['bleu']:.4g}, exact match {metrics['exact_match']:.4g}, "
                f"perplexity {metrics['perplexity']:.4g}")


class LanguageModeling(Task):
    """Next-token prediction: inputs (B, T) token ids, targets (B, T) the same block shifted by one.

    The model gives logits (B, T, V); training minimises their cross-entropy. Evaluation reports the
    loss per token, its perplexity, and bits per character, which compares tokenizers: the summed
    negative log-likelihood in bits over the characters the target tokens stand for (one each at
    character level; `token_chars`, a list of each id's length, where the facts give it), ranked
    lower is better. Metrics are sums gathered from every rank.
    """

    kind = "language-modeling"
    metric = "bits_per_char"
    higher_is_better = False
    REPORTED = ("bits_per_char", "loss", "perplexity")

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), label_smoothing=self.label_smoothing)

    def metrics(self) -> dict:
        return {"nll": Sum(), "tokens": Sum(), "chars": Sum()}

    def update(self, metrics: Metrics, logits: torch.Tensor, targets: torch.Tensor) -> None:
        nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")
        metrics["nll"].update(nll.double())
        metrics["tokens"].update(float(targets.numel()))
        chars = self.facts.get("token_chars")
        metrics["chars"].update(float(targets.numel()) if chars is None else
                                torch.as_tensor(chars, dtype=torch.float64, device=targets.device)[targets].sum())

    def compute(self, metrics: Metrics) -> dict[str, float]:
        values = {k: float(v) for k, v in metrics.compute().items()}
        loss = values["nll"] / values["tokens"]
        return {"bits_per_char": values["nll"] / math.log(2) / values["chars"], "loss": loss,
                "perplexity": math.exp(loss)}

    def describe(self, metrics: dict[str, float]) -> str:
        return f"test bits per character {metrics['bits_per_char']:.4g}, perplexity {metrics['perplexity']:.4g}"


class MaskedLanguageModeling(Task):
    """BERT's pre-training (Section 3.1): the masked LM, and next sentence prediction where the data has it.

    Inputs {"idx": (B, T) ids with the chosen tokens replaced, "segments": (B, T), "mask": (B, T)}; targets
    {"labels": (B, T) the original ids of the chosen positions, NOT_CHOSEN elsewhere (padding too),
    "next_sentence_label": (B,) 0 IsNext, 1 NotNext} (common.data.sentence_pairs; single segments have no
    next_sentence_label). The model gives (MLM logits (B, T, V), NSP logits (B, 2) or None). The loss is
    the released code's: the masked LM's cross-entropy averaged over the batch's chosen tokens, plus NSP's
    averaged over its pairs where the data labels them. The loss counts only the chosen positions: a
    padded batch's summed scores are those of its sequences alone (masked_lm_sums). Evaluation reports
    the MLM accuracy (the share of chosen tokens predicted, ranked higher is better), perplexity (exp
    of the MLM loss per chosen token), NSP accuracy and loss, and their sum ("loss"), as sums over
    every rank's batches.
    """

    kind = "masked-lm"
    metric = "mlm_accuracy"
    higher_is_better = True
    beside = ("perplexity", "nsp_accuracy")
    train_metric = "mlm_accuracy"

    def loss(self, outputs: tuple, targets: dict) -> torch.Tensor:
        mlm_logits, nsp_logits = outputs
        loss = masked_lm_loss(mlm_logits, targets["labels"])
        if nsp_logits is not None and "next_sentence_label" in targets:
            loss = loss + F.cross_entropy(nsp_logits.float(), targets["next_sentence_label"])
        return loss

    @torch.no_grad()
    def train_counts(self, outputs: tuple, targets: dict) -> torch.Tensor:
        _, correct, count = masked_lm_sums(outputs[0], targets["labels"])
        return torch.stack([correct, count]).double()

    def metrics(self) -> dict:
        return {"nll": Sum(), "correct": Sum(), "count": Sum(), "nsp_accuracy": Accuracy(), "nsp_loss": Mean()}

    def update(self, metrics: Metrics, outputs: tuple, targets: dict) -> None:
        mlm_logits, nsp_logits = outputs
        for name, value in zip(("nll", "correct", "count"), masked_lm_sums(mlm_logits, targets["labels"])):
            metrics[name].update(value.double())
        if nsp_logits is not None and "next_sentence_label" in targets:
            metrics["nsp_accuracy"].update(nsp_logits.float(), targets["next_sentence_label"])
            metrics["nsp_loss"].update(F.cross_entropy(nsp_logits.float(), targets["next_sentence_label"],
                                                       reduction="none"))

    def compute(self, metrics: Metrics) -> dict[str, float]:
        values = {k: float(v) for k, v in metrics.compute().items()}  # NaN NSP scores where nothing had NSP
        scores = masked_lm_metrics(values["nll"], values["correct"], values["count"])
        if not math.isnan(values["nsp_accuracy"]):
            scores |= {"mlm_loss": scores["loss"], "nsp_accuracy": values["nsp_accuracy"],
                       "nsp_loss": values["nsp_loss"], "loss": scores["loss"] + values["nsp_loss"]}
        return scores

    def describe(self, metrics: dict[str, float]) -> str:
        nsp = f", NSP accuracy {metrics['nsp_accuracy']:.4g}" if "nsp_accuracy" in metrics else ""
        return f"test MLM accuracy {metrics['mlm_accuracy']:.4g}, perplexity {metrics['perplexity']:.4g}{nsp}"


def gathered_mean_average_precision() -> Metric:
    """torchmetrics' MeanAveragePrecision (COCO's bbox evaluation by faster_coco_eval) whose per-image
    states come from every rank in one all_gather_object. Its own synchronisation gathers each image's
    tensors one collective at a time: on two ranks over gloo, 500 images of 20 detections each took
    12.1 s to compute against 2.7 s gathered at once, with equal results (tests/test_detection.py)."""
    import torch.distributed as dist
    from torchmetrics.detection import MeanAveragePrecision  # imported here: it takes a second

    class GatheredMeanAveragePrecision(MeanAveragePrecision):
        def _sync_dist(self, dist_sync_fn=None, process_group=None) -> None:
            names = [name for name in self._defaults if isinstance(getattr(self, name), list)]
            everyone = [None] * dist.get_world_size(process_group)
            dist.all_gather_object(everyone, {name: getattr(self, name) for name in names}, group=process_group)
            for name in names:  # rank 0's images, then rank 1's, ...: every state in the same order
                setattr(self, name, [item for states in everyone for item in states[name]])

    return GatheredMeanAveragePrecision(box_format="xyxy", iou_type="bbox", backend="faster_coco_eval")


TASKS = {task.kind: task for task in (Classification, Regression, Detection, Segmentation, Seq2Seq, LanguageModeling,
                                       MaskedLanguageModeling)}


def flip_tta(forward: Callable, inputs: torch.Tensor):
    """--tta flip: each test image scored by the mean of its logits and its mirror image's (left to right).
    Both forwards run on every rank (a pipeline's stages before the last give None, and so does this)."""
    outputs, mirrored = forward(inputs), forward(inputs.flip(-1))
    return None if outputs is None else (outputs + mirrored) / 2


def get_task(kind: str, facts: dict | None = None, label_smoothing: float = 0.0, **options) -> Task:
    if kind not in TASKS:
        raise ValueError(f"unknown task kind '{kind}'; choose from: {', '.join(TASKS)}")
    return TASKS[kind](facts, label_smoothing=label_smoothing, **options)


def register(task: type[Task]) -> type[Task]:
    """Add a task kind defined outside this module (a test's, a user's own); its kind must be new."""
    if task.kind in TASKS:
        raise ValueError(f"a task of kind '{task.kind}' is already registered")
    TASKS[task.kind] = task
    return task
