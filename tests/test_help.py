"""`python train.py --help`: its flags in groups, and the help lines that name data sets and papers true."""

import re

from common.config import build_parser
from common.data import DATASETS
from papers import get_paper, list_papers

GROUPS = ["run", "model", "data", "training", "optimization", "evaluation", "parallelism", "checkpoints",
          "tracking and profiling"]


def help_of(flag: str) -> str:
    return build_parser()._option_string_actions[flag].help


def named(name: str, text: str) -> bool:
    """`name` as a word of `text` (mnist is not named by fashion-mnist)."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def test_flags_come_in_groups():
    parser = build_parser()
    groups = {g.title: g._group_actions for g in parser._action_groups}
    assert [title for title in groups if title not in ("positional arguments", "options")] == GROUPS
    assert [a.option_strings for a in groups["options"]] == [["-h", "--help"]]  # no flag left ungrouped
    assert all(groups[title] for title in GROUPS)
    text = parser.format_help()
    assert [t for t in re.findall(r"^(\S[^:\n]*):$", text, re.M) if t not in ("options",)] == GROUPS


def test_data_dir_names_every_data_set_read_from_disk():
    folders = [name for name, d in DATASETS.items() if d.reads_folder]
    assert {"coco", "pairs", "text", "tokens", "imagefolder"} <= set(folders)
    assert [name for name in folders if not named(name, help_of("--data-dir"))] == []
    fetched = [name for name, d in DATASETS.items() if d.fetch is not None]
    assert fetched and [name for name in fetched if not named(name, help_of("--download"))] == []


def test_parallelism_lines_name_the_papers_that_take_them():
    """--tp and --pp list the papers with a tp_plan and a pipeline, as validate's errors do."""
    for flag, has in (("--tp", lambda s: s.tp_plan), ("--pp", lambda s: s.pipeline)):
        listed = re.search(r"\(([\w, ]+)\)$", help_of(flag)).group(1).split(", ")
        assert sorted(listed) == sorted(n for n in list_papers() if has(get_paper(n))), flag


def test_augment_names_each_data_sets_own_augmentation():
    """--augment auto (the default) is the data set's own: the help line names each that is not none."""
    own = {name: d.augment for name, d in DATASETS.items() if d.augment != "none"}
    assert own == {"fashion-mnist": "crop:4,flip", "mnist": "crop:4"}
    for name, augment in own.items():
        assert f"{augment} for {name}" in help_of("--augment")
    assert "auto (default)" in help_of("--augment") and "none for the others" in help_of("--augment")
