"""The documentation cannot rot: README stays a short front door, every relative link and #anchor of
README.md, docs/ and the paper notes leads somewhere, every block the leaderboard writes is what it
writes from results/ today, the site builds with `mkdocs build --strict`, and nothing of the long
README that docs/ came from was lost."""

import functools
import importlib.util
import mimetypes
import os
import re
import shlex
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest
import yaml

from common import docs, leaderboard
from tests.conftest import ROOT

PAGES = docs.pages()
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def test_readme_is_a_short_front_door():
    text = README.read_text()
    # 15,000 until the leaderboard block took the sweeps' runs, and with them four more data sets' tables
    assert len(text.encode()) < 16_000, "README.md is the front door: move the detail into docs/"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pytest -q" in ci and "pip install -r requirements.txt && python -m pytest -q" in text
    for heading in ("## Quick start", "## Papers", "### The claims tested so far"):
        assert f"\n{heading}\n" in text
    for note in docs.paper_notes():
        assert f"]({note.relative_to(ROOT)})" in text, f"the papers table lacks {note.parent.name}"
    assert text.count(leaderboard.START) == 1 and "mkdocs serve" in text and "](docs/README.md)" in text


def test_every_docs_page_is_in_the_index_and_in_the_sites_nav():
    index = (ROOT / "docs" / "README.md").read_text()
    nav_text = "nav:" + (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]  # the rest holds a python tag
    nav = yaml.safe_load(nav_text)["nav"]
    in_nav = {page for section in nav for entry in section.values() for item in
              (entry if isinstance(entry, list) else [entry])
              for page in (item.values() if isinstance(item, dict) else [item])}  # "Title: page" or page
    for page in DOCS:
        assert page.name == "README.md" or f"]({page.name})" in index, f"docs/README.md does not link {page.name}"
        assert f"docs/{page.name}" in in_nav, f"mkdocs.yml's nav lacks docs/{page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    assert docs.broken_links(page) == []


def test_the_link_checker_reports_a_broken_link_and_a_broken_anchor(tmp_path):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")  # the page with its neighbours, outside the repository
    shutil.copy(README, tmp_path)
    copy = tmp_path / "docs" / "performance.md"
    text = copy.read_text()
    good = "](strategies.md#activation-checkpointing)"
    assert good in text and docs.broken_links(copy) == []
    copy.write_text(text.replace(good, "](strategies.md#activation-checkpoints)", 1))
    assert docs.broken_links(copy) == ["strategies.md#activation-checkpoints: no heading #activation-checkpoints "
                                       "in strategies.md"]
    copy.write_text(text.replace(good, "](strategy.md#activation-checkpointing)", 1))
    assert docs.broken_links(copy) == ["strategy.md#activation-checkpointing: no such file"]


def test_a_fence_inside_a_list_item_hides_its_backticks_and_not_the_links_after_it():
    """A fenced block indented under a list item is code, as on GitHub: its backticks open no code span
    that would swallow the next links (a note's links went unchecked, and its sweep file left off the
    site, that way)."""
    text = "- a figure:\n\n   ```\n   a | b `\n   ```\n\nsee `x` and [the sweep](claims/s.yaml), `y`\n"
    assert docs.links(text) == ["claims/s.yaml"]
    assert docs.links("```\n[not a link](a.md)\n```\n[a link](b.md)") == ["b.md"]


def test_anchors_follow_githubs_rules():
    text = "# Language models: GPT on Python's documentation\n## `--ac` and faster_rcnn\n## Notes\n## Notes\n" \
           "```\n# not a heading\n```\n"
    assert len(docs.links(README.read_text())) > 30, "README's links are found"
    assert docs.anchors(text) == {"language-models-gpt-on-pythons-documentation", "--ac-and-faster_rcnn",
                                  "notes", "notes-1"}
    assert docs.links("[a](b.md#c) `[no](code.md)` [web](https://x.org) ![img](d.png)") == ["b.md#c", "d.png"]


def writing_commands(page):
    """The `python -m common.leaderboard ... --write FILE` commands a page gives; a note's own table,
    when the note names no command, by the one docs/adding-a-paper.md gives."""
    text = page.read_text()
    commands = [shlex.split(c) for c in re.findall(r"python -m common\.leaderboard ([^`\n]*--write [^`\n#]*)", text)]
    if page.parent.parent.name == "papers" and leaderboard.START in text and not any(
            "--sweep" not in c for c in commands):
        name = page.parent.name
        commands.append(["--paper", name, "--format", "markdown", "--write", f"papers/{name}/README.md"])
    return commands


def sweep_names(argv):
    """The names after --sweep (one or several), those of its block's markers joined by +."""
    if "--sweep" not in argv:
        return []
    rest = argv[argv.index("--sweep") + 1:]
    return rest[:next((k for k, a in enumerate(rest) if a.startswith("--")), len(rest))]


def test_every_block_the_leaderboard_writes_is_up_to_date(tmp_path, monkeypatch, capsys):
    store = functools.lru_cache(leaderboard.local_results)
    monkeypatch.setattr(leaderboard, "local_results", lambda folder: store(str(folder)))
    written = set()
    for page in PAGES:
        for argv in writing_commands(page):
            i = argv.index("--write")
            target, copy = ROOT / argv[i + 1], tmp_path / "page.md"
            shutil.copy(target, copy)
            into_copy = ["--results-dir", str(ROOT / "results")] + argv[:i + 1] + [str(copy)] + argv[i + 2:]
            assert leaderboard.main(into_copy) == 0, capsys.readouterr().err
            assert copy.read_text() == target.read_text(), f"stale: {' '.join(argv)} changes {argv[i + 1]}"
            written.add((argv[i + 1], "+".join(sweep_names(argv)) or None))
    for page in [README, *DOCS]:  # each block of README and docs/ has its command beside it
        for name in re.findall(r"<!-- leaderboard:(?:(\S+):)?start -->", docs.prose(page.read_text())):
            assert (str(page.relative_to(ROOT)), name or None) in written, f"{page.name}: who writes block {name}?"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The site, built once for this module's tests: (the finished `mkdocs build --strict`, its folder)."""
    site = tmp_path_factory.mktemp("site") / "site"
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2.0
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    return done, site


def test_the_site_builds_strictly(built):
    done, site = built
    assert done.returncode == 0, done.stderr[-3000:]
    home = (site / "index.html").read_text()
    for note in docs.paper_notes():
        assert (site / note.parent.relative_to(ROOT) / "index.html").exists()
        assert f'href="{note.parent.relative_to(ROOT)}/"' in home, f"no {note.parent.name} in the nav"
    assert (site / "docs" / "leaderboard" / "index.html").exists()
    assert (site / "papers" / "alexnet" / "claims" / "relu-vs-tanh.png").exists(), "a note's figure"
    assert '<a href="claims/relu-vs-tanh.png"><img ' in (site / "papers" / "alexnet" / "index.html").read_text(), \
        "a figure links to its file at full size (docs/hooks.py)"
    assert (site / "docs" / "lineage-shapes.png").exists()
    assert re.search(r'<a [^>]*href="docs/"[^>]*>\s*<span class="md-ellipsis">\s*Overview\s*</span>', home), \
        "the documentation's first page is called Overview in the nav"


OUTSIDE = re.compile(r"\s*(?:https?:)?//", re.I)  # another site's address; a relative one or data: stays in
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+['"]([^'"]+)""", re.I)
NOT_FETCHED = {"canonical", "alternate", "prev", "next"}  # <link rel=...> that names a page, loads nothing


class _Fetched(HTMLParser):
    """The addresses a page makes the browser fetch by itself: scripts, stylesheets, icons, images, frames,
    media, and url()/@import in its styles. Links the reader follows (<a href>) are not among them."""

    def __init__(self):
        super().__init__()
        self.found, self._in_style = [], False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "link" and not NOT_FETCHED & set((a.get("rel") or "").lower().split()):
            self.found.append(a.get("href") or "")
        for name in ("src", "data", "poster"):
            if name in a and tag != "a":
                self.found.append(a[name] or "")
        if a.get("srcset"):
            self.found += [part.split()[0] for part in a["srcset"].split(",") if part.strip()]
        if a.get("style"):
            self.found += [u or i for u, i in CSS_URL.findall(a["style"])]
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.found += [u or i for u, i in CSS_URL.findall(data)]


def fetched_from_outside(site):
    """(file, address) of everything the built site's pages and stylesheets load from another site."""
    outside = []
    for page in sorted(site.rglob("*.html")):
        parser = _Fetched()
        parser.feed(page.read_text())
        outside += [(str(page.relative_to(site)), u) for u in parser.found if OUTSIDE.match(u)]
    for sheet in sorted(site.rglob("*.css")):
        outside += [(str(sheet.relative_to(site)), u or i) for u, i in CSS_URL.findall(sheet.read_text())
                    if OUTSIDE.match(u or i)]
    return outside


def test_the_site_loads_nothing_from_outside_it(built):
    """Offline the site reads as online: no script, style, font or image of a CDN or Google Fonts."""
    done, site = built
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list(site.rglob("*.html"))) > 30
    outside = fetched_from_outside(site)
    assert not outside, f"{len(outside)} loads from outside the site, such as {outside[:3]}"


def test_the_outside_check_finds_a_cdn_and_passes_a_link(tmp_path):
    (tmp_path / "a.html").write_text(
        '<link rel="stylesheet" href="assets/main.css"><link rel="canonical" href="https://x.org/a/">'
        '<a href="https://arxiv.org/abs/1706.03762">paper</a><img src="data:image/png;base64,AAAA">'
        '<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script>'
        '<style>@import "//fonts.googleapis.com/css?family=Roboto";</style>')
    (tmp_path / "b.css").write_text('a { background: url("img/x.png") } b { src: url(https://x.org/f.woff2) }')
    assert fetched_from_outside(tmp_path) == [
        ("a.html", "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"),
        ("a.html", "//fonts.googleapis.com/css?family=Roboto"), ("b.css", "https://x.org/f.woff2")]


def test_sweep_files_open_as_text_under_mkdocs_serve():
    """`mkdocs serve` types a file by Python's mimetypes, which knows no .yaml: a browser downloaded the
    notes' claims/*.yaml as application/octet-stream. The hooks module, loaded by serve, types them as text."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    linked = {p.suffix for page in PAGES for p in docs.linked_files(page)}
    assert ".yaml" in linked
    for suffix in linked - {".md"}:
        kind = mimetypes.guess_type(f"papers/x/claims/file{suffix}")[0] or "application/octet-stream"
        assert kind.startswith(("text/", "image/")), f"a {suffix} file is served as {kind}"
    from mkdocs.livereload import LiveReloadServer  # what serve itself answers

    assert LiveReloadServer._guess_type("papers/alexnet/claims/relu-vs-tanh.yaml") == "text/plain"


OLD_README = "ed608b7"  # the last commit whose README held everything
# BERT's "LTR & No NSP" data set, after pydoc-segments' row
ROW_LTR = (
    '| `pydoc-ltr` | tokens: "[CLS] A [SEP]", up to 128 WordPiece tokens | masked LM (its MLM accuracy '
    'and perplexity are next-token accuracy and perplexity) | `pydoc-segments` unmasked, each position '
    'labelled with the next token (the last, `[SEP]`, and padding with none), the same 4,470 train / 655 '
    'test samples: BERT\'s "LTR & No NSP" pre-training (Table 5), which builds bert left-to-right (causal '
    'attention) without its NSP head; a classifier fine-tuned from it with `--init` stays causal |\n'
)
# --tta flip's row in the flags table, before --seq-len's
TTA_ROW = " test-time augmentation, for image classification on images of one size: each test image is scored by the mean of its logits and its mirror image's (left to right), in every evaluation of the run; recorded in config.json. `python -m common.evaluate --run RUN --tta none` (or `flip`) scores the same final weights the other way, so that a recipe's gain from it is measured on the same runs. Off by default (`none`) |"
EDITS = {  # what moving it changed, besides link targets and heading levels
    # provenance: the sweep refuses uncommitted changes; a result records its commits at start and end
    "validates and prints the\n  command lines.": "validates and prints the\n  command lines;\n- refuses, in one line and with exit code 2, to start on a checkout whose\n  tracked files have uncommitted changes: a run records the commit it ran,\n  and a result of code that no commit holds cannot be rerun. `--allow-dirty`\n  runs anyway and records `\"allow_dirty\": true` in each run's sweep tag\n  (the runs' commit then ends in `-dirty`, and the leaderboard marks it `*`).",
    "torch, git commit, wandb run id, the command line,": "torch, git commit its code came from (its last start's) and\n                     its first start's (each it resumed at, if others; \"-dirty\": uncommitted changes),\n                     wandb run id, the command line,",
    "--write README.md": "--write docs/leaderboard.md",
    # --eval-samples: a quick check's share of the test split, for the tests' equivalence runs
    "| `--train-fraction F` | train on a fixed share of the training split: the same samples for every seed, a smaller share inside a larger one; the test split stays whole |":
        "| `--train-fraction F` | train on a fixed share of the training split: the same samples for every seed, a smaller share inside a larger one; the test split stays whole |\n| `--eval-samples N` | evaluate on a fixed N of the test split's samples (drawn as `--train-fraction`'s: the same for every run and process count): a quick check, as the tests' equivalence runs use it; such a run is no result, and the leaderboard leaves it out |",
    # BLEU as running sums of its own (common.metrics.BLEU), no longer torchmetrics' class
    "(sacrebleu's, through torchmetrics)": "(sacrebleu's tokenizers and torchmetrics' rule, as running sums: `common.metrics.BLEU`)",
    "the leaderboard below shows its best seed": "the [leaderboard] shows its best seed",
    "first command reached": "first command of the [Quick start] reached",
    "after `python -m common.export --run` ([Export])": "after python -m common.export --run (see below)",
    # the requeue marker (stopped.json): the sketch requeues on it, not on a missing result.json
    "Under torchrun, send the signal to torchrun: it forwards SIGTERM (and, with\n`--signals-to-handle SIGTERM,SIGUSR1`, SIGUSR1) to its workers, waits\n`--shutdown-timeout` seconds (30 by default: give a large model's save more)\nand then kills them; the workers exit 75, but torchrun itself exits 1 after\na signal, so a script decides on the run directory instead: no `result.json`\nmeans the run is not finished. An sbatch script that requeues itself until\nthe run is done (a sketch: SLURM is not available on this repository's\nmachine, so it has not been run):":
        'Under torchrun, send the signal to torchrun: it forwards SIGTERM (and, with\n`--signals-to-handle SIGTERM,SIGUSR1`, SIGUSR1) to its workers, waits\n`--shutdown-timeout` seconds (30 by default: give a large model\'s save more)\nand then kills them; the workers exit 75, but torchrun itself exits 1 after\na signal, so a script decides on the run directory instead. A run that\nstopped on request leaves `stopped.json` there, written by rank 0 once the\ncheckpoint is complete (atomically: a reader sees all of it or nothing):\n`{"reason": "SIGTERM", "step": 361, "checkpoint":\n"runs/vit-.../checkpoints/step_361", "exit_code": 75, "resume": "torchrun\n--nproc_per_node 4 train.py --resume runs/vit-..."}`, the reason being\n`SIGTERM`, `SIGUSR1`, `--time-limit` or `nonfinite` (a non-finite loss, below).\nA resumed run removes it once it has loaded its checkpoint, and a finished\nrun has none. A crash writes none, so a script that requeues only on the\nmarker does not requeue a run that crashes at the same step every time; nor\nshould it requeue a `nonfinite` stop, which would diverge at the same step\nagain: that one waits for a fix. An sbatch script that requeues itself while\nthe run stops on request (a sketch: SLURM is not available on this\nrepository\'s machine, so it has not been run):',
    '```bash\n#!/bin/bash\n#SBATCH --nodes=1 --gpus-per-node=4 --time=04:00:00\n#SBATCH --signal=B:USR1@300        # SIGUSR1 to this script 5 minutes before the limit\n#SBATCH --requeue --open-mode=append\nRUN=runs/vit-$SLURM_JOB_ID         # a requeued job keeps its id\nif [ -f $RUN/config.json ]; then ARGS="--resume $RUN"; else ARGS="--paper vit --out $RUN"; fi\ntorchrun --nproc_per_node 4 train.py $ARGS --time-limit 03:58:00 &\nPID=$!\ntrap \'kill -TERM $PID\' USR1        # torchrun passes SIGTERM on to every rank\nwait $PID; wait $PID\n[ -f $RUN/result.json ] || scontrol requeue $SLURM_JOB_ID\n```':
        '```bash\n#!/bin/bash\n#SBATCH --nodes=1 --gpus-per-node=4 --time=04:00:00\n#SBATCH --signal=B:USR1@300        # SIGUSR1 to this script 5 minutes before the limit\n#SBATCH --requeue --open-mode=append\nRUN=runs/vit-$SLURM_JOB_ID         # a requeued job keeps its id\nif [ -f $RUN/config.json ]; then ARGS="--resume $RUN"; else ARGS="--paper vit --out $RUN"; fi\nrm -f $RUN/stopped.json            # the last job\'s, which a resume failing before it loads would keep\ntorchrun --nproc_per_node 4 train.py $ARGS --time-limit 03:58:00 &\nPID=$!\ntrap \'kill -TERM $PID\' USR1        # torchrun passes SIGTERM on to every rank\nwait $PID; wait $PID\nagain only after a stop request (a signal, --time-limit): not after a crash, nor a non-finite loss\ngrep -qs \'"reason": "SIG\\|"reason": "--time\' $RUN/stopped.json && scontrol requeue $SLURM_JOB_ID\n```',
    "A loss that is NaN or infinite on any rank ends the run the same way on\nevery rank, with exit code **65** and one line (`train.py: error: the loss is\nnan at step 3; the run stops; last good checkpoint: runs/.../step_2 (resume\nwith --resume runs/..., after a fix)`); with `--nonfinite skip` that step's\nupdate is left out on every rank (as the fp16 GradScaler skips a step; the\nlearning-rate schedule moves on), the skips are counted in metrics.jsonl and\nresult.json (`skipped_steps`), and `--nonfinite-patience K` skipped steps in\na row (10) stop it as above (`tests/test_nonfinite.py`: a NaN put into one\nrank's batch under ddp).":
        "A loss that is NaN or infinite on any rank ends the run the same way on\nevery rank, with exit code **65** and one line (`train.py: error: the loss is\nnan at step 3; the run stops; last good checkpoint: runs/.../step_2 (resume\nwith --resume runs/..., after a fix)`), and `stopped.json` with reason\n`nonfinite`, the step whose loss it was, the last good checkpoint (or null)\nand exit code 65; with `--nonfinite skip` that step's\nupdate is left out on every rank (as the fp16 GradScaler skips a step; the\nlearning-rate schedule moves on), the skips are counted in metrics.jsonl and\nresult.json (`skipped_steps`), and `--nonfinite-patience K` skipped steps in\na row (10) stop it as above (`tests/test_nonfinite.py`: a NaN put into one\nrank's batch under ddp).",
    '  checkpoints/step_<N>/  DCP checkpoints (see below)\n':
        '  checkpoints/step_<N>/  DCP checkpoints (see below)\n  stopped.json       only while a run that stopped on request (signal, --time-limit, non-finite loss)\n                     waits to be resumed: reason, step, checkpoint, exit code, the resume command\n',
    # docs/performance.md after the start-up and per-step work: row a and row g measured again, the bench's
    # default papers, the smoke test's --papers all; adding a paper's catalog line
    "One run of the bench on this repository's machine\n(2-core AMD EPYC CPU, torch 2.14.1, no GPU), when its default papers were\nvit, resnet and lstm (today's default is every paper but detection's, so\nthis is the run of):":
        "The bench times one paper of each family by default\n(vit, resnet, lstm); `--papers all` times every paper but detection's. It\nprints a line on stderr as each (row, paper) starts and when it ends, with the\ntime left as estimated so far, and Ctrl-C prints the rows measured until then.\n\nA quick look, every default row briefly (4 steps, 1 repeat, the eager compile\nbackend; its ratios are rough): **205 s** wall on this repository's machine\n(2-core AMD EPYC, torch 2.14.1, no GPU), commit fbaa830:\n\n```\npython -m common.bench --quick\n```\n\nOne run of the bench on the same machine, when its default papers were vit,\nresnet and lstm, as they are again (rows b to f; rows a and g below were\nmeasured again at commit fbaa830, see [What a step costs]\nand the row g lines under the table):",
    '| a | vit: trainer vs bare loop, samples/s (100 steps, batch 64) | 3,567 | 3,493 | 1.035 | >= 0.97 | yes |\n':
        '',
    '| a | resnet: trainer vs bare loop, samples/s (100 steps, batch 64) | 5,083 | 4,931 | 1.023 | >= 0.97 | yes |\n':
        '',
    '| a | lstm: trainer vs bare loop, samples/s (100 steps, batch 64) | 10,999 | 10,438 | 1.057 | >= 0.97 | yes |\n':
        '',
    '| g | vit tiny: inference latency, batch 1: compiled vs eager | 0.551 ms | 0.739 ms | 0.746 |  |  |\n':
        '',
    '| g | vit tiny: inference latency, batch 32: compiled vs eager | 2.424 ms | 2.660 ms | 0.949 |  |  |\n':
        '',
    '| g | resnet tiny: inference latency, batch 1: compiled vs eager | 0.430 ms | 0.693 ms | 0.622 |  |  |\n':
        '',
    '| g | resnet tiny: inference latency, batch 32: compiled vs eager | 1.471 ms | 1.816 ms | 0.823 |  |  |\n':
        '',
    '| g | lstm tiny: inference latency, batch 1: compiled vs eager | 0.182 ms | 0.410 ms | 0.443 |  |  |\n':
        '',
    '| g | lstm tiny: inference latency, batch 32: compiled vs eager | 0.528 ms | 0.842 ms | 0.628 |  |  |\n':
        '',
    '| g | onnxruntime: comes with the ONNX export issue |  |  |  |  |  |\n':
        '',
    '`tests/test_bench.py` runs `python -m common.bench\n--smoke` over every paper of the default list, so a new paper cannot break the\nbench unnoticed':
        '`tests/test_bench.py` runs `python -m common.bench\n--smoke --papers all` (rows c and f; the others over one paper of each kind of\ninput), so a new paper cannot break the\nbench unnoticed',
    "3. **One line in `papers/__init__.py`**: the folder's name in `PAPER_FOLDERS`.\n":
        "3. **One line in `papers/__init__.py`**: the folder's name in `PAPER_FOLDERS`; then\n   `python -m papers.catalog` writes the paper's name, family, year, title and flavors into\n   `papers/catalog.json`, which `train.py --list` prints without importing torch, and into the\n   table of [The papers] (a test fails, naming this command, while the file and the papers\n   disagree); README's table of papers gets the paper's row by hand, in the catalog's order.\n",
    '- The trainer costs nothing measurable over a bare PyTorch loop (row a: 1.02\n  to 1.06, within the noise;':
        '- The trainer costs nothing measurable over a bare PyTorch loop (row a at\n  commit fbaa830, one process and 2-process DDP: 0.975 to 1.030, [What a step\n  costs]; before, in one process: 1.02 to 1.06, within the noise;',
    '- Compiled inference is 1.3x to 2.3x faster at batch 1 and 1.05x to 1.6x at batch 32 (row g).\n  Row g now also times onnxruntime; its run is in\n  [Export to ONNX and serve on a CPU].':
        '- Compiled inference is 1.4x to 2.3x faster at batch 1 and 1.1x to 1.5x at batch 32 (row g);\n  onnxruntime on the same 2 threads is 2.1x to 4.7x faster at batch 1, 1.7x (ResNet, LSTM) at\n  batch 32, and 8% slower for the tiny ViT at batch 32 (see also\n  [Export to ONNX and serve on a CPU]).',
    # issue 44 part 5: the recurrent layers' mechanics and the classifier trio shared in common/layers.py
    "common/layers.py   the layers several papers share: masked batch norm and pooling for padded batches":
        "common/layers.py   the layers several papers share: masked norm and pooling, the classifier trio, RNN/LSTM/GRU mechanics",
    # the wrapping in one parallelize function of small steps, in common/parallelize.py, for the Trainer and the
    # memory bench; how a step runs on the parallelized model in common/step.py
    "One trainer, one order in `common/parallel.py`:": "One trainer, one order in `common/parallelize.py`:",
    "common/parallel.py process group, device, move / split / compile / wrap in one order":
        "common/parallel.py process group, device, the strategy that runs, gradient sync and clipping over shards\n"
        "common/parallelize.py the one parallelization path: stages, tp, ac, compile, FSDP2 / DDP, in one order\n"
        "common/step.py     how a step runs on the parallelized model: whole on every rank, or through pipeline stages",
    # a paper folder with a tool of its own builds PAPER in spec.py (issue 41: its --help without torch)
    "   [Fine-tuning]).\n3. **One line in `papers/__init__.py`**":
        "   [Fine-tuning]).\n   A folder with a command-line tool of its own (a claim script, `python -m\n   papers.<name>.claims.<tool>`) puts this in `papers/<name>/spec.py` instead,\n   and its `__init__.py` hands every name on from there when first asked for\n   (`papers.spec_on_demand`; copy `papers/densenet/__init__.py`), so that the tool's `--help`\n   answers without importing the model and torch (`tests/test_startup.py`).\n3. **One line in `papers/__init__.py`**",
    # Fashion-MNIST as a checked benchmark (and MNIST): where the files come from, the checks, the default
    # augmentation (docs/datasets.md's section "MNIST and Fashion-MNIST")
    "| `mnist` | image 1x28x28 | classification | `DIR/MNIST/raw/` with the four uncompressed idx files (`train-images-idx3-ubyte`, ...) |":
        "| `mnist` | image 1x28x28 | classification | MNIST's 60,000 train / 10,000 test handwritten digits: the four idx files (`train-images-idx3-ubyte`, ...), gzipped or not, in `--data-dir DIR` or `DIR/MNIST/raw/`, or fetched with `--download`; checked by size and idx header; trained with `crop:4` by default; see [MNIST and Fashion-MNIST] |",
    "| `fashion-mnist` | image 1x28x28 | classification | `DIR/FashionMNIST/raw/`, the same four idx files |":
        "| `fashion-mnist` | image 1x28x28 | classification | Zalando's 60,000 train / 10,000 test images of ten kinds of clothing, the same four files: from `--data-dir`, else Debian's package `dataset-fashion-mnist` (`/usr/share/datasets/fashion-mnist`), else `--download`; checked by size and sha256; trained with `crop:4,flip` by default; see [MNIST and Fashion-MNIST] |",
    "repo's recipe (AdamW, warmup then cosine, no augmentation), which trains every":
        "repo's recipe (AdamW, warmup then cosine, no augmentation but the data set's\nown), which trains every",
    # the claims' verdicts computed by python -m common.claims (issue 43): each entry's bold verdict is the
    # tool's, the words after it kept as they were
    "what differs from the paper's setup:\n\n- [AlexNet]":
        "what differs from the paper's setup. The words after each verdict were written by hand before the "
        "verdicts were computed, and some say more or less than the verdict (issue 43 lists them):\n\n- [AlexNet]",
    "Welch, epochs to a target\n": "Welch, epochs to a target\ncommon/claims.py   a claim's hypothesis (beside its "
        "sweep file) -> its verdict: Welch, Holm, one rule\n",
    "a paper's claim stands on, and their figures":
        "a paper's claim stands on, each with its hypothesis (FILE.hypothesis.yaml, written before the runs), and "
        "their figures",
    "**Does not hold\n  here**: at each": "**Verdict: not decided**: at each",
    "**Degradation holds, the gain from\n  depth does not show at this budget**":
        "**Verdict: degradation: holds; residual gain: opposite; degradation at a constant rate: holds; residual "
        "gain at a constant rate: opposite**",
    "**Holds, at smaller margins**": "**Verdict: not decided**",
    "**Does not hold here; the reverse does**": "**Verdict: opposite**",
    "**Holds, by more than the paper's 0.9 BLEU**": "**Verdict: one head: holds; too many heads: holds**",
    "**Not decided here**: on the shapes after 6": "**Verdict: not decided**: on the shapes after 6",
    "**Half holds**": "**Verdict: ResNet ahead on little data: holds; ViT overtakes with more: opposite**",
    "**Holds in direction, much smaller**": "**Verdict: holds**",
    "**Holds, scaled to the objects an image holds**": "**Verdict: not decided**",
    "**Does not hold here; its shape does**": "**Verdict: opposite**",
    "**The first holds, the second is not decided here**":
        "**Verdict: (a) linear bottlenecks: holds; (b) shortcuts between bottlenecks: not decided**",
    # the prose after the verdicts made consistent with the intervals and with results/ (a reader's review)
    "has only begun to learn in the 310 steps a sweep affords here.":
        "has only begun to learn in the 310 steps a sweep affords here. Depth costs the residual net as much "
        "as the plain one (residual-56 minus plain-56 -0.04, 95% interval -0.16 to +0.08; in the first sweep "
        "+0.002, -0.016 to +0.020), so what holds is not the paper's degradation, which is the plain net's alone.",
    "16 heads of 8 score as 1 head does.":
        "16 heads of 8 score as 1 head does, 2.8 BLEU below 4 heads (95% interval 1.3 to 4.4).",
    "share is a small data set.":
        "share is a small data set. ViT underfits rather than overfits, though: its training accuracy ends at "
        "0.21 to 0.31 on every share, the ResNet's at about 1.0, so the first half holds without the paper's "
        "mechanism (overfitting on little data).",
    "at 98 BLEU: short sources leave the tanh unit usable.":
        "at 98 BLEU: the gates help (+1.88 BLEU, 95% interval 1.34 to 2.41), but the paper's stronger "
        "statement, that a tanh unit gives nothing meaningful, does not hold: short sources leave the tanh "
        "unit usable.",
    "DETR tiny is 0.49 to 0.53 AP below Faster R-CNN tiny at every size":
        "DETR tiny is 0.52, 0.52 and 0.49 AP below Faster R-CNN tiny on small, medium and large digits",
    "(e.g. `crop:4,flip`; see `common/data/augment.py`) |":
        "(e.g. `crop:4,flip`; see `common/data/augment.py`); `none` for none; `auto`, the default: the data set's own, "
        "`crop:4,flip` for fashion-mnist, `crop:4` for mnist, none for the others |",
    # the bench's rows b to f run again (issue 49): the old run's paragraph, command and table replaced
    'One run of the bench on the same machine, when its default papers were vit,\nresnet and lstm, as they are again (rows b to f; rows a and g below were\nmeasured again at commit fbaa830, see [What a step costs]\nand the row g lines under the table):':
        "Rows b to f, run again with today's code at commit 432b1c4 (965 s; rows a\nand g below were measured at commit fbaa830, see [What a step costs]\nand the row g lines under the table). This machine's CPU reports the same name\nas before, but torch finds only AVX2 on it and no bf16 instructions (the\nbench's first line says so from commit d9c5d25 on):",
    '```\npython -m common.bench --repeats 3 --steps 100 --papers vit,resnet,lstm\n```':
        '```\npython -m common.bench --rows b,c,d,e,f --repeats 3 --steps 100\n```',
    '| row | comparison | A | B | ratio A/B | target | met |\n|---|---|---|---|---|---|---|\n| b | vit tiny, 8x8, patch 2 vs timm: forward+backward, batch 64 | 16.51 ms | 17.03 ms | 0.962 | <= 1.05 | yes |\n| b | vit ViT-B/16, 224x224 vs timm: forward+backward, batch 2 | 1398.14 ms | 1401.53 ms | 0.990 | <= 1.05 | yes |\n| b | resnet resnet18, 64x64 vs torchvision: forward+backward, batch 16 | 111.51 ms | 108.98 ms | 1.014 | <= 1.05 | yes |\n| b | resnet resnet50, 64x64 vs torchvision: forward+backward, batch 8 | 199.27 ms | 201.88 ms | 1.007 | <= 1.05 | yes |\n| c | lstm ours eager vs nn.LSTM (eager): forward+backward, batch 64, 8 steps, 128 cells | 3.87 ms | 1.88 ms | 2.065 |  |  |\n| c | lstm ours compiled vs nn.LSTM (eager): forward+backward, batch 64, 8 steps, 128 cells | 2.76 ms | 2.07 ms | 1.402 |  |  |\n| d | vit tiny: compiled (inductor) vs eager training, samples/s (first step 0.7 s) | 2,761 | 2,597 | 1.117 |  |  |\n| d | vit larger: compiled (inductor) vs eager training, samples/s (first step 1.9 s) | 873 | 825 | 1.060 |  |  |\n| d | resnet tiny: compiled (inductor) vs eager training, samples/s (first step 0.9 s) | 5,746 | 5,035 | 1.132 |  |  |\n| d | resnet larger: compiled (inductor) vs eager training, samples/s (first step 1.3 s) | 656 | 522 | 1.276 |  |  |\n| d | lstm tiny: compiled (inductor) vs eager training, samples/s (first step 0.4 s) | 20,414 | 13,265 | 1.511 |  |  |\n| d | lstm larger: compiled (inductor) vs eager training, samples/s (first step 0.9 s) | 1,501 | 1,054 | 1.423 |  |  |\n| e | vit tiny: bf16 autocast vs fp32 training on cpu, samples/s | 1,813 | 2,747 | 0.660 |  |  |\n| e | vit larger: bf16 autocast vs fp32 training on cpu, samples/s | 668 | 788 | 0.847 |  |  |\n| e | resnet tiny: bf16 autocast vs fp32 training on cpu, samples/s | 4,364 | 4,009 | 1.112 |  |  |\n| e | resnet larger: bf16 autocast vs fp32 training on cpu, samples/s | 745 | 481 | 1.517 |  |  |\n| e | lstm tiny: bf16 autocast vs fp32 training on cpu, samples/s | 9,715 | 10,032 | 0.979 |  |  |\n| e | lstm larger: bf16 autocast vs fp32 training on cpu, samples/s | 1,409 | 1,081 | 1.303 |  |  |\n| f | vit: ddp 2 processes vs 1 process, samples/s at global batch 64 | 2,742 | 2,714 | 0.935 |  |  |\n| f | vit: fsdp vs ddp (2 processes), samples/s | 1,482 | 2,742 | 0.540 |  |  |\n| f | vit: fsdp vs ddp, bytes per rank (params, grads, AdamW state) | 2,174,160 | 4,311,328 | 0.504 |  |  |\n| f | resnet: ddp 2 processes vs 1 process, samples/s at global batch 64 | 3,391 | 5,201 | 0.652 |  |  |\n| f | resnet: fsdp vs ddp (2 processes), samples/s | 1,587 | 3,391 | 0.468 |  |  |\n| f | resnet: fsdp vs ddp, bytes per rank (params, grads, AdamW state) | 2,379,692 | 4,759,292 | 0.500 |  |  |\n| f | lstm: ddp 2 processes vs 1 process, samples/s at global batch 64 | 7,450 | 10,364 | 0.673 |  |  |\n| f | lstm: fsdp vs ddp (2 processes), samples/s | 3,467 | 7,450 | 0.448 |  |  |\n| f | lstm: fsdp vs ddp, bytes per rank (params, grads, AdamW state) | 575,592 | 1,151,160 | 0.500 |  |  |':
        '| row | comparison | A | B | ratio A/B | target | met |\n|---|---|---|---|---|---|---|\n| b | vit vs timm vit_base_patch16_224, 8x8: forward+backward, batch 64 | 18.83 ms | 18.90 ms | 0.996 | <= 1.05 | yes |\n| b | vit vs timm vit_base_patch16_224, 224x224: forward+backward, batch 2 | 1572.38 ms | 1535.09 ms | 0.998 | <= 1.05 | yes |\n| b | resnet vs torchvision resnet18, 64x64: forward+backward, batch 16 | 181.78 ms | 180.52 ms | 1.004 | <= 1.05 | yes |\n| b | resnet vs torchvision resnet50, 64x64: forward+backward, batch 8 | 264.09 ms | 277.77 ms | 0.963 | <= 1.05 | yes |\n| c | lstm ours eager vs nn.LSTM (eager): forward+backward, batch 64, 8 steps, 128 cells | 5.37 ms | 2.80 ms | 1.935 |  |  |\n| c | lstm ours compiled vs nn.LSTM (eager): forward+backward, batch 64, 8 steps, 128 cells | 3.90 ms | 2.80 ms | 1.392 |  |  |\n| d | vit tiny: compiled (inductor) vs eager training, samples/s (first step 1.0 s) | 3,074 | 2,963 | 1.050 |  |  |\n| d | vit larger: compiled (inductor) vs eager training, samples/s (first step 2.4 s) | 794 | 830 | 0.937 |  |  |\n| d | resnet tiny: compiled (inductor) vs eager training, samples/s (first step 1.0 s) | 3,789 | 3,407 | 1.126 |  |  |\n| d | resnet larger: compiled (inductor) vs eager training, samples/s (first step 1.7 s) | 424 | 341 | 1.244 |  |  |\n| d | lstm tiny: compiled (inductor) vs eager training, samples/s (first step 1.9 s) | 8,349 | 6,292 | 1.331 |  |  |\n| d | lstm larger: compiled (inductor) vs eager training, samples/s (first step 7.8 s) | 1,044 | 628 | 1.619 |  |  |\n| e | vit tiny: bf16 autocast vs fp32 training on cpu, samples/s | 171 | 3,076 | 0.053 |  |  |\n| e | vit larger: bf16 autocast vs fp32 training on cpu, samples/s | 46 | 887 | 0.050 |  |  |\n| e | resnet tiny: bf16 autocast vs fp32 training on cpu, samples/s | 159 | 3,696 | 0.043 |  |  |\n| e | resnet larger: bf16 autocast vs fp32 training on cpu, samples/s | 24 | 349 | 0.068 |  |  |\n| e | lstm tiny: bf16 autocast vs fp32 training on cpu, samples/s | 1,340 | 8,800 | 0.152 |  |  |\n| e | lstm larger: bf16 autocast vs fp32 training on cpu, samples/s | 50 | 863 | 0.059 |  |  |\n| f | vit: ddp 2 processes vs 1 process, samples/s at global batch 64 | 1,737 | 1,995 | 0.739 |  |  |\n| f | vit: fsdp vs ddp (2 processes), samples/s | 1,012 | 1,737 | 0.586 |  |  |\n| f | vit: fsdp vs ddp, bytes per rank (params, grads, AdamW state) | 2,174,160 | 4,311,328 | 0.504 |  |  |\n| f | resnet: ddp 2 processes vs 1 process, samples/s at global batch 64 | 2,359 | 2,940 | 0.758 |  |  |\n| f | resnet: fsdp vs ddp (2 processes), samples/s | 1,141 | 2,359 | 0.484 |  |  |\n| f | resnet: fsdp vs ddp, bytes per rank (params, grads, AdamW state) | 2,379,692 | 4,759,292 | 0.500 |  |  |\n| f | lstm: ddp 2 processes vs 1 process, samples/s at global batch 64 | 4,518 | 5,700 | 0.793 |  |  |\n| f | lstm: fsdp vs ddp (2 processes), samples/s | 2,305 | 4,518 | 0.526 |  |  |\n| f | lstm: fsdp vs ddp, bytes per rank (params, grads, AdamW state) | 575,592 | 1,151,160 | 0.500 |  |  |',
    # the config in sections (issue 44): the layout's lines of the modules it became
    "common/config.py   TrainConfig, flags, validation\n": "common/config.py   TrainConfig, its flags generated from "
        "the sections, resolving, validate asking each concern\ncommon/sections.py the config's sections (run, model, "
        "data, ...): each field and its flag described once\ncommon/flags.py    the flags' value types and "
        "--model-kwargs' KEY=VALUE items\n",
    "common/data/       datasets and the per-rank loaders\n": "common/data/       datasets and the per-rank loaders; "
        "data/checks.py: the data's checks of a config\n",
    "the curves (training loss and accuracy, test metrics, by step)":
        "the curves (training loss and accuracy, test metrics, the wall time at each test, by step)",
    # the rate and warmup in use moved from config.json into the training state (issue 44 part 4)
    "and config.json records\nthem (`batch_size`, `lr_in_use`, `warmup_in_use`; `lr` and `lr_batch` stay\nwhat was given, so a resumed run scales the same).":
        "and config.json records\nthe batch (`batch_size`), and result.json and each checkpoint's trainer.json\nthe rate and warmup in use (`lr`, `warmup_steps`; config.json's `lr` and\n`lr_batch` stay what was given, so a resumed run scales the same).",
    "common/trainer.py  the Trainer: build, train_step, evaluate, save / resume, finish\n":
        "common/trainer.py  the Trainer: build, train_step, evaluate, save / resume, finish\ncommon/train_state.py the "
        "training state a checkpoint saves: step, epoch, best, the rate in use, ...\n",
    "(2-core AMD EPYC, torch 2.14.1, no GPU), commit fbaa830:": "(2-core AMD EPYC, torch 2.14.1, no GPU), commit "
        "fbaa830, and **194 s** (37\nrows) from a fresh clone at commit 9549a06 on a machine of the same name\nwithout "
        "bf16 instructions (`CPU: AMD EPYC (2 cores, AVX2, no bf16)`):",
    # the metrics that are sums became common.metrics' own (issue 41 part 3: torchmetrics' import in every rank)
    "common/tasks.py    per task kind: (outputs, targets) -> loss, and torchmetrics metrics synchronised across ranks\n":
        "common/tasks.py    per task kind: (outputs, targets) -> loss, and metrics synchronised across ranks\n"
        "common/metrics.py  the metrics that are running sums (accuracy, mean, mse, sum), summed over the ranks\n",
    "sample) into the loss, and scores the test split with torchmetrics metrics,\nwhich synchronise themselves across ranks.":
        "sample) into the loss, and scores the test split with metrics that\nsynchronise themselves across ranks: "
        "`common.metrics`' running sums (accuracy,\nmean, mean squared error, sum) or any torchmetrics metric.",
    # a paper added after the move: ResNeXt, after ResNet in the table of papers
    "| Deep Residual Learning for Image Recognition |\n| [densenet]": "| Deep Residual Learning for Image "
        "Recognition |\n| [resnext] | cnn | 2017 | tiny, tiny-1x28d, tiny-4x11d, resnext50_32x4d, resnext101_32x4d, "
        "resnext101_64x4d, cifar-29-8x64d, cifar-29-16x64d | Aggregated Residual Transformations for Deep Neural "
        "Networks |\n| [densenet]",
    # ConvNeXt added (a row of the papers table; a paper whose forward is a chain, for --pp)
    "MobileNetV2: Inverted Residuals and Linear Bottlenecks |\n": "MobileNetV2: Inverted Residuals and Linear "
        "Bottlenecks |\n| [convnext] | cnn | 2022 | tiny, convnext_t, convnext_s, convnext_b, convnext_l | A ConvNet for "
        "the 2020s |\n",
    "digits at 32x32 | accuracy 0.9972 (93 s) |\n": "digits at 32x32 | accuracy 0.9972 (93 s) |\n| convnext | "
        "`torchrun --nproc_per_node 2 train.py --paper convnext` | digits at 28x28 | not run yet (see its note) |\n",
    # the Swin Transformer added: its row of the papers table, its reference, and the --tp and --pp lists
    "ViT-H/14 | An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale |\n":
        "ViT-H/14 | An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale |\n| [swin] | "
        "transformer | 2021 | tiny, swin_t, swin_s, swin_b, swin_l | Swin Transformer: Hierarchical Vision "
        "Transformer using Shifted Windows |\n",
    "reference implementation: ViT against timm;\n":
        "reference implementation: ViT against timm;\nthe Swin Transformer against torchvision;\n",
    "for a paper with a `tp_plan` (vit, gpt, transformer)": "for a paper with a `tp_plan` (vit, swin, gpt, transformer)",
    "as the paper's `tp_plan` names them (vit, gpt, transformer)":
        "as the paper's `tp_plan` names them (vit, deit, swin, gpt, transformer; swin's also splits its relative position "
        "bias tables by heads)",
    # the papers whose forward is a chain (--pp), with ResNeXt, ConvNeXt and the Swin Transformer added
    "N stages on N processes (gpt, resnet, vgg, vit)": "N stages on N processes (convnext, deit, gpt, resnet, resnext, "
        "swin, vgg, vit)",
    "`PipelineChain` in the spec: gpt, resnet, vgg, vit)": "`PipelineChain` in the spec: convnext, deit, gpt, resnet, "
        "resnext, swin, vgg, vit)",
    # DeiT (applied last, over the edits above): its row in the papers table, its flags, and the papers that take --tp and --pp
    "| [vit] | transformer | 2020 | tiny, tiny/4, ViT-B/16, ViT-L/16, ViT-H/14 | An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale |\n": "| [vit] | transformer | 2020 | tiny, tiny/4, ViT-B/16, ViT-L/16, ViT-H/14 | An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale |\n| [deit] | transformer | 2021 | tiny, tiny-distilled, deit_ti, deit_s, deit_b, deit_ti_distilled, deit_s_distilled, deit_b_distilled | Training data-efficient image transformers & distillation through attention |\n",
    "`lighting:S` (e.g. `crop:4,flip`; see `common/data/augment.py`); `none` for none; `auto`, the default: the data set's own, `crop:4,flip` for fashion-mnist, `crop:4` for mnist, none for the others |\n": "`lighting:S`, `randaug:M-S`, `erase:P` (e.g. `crop:4,flip`; see `common/data/augment.py`); `none` for none; `auto`, the default: the data set's own, `crop:4,flip` for fashion-mnist, `crop:4` for mnist, none for the others. For classification, DeiT's batch steps too: `mixup:A`, `cutmix:A`, `repeat:N` (see [Distillation and DeiT's recipe]) |\n| `--teacher RUN_DIR`, `--distillation {none,soft,hard}`, `--distillation-tau`, `--distillation-lambda` | knowledge distillation from a finished run, for a student with a distillation head (deit); see [Distillation and DeiT's recipe] |\n",
    "(vit, swin, gpt, transformer)": "(vit, deit, swin, gpt, transformer)",
    "| vit | `torchrun --nproc_per_node 2 train.py --paper vit` | digits | accuracy 0.975 |\n":
        "| vit | `torchrun --nproc_per_node 2 train.py --paper vit` | digits | accuracy 0.975 |\n| deit | `torchrun "
        "--nproc_per_node 2 train.py --paper deit` | digits | accuracy 0.9833 (137 s, on a machine loaded by other "
        "jobs) |\n| swin | `torchrun --nproc_per_node 2 train.py --paper swin` | digits at 28x28 | not run in full yet (see "
        "[its note]) |\n",
    # ResNet's and ViT's claims again on Fashion-MNIST (applied last): their verdicts, not run yet, and a line each
    "residual gain at a constant rate: opposite**": "residual gain at a constant rate: opposite; degradation on "
        "Fashion-MNIST: not run yet; residual gain on Fashion-MNIST: not run yet**",
    "which is the plain net's alone.": "which is the plain net's alone. The same four nets on Fashion-MNIST (half "
        "the training set, 4 epochs, the rate held at 0.1) have their hypothesis committed and are not run yet.",
    "ViT overtakes with more: opposite**": "ViT overtakes with more: opposite; ResNet ahead on little "
        "Fashion-MNIST: not run yet; ViT overtakes on all of Fashion-MNIST: not run yet**",
    "mechanism (overfitting on little data).": "mechanism (overfitting on little data). The same comparison on "
        "Fashion-MNIST (10%, 30% and 100% of its 60,000 images, 8 epochs) has its hypothesis committed and is not "
        "run yet.",
    "row g at batch 1)": "row g at batch 1, rows d and e at batch 4)",  # --smoke's smaller batch
    # AlexNet's, GoogLeNet's and MobileNetV2's claims again on Fashion-MNIST: their verdicts, not run yet, and a line each
    "with tanh units. **Verdict: not decided**": "with tanh units. **Verdict: six times faster: not decided; faster on "
        "Fashion-MNIST: not run yet**",
    "(95% interval 0.81 to 1.66), within noise.": "(95% interval 0.81 to 1.66), within noise. Figure 1's network on "
        "Fashion-MNIST (all 60,000 images, no augmentation, the epochs to 10% training error, a target chosen from a "
        "probe before the runs) has its hypothesis committed and is not run yet.",
    "(about 0.5%). **Verdict: not decided**": "(about 0.5%). **Verdict: auxiliary classifier helps a little: not "
        "decided; auxiliary classifier helps a little, Fashion-MNIST: not run yet**",
    "holds both no effect and 0.5%.": "holds both no effect and 0.5%. The same two nets on Fashion-MNIST (all 60,000 "
        "images, 12 epochs) have their hypothesis committed and are not run yet.",
    "(b) shortcuts between bottlenecks: not decided**": "(b) shortcuts between bottlenecks: not decided; (a) linear "
        "bottlenecks, Fashion-MNIST: not run yet; (b) shortcuts between bottlenecks, Fashion-MNIST: not run yet**",
    "in the paper's order but within the seeds' spread.": "in the paper's order but within the seeds' spread. The "
        "four variants on Fashion-MNIST (all 60,000 images, 8 epochs) have their hypothesis committed and are not run yet.",
    # ResNet's Fashion-MNIST claim, run: its verdicts and what they say
    "degradation on Fashion-MNIST: not run yet; residual gain on Fashion-MNIST: not run yet**":
        "degradation on Fashion-MNIST: holds; residual gain on Fashion-MNIST: opposite**",
    "The same four nets on Fashion-MNIST (half the training set, 4 epochs, the rate held at 0.1) have their "
    "hypothesis committed and are not run yet.": "On Fashion-MNIST (half the training set, 4 epochs, the rate held "
        "at 0.1) the verdicts change with real data: the residual net now trains better than the plain one at 56 "
        "layers (-0.068 training error, Holm's interval -0.125 to -0.011), the paper's plain-specific degradation, "
        "while plain-56 is still 0.125 above plain-20 (0.087 to 0.164); residual-56 does not yet beat residual-20 "
        "(+0.062, 0.013 to 0.112: opposite) after 936 steps, both curves still falling.",
    # ViT's Fashion-MNIST claim: its first claim decided by the runs in
    "ResNet ahead on little Fashion-MNIST: not run yet; ViT overtakes on all of Fashion-MNIST: not run yet**":
        "ResNet ahead on little Fashion-MNIST: holds; ViT overtakes on all of Fashion-MNIST: not run yet**",
    # the papers' table: its flavors on a page of their own (docs/papers.md, written from the catalog), which
    # also gave AlexNet's figure-1 and GPT's tiny-classifier flavors the README's table had missed
    "`python train.py --list` prints this table:": "`python train.py --list` prints this table:",
    "| tiny, AlexNet, torchvision |": "| tiny, AlexNet, torchvision, figure-1 |",
    "| tiny, GPT, GPT-2-124M,": "| tiny, tiny-classifier, GPT, GPT-2-124M,",
    # ViT's Fashion-MNIST claim, all 18 runs in
    "The same comparison on Fashion-MNIST (10%, 30% and 100% of its 60,000 images, 8 epochs) has its hypothesis "
    "committed and is not run yet.": "On Fashion-MNIST (10%, 30% and 100% of its 60,000 images, 8 epochs, 3 seeds) "
        "the verdicts stand: ResNet is ahead by 20.5, 16.7 and 12.4 points (every interval above 0), a gap that "
        "narrows with data but is not closed at 60,000 images; neither net overfits there (training and test "
        "accuracy within a point), so ViT again loses by fitting more slowly, not by overfitting.",
    "ResNet ahead on little Fashion-MNIST: holds; ViT overtakes on all of Fashion-MNIST: not run yet**":
        "ResNet ahead on little Fashion-MNIST: holds; ViT overtakes on all of Fashion-MNIST: opposite**",
    # --augment elastic:STD for segmentation
    "`repeat:N` (see [Distillation and DeiT's recipe]) |\n": "`repeat:N` (see [Distillation and DeiT's recipe]). For "
        "segmentation (images of any size), `elastic:STD`: U-Net's elastic deformation of the image and its masks "
        "together ([Segmentation]) |\n",
    # AlexNet's Fashion-MNIST claim, all 18 runs in
    "six times faster: not decided; faster on Fashion-MNIST: not run yet**":
        "six times faster: not decided; faster on Fashion-MNIST: not decided**",
    "a target chosen from a probe before the runs) has its hypothesis committed and is not run yet.":
        "a target chosen from a probe before the runs, 18 runs) leaves it undecided again: at their fastest rate "
        "(0.04 for both) tanh takes 1.00 times ReLU's epochs (95% interval 0.65 to 1.55); at each shared rate ReLU is "
        "slightly ahead, far from six times.",
    # GoogLeNet's Fashion-MNIST claim, all 6 runs in
    "auxiliary classifier helps a little: not decided; auxiliary classifier helps a little, Fashion-MNIST: not run yet**":
        "auxiliary classifier helps a little: not decided; auxiliary classifier helps a little, Fashion-MNIST: "
        "not decided**",
    "The same two nets on Fashion-MNIST (all 60,000 images, 12 epochs) have their hypothesis committed and are not "
    "run yet.": "The same two nets on Fashion-MNIST (all 60,000 images, 12 epochs, 6 runs) leave it undecided again: "
        "with the auxiliary classifier 0.9126 ± 0.0028, without 0.9115 ± 0.0018, a difference of +0.11 points (95% "
        "interval -0.47 to +0.69) that holds no effect and the paper's 0.5% alike; the seeds no longer scatter "
        "without it.",
    # --tta flip: a row of its own before --seq-len's
    "| `--seq-len T` | the generated": "| `--tta flip` |" + TTA_ROW + "\n| `--seq-len T` | the generated",
    # --reach-in minutes: a speedrun's clock
    "  first reached a target, with how many runs reached it.\n": "  first reached a target, with how many runs reached it "
        "(`--reach-in minutes`:\n  the wall minutes to it instead, each run's steps at its mean rate, a speedrun's "
        "clock).\n",
    # --sweep A B: several sweeps' runs together
    "  standalone runs (`--include-sweeps` ranks them too).\n": "  standalone runs (`--include-sweeps` ranks them too). "
        "`--sweep A B` shows\n  the runs of several sweeps together, as one experiment's arms written in two\n  files (a "
        "claim's second arm, say), each combination a row. A parameter that\n  one of them sets to one value and the "
        "others leave out (VGG's deeper nets'\n  `--init`) is shown once above the table, \"(in that sweep only)\", not "
        "in each\n  row, unless it alone tells two rows apart.\n",
    "`<!-- leaderboard:NAME:end -->`.": "`<!-- leaderboard:NAME:end -->` (for\n  several sweeps, NAME is their names "
        "joined by `+`).",
    # --init RUN_DIR and --init-tensors: a row of their own under --init REF
    "| `--init REF` | start from a reference's pretrained weights instead of a flavor (see [Fine-tuning]) |\n":
        "| `--init REF` | start from a reference's pretrained weights instead of a flavor (see [Fine-tuning]) |\n"
        "| `--init RUN_DIR`, `--init-tensors REGEX` | start from a finished run of the same paper: every tensor of "
        "`--flavor`'s model that the run's model.safetensors holds by name and shape, or with `--init-tensors` only those "
        "whose names match the regular expression in full (the others keep their initialisation); a `{seed}` in RUN_DIR "
        "is the run's own `--seed`, so that each seed of a sweep starts from the run of its seed (see [Fine-tuning]) |\n",
    # LoRA's flags: a row of their own under --init RUN_DIR's
    "its seed (see [Fine-tuning]) |\n| `--model-kwargs":
        "its seed (see [Fine-tuning]) |\n| `--lora RANK`, `--lora-alpha ALPHA`, `--lora-targets q,v` | with `--init`, "
        "train a low-rank update of the attention projections alone (LoRA), every weight `--init` loaded frozen; "
        "checkpoints and model.safetensors hold what trains (see [Fine-tuning]) |\n| `--model-kwargs",
    # BERT: its tp_plan (GPT's blocks), and its default run
    "(vit, deit, swin, gpt, transformer)": "(vit, deit, swin, gpt, bert, transformer)",
    "names them (vit, deit, swin, gpt, transformer;": "names them (vit, deit, swin, gpt, bert, transformer;",
    "| pydoc | 1.679 bits per character (548 s; a unigram model: 4.63) |\n":
        "| pydoc | 1.679 bits per character (548 s; a unigram model: 4.63) |\n| bert | `torchrun --nproc_per_node 2 "
        "train.py --paper bert` | pydoc-pairs | not run in full yet (see [its note]) |\n",
    # BERT's pre-training data sets, before text's row
    "| `text` | tokens, as `pydoc` | language modeling (bits per character) |":
        '| `pydoc-pairs` | tokens: "[CLS] A [SEP] B [SEP]", up to 128 WordPiece tokens, with segment ids and a '
        "padding mask | masked LM (MLM accuracy, perplexity, NSP accuracy) | BERT's pre-training samples "
        "(`common/data/sentence_pairs.py`, as the released `create_pretraining_data.py` makes them): pydoc-rest's"
        ' training topics as documents, split into sentences; A a run of sentences, B the text after it (IsNext) '
        "or, half of the time, a run from a random other topic (NotNext); 15% of each sample's tokens chosen once"
        " (80% `[MASK]`, 10% a random token, 10% kept) from a generator seeded by the sample's index; the text "
        "read 10 times, each with its own pairs and masks: 5,971 train / 884 test samples (pydoc's test topics), "
        "116.7 tokens on average, 55.6% NotNext; pydoc's WordPiece only (`--tokenizer wordpiece`, the ids of "
        '`pydoc-topics` read with it); bert trains on it |\n| `pydoc-segments` | tokens: "[CLS] A [SEP]", up to '
        '128 WordPiece tokens | masked LM (MLM accuracy, perplexity) | `pydoc-pairs` as single segments with no '
        'NSP label (4,470 train / 655 test samples): BERT\'s "No NSP" pre-training (Table 5), which builds bert '
        'without its NSP head |\n'
        + ROW_LTR + "| `text` | tokens, as `pydoc` | language modeling (bits per character) |",
    # FCN added: its row of the papers' table, and where it is checked
    "| End-to-End Object Detection with Transformers |\n": "| End-to-End Object Detection with Transformers |\n"
        "| [fcn] | cnn | 2015 | tiny, FCN-32s, FCN-16s, FCN-8s, FCN-8s-at-once, torchvision-fcn_resnet50 | Fully "
        "Convolutional Networks for Semantic Segmentation |\n",
    "its Hungarian matcher checked against brute force. Translation follows": "its Hungarian matcher checked against "
        "brute force. Segmentation follows\n([Segmentation]): FCN against torchvision's `fcn_resnet50`, the\nreleased "
        "Caffe nets' crops and its Table 1's parameter count. Translation follows",
    # U-Net added: its row of the papers' table, where it is checked, and --pixel-weights (its weight map on or off)
    "Fully Convolutional Networks for Semantic Segmentation |\n": "Fully Convolutional Networks for Semantic "
        "Segmentation |\n| [unet] | cnn | 2015 | tiny, u-net, u-net-padded | U-Net: Convolutional Networks for "
        "Biomedical Image Segmentation |\n",
    "and its Table 1's parameter count. Translation follows": "and its Table 1's parameter count, and U-Net against "
        "its\nFigure 1's shapes and parameter count. Translation follows",
    "| `--label-smoothing`, `--clip-grad` | cross-entropy smoothing; max gradient norm (0: off) |\n":
        "| `--label-smoothing`, `--clip-grad` | cross-entropy smoothing; max gradient norm (0: off) |\n"
        "| `--pixel-weights {paper,none}` | segmentation: each labelled pixel's weight in the training loss, the "
        "paper's own where its spec has one (`paper`, the default: U-Net's weight map of equation 2), or 1 for every "
        "pixel (`none`); see [Segmentation] |\n",
    # MobileNetV2's Fashion-MNIST claim, all 12 runs in
    "(a) linear bottlenecks, Fashion-MNIST: not run yet; (b) shortcuts between bottlenecks, Fashion-MNIST: not run "
    "yet**": "(a) linear bottlenecks, Fashion-MNIST: not decided; (b) shortcuts between bottlenecks, Fashion-MNIST: "
        "not decided**",
    "The four variants on Fashion-MNIST (all 60,000 images, 8 epochs) have their hypothesis committed and are not "
    "run yet.": "On Fashion-MNIST (all 60,000 images, 8 epochs, 12 runs) both are not decided: the paper's network is "
        "ahead of each variant, by 0.27 points over ReLU6 after the projections (95% interval -0.17 to +0.70), 0.41 "
        "over shortcuts between expansions (Holm's -0.17 to +0.98) and 0.36 over none (-0.13 to +0.84). Every variant "
        "was still learning, its training accuracy no higher than its test accuracy (but in one run, by 0.002): at "
        "this budget the tiny net's capacity, not the variant, limits all four.",
    # torch's FLOP count of a grouped convolution's weight gradient replaced by ours
    "meta-device copy of the model; the peak comes from a table of known\naccelerators (H100, H200, A100, V100, L4) "
    "or, on a CPU or an unknown device,\nfrom a 1024x1024 matrix product measured at start, and the log says which.":
        "meta-device copy of the model, with one formula of our own: torch 2.14 counts the weight gradient of a "
        "grouped or depthwise convolution as if it had one group (G times too many FLOPs for that term). Results of "
        "commits up to 8f41804 carry torch's count, which overstates the FLOPs and MFU of the papers with such "
        "convolutions: ResNeXt's, MobileNetV2's and ConvNeXt's Fashion-MNIST runs logged MFUs of 0.21 to 0.28, 0.86 "
        "to 1.00 and 0.67 to 1.28 (`tests/test_speed.py` checks the count of a grouped convolution). The peak comes "
        "from a table of known accelerators (H100, H200, A100, V100, L4) or, on a CPU or an unknown device, from a "
        "1024x1024 matrix product measured at start, and the log says which.",
    # ConvNeXt's and Swin's default commands, run in full
    "| digits at 28x28 | not run yet (see its note) |": "| digits at 28x28 | accuracy 0.9611 (90 s, niced beside a "
        "2-process training run) |",
    "| digits at 28x28 | not run in full yet (see [its note]) |": "| digits at 28x28 | accuracy 0.8694 (136 s, niced "
        "beside a 2-process training run) |",
}


def normal(text):
    """Link targets dropped, headings' levels dropped, lines joined."""
    text = re.sub(r"\]\([^)\s]*\)", "]", text)
    return re.sub(r"(?m)^#{1,6} ", "", text)


def test_nothing_of_the_old_readme_was_lost():
    shown = subprocess.run(["git", "show", f"{OLD_README}:README.md"], cwd=ROOT, capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"commit {OLD_README} is not in this clone's history")
    old = normal(shown.stdout)
    for before, after in EDITS.items():
        old = old.replace(before, after)
    new = " ".join(" ".join(normal(p.read_text()) for p in [README, *DOCS]).split())
    lost = [chunk for chunk in re.split(r"\n\s*\n", old) if " ".join(chunk.split()) not in new]
    assert not lost, f"{len(lost)} paragraphs, tables or code blocks of the old README are nowhere now: {lost[:2]}"
