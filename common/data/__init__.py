"""Datasets by name, and the loaders that give every rank its share.

A dataset is registered here with its task kind, its kind of input ("image" or
"sequence"), and the facts a model is built for (classes, channels, image
size, features per step), so that a paper can be paired with any dataset of
its kind of input. A batch is (inputs, targets): inputs are a tensor or, for
data sets whose samples differ in size, a dict of the padded batch and its mask;
targets are a tensor, or a list with one dict per sample (see common.data.collate).
Code outside the repository (a test, a user's own data) adds a data set with
`register`. A Hugging Face data set is named `hf:NAME_OR_PATH[:CONFIG]` and its spec made when
asked for (see common.data.hf).
"""

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from common.data import (adding, canvas, coco, dates, detect, digits, long_pairs, mnist, pairs, segfolder,
                         sentence_pairs, shapes, text, tokens, vision, wds)
from common.data.augment import Augmented
from common.data.collate import pad_images, pad_masked_lm, pad_pairs, pad_segmentation, pad_sequences, stack
from common.data.mapped import Mapped
from common.data.samplers import BucketBatchSampler, RepeatedAugmentation, ResumableSampler
from common.errors import ConfigError

from common.choices import HF_PREFIX


@dataclass(frozen=True)
class DatasetSpec:
    """A named dataset.

    Args:
        name: the --dataset value.
        task: the task kind it is scored with (see common.tasks).
        inputs: what a sample is: "image" (C, H, W), "sequence" (T, F), "pairs" (a source and a
            target sequence of token ids, (S,) and (T,)), or "tokens" (a block of token ids (T,), its
            target the block shifted by one, or for a classification data set its class id).
        facts: (data_dir, image_size) -> what the model is built for: num_classes (the
            outputs of its head: classes, or 1 for a scalar target), and in_chans and
            img_size for images, input_size (and seq_len where every sequence has
            it) for sequences; size_multiple where every side is a multiple of it; vocab_size
            (and what decodes ids) for tokens. Takes every key of `options(cfg)`; raises
            ConfigError when the data is not where it should be.
        load: (data_dir, image_size, ...) -> (train, test) datasets of (input, target) pairs.
        description: one line for the README.
        resizable: --image-size applies (and makes every image N x N).
        variable_size: samples differ in size (unless --image-size resizes them): batches
            are padded with a mask, and the datasets have `sizes` (a length, or height and
            width, per sample) for bucketing. Only papers that read padded batches train on them.
        preprocess: (data_dir, image_size) -> how an image file becomes a model input (layout,
            colour mode, size, scale, mean, std, label names), which export stores in the ONNX
            file for common.predict; None where samples are not images.
        collate_fn: (samples, pad_multiple) -> (inputs, targets), for samples that the
            built-in stacking and padding cannot batch (targets padded to a common length).
        reads_folder: the data is read from the user's --data-dir: any failure to read it is
            an input error (see `read`).
        fetch: data_dir -> None, downloads the data set into data_dir (--download); None where
            it cannot be downloaded. (An hf: Hub data set's goes into the Hugging Face cache, and
            MNIST's finds the files elsewhere first; they return the line `download` prints.)
        options: the run options it reads besides data_dir and image_size ("block_size",
            "tokenizer", "vocab_size", "seq_len", "hf_split", "hf_columns"); a run may set only those.
        streamed: its training set is streamed (common.data.wds), not read by index: no
            --train-fraction.
        augment: the training augmentation (common.data.augment) when --augment is left out
            ("auto"): the one its benchmark is usually trained with.
    """

    name: str
    task: str
    inputs: str
    facts: Callable[..., dict]
    load: Callable[..., tuple[Dataset, Dataset]]
    description: str = ""
    resizable: bool = False
    variable_size: bool = False
    preprocess: Callable[..., dict] | None = None
    collate_fn: Callable[..., tuple] | None = None
    reads_folder: bool = False
    fetch: Callable[[str], None] | None = None
    options: tuple[str, ...] = ()
    streamed: bool = False
    augment: str = "none"

    def training_augment(self, augment: str = "auto") -> str:
        """An --augment value, with "auto" (its default) standing for this data set's own."""
        return self.augment if augment == "auto" else augment

    def read(self, data_dir: str | None = None, image_size: int | None = None, **options) -> tuple[Dataset, Dataset]:
        """The (train, test) datasets (options: block_size, tokenizer, vocab_size, as `options` gives
        them; None keeps the data set's default). For data read from the user's folder, any failure
        to read it (files missing, corrupted, of another format) is one ConfigError naming the folder
        and what is wrong."""
        sizes = dict(image_size=image_size) | {k: v for k, v in options.items() if v is not None}
        if not self.reads_folder:
            return self.load(data_dir=data_dir, **sizes)
        try:
            return self.load(data_dir=data_dir, **sizes)
        except ConfigError:
            raise
        except Exception as e:  # torchvision's readers raise many kinds: RuntimeError, OSError, pickle's ...
            why = (str(e).strip().splitlines() or [""])[0].replace("You can use download=True to download it",
                                                                    "--download fetches a fresh copy")
            where = data_dir or self.name.removeprefix(HF_PREFIX)
            raise ConfigError(f"--dataset {self.name}: cannot read {where}: {why} ({type(e).__name__})") from None

    def is_variable(self, image_size: int | None = None) -> bool:
        """Samples differ in size, so batches are padded (--image-size N makes them all N x N)."""
        return self.variable_size and not (self.resizable and image_size)

    def collate(self, pad_multiple: int = 1, image_size: int | None = None) -> Callable:
        """How samples become a batch: stacked, or padded with a mask when sizes vary."""
        if self.collate_fn is not None:
            return partial(self.collate_fn, pad_multiple=pad_multiple)
        if not self.is_variable(image_size):
            return stack
        return partial(pad_images if self.inputs == "image" else pad_sequences, pad_multiple=pad_multiple)


def options(cfg) -> dict:
    """What a run's config tells a data set's `facts`, `read` and `preprocess`: its folder, image size, for
    text the block size and tokenizer, for generated sequences their length, for a Hugging Face data set
    its splits and columns (None: the data set's default)."""
    return dict(data_dir=cfg.data_dir, image_size=cfg.image_size, block_size=cfg.block_size,
                tokenizer=cfg.tokenizer, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len, hf_split=cfg.hf_split,
                hf_columns=cfg.hf_columns)


class Share(Subset):
    """A fixed share of a data set (--train-fraction; --eval-samples gives a count): the first k samples of a
    permutation drawn from a fixed seed, kept in the data set's order, so that every run and seed trains on
    the same samples and a smaller share is part of a larger one. Keeps `sizes` for bucketing."""

    def __init__(self, dataset: Dataset, fraction: float = 1.0, count: int | None = None):
        n = len(dataset)
        k = min(count, n) if count is not None else max(1, round(fraction * n))
        order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
        super().__init__(dataset, sorted(order[:k].tolist()))
        if hasattr(dataset, "sizes"):
            self.sizes = [dataset.sizes[i] for i in self.indices]


class PixelWeights(Mapped):
    """A segmentation training set whose targets also hold each pixel's weight in the loss, "weights" (H, W),
    from a paper's `weigh(target)` (PaperSpec.pixel_weights) of each sample's target maps."""

    def __init__(self, dataset: Dataset, weigh: Callable[[dict], torch.Tensor]):
        super().__init__(dataset)
        self.weigh = weigh

    def map(self, image: torch.Tensor, target: dict) -> tuple[torch.Tensor, dict]:
        return image, {**target, "weights": self.weigh(target)}


def _fixed(**facts) -> Callable[..., dict]:
    return lambda **_: dict(facts)


DATASETS = {
    spec.name: spec
    for spec in (
        DatasetSpec("digits", "classification", "image", digits.facts, digits.load, resizable=True,
                    preprocess=digits.image_preprocessing,
                    description="scikit-learn's 1,797 handwritten 8x8 digits, fixed stratified 80/20 split"),
        DatasetSpec("digits-rows", "classification", "sequence", _fixed(num_classes=10, input_size=8, seq_len=8),
                    digits.load_rows, preprocess=partial(digits.preprocessing, layout="rows"),
                    description="the same digits read row by row: 8 steps of 8 pixels"),
        DatasetSpec("digits-canvas", "classification", "image", digits.canvas_facts, digits.load_canvas,
                    variable_size=True, resizable=True, preprocess=digits.canvas_preprocessing,
                    description="the digits scaled 1x to 3x at random spots of square canvases of 16 to 48 pixels"),
        DatasetSpec("digits-detect", "detection", "image", detect.facts, detect.load, variable_size=True,
                    preprocess=detect.preprocessing,
                    description=f"{detect.TRAIN_SIZE:,} train / {detect.TEST_SIZE:,} test canvases of 48 to 128 by 48 "
                                f"to 128 pixels holding 0 to 6 digits scaled 1x to 4x, with their boxes"),
        DatasetSpec("dates", "seq2seq", "pairs", dates.facts, dates.load, variable_size=True, collate_fn=pad_pairs,
                    description=f"{dates.TRAIN_SIZE:,} train / {dates.TEST_SIZE:,} test dates written in "
                                f"{dates.NUM_STYLES} styles (English, French, German, Spanish) -> ISO 8601, "
                                f"character level; no test date is a training date"),
        DatasetSpec("long-pairs", "seq2seq", "pairs", long_pairs.facts, long_pairs.load, variable_size=True,
                    collate_fn=pad_pairs,
                    description=f"{long_pairs.TRAIN_SIZE:,} train / {long_pairs.TEST_SIZE:,} test sentences of a toy "
                                f"English -> French, {long_pairs.MIN_LENGTH} to {long_pairs.MAX_LENGTH} words spread "
                                f"evenly over lengths, word level: a dictionary, adjectives after the noun, agreement "
                                f"of articles and adjectives; for BLEU by source length (Bahdanau et al.'s Figure 2)"),
        DatasetSpec("pairs", "seq2seq", "pairs", pairs.facts, pairs.load, variable_size=True, collate_fn=pad_pairs,
                    reads_folder=True,
                    description=f"sentence pairs from --data-dir: a .txt/.tsv file (or a folder holding one), one "
                                f"source<TAB>target a line (Tatoeba / Anki), word level, vocabularies of the "
                                f"words seen {pairs.MIN_FREQ}+ times in training, a fixed "
                                f"{pairs.TEST_FRACTION:.0%} test split"),
        DatasetSpec("pydoc", "language-modeling", "tokens", text.facts, text.load,
                    options=("block_size", "tokenizer", "vocab_size"),
                    description="the Python documentation topics pydoc_data ships (about 465,000 characters of "
                                "English), character level or --tokenizer bpe, in blocks of 128 tokens; the last "
                                "topics by name (10%) for test"),
        DatasetSpec("pydoc-rest", "language-modeling", "tokens", partial(text.facts, dataset="pydoc-rest"),
                    partial(text.load, dataset="pydoc-rest"), options=("block_size", "tokenizer", "vocab_size"),
                    description=f"pydoc without the {len(text.TOPIC_CLASSES)} topics of pydoc-topics and the two that "
                                f"repeat their text (its other training topics, about 203,000 characters; its test topics), pydoc's tokenizer: "
                                f"pre-training text that holds no pydoc-topics passage"),
        DatasetSpec("pydoc-topics", "classification", "tokens", text.topics_facts, text.topics_load,
                    options=("block_size", "tokenizer", "vocab_size"),
                    description=f"passages of 128 tokens (pydoc's, as --dataset pydoc's) of "
                                f"{len(text.TOPIC_CLASSES)} pydoc topics of its training split, labelled by topic, "
                                f"{text.TOPIC_TRAIN} train / {text.TOPIC_TEST} test a topic from the start and the "
                                f"end of its text: a small labelled task for a model pre-trained on pydoc"),
        DatasetSpec("pydoc-pairs", "masked-lm", "tokens", sentence_pairs.facts, sentence_pairs.load,
                    variable_size=True, collate_fn=pad_masked_lm, options=("block_size", "tokenizer", "vocab_size"),
                    description="BERT's pre-training samples \"[CLS] A [SEP] B [SEP]\" of pydoc-rest's topics in pydoc's "
                                "WordPiece (--tokenizer wordpiece), B the text after A or (half of them) a random "
                                "topic's, labelled IsNext / NotNext, at most 128 tokens; 15% of the tokens masked "
                                "once (80% [MASK], 10% random, 10% kept); the text read 10 times, each its own pairs "
                                "and masks; pydoc's test topics for test"),
        DatasetSpec("pydoc-segments", "masked-lm", "tokens", partial(sentence_pairs.facts, nsp=False),
                    partial(sentence_pairs.load, nsp=False), variable_size=True, collate_fn=pad_masked_lm,
                    options=("block_size", "tokenizer", "vocab_size"),
                    description="pydoc-pairs as single segments \"[CLS] A [SEP]\" with no NSP label: BERT's \"No "
                                "NSP\" pre-training (Table 5)"),
        DatasetSpec("pydoc-ltr", "masked-lm", "tokens", partial(sentence_pairs.facts, nsp=False, ltr=True),
                    partial(sentence_pairs.load, nsp=False, ltr=True), variable_size=True, collate_fn=pad_masked_lm,
                    options=("block_size", "tokenizer", "vocab_size"),
                    description="pydoc-segments unmasked, each position labelled with the next token: BERT's \"LTR "
                                "& No NSP\" pre-training (Table 5), which builds bert left-only (causal); its MLM "
                                "accuracy is next-token accuracy"),
        DatasetSpec("text", "language-modeling", "tokens", partial(text.facts, dataset="text"),
                    partial(text.load, dataset="text"), reads_folder=True, options=("block_size", "tokenizer", "vocab_size"),
                    description="UTF-8 text from --data-dir: a file, or a folder's .txt files joined in order of "
                                "their paths; the last 10% (from a line break) for test; as pydoc otherwise"),
        DatasetSpec("tokens", "language-modeling", "tokens", tokens.facts, tokens.load, reads_folder=True,
                    options=("block_size",),
                    description=f"token shards from --data-dir, written by python -m common.data.prepare_text "
                                f"(train.bin, test.bin, and meta.json with the tokenizer), read through numpy.memmap: "
                                f"corpora beyond memory; blocks of 128 tokens as text's, shuffled in chunks; the test "
                                f"split at most {tokens.EVAL_BLOCKS:,} blocks spread evenly over test.bin"),
        DatasetSpec("wds", "classification", "image", wds.facts, wds.load, resizable=True, preprocess=wds.preprocess,
                    reads_folder=True, streamed=True,
                    description="WebDataset tar shards of images and class indices from --data-dir "
                                "'DIR/train-{000000..000009}.tar' (test shards named alike), as python -m "
                                "common.data.write_shards writes them; streamed, resized to --image-size"),
        DatasetSpec("shapes", "classification", "image", shapes.facts, shapes.load, resizable=True,
                    preprocess=shapes.preprocessing,
                    description=f"{shapes.TRAIN_SIZE:,} train / {shapes.TEST_SIZE:,} test 32x32 colour images of ten "
                                f"shapes of random colour, size, rotation and place on cluttered backgrounds"),
        DatasetSpec("adding", "regression", "sequence", _fixed(num_classes=1, input_size=2), adding.load,
                    variable_size=True,
                    description=f"the adding problem, lengths {adding.MIN_LENGTH} to {adding.MAX_LENGTH}, "
                                f"{adding.TRAIN_SIZE:,} train / {adding.TEST_SIZE:,} test sequences"),
        DatasetSpec("adding-1997", "regression", "sequence", adding.facts_1997, adding.load_1997,
                    variable_size=True, options=("seq_len",),
                    description=f"the adding problem as Hochreiter and Schmidhuber 1997 pose it (Experiment 4): "
                                f"values in [-1, 1], target 0.5 + (X1 + X2)/4, lengths T to T + T/10 for "
                                f"--seq-len T (default {adding.DEFAULT_T}), {adding.TRAIN_SIZE_1997:,} train / "
                                f"{adding.TEST_SIZE_1997:,} test sequences"),
        DatasetSpec("cifar10", "classification", "image", vision.cifar10_facts, vision.cifar10_load, resizable=True,
                    preprocess=vision.cifar10_preprocess, reads_folder=True, fetch=vision.cifar10_fetch,
                    description="CIFAR-10 from --data-dir (python version), 32x32 RGB, 10 classes"),
        DatasetSpec("mnist", "classification", "image", mnist.mnist_facts, mnist.mnist_load, resizable=True,
                    preprocess=mnist.mnist_preprocess, reads_folder=True, fetch=mnist.mnist_fetch, augment="crop:4",
                    description="MNIST's 60,000 train / 10,000 test 28x28 grey digits from --data-dir (the four "
                                "idx files, gzipped or not), checked by size and header; trains with random "
                                "4-pixel shifts (crop:4) unless --augment says otherwise"),
        DatasetSpec("fashion-mnist", "classification", "image", mnist.fashion_facts, mnist.fashion_load,
                    resizable=True, preprocess=mnist.fashion_preprocess, reads_folder=True,
                    fetch=mnist.fashion_fetch, augment="crop:4,flip",
                    description="Fashion-MNIST's 60,000 train / 10,000 test 28x28 grey images of 10 kinds of "
                                "clothing from --data-dir or Debian's dataset-fashion-mnist, checked by sha256; "
                                "trains with crop:4,flip unless --augment says otherwise"),
        DatasetSpec("fashion-mnist-rows", "classification", "sequence", mnist.fashion_rows_facts,
                    mnist.fashion_rows_load, preprocess=mnist.fashion_rows_preprocess, reads_folder=True,
                    description="Fashion-MNIST read row by row, as a recurrent network reads it: 28 steps of 28 "
                                "pixels, from the same files and checks"),
        DatasetSpec("coco", "detection", "image", coco.facts, coco.load, variable_size=True,
                    preprocess=coco.preprocessing, reads_folder=True,
                    description="COCO-format detection data from --data-dir: train.json and test.json, or one "
                                ".json split 80/20, and their images"),
        DatasetSpec("fashion-canvas", "segmentation", "image", canvas.facts, canvas.load, variable_size=True,
                    preprocess=canvas.preprocessing, collate_fn=pad_segmentation, reads_folder=True,
                    description=f"{canvas.TRAIN_SIZE:,} train / {canvas.TEST_SIZE:,} test canvases of 40 to 96 by 40 to "
                                f"96 pixels holding 1 to {canvas.MAX_ITEMS} Fashion-MNIST items (their own pixels, "
                                f"from fashion-mnist's files), touching and overlapping, with a class per pixel "
                                f"(background and the ten, void on a band at every border) and an instance id"),
        DatasetSpec("segfolder", "segmentation", "image", segfolder.facts, segfolder.load, variable_size=True,
                    preprocess=segfolder.preprocessing, collate_fn=pad_segmentation, reads_folder=True,
                    description="images and their masks of class indices from --data-dir: classes.txt, images/ "
                                "and masks/ (a PNG per image, palette or grayscale, 255 void), at their own "
                                "sizes; a fixed 20% test split unless train/ and test/ are given"),
        DatasetSpec("imagefolder", "classification", "image", vision.imagefolder_facts, vision.imagefolder_load,
                    resizable=True, preprocess=vision.imagefolder_preprocess, reads_folder=True,
                    description="a folder of class subfolders from --data-dir, resized to --image-size"),
    )
}


def get_dataset(name: str, hf_columns: str | None = None, data_dir: str | None = None,
                online: bool = False) -> DatasetSpec:
    """A registered data set, or the spec of a Hugging Face one (hf:NAME_OR_PATH[:CONFIG]), whose task
    comes from --hf-columns or else from its column names, read from the data (from the Hub: with
    online, as --download allows). ValueError for an unknown name; ConfigError for unreadable hf: data."""
    if name.startswith(HF_PREFIX):
        from common.data import hf  # imported only for an hf: data set

        return DatasetSpec(**hf.spec_fields(name, hf_columns, data_dir, online))
    if name not in DATASETS:
        raise ValueError(f"unknown dataset '{name}'; choose from: {', '.join(DATASETS)}, or hf:NAME_OR_PATH")
    return DATASETS[name]


def dataset_for(cfg) -> DatasetSpec:
    """The data set a run's config names (an hf: one read for its --hf-columns, in its --data-dir cache)."""
    return get_dataset(cfg.dataset, cfg.hf_columns, cfg.data_dir)


def fetch(cfg) -> None:
    """--download: the data set's files fetched, or found where they are, before the config's checks read
    them (train.py calls it before common.config.validate, which writes nothing); rank 0 says where."""
    if not cfg.download:
        return
    try:
        spec = get_dataset(cfg.dataset, cfg.hf_columns, cfg.data_dir, online=True)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    line = download(spec, cfg.data_dir)
    if os.environ.get("RANK", "0") == "0":
        print(line, flush=True)


def download(spec: DatasetSpec, data_dir: str | None = None) -> str:
    """Fetch a data set into data_dir (default data/) with torchvision's download (what is there already
    and passes its md5 check is kept); one process at a time (a file lock), so every rank of a launch may
    call it. A Hub data set (hf:NAME) goes into the Hugging Face cache (data_dir, if given, is the cache).
    Returns a line saying where the files are. A failure (no network) is a ConfigError, and a folder
    that the attempt created is removed again."""
    import contextlib
    import io
    import shutil

    from filelock import FileLock

    if spec.fetch is None:
        fetchable = ", ".join(name for name, d in DATASETS.items() if d.fetch)
        raise ConfigError(f"--download does not apply to {spec.name}; it fetches {fetchable} and Hub data sets "
                          f"(hf:NAME)")
    if spec.name.startswith(HF_PREFIX):
        return spec.fetch(data_dir)
    data_dir = data_dir or "data"
    root, existed = Path(data_dir), Path(data_dir).exists()
    root.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(root / ".download.lock"), contextlib.redirect_stdout(io.StringIO()):  # torchvision prints
            line = spec.fetch(str(root))  # a line where it found the files elsewhere
    except Exception as e:  # no network, a refused connection, a failed md5 check
        if not existed:
            shutil.rmtree(root, ignore_errors=True)
        why = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(f"--download: could not fetch {spec.name} into {root} ({type(e).__name__}: {why}); "
                          f"without a network, put its files there yourself") from None
    (root / ".download.lock").unlink(missing_ok=True)
    if not existed and not any(root.iterdir()):
        root.rmdir()
    return line or f"--download: {spec.name} is in {root}/"


def register(spec: DatasetSpec) -> DatasetSpec:
    """Add a data set defined outside this module (a test's, a user's own); its name must be new."""
    if spec.name in DATASETS:
        raise ValueError(f"a dataset named '{spec.name}' is already registered")
    DATASETS[spec.name] = spec
    return spec


def train_loader(dataset: Dataset, global_batch: int, micro_batch: int, rank: int, world_size: int, seed: int,
                 num_workers: int = 0, collate: Callable | None = None, bucketing: str = "none",
                 repeats: int = 1) -> DataLoader:
    """This rank's micro-batches, in a new order every epoch: call `loader.epoch_sampler.set_epoch(epoch, start)`.
    Incomplete global batches are dropped. Shards (common.data.wds) are streamed by a ShardStream.

    Args:
        bucketing: "none" (a random order) or "size" (batches of similar sizes; the
            dataset must have `sizes`).
        repeats: above 1, repeated augmentation (--augment repeat:N, samplers.RepeatedAugmentation).
    """
    # a generator of the loader's own: starting an epoch draws nothing from torch's global one, which
    # dropout and augmentation draw from and checkpoints restore, so a resumed run draws as the first did
    generator = torch.Generator().manual_seed(seed)
    base, augment = (dataset.dataset, dataset.augment) if isinstance(dataset, Augmented) else (dataset, None)
    if isinstance(base, wds.Shards):  # streamed: the data set itself deals the samples out
        stream = wds.ShardStream(base, global_batch, micro_batch, rank, world_size, seed, num_workers, augment)
        loader = DataLoader(stream, batch_size=micro_batch, drop_last=True, num_workers=num_workers,
                            collate_fn=collate)
        loader.epoch_sampler = stream
        return loader
    if bucketing == "size":
        sampler = BucketBatchSampler(dataset.sizes, global_batch, micro_batch, rank, world_size, seed)
        loader = DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=collate,
                            generator=generator)
    else:
        sampler = (RepeatedAugmentation(dataset, rank, world_size, seed, repeats) if repeats > 1
                   else ResumableSampler(dataset, rank=rank, world_size=world_size, seed=seed))
        loader = DataLoader(dataset, batch_size=micro_batch, sampler=sampler, drop_last=True,
                            num_workers=num_workers, collate_fn=collate, generator=generator)
    loader.epoch_sampler = sampler
    return loader


def eval_loader(dataset: Dataset, batch_size: int, rank: int, world_size: int,
                collate: Callable | None = None) -> DataLoader:
    """This rank's disjoint share of the evaluation set, with no sample repeated or left out
    (in order of size where samples differ in size, so that batches need little padding)."""
    indices = list(range(rank, len(dataset), world_size))
    if hasattr(dataset, "sizes"):
        indices.sort(key=lambda i: dataset.sizes[i])
    return DataLoader(Subset(dataset, indices), batch_size=batch_size, shuffle=False, collate_fn=collate)
