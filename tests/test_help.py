"""`python train.py --help`: its flags in groups, and the help lines that name data sets and papers true."""

import re

from common.config import build_parser
from common.data import DATASETS
from papers import get_paper, list_papers

GROUPS = ["run", "model", "lora", "data", "training", "optimization", "evaluation", "parallelism", "checkpoints",
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


# every flag train.py had when its parser was written by hand, before the sections generated it
FLAGS = """--ac --augment --batch-size --beam --block-size --bucketing --ckpt-every --clip-grad --compile
--compile-backend --compile-mode --data-dir --dataset --download --dp-replicate --dp-shard --epochs --eval-samples --flavor --gamma
--gammas --grad-accum --hf-columns --hf-split --image-size --init --keep-ckpts --label-smoothing --length-penalty
--list --log-every --lr --lr-scaling --max-steps --microbatches --milestones --model-kwargs --momentum --nesterov
--nonfinite --nonfinite-patience --num-workers --optimizer --out --pad-multiple --paper --pp --pp-schedule
--precision --profile --recipe --rerun --results-dir --resume --schedule --seed --seq-len --sequence-parallel
--strategy --time-limit --tokenizer --tp --train-fraction --vocab-size --wandb --wandb-project --warmup-steps
--weight-decay""".split() + "--teacher --distillation --distillation-tau --distillation-lambda".split()  # DeiT's
FLAGS += ["--init-tensors"]  # VGG's deeper nets from net A's layers
FLAGS += ["--lora", "--lora-alpha", "--lora-targets"]  # LoRA's low-rank update (common.lora)
FLAGS += ["--pixel-weights"]  # a segmentation paper's own weight of each pixel in the loss, or none (U-Net's)
FLAGS += ["--tta"]  # test-time augmentation of image classification (the Fashion-MNIST speedrun)
COMMANDS = {"--list", "--rerun", "--resume"}  # what to do, not config fields


def test_every_flag_is_a_field_of_its_section_and_reads_its_default_back():
    """The parser is generated from the sections: each flag keeps its name, sits in its section's group,
    has its field's help, and reads the field's default (as text) back to the same value; the fields a
    resumed run may change are the ones marked so in their metadata."""
    import dataclasses

    from common.config import RESUMABLE, TrainConfig
    from common.sections import SECTIONS

    parser = build_parser()
    assert sorted(a.option_strings[0] for a in parser._actions if a.option_strings[0] != "-h") == sorted(FLAGS)
    groups = {g.title: {a.dest for a in g._group_actions} for g in parser._action_groups}
    for title, section in SECTIONS.items():
        for f in dataclasses.fields(section):
            if not f.metadata["flag"]:
                continue
            action = parser._option_string_actions["--" + f.name.replace("_", "-")]
            assert action.dest in groups[title] and action.help == f.metadata["help"], f.name
            factory = f.default_factory if f.default_factory is not dataclasses.MISSING else lambda: None
            default = factory() if f.default is dataclasses.MISSING else f.default
            if action.type is not None and default is not None and not action.nargs:
                assert action.type(str(default)) == default, f.name
            if action.choices is not None and default is not None:
                assert default in action.choices, f.name
    assert set(FLAGS) - COMMANDS == {"--" + f.name.replace("_", "-") for f in dataclasses.fields(TrainConfig)
                                     if f.metadata["flag"]}
    assert RESUMABLE == {"strategy", "dp_replicate", "dp_shard", "tp", "sequence_parallel", "pp", "pp_schedule",
                         "microbatches", "ac", "time_limit", "nonfinite", "nonfinite_patience", "wandb",
                         "results_dir", "log_every", "num_workers", "ckpt_every", "keep_ckpts", "compile",
                         "compile_mode", "compile_backend", "download", "profile"}
