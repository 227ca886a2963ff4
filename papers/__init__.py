"""The registry of papers.

Each paper folder defines a `PAPER` spec; every one is imported here by name,
so none can go missing silently. Adding a paper is one line in `PAPER_FOLDERS`
(docs/adding-a-paper.md); code outside the repository (a test, a user's
own model) adds one with `register`. Importing the registry imports no paper: each paper's folder is
imported when it is first asked for, and `train.py --list` reads papers/catalog.json (see
papers/catalog.py), so that neither it nor `--help` imports torch.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, NamedTuple

if TYPE_CHECKING:
    import torch
    import torch.nn as nn


class ReferenceModel(NamedTuple):
    """A reference implementation that bench row b times ours against (`python -m common.bench --rows b`).

    Args:
        ref: SOURCE:NAME as `--init` takes it ("torchvision:resnet18", "timm:vit_base_patch16_224"),
            built without pretrained weights; the paper's `pretrained[SOURCE]` loader copies its
            weights into ours.
        shape: the input batch both are timed on, forward and backward: (B, C, H, W) of an image
            paper, (B, T) token ids of a paper whose inputs are "tokens".
        kwargs: the reference's constructor arguments (timm.create_model, torchvision's get_model).
        build: builds the reference from kwargs, for a source that `--init` does not take (a language
            model's: "transformers:GPT2LMHeadModel"); None: `SOURCES[source](name, pretrained=False, **kwargs)`
            (common.pretrained).
        load: turns the reference into ours holding its weights; None: the paper's `pretrained[source]`.
    """

    ref: str
    shape: tuple[int, ...]
    kwargs: dict = {}
    build: Callable[..., nn.Module] | None = None
    load: Callable[[nn.Module], nn.Module] | None = None


class PipelineChain(NamedTuple):
    """A model whose forward is a chain of its repeated blocks, as pipeline parallelism (`--pp N`,
    common.pipeline) cuts it: `forward(x) == readout(model, blocks[-1](... blocks[0](embed(model, x))))`
    on inputs of one size, each block taking the running tensor alone (a block that returns a tuple,
    such as GPT's (h, kv), passes on its first element).

    Args:
        embed: what the forward does before the first block; runs on the first stage.
        readout: what it does after the last block (final norm, pooling, head); runs on the last stage,
            followed by the loss.
        first: the model's attributes `embed` reads; only the first stage keeps them.
        last: the attributes `readout` reads; only the last stage keeps them. One in both (GPT's tied
            W_e) is kept by both stages, and its gradient summed between them, so that the two copies
            stay one weight.
    """

    embed: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    readout: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    first: tuple[str, ...]
    last: tuple[str, ...]


@dataclass(frozen=True)
class PaperSpec:
    """What the trainer needs to know about a paper.

    Args:
        name: the --paper value.
        family: cnn, rnn or transformer.
        title, authors, year, url: the paper.
        model: the model class; called with a flavor's keyword arguments.
        flavors: flavor name -> model keyword arguments; "tiny" is the default.
        inputs: the kind of sample the model reads ("image" or "sequence"); datasets must match.
        task: the task kind of its default dataset (see common.tasks).
        defaults: TrainConfig values for this paper (dataset, epochs, lr, ...).
        reference: the trusted implementation it is checked against.
        shard_blocks: the attribute (dotted path) holding the model's repeated blocks, an
            nn.ModuleList; fsdp shards each block as one unit, then the rest. None: fsdp
            shards the model as one unit.
        tp_plan: tensor parallelism (`--tp N`, common.tensor_parallel): paths within each of the
            `shard_blocks` mapped to how their linear layer is split over the ranks, "colwise" (by
            output columns), "colwise-qkv" (a fused q, k, v matrix, by columns within each) or
            "rowwise" (by input rows), and the pre-norms "norm" where --sequence-parallel splits the
            positions. Empty: the paper does not take --tp.
        pipeline: pipeline parallelism (`--pp N`, common.pipeline): how the forward chains the
            `shard_blocks` (see PipelineChain). None: the paper does not take --pp. A model one of whose
            configurations cannot be cut says why in its attribute `pipeline_refusal` (DeiT⚗'s two heads).
        data_kwargs: the facts of a dataset that the model class takes (num_classes,
            in_chans, img_size, input_size, seq_len).
        padded_batches: the model reads padded batches of samples of different sizes:
            `forward(images, mask=None)` with mask (B, H, W), or `forward(x, lengths=None)`
            with lengths (B,), and gives each sample the output it has alone. Only such
            papers train on variable-size data sets; others read one size and need no
            mask code.
        pixel_weights: segmentation: the paper's own weight of each pixel in the training loss (U-Net's
            weight map), as a function of one training sample's target maps ("labels", and "instances"
            where the data set gives them, each (H, W)) returning (H, W) weights; the trainer adds them
            to each training sample's targets as "weights", and the task multiplies each pixel's
            cross-entropy by its weight. None: every labelled pixel weighs 1.
        pretrained: source -> loader, for fine-tuning from a reference implementation's
            pretrained weights (`--init SOURCE:NAME`, see common.pretrained): the loader takes
            that source's model ("timm": a timm model, "torchvision": a torchvision model) and
            returns this paper's model holding its weights. The model then has the interface
            that adapts it to a data set: `get_classifier()` (the head, an nn.Linear),
            `reset_classifier(num_classes)` (a new head initialised as the paper's), `in_chans`
            and, where img_size is a data kwarg, `img_size` and `resize_position_embeddings(img_size)`.
            Empty: the paper trains from scratch only.
        recipe: the paper's own training recipe as TrainConfig values (optimizer, lr, momentum,
            weight_decay, batch_size, epochs or max_steps, schedule, milestones, gamma,
            warmup_steps, augment, ...), applied over `defaults` by `--recipe paper`.
        reference_models: the reference configurations bench row b times ours against, the
            first one in its quick form (see ReferenceModel).
        variants: flavor -> the fields that differ for a flavor of another kind (model, inputs,
            task, defaults, data_kwargs, ...): GRU's sequence classifier beside its encoder-decoder.
            `for_flavor` gives the spec a flavor trains under.
    """

    name: str
    family: str
    title: str
    authors: str
    year: int
    url: str
    model: Callable[..., nn.Module]
    flavors: dict[str, dict]
    inputs: str
    task: str
    defaults: dict = field(default_factory=dict)
    reference: str = ""
    shard_blocks: str | None = None
    tp_plan: dict[str, str] = field(default_factory=dict)
    pipeline: PipelineChain | None = None
    data_kwargs: tuple[str, ...] = ("num_classes",)
    padded_batches: bool = False
    pixel_weights: Callable[[dict], torch.Tensor] | None = None
    pretrained: dict[str, Callable[[nn.Module], nn.Module]] = field(default_factory=dict)
    recipe: dict = field(default_factory=dict)
    reference_models: tuple[ReferenceModel, ...] = ()
    variants: dict[str, dict] = field(default_factory=dict)

    def for_flavor(self, flavor: str) -> "PaperSpec":
        """The spec this flavor trains under: this one, with a variant's fields in place."""
        return dataclasses.replace(self, **self.variants[flavor], variants={}) if flavor in self.variants else self

    def build(self, flavor: str = "tiny", **overrides) -> nn.Module:
        """The model of one flavor; `overrides` (num_classes, in_chans, img_size, ...) replace its values."""
        if flavor not in self.flavors:
            raise ValueError(f"unknown flavor '{flavor}' for {self.name}; choose from: {', '.join(self.flavors)}")
        return self.for_flavor(flavor).model(**{**self.flavors[flavor], **overrides})

    def build_for_data(self, flavor: str, facts: dict, model_kwargs: dict | None = None) -> nn.Module:
        """The model of one flavor, built for a dataset's facts (see common.data.DatasetSpec), with
        `model_kwargs` over the flavor's arguments (a list, as JSON keeps a tuple, is passed as a tuple)."""
        data_kwargs = self.for_flavor(flavor).data_kwargs
        missing = [k for k in data_kwargs if k not in facts]
        if missing:
            raise ValueError(f"{self.name} needs {', '.join(missing)} from the dataset, which does not give it")
        given = {k: tuple(v) if isinstance(v, list) else v for k, v in (model_kwargs or {}).items()}
        return self.build(flavor, **given, **{k: facts[k] for k in data_kwargs})

    def model_arguments(self, flavor: str) -> list[str] | None:
        """The constructor arguments of a flavor's model that a run may set (--model-kwargs): all but
        those the data set gives; None where the model takes any keyword."""
        spec = self.for_flavor(flavor)
        params = inspect.signature(spec.model).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and p.name not in spec.data_kwargs]


# Every paper's folder, one line each, in the order `train.py --list` shows them.
# The CNN lineage first, in the order a study group reads it (ConvNeXt, ResNet modernised with MobileNetV2's
# inverted bottleneck and the Transformer's design, last), detection on a CNN (Faster R-CNN, then DETR's
# Transformer on a ResNet) and segmentation (FCN, then U-Net's symmetric expansive path); then attention for
# images (ViT, then Swin's shifted windows) and recurrence for sequences, and translation from recurrence to
# attention (GRU, Seq2Seq, Bahdanau et al., the Transformer), then GPT and BERT.
PAPER_FOLDERS = (
    "lenet",
    "alexnet",
    "vgg",
    "googlenet",
    "resnet",
    "resnext",
    "densenet",
    "mobilenetv2",
    "convnext",
    "faster_rcnn",
    "detr",
    "fcn",
    "unet",
    "vit",
    "deit",
    "swin",
    "lstm",
    "gru",
    "seq2seq",
    "bahdanau",
    "transformer",
    "gpt",
    "bert",
)


_PAPERS: dict[str, PaperSpec] = {}  # the specs imported so far, and those added with `register`


def list_papers() -> list[str]:
    """Every paper's name, the registry's in PAPER_FOLDERS' order (a folder is named as its paper), then
    those added with `register`; imports none of them."""
    return [*PAPER_FOLDERS, *(name for name in _PAPERS if name not in PAPER_FOLDERS)]


def get_paper(name: str) -> PaperSpec:
    if name not in _PAPERS and name in PAPER_FOLDERS:
        _PAPERS[name] = importlib.import_module(f"papers.{name}").PAPER
    if name not in _PAPERS:
        raise ValueError(f"unknown paper '{name}'; choose from: {', '.join(list_papers())}")
    return _PAPERS[name]


def spec_on_demand(package: str) -> Callable[[str], object]:
    """A paper package's module `__getattr__` (PEP 562) that hands on every name of its spec.py, imported
    when a name is first asked for: a package with a command-line tool of its own keeps its spec there,
    so that `python -m papers.<name>.<tool> --help` answers without importing the model and torch."""

    def __getattr__(name: str):
        spec = importlib.import_module(f"{package}.spec")  # the model, and torch
        try:
            return getattr(spec, name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__


def register(spec: PaperSpec) -> PaperSpec:
    """Add a paper defined outside this registry (a test's, a user's own model); its name must be new."""
    if spec.name in _PAPERS or spec.name in PAPER_FOLDERS:
        raise ValueError(f"a paper named '{spec.name}' is already registered")
    _PAPERS[spec.name] = spec
    return spec
