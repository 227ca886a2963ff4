"""Hugging Face datasets as data sets of the registry: `--dataset hf:NAME_OR_PATH[:CONFIG]`.

    python train.py --paper lenet --dataset hf:data/colours --image-size 32
    python train.py --paper gpt --dataset hf:Salesforce/wikitext:wikitext-2-raw-v1 --download
    python train.py --paper transformer --dataset hf:data/en-fr.parquet --hf-columns source=en,target=fr

NAME_OR_PATH is, in this order:
    a folder written by `save_to_disk` (it holds dataset_dict.json, or state.json for a single
        Dataset), read with `datasets.load_from_disk`;
    a .parquet or .arrow file, or a folder holding them, read with `load_dataset("parquet" | "arrow")`:
        a folder's files fall into splits by their names as on the Hub (train-*.parquet,
        test/*.parquet, ...); files whose names name no split, or a single file, are one split;
    else a data set of the Hub (NAME or OWNER/NAME; CONFIG its configuration), read from the local
        Hugging Face cache with the Hub switched off: nothing is fetched unless --download is given,
        which fetches it into the cache.
--data-dir, if given, is the cache (datasets' cache_dir: Hub data sets, and the Arrow copies that
load_dataset makes of parquet and arrow files); otherwise datasets' own (HF_HOME, HF_DATASETS_CACHE).
Nothing is written into a save_to_disk folder.

--hf-split TRAIN[,TEST] names the splits to train and to test on (default train,test). A single name
is a split cut into train and test 80/20 by a fixed seed, as imagefolder cuts a folder (stratified by
label for images); so is the one split of a source that has only one (one parquet file, ...) when
--hf-split is left out. A Dataset saved on its own has no named splits: it is always cut so.

--hf-columns ROLE=COLUMN,... says what the columns hold, and so the task:
    image=COL,label=COL    classification ("image" inputs): each image decoded by Pillow (datasets'
                           Image feature), in RGB, resized to --image-size N x N (required) and
                           normalised with ImageNet's statistics, as imagefolder; the classes are the
                           label's ClassLabel names, or the ids 0 to the largest label;
    text=COL               language modeling ("tokens" inputs): a split's non-empty rows, stripped and
                           joined by blank lines, tokenized and cut into blocks as --dataset text does
                           (--tokenizer, --vocab-size, --block-size);
    source=COL,target=COL  seq2seq ("pairs" inputs): words and vocabularies as --dataset pairs makes them.
A column of a Translation or a struct column is COL.KEY (source=translation.en,target=translation.fr).
Without --hf-columns they are read from the column names where only one task fits: image (or img) and
label; text; source and target.

Every rank reads the same map-style data set (memory-mapped Arrow), and the trainer's samplers give
each rank its share of the global batches one process reads, so N processes train what one does and a
resumed run continues exactly; `datasets.distributed.split_dataset_by_node` would instead give each
rank a contiguous shard of its own and change the batches, so it is not used. `datasets` is imported
only when an hf: data set is read.
"""

import contextlib
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from common.data import pairs, text, vision
from common.data.collate import pad_pairs
from common.errors import ConfigError

FILE_KINDS = {".parquet": "parquet", ".arrow": "arrow"}
ROLES = {"classification": ("image", "label"), "language-modeling": ("text",), "seq2seq": ("source", "target")}
INPUTS = {"classification": "image", "language-modeling": "tokens", "seq2seq": "pairs"}
GUESSES = {"image": ("image", "img"), "label": ("label",), "text": ("text",), "source": ("source",),
           "target": ("target",)}  # the column names a role is read from without --hf-columns
COLUMNS = "image=COL,label=COL (classification), text=COL (language modeling) or source=COL,target=COL (seq2seq)"
TRAIN_SHARE = f"{1 - vision.TEST_FRACTION:.0%}"  # of a split cut into train and test
CUT = f"cut {TRAIN_SHARE}/{vision.TEST_FRACTION:.0%}"


def _datasets():
    """The datasets package, quiet (no progress bars, no warnings), imported when first needed."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


@contextlib.contextmanager
def _hub(online: bool):
    """The Hub reachable only when asked (--download), and its retries unspoken (a failure is one line
    afterwards). datasets and huggingface_hub read HF_HUB_OFFLINE when imported, so their flags are set
    here, and set back afterwards."""
    import huggingface_hub.constants as hub
    from huggingface_hub.utils import logging

    config = _datasets().config
    saved = config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE, logging.get_verbosity()
    config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = not online
    logging.set_verbosity_error()
    try:
        yield
    finally:
        config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE, verbosity = saved
        logging.set_verbosity(verbosity)


# ---------------------------------------------------------------- where the data is


@dataclass(frozen=True)
class Source:
    """What NAME_OR_PATH names. kind: "disk" (a save_to_disk folder), "parquet" or "arrow" (a file or
    a folder of them), or "hub"; config: a Hub data set's configuration."""

    kind: str
    path: str
    config: str | None = None


def source(name: str) -> Source:
    """The source an hf: name names (see the module's docstring for the order)."""
    rest = name.split(":", 1)[1]  # what follows hf:
    path, config = Path(rest), None
    if rest and not path.exists() and ":" in rest:
        rest, config = rest.rsplit(":", 1)
        path = Path(rest)
        if path.exists():
            raise ConfigError(f"--dataset {name}: :{config} names a configuration of a Hub data set, but {rest} "
                              f"is a local path")
    if not rest or config == "":
        raise ConfigError(f"--dataset {name}: give hf:NAME_OR_PATH or hf:NAME:CONFIG")
    if path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
        return Source("disk", rest)
    if path.is_file():
        if path.suffix.lower() not in FILE_KINDS:
            raise ConfigError(f"--dataset {name}: {path} is not a .parquet or .arrow file")
        return Source(FILE_KINDS[path.suffix.lower()], rest)
    if path.is_dir():
        kinds = {FILE_KINDS[p.suffix.lower()] for p in path.rglob("*") if p.suffix.lower() in FILE_KINDS}
        if len(kinds) != 1:
            held = "both .parquet and .arrow files; keep one kind" if kinds else (
                "no save_to_disk data set (dataset_dict.json or state.json) and no .parquet or .arrow file")
            raise ConfigError(f"--dataset {name}: {path} holds {held}")
        return Source(kinds.pop(), rest)
    if path.is_absolute() or rest.startswith(".") or rest.count("/") > 1:
        raise ConfigError(f"--dataset {name}: {rest} does not exist")
    return Source("hub", rest, config)


def _stamp(src: Source) -> tuple:
    """The names, sizes and times of a local source's files: data changed on disk is read again."""
    if src.kind == "hub":
        return ()
    root = Path(src.path)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)


def _one_line(e: Exception) -> str:
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__


@lru_cache(maxsize=8)
def _open(name: str, src: Source, cache_dir: str | None, online: bool, stamp: tuple) -> dict | Any:
    """{split: datasets.Dataset}, or one datasets.Dataset (saved on its own): memory-mapped, not read."""
    hf = _datasets()
    try:
        with _hub(online):
            if src.kind == "disk":
                data = hf.load_from_disk(src.path)
            elif src.kind in FILE_KINDS.values():
                files = dict(data_files=src.path) if Path(src.path).is_file() else dict(data_dir=src.path)
                data = hf.load_dataset(src.kind, cache_dir=cache_dir, **files)
            else:
                data = hf.load_dataset(src.path, src.config, cache_dir=cache_dir)
    except Exception as e:  # datasets raises many kinds: FileNotFoundError, ConnectionError, ValueError, ...
        cache = cache_dir or hf.config.HF_DATASETS_CACHE
        if online:
            raise ConfigError(f"--download: could not fetch {name} into {cache} ({type(e).__name__}: "
                              f"{_one_line(e)})") from None
        if src.kind == "hub" and isinstance(e, ConnectionError):
            raise ConfigError(f"--dataset {name}: {src.path} is no local folder or file, and no Hub data set of that "
                              f"name is in the Hugging Face cache {cache}; --download fetches it") from None
        raise ConfigError(f"--dataset {name}: cannot read {src.path}: {_one_line(e)} ({type(e).__name__})") from None
    return dict(data) if isinstance(data, hf.DatasetDict) else data


def read_source(name: str, cache_dir: str | None = None, online: bool = False) -> dict | Any:
    """What an hf: name holds: {split: Dataset}, or a single Dataset (see `_open`); online (a Hub data
    set only): fetched into the cache first, if not there yet."""
    src = source(name)
    return _open(name, src, cache_dir, online and src.kind == "hub", _stamp(src))


def download(name: str, data_dir: str | None = None) -> str:
    """--download: a Hub data set fetched into the cache (datasets locks it while it writes, so every
    rank may ask). Returns a line saying where it is."""
    src = source(name)
    if src.kind != "hub":
        raise ConfigError(f"--download fetches Hub data sets; {name} is read from {src.path}")
    read_source(name, data_dir, online=True)
    return f"--download: {src.path} is in the Hugging Face cache {data_dir or _datasets().config.HF_DATASETS_CACHE}"


# ---------------------------------------------------------------- columns and splits


def parse_columns(value: str) -> tuple[str, dict[str, str]]:
    """"image=img,label=label" -> ("classification", {"image": "img", "label": "label"})."""
    columns = {}
    for item in value.split(","):
        role, eq, column = (part.strip() for part in item.partition("="))
        if not eq or not column or role not in GUESSES or role in columns:
            break
        columns[role] = column
    else:
        for task, roles in ROLES.items():
            if set(roles) == set(columns):
                return task, columns
    raise ConfigError(f"--hf-columns '{value}': give {COLUMNS}")


def infer_columns(name: str, names: list[str]) -> tuple[str, dict[str, str]]:
    """The task and columns that the column names leave no doubt about."""
    fits = {}
    for task, roles in ROLES.items():
        found = {role: [c for c in GUESSES[role] if c in names] for role in roles}
        if all(len(c) == 1 for c in found.values()):
            fits[task] = {role: c[0] for role, c in found.items()}
    if len(fits) != 1:
        raise ConfigError(f"--dataset {name}: its columns ({', '.join(names)}) do not say the task; name them with "
                          f"--hf-columns {COLUMNS}")
    return next(iter(fits.items()))


def task_and_columns(name: str, hf_columns: str | None, data_dir: str | None = None,
                     online: bool = False) -> tuple[str, dict[str, str]]:
    """From --hf-columns, or else from the column names of the data's first split."""
    if hf_columns is not None:
        return parse_columns(hf_columns)
    data = read_source(name, data_dir, online)
    first = next(iter(data.values())) if isinstance(data, dict) else data
    return infer_columns(name, list(first.column_names))


def _cut(name: str, rows, where: str, label: str | None) -> tuple[Any, Any]:
    """A split cut into train and test as imagefolder cuts a folder: a fixed seed, stratified by label
    where every class has two rows and the test part a row of each."""
    from sklearn.model_selection import train_test_split

    n = len(rows)
    if round(vision.TEST_FRACTION * n) < 1 or n < 2:
        raise ConfigError(f"--dataset {name}: {where} holds {n} rows, too few to be {CUT} into train and test")
    labels = rows[label][:] if label else None
    counts = Counter(labels or [])
    stratified = labels is not None and min(counts.values()) >= 2 and round(vision.TEST_FRACTION * n) >= len(counts)
    train, test = train_test_split(list(range(n)), test_size=vision.TEST_FRACTION, random_state=vision.SPLIT_SEED,
                                   stratify=labels if stratified else None)
    return rows.select(sorted(train)), rows.select(sorted(test))


def _splits(name: str, data, hf_split: str | None, label: str | None) -> tuple[Any, Any, tuple[str, str], list]:
    """(train rows, test rows, where each comes from, the whole splits they come from)."""
    if not isinstance(data, dict):
        if hf_split is not None:
            raise ConfigError(f"--dataset {name} is one Dataset saved on its own, with no named splits: it is {CUT} "
                              f"into train and test; leave out --hf-split")
        wheres = (f"{TRAIN_SHARE} of the Dataset", "the rest of the Dataset")
        return *_cut(name, data, "the Dataset", label), wheres, [data]
    if hf_split is None:
        names = ["train", "test"] if {"train", "test"} <= data.keys() else list(data) if len(data) == 1 else None
        if names is None:
            raise ConfigError(f"--dataset {name} has no splits train and test; its splits: {', '.join(data)}; choose "
                              f"with --hf-split TRAIN,TEST (or TRAIN alone, {CUT})")
    else:
        names = [s.strip() for s in hf_split.split(",")]
        if len(names) > 2 or not all(names) or len(set(names)) < len(names):
            raise ConfigError(f"--hf-split '{hf_split}': give TRAIN or TRAIN,TEST, the names of two different splits")
        for split in names:
            if split not in data:
                raise ConfigError(f"--dataset {name} has no split '{split}'; its splits: {', '.join(data)}")
    if len(names) == 2:
        return data[names[0]], data[names[1]], (f"split '{names[0]}'", f"split '{names[1]}'"), [data[n] for n in names]
    where = f"split '{names[0]}'"
    wheres = (f"{TRAIN_SHARE} of {where}", f"the rest of {where}")
    return *_cut(name, data[names[0]], where, label), wheres, [data[names[0]]]


def _parts(rows, column: str) -> tuple[str, str]:
    """(column, key) of COL.KEY, or (column, "") of a column (whose name may hold a dot)."""
    return (column, "") if column in rows.features else column.partition(".")[::2]


def _values(rows, column: str) -> list:
    """A column's values; COL.KEY: the KEY of each value of COL (a Translation or a struct)."""
    top, key = _parts(rows, column)
    values = rows[top][:]
    return [v[key] if v is not None else None for v in values] if key else values


def _check_column(name: str, rows, where: str, role: str, column: str) -> None:
    """The column is there and holds what its role reads."""
    hf = _datasets()
    top, key = _parts(rows, column)
    features = rows.features
    if top not in features:
        raise ConfigError(f"--dataset {name} has no column '{top}' ({role}={column}) in {where}; its columns: "
                          f"{', '.join(features)}")
    feature = features[top]
    if key:
        keys = list(getattr(feature, "languages", None) or (feature if isinstance(feature, dict) else []))
        if key not in keys:
            raise ConfigError(f"--dataset {name}: column '{top}' has no '{key}' ({role}={column}); "
                              f"{'its keys: ' + ', '.join(keys) if keys else 'it holds no keys'}")
        feature = feature[key] if isinstance(feature, dict) else hf.Value("string")
    if role == "image":
        ok, want = isinstance(feature, hf.Image), "images (an Image feature)"
    elif role == "label":
        ok = isinstance(feature, hf.ClassLabel) or str(getattr(feature, "dtype", "")).startswith(("int", "uint"))
        want = "class ids (a ClassLabel or integers; strings become ids with Dataset.class_encode_column)"
    else:
        ok, want = getattr(feature, "dtype", None) in ("string", "large_string"), "text (strings)"
    if not ok:
        raise ConfigError(f"--dataset {name}: column '{column}' ({role}) of {where} is {feature}, not {want}")


@dataclass(frozen=True, eq=False)  # hashed by identity, for the caches of what is made from it
class Chosen:
    """What a run reads: the task, the column of each role, the train and test rows (datasets.Dataset),
    where each comes from (for messages), and the whole splits they come from."""

    name: str
    task: str
    columns: dict[str, str]
    train: Any
    test: Any
    wheres: tuple[str, str]
    whole: list


def chosen(name: str, data_dir: str | None = None, hf_split: str | None = None,
           hf_columns: str | None = None) -> Chosen:
    """The rows and columns that an hf: data set's options choose, checked (every mistake a ConfigError)."""
    src = source(name)
    return _chosen(name, data_dir, hf_split, hf_columns, _stamp(src))


@lru_cache(maxsize=8)
def _chosen(name: str, data_dir: str | None, hf_split: str | None, hf_columns: str | None, stamp: tuple) -> Chosen:
    task, columns = task_and_columns(name, hf_columns, data_dir)
    train, test, wheres, whole = _splits(name, read_source(name, data_dir), hf_split, columns.get("label"))
    for rows, where in zip((train, test), wheres):
        for role, column in columns.items():
            _check_column(name, rows, where, role, column)
    return Chosen(name, task, columns, train, test, wheres, whole)


# ---------------------------------------------------------------- the three kinds of data


class Images(Dataset):
    """(image (3, N, N), label) of an HF split: decoded by Pillow, in RGB, resized and normalised."""

    def __init__(self, rows, image: str, label: str, transform):
        self.rows, self.image, self.label, self.transform = rows.select_columns([image, label]), image, label, transform

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        row = self.rows[i]
        return self.transform(row[self.image].convert("RGB")), int(row[self.label])


@lru_cache(maxsize=8)
def _classes(c: Chosen) -> list[str]:
    """The class names: the ClassLabel's, or the ids 0 .. the largest label of either split."""
    hf, label = _datasets(), c.columns["label"]
    ids = {i for rows in c.whole for i in rows.unique(label) if i is not None}
    feature = c.train.features[label]
    names = list(feature.names) if isinstance(feature, hf.ClassLabel) else [str(i) for i in range(max(ids) + 1)]
    if min(ids) < 0 or max(ids) >= len(names):
        raise ConfigError(f"--dataset {c.name}: column '{label}' holds label {min(ids) if min(ids) < 0 else max(ids)}, "
                          f"not a class id from 0 to {len(names) - 1} (an unlabelled split?)")
    return names


def _check_image(c: Chosen) -> None:
    """The first training image decodes (read now rather than in the middle of training)."""
    try:
        c.train[0][c.columns["image"]].convert("RGB")
    except Exception as e:  # Pillow's many kinds
        raise ConfigError(f"--dataset {c.name}: the first image of {c.wheres[0]} does not decode "
                          f"({_one_line(e)})") from None


@lru_cache(maxsize=8)
def _texts(c: Chosen) -> tuple[str, str]:
    """(training text, test text): each split's non-empty rows, stripped, joined by blank lines."""
    return tuple("\n\n".join(t.strip() for t in _values(rows, c.columns["text"]) if t and t.strip())
                 for rows in (c.train, c.test))


@lru_cache(maxsize=8)
def _corpus(c: Chosen) -> pairs.Corpus:
    """The pairs of both splits with their vocabularies (from the training rows), as --dataset pairs."""
    texts, lines = [], []
    for rows, where in zip((c.train, c.test), c.wheres):
        for i, (s, t) in enumerate(zip(_values(rows, c.columns["source"]), _values(rows, c.columns["target"]))):
            if not (s and s.strip() and t and t.strip()):
                side = "source" if not (s and s.strip()) else "target"
                raise ConfigError(f"--dataset {c.name}: row {i} of {where} has an empty {side} "
                                  f"('{c.columns[side]}')")
            texts.append((s.strip(), t.strip()))
            lines.append(i)
    n = len(c.train)
    return pairs.build_corpus(Path(c.name), texts, lines, list(range(n)), list(range(n, len(texts))))


def _need_size(name: str, image_size: int | None) -> None:
    if not image_size:
        raise ConfigError(f"--dataset {name} needs --image-size N: every image is resized to N x N")


def facts(name: str, data_dir: str | None = None, image_size: int | None = None, hf_split: str | None = None,
          hf_columns: str | None = None, tokenizer: str = "char", vocab_size: int | None = None, **_) -> dict:
    """What a model is built for: classes, channels and size; the tokenizer's vocabulary; or both
    vocabularies of the pairs (as imagefolder, text and pairs give them)."""
    c = chosen(name, data_dir, hf_split, hf_columns)
    if c.task == "classification":
        _need_size(name, image_size)
        _check_image(c)
        return dict(num_classes=len(_classes(c)), in_chans=3, img_size=image_size)
    if c.task == "language-modeling":
        return text.tokenizer_of(_texts(c), tokenizer or "char", vocab_size).facts()
    return pairs.facts_of(_corpus(c))


def load(name: str, data_dir: str | None = None, image_size: int | None = None, hf_split: str | None = None,
         hf_columns: str | None = None, tokenizer: str = "char", vocab_size: int | None = None,
         block_size: int | None = None, **_) -> tuple[Dataset, Dataset]:
    """The training and test sets: images, blocks of tokens, or pairs."""
    facts(name, data_dir, image_size, hf_split, hf_columns, tokenizer, vocab_size)
    c = chosen(name, data_dir, hf_split, hf_columns)
    if c.task == "classification":
        t = vision._transform(vision.IMAGENET_STATS, image_size)
        return tuple(Images(rows, c.columns["image"], c.columns["label"], t) for rows in (c.train, c.test))
    if c.task == "language-modeling":
        tok = text.tokenizer_of(_texts(c), tokenizer or "char", vocab_size)
        return text.blocks_of(_texts(c), tok, block_size, name, c.wheres)
    return pairs.datasets_of(_corpus(c))


def preprocess(name: str, data_dir: str | None = None, image_size: int | None = None, hf_split: str | None = None,
               hf_columns: str | None = None, **_) -> dict:
    """How an image file becomes a model input, as for imagefolder; the labels are the class names."""
    c = chosen(name, data_dir, hf_split, hf_columns)
    _need_size(name, image_size)
    return vision._preprocessing(vision.IMAGENET_STATS, "RGB", image_size, _classes(c))


def spec_fields(name: str, hf_columns: str | None = None, data_dir: str | None = None, online: bool = False) -> dict:
    """The fields of the DatasetSpec of an hf: name (see common.data.get_dataset). The task comes from
    --hf-columns, or else from the column names (reading the data: online with --download)."""
    task, _ = task_and_columns(name, hf_columns, data_dir, online)
    src = source(name)
    tokens = ("block_size", "tokenizer", "vocab_size") if task == "language-modeling" else ()
    images = task == "classification"
    return dict(name=name, task=task, inputs=INPUTS[task], facts=partial(facts, name), load=partial(load, name),
                description=f"a Hugging Face data set ({src.kind}: {src.path})", resizable=images,
                variable_size=task == "seq2seq", preprocess=partial(preprocess, name) if images else None,
                collate_fn=pad_pairs if task == "seq2seq" else None, reads_folder=True,
                fetch=partial(download, name) if src.kind == "hub" else None,
                options=("hf_split", "hf_columns", *tokens))
