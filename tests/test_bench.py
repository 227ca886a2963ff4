"""The bench (common/bench.py): its smoke form over every paper it times by default, and its refusals.
The figures themselves are the README's, from full runs; here only that each row runs."""

import pytest

from types import SimpleNamespace

import torch

from common import bench, bench_rows, export
from common.config import build_parser, resolve, validate
from papers import get_paper

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`


def table_rows(table: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.split("|")[1:-1]] for line in table.splitlines()[2:]]


class StandIn:
    """An onnxruntime session's stand-in that runs the PyTorch graph export would write: the graph's inputs
    as export names them, fed as numpy arrays (export itself is tested for every paper in test_export.py)."""

    def __init__(self, model, spec, facts):
        self.graph = export.graph(model)
        multiple = export.size_multiple(model, None)
        self.names = list(export.example(spec.inputs, facts, multiple, 1, False, 0, spec.padded_batches))

    def get_inputs(self):
        return [SimpleNamespace(name=n) for n in self.names]

    def run(self, _, feed: dict):
        assert list(feed) == self.names
        with torch.no_grad():
            return self.graph(*(torch.from_numpy(v) for v in feed.values()))


def exported_or_stood_in(real):
    """Row g's ONNX session: exported and checked for real for a paper of a fixed size (lenet, whose
    larger sizes broke the bench once) and one that reads padded batches (vit); a stand-in for the others
    (an export takes 2 to 12 s here)."""
    def session(model, spec, facts, threads, folder):
        if spec.name in ("lenet", "vit"):
            return real(model, spec, facts, threads, folder)
        return StandIn(model, spec, facts)

    return session


# rows a, b, d, e and g put every paper through the trainer, torch.compile, autocast, torch.export and their
# batches, and beside its reference, which tests/test_papers.py (compile, the trainer), tests/test_export.py
# (torch.export and the example batches) and each paper's tests (its reference) do for every paper; here they run for one paper of each kind of input and output the
# bench handles (a fixed size, auxiliary outputs, padded images, sequences, pairs, tokens), as every paper
# did until commit 9e621dd (row e until ac27f92, rows b and g until 48625ed)
KINDS = ("lenet", "googlenet", "vit", "lstm", "seq2seq", "gpt")
# row a runs each paper's default run through the trainer and a bare loop, the same code for every paper
# (the trainer itself is test_papers' and test_train's): an image paper and a sequence paper, for the
# suite's time (each run evaluates its whole test split)
ROW_A_KINDS = ("vit", "lstm")


def test_every_default_row_runs_for_every_paper_it_times(capsys, monkeypatch):
    """A new paper cannot break the bench unnoticed: `--smoke` (one step, one call, no warm-up) runs rows c
    and f over every paper (--papers all), rows b, d, e and g over KINDS and row a over ROW_A_KINDS. Row f's three launches
    a paper (8 minutes for all of them) are not made: each of its commands goes through train.py's own flag
    checks at its number of processes, which refuse a paper that cannot train that way; row g's ONNX
    exports are made for two papers (see exported_or_stood_in)."""
    launches = []

    def checked(flags: list[str], nproc: int) -> dict:
        cfg = resolve(vars(build_parser().parse_args(flags + ["--wandb", "disabled"])))
        validate(cfg, world_size=nproc)
        launches.append((cfg.paper, cfg.strategy, nproc))
        return {"samples_per_s": 1.0, "batch_size": cfg.batch_size, "memory_per_rank": [{"total": 1}]}

    def loop_checked(paper: str, nproc: int, steps: int, repeats: int, skips: list[str]) -> dict:
        if nproc == 1:  # the trainer and the bare loop for real, in this process
            return real_loop(paper, nproc, steps, repeats, skips)
        checked(["--paper", paper, "--max-steps", str(steps)], nproc)
        return {"trainer": [1.0], "bare": [1.0]} | {f"trainer -{s}": [1.0] for s in skips}

    real_loop = bench_rows._run_loop
    monkeypatch.setattr(bench_rows, "_run_train", checked)
    monkeypatch.setattr(bench_rows, "_run_loop", loop_checked)
    monkeypatch.setattr(bench_rows, "_onnx_session", exported_or_stood_in(bench_rows._onnx_session))
    table = "\n".join([bench.main(["--smoke", "--rows", "c,f", "--papers", "all"]),
                       bench.main(["--smoke", "--rows", "b,d,e,g", "--papers", ",".join(KINDS)]),
                       bench.main(["--smoke", "--rows", "a", "--papers", ",".join(ROW_A_KINDS)])])
    rows = [r for r in table_rows(table) if r and r[0] != "row" and not r[0].startswith("-")]
    assert rows and all(float(r[4]) > 0 for r in rows)
    covers = lambda letter: {r[1].split(":")[0].split(" ")[0] for r in rows if r[0] == letter}
    papers = set(bench_rows.benched())
    assert len(papers) >= 14 and "lenet" in papers  # a fixed-size paper: row g exports it at its own size
    assert covers("f") == papers
    for letter in "deg":
        assert covers(letter) == set(KINDS), letter
    assert covers("a") == set(ROW_A_KINDS)
    assert covers("b") == {p for p in KINDS if get_paper(p).reference_models}
    assert covers("c") == {"lstm"}
    assert sum(r[0] == "g" for r in rows) == 2 * len(KINDS)  # compiled and onnxruntime, at batch 1
    assert "gpt vs transformers GPT2LMHeadModel, 128 tokens: forward+backward, batch 64" in table
    assert sum(r[0] == "a" for r in rows) == 2 * len(ROW_A_KINDS)  # one process and two, without the feature runs
    assert sorted(launches) == sorted([(p, s, n) for p in papers for s, n in (("auto", 1), ("ddp", 2), ("fsdp", 2))]
                                      + [(p, "auto", 2) for p in ROW_A_KINDS])  # row f's, then row a's 2 processes


def test_the_bench_refuses_detection_papers_and_unknown_rows_in_one_line(capsys):
    assert bench.main(["--rows", "a", "--papers", "faster_rcnn,vit"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the bench times classification and sequence papers; not faster_rcnn (")
    assert "faster_rcnn" not in bench_rows.benched() and "vit" in bench_rows.benched() and len(err.splitlines()) == 1
    assert bench.main(["--rows", "a,z"]) == 2
    assert capsys.readouterr().err.strip() == "error: unknown row(s) z; choose from: a, b, c, d, e, f, g, h, i, batch"


def test_row_i_times_each_loader_and_worker_count_against_each_image_papers_model(capsys):
    """Row i (smoke: 320 images): the image folder, wds shards and HF dataset each delivered batches with
    0, 1 and 2 workers, compared with the image papers' models (lstm reads sequences: no column)."""
    rows = table_rows(bench.main(["--rows", "i", "--smoke", "--papers", "vit,lstm"]))
    assert [(r[1], r[2]) for r in rows] == [(d, w) for d in ("imagefolder", "wds", "hf") for w in ("0", "1", "2")]
    for r in rows:
        loader, model, ratio = (float(c.replace(",", "")) for c in r[3:6])
        # the table rounds samples/s to whole numbers and the ratio to 2 decimals (common.bench_loader): the
        # ratio of the unrounded figures lies between those of the rounded ones moved half a unit, and the
        # printed ratio within half a hundredth of it (a busy machine's model row: 12/s, ratios near 20)
        assert len(r) == 6 and loader > 0 and model > 0.5
        assert (loader - 0.5) / (model + 0.5) - 0.005 <= ratio <= (loader + 0.5) / (model - 0.5) + 0.005


def test_progress_goes_to_stderr_a_line_per_row_and_paper_and_ctrl_c_prints_what_was_measured(capsys, monkeypatch):
    """The default papers are one of each family; each (row, paper) has a line as it starts and one with its
    time and the time left; an interrupt prints the rows measured so far as a table and exits 130."""
    calls = []

    def fake(args, device):
        calls.append(args.papers)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return [bench_rows.row("a", f"{args.papers[0]}: made up", "1", "1", 1.0)]

    monkeypatch.setitem(bench_rows.ROWS, "a", fake)
    monkeypatch.setitem(bench_rows.ROWS, "b", fake)
    assert bench.main(["--smoke", "--rows", "a,b"]) == 130
    out, err = capsys.readouterr()
    assert calls == [["vit"], ["resnet"], ["lstm"], ["vit"]]
    started = [line for line in err.splitlines() if line.endswith("...")]
    assert started == [f"bench: row {r}, {p} ({i}/6) ..." for i, (r, p) in
                       enumerate([("a", "vit"), ("a", "resnet"), ("a", "lstm"), ("b", "vit")], 1)]
    assert sum("min left" in line for line in err.splitlines()) == 3
    assert "interrupted" in out and [r[1] for r in table_rows(out.split("\n\n", 2)[-1])] == [
        "vit: made up", "resnet: made up", "lstm: made up"]


def test_rows_d_and_e_time_the_fashion_mnist_speedrun_s_model_outside_quick():
    """ResNet's rows d and e time, besides its tiny flavor on digits and ResNet-20, the speedrun's model on
    28x28 grey images (docs/fashion-mnist.md's speedrun cites row d's compiled against eager)."""
    assert [label for label, _ in bench_rows._configs("resnet", quick=False)] == [
        "tiny", "larger", "fashion-mnist speedrun"]
    assert [label for label, _ in bench_rows._configs("resnet", quick=True)] == ["tiny"]
    build = dict(bench_rows._configs("resnet", quick=False))["fashion-mnist speedrun"]
    model, inputs, targets, _ = build("resnet", 2, torch.device("cpu"))
    assert inputs.shape == (2, 1, 28, 28) and model(inputs).shape == (2, 10)
    assert sum(p.numel() for p in model.parameters()) == 297_450  # the tiny flavor of docs/fashion-mnist.md's table
