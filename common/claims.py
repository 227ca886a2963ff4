"""Claims: the hypothesis written before the runs, turned into a verdict by one written rule.

    python -m common.claims verdict papers/transformer/claims/heads.yaml
    python -m common.claims verdict --all [--write]     # --write: README's claims table, docs/claims.md's

Beside each sweep file of a claim, `<file>.hypothesis.yaml` says what its runs are to show (the sweep file
stays a W&B sweep file: wandb's schema takes a string `description` and no key of ours):

    paper: Transformer                    # its name in the tables
    title: "Table 3 (A): one head is worse than several"
    statement: the paper's words          # and where: the section, figure or table
    where: Table 3, rows (A)
    metric: bleu                          # a final metric, another final metric or a curve's last value
    # reach: "train/error<=0.25"          #   or the epochs until a curve reaches a target
    # file: proposals.json                #   or numbers of a re-evaluation file beside it: arms give `path`
    #                                     #   (not written yet: not run yet)
    # scale: log    best_over: [lr]    paired: true
    arms:                                 # the parameters that pick an arm's runs out of the sweep
      4 heads: {model-kwargs: num_heads=4}
      1 head: {model-kwargs: num_heads=1}
    claims:
      - label: one head
        pairs: {"4 heads > 1 head": 0.9}  # '>' the claim is A above B, '<' below, '=' no difference;
        min_difference: null              #   the value: the paper's A - B on this scale, or null
    stated_after_results: [min_difference]

Every pair is compared by Welch's t (scipy): the difference of the means and its 95% interval, then Holm's
correction over the pairs of one claim, as intervals: the pairs in the order of their p-values get the
levels 1 - 0.05/m, 1 - 0.05/(m - 1), ... until the first whose interval holds 0, which and every later
one keep its level. The verdict of a pair reads its corrected interval (docs/claims.md, "The rule"), the
verdict of a claim is its weakest pair's. Nothing here imports torch.
"""

import argparse
import json
import math
import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from common import seeds
from common.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
ALPHA = 0.05
HOLDS, SMALLER, OPPOSITE, NO_EFFECT, NOT_DECIDED, NOT_RUN = (
    "holds", "smaller than the paper's", "opposite", "no effect", "not decided", "not run yet")
# a claim's verdict: its weakest pair's; a pair with an arm whose sweep has not finished its seeds is not run yet
WEAKEST_FIRST = (NOT_RUN, OPPOSITE, NO_EFFECT, NOT_DECIDED, SMALLER, HOLDS)
PAIR = re.compile(r"\s*(.+?)\s+([<>=])\s+(.+?)\s*")
KEYS = {"paper", "title", "statement", "where", "written", "metric", "reach", "file", "scale", "best_over",
        "paired", "arms", "claims", "stated_after_results", "part_of", "reading"}
BLOCKS = {"claims": "README.md", "claims:pairs": "docs/claims.md", "claims:real-data": "docs/claims.md"}  # markers: file
REAL = "-fashion-mnist"  # FILE-fashion-mnist.yaml beside FILE.yaml: FILE's claims run again on real data


# ---------------------------------------------------------------- the hypothesis


@dataclass
class Pair:
    a: str
    op: str  # ">", "<" or "="
    b: str
    paper: float | None  # the paper's a - b on this pair's scale

    def __str__(self):
        return f"{self.a} {self.op} {self.b}"


@dataclass
class Claim:
    label: str
    says: str
    pairs: list[Pair]
    min_difference: float | None


@dataclass
class Hypothesis:
    path: Path  # the sweep file
    sweep: str
    spec: dict
    arms: dict
    claims: list[Claim]
    planned: dict  # {arm: the seeds its sweep runs}: fewer runs in the store and its pairs are not run yet

    @property
    def paper_dir(self) -> Path:
        return self.path.parent.parent

    @property
    def log(self) -> bool:
        return self.spec.get("scale") == "log"

    def label(self) -> str:
        if self.spec.get("file"):
            return f"{self.spec.get('metric', 'value')} ({self.spec['file']})"
        if self.spec.get("reach"):
            key, op, target = seeds.parse_reach(self.spec["reach"])
            return f"epochs to {key} {op} {target:g}"
        return self.spec.get("metric", "-")


def hypothesis_file(sweep_file: Path) -> Path:
    return sweep_file.with_name(sweep_file.stem + ".hypothesis.yaml")


def sweep_files(root: Path = ROOT) -> list[Path]:
    """Every claim's sweep file (papers/*/claims/*.yaml without the hypotheses beside them)."""
    found = [p for p in root.glob("papers/*/claims/*.yaml") if not p.name.endswith(".hypothesis.yaml")]
    return sorted(found, key=lambda p: (p.parent, p.stem))  # a paper's first sweep before its follow-ups


def load(sweep_file: str | Path) -> Hypothesis:
    """The hypothesis beside a sweep file; ConfigError naming what is missing or wrong."""
    import yaml

    path = Path(sweep_file)
    if path.name.endswith(".hypothesis.yaml"):
        path = path.with_name(path.name.replace(".hypothesis.yaml", ".yaml"))
    where = hypothesis_file(path)
    if not path.is_file() or not where.is_file():
        raise ConfigError(f"{path}: needs the sweep file and its hypothesis {where.name} beside it")
    try:
        spec, sweep = yaml.safe_load(where.read_text()), yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} or its sweep file is not YAML: {' '.join(str(e).split())}") from None
    if not isinstance(spec, dict) or set(spec) - KEYS:
        raise ConfigError(f"{where}: a mapping of {', '.join(sorted(KEYS))}; "
                          f"not {', '.join(sorted(set(spec or {}) - KEYS))}")
    name, arms, claims = str(sweep.get("name") or path.stem), spec.get("arms") or {}, []
    for c in spec.get("claims") or []:
        if not isinstance(c, dict) or "label" not in c or not c.get("pairs"):
            raise ConfigError(f"{where}: each claim has a label and its pairs")
        pairs = []
        for text, paper in (c.get("pairs") or {}).items():
            match = PAIR.fullmatch(text)
            if not match or match[1] not in arms or match[3] not in arms:
                raise ConfigError(f"{where}: pair '{text}' is not 'ARM > ARM' ('<', '=') of arms {', '.join(arms)}")
            pairs.append(Pair(match[1], match[2], match[3], paper))
        claims.append(Claim(str(c["label"]), str(c.get("says", "")), pairs, c.get("min_difference")))
    if not claims and not spec.get("part_of"):
        raise ConfigError(f"{where}: no claims (a sweep that only serves another's claim says part_of)")
    planned = {}
    for arm, params in arms.items():
        if spec.get("file"):  # a re-evaluation of the sweep's runs: a number per seed of it
            planned[arm] = seed_count(sweep)
            continue
        own = sweep if "sweep" not in params else sweep_named(path, params["sweep"])
        check_arm(where, arm, params, own)
        planned[arm] = seed_count(own)
    return Hypothesis(path, name, spec, arms, claims, planned)


def arm_names(root: Path = ROOT) -> list[tuple[str, dict, str]]:
    """(sweep, parameters, arm) of every claim's arm that picks its runs by their parameters (not a
    re-evaluation file's): a sweep's figure names its combinations by them."""
    named = []
    for path in sweep_files(root):
        h = load(path)
        for arm, params in ({} if h.spec.get("file") else h.arms).items():
            params = dict(params)
            named.append((str(params.pop("sweep", h.sweep)), params, arm))
    return named


def seed_count(sweep: dict) -> int:
    """How many seeds a sweep file runs each combination with (1 where it names none)."""
    p = (sweep.get("parameters") or {}).get("seed")
    return 1 if not isinstance(p, dict) or "value" in p else len(p.get("values", [])) or 1


def sweep_named(beside: Path, name: str) -> dict:
    """The sweep file of that name in the same claims folder, or in the repository's sweeps/ (a paper's
    Fashion-MNIST sweep, whose runs are one arm of a claim)."""
    import yaml

    root = beside.parent.parent.parent.parent
    for other in [p for p in sweep_files(root) if p.parent == beside.parent] + sorted((root / "sweeps").glob("*.yaml")):
        if yaml.safe_load(other.read_text()).get("name") == name:
            return yaml.safe_load(other.read_text())
    raise ConfigError(f"{beside}: no sweep named {name} beside it nor in sweeps/")


def check_arm(where: Path, arm: str, params: dict, sweep: dict) -> None:
    """An arm names parameters of its sweep and values they take there (a typo fails here, not as an arm
    without runs)."""
    grid = sweep.get("parameters") or {}
    for key, value in params.items():
        if key == "sweep":
            continue
        p = grid.get(key)
        taken = [p["value"]] if isinstance(p, dict) and "value" in p else (p or {}).get("values", [])
        if str(value) not in map(str, taken):
            raise ConfigError(f"{where}: arm '{arm}': {key}={value} is not among the sweep's "
                              f"{key} ({', '.join(map(str, taken)) or 'no such parameter'})")


# ---------------------------------------------------------------- the numbers of an arm


def _walk(node, keys: list[str], seen: tuple = ()):
    """(the values '*' stood for, the number) at each end of a JSON path."""
    if not keys:
        yield seen, float(node)
        return
    head, rest = keys[0], keys[1:]
    children = node.items() if head == "*" else [(head, node[head])] if head in node else []
    for key, child in children:
        yield from _walk(child, rest, seen + ((key,) if head == "*" else ()))


def arm_values(h: Hypothesis, arm: str, results: list[dict], files: dict) -> dict[str, float]:
    """{seed (or what '*' stood for): number} of one arm."""
    spec = dict(h.arms[arm])
    if h.spec.get("file"):
        path = h.path.parent / h.spec["file"]
        data = files.setdefault(path, json.loads(path.read_text()) if path.is_file() else None)
        if data is None:  # its script has not run: no numbers, the claim not run yet
            return {}
        found = {"/".join(k): v for k, v in _walk(data, spec["path"].split("/"))}
        if not found:
            raise ConfigError(f"{h.path}: arm '{arm}': {spec['path']} finds no number in {h.spec['file']}")
        return found
    sweep = spec.pop("sweep", h.sweep)
    runs = [r for r in results if (r.get("sweep") or {}).get("name") == sweep
            and all(str(r["sweep"]["combination"].get(k)) == str(v) for k, v in spec.items())]
    score = (lambda r: seeds.reach(r, *seeds.parse_reach(h.spec["reach"]))) if h.spec.get("reach") else (
        lambda r: seeds.value(r, h.spec["metric"]))
    groups: dict[str, dict] = {}
    for r in runs:  # by the parameters tuned per arm (best_over): each arm at its best, as --versus
        key = json.dumps({k: r["sweep"]["combination"].get(k) for k in h.spec.get("best_over", [])})
        if (v := score(r)) is not None:
            groups.setdefault(key, {})[str(r["sweep"]["combination"].get("seed"))] = v
    if not groups:
        return {}
    lower = bool(h.spec.get("reach")) or seeds.lower_is_better(h.spec.get("metric", ""))
    mean = lambda g: sum(g.values()) / len(g)
    return (min if lower else max)(groups.values(), key=mean)


# ---------------------------------------------------------------- comparing, correcting, the verdict


@dataclass
class Compared:
    pair: Pair
    n: tuple[int, int]
    difference: float  # a - b (of the logarithms with scale: log)
    low: float  # Welch's 95% interval
    high: float
    p: float
    level: float = 0.95  # Holm's
    holm_low: float = math.nan
    holm_high: float = math.nan
    verdict: str = NOT_DECIDED


def compare(a: dict[str, float], b: dict[str, float], paired: bool = False, level: float = 0.95):
    """(difference of the means, low, high, p): Welch's t, or with paired the t of the differences of the
    keys both have; nan where either side has fewer than two numbers."""
    from scipy import stats

    if paired:
        keys = sorted(set(a) & set(b))
        a, b = {k: a[k] for k in keys}, {k: b[k] for k in keys}
    x, y = list(a.values()), list(b.values())
    if len(x) < 2 or len(y) < 2:
        d = (sum(x) / len(x) if x else math.nan) - (sum(y) / len(y) if y else math.nan)
        return d, math.nan, math.nan, math.nan
    d = sum(x) / len(x) - sum(y) / len(y)
    if max(x) == min(x) and max(y) == min(y) or paired and len({u - v for u, v in zip(x, y)}) == 1:
        return d, d, d, (1.0 if d == 0 else 0.0)  # no spread: the difference is what it is
    with warnings.catch_warnings():  # scipy's note on nearly equal numbers (runs at chance): the numbers stand
        warnings.simplefilter("ignore", RuntimeWarning)
        test = stats.ttest_rel(x, y) if paired else stats.ttest_ind(x, y, equal_var=False)
        interval = test.confidence_interval(level)
    return d, float(interval.low), float(interval.high), float(test.pvalue)


def holm(compared: list[Compared], values: list[tuple[dict, dict]], paired: bool) -> None:
    """Each pair's interval at its Holm level (the module's docstring), in place; values: each pair's (a, b)."""
    m, stop = len(compared), None
    order = sorted(range(m), key=lambda i: (math.isnan(compared[i].p), compared[i].p))
    for rank, i in enumerate(order):
        c = compared[i]
        c.level = stop if stop is not None else 1 - ALPHA / (m - rank)
        _, c.holm_low, c.holm_high, _ = compare(*values[i], paired, c.level)
        if stop is None and not (c.holm_low > 0 or c.holm_high < 0):
            stop = c.level


def verdict(low: float, high: float, op: str, paper: float | None, min_difference: float | None) -> str:
    """The rule (docs/claims.md): the verdict of one pair from its corrected interval of a - b."""
    if math.isnan(low) or math.isnan(high):
        return NOT_DECIDED
    within = min_difference is not None and -min_difference <= low and high <= min_difference
    if op == "=":  # a claim of no difference
        if within:
            return HOLDS
        beyond = min_difference is not None and (low > min_difference or high < -min_difference)
        return OPPOSITE if beyond else NOT_DECIDED
    sign = 1 if op == ">" else -1
    low, high = sorted((sign * low, sign * high))  # now the claim is "above 0"
    if low > 0:
        return SMALLER if paper is not None and high < sign * paper else HOLDS
    if high < 0:
        return OPPOSITE
    return NO_EFFECT if within else NOT_DECIDED


@dataclass
class Judged:
    claim: Claim
    pairs: list[Compared]
    verdict: str


def judge(h: Hypothesis, results: list[dict]) -> list[Judged]:
    files: dict = {}
    values = {arm: arm_values(h, arm, results, files) for arm in h.arms}
    if h.log:
        if any(v <= 0 for vs in values.values() for v in vs.values()):
            raise ConfigError(f"{h.path}: scale: log needs positive numbers")
        values = {arm: {k: math.log(v) for k, v in vs.items()} for arm, vs in values.items()}
    out, paired = [], h.spec.get("paired", False)
    for claim in h.claims:
        pairs = [(values[p.a], values[p.b]) for p in claim.pairs]
        compared = [Compared(p, (len(a), len(b)), *compare(a, b, paired)) for p, (a, b) in zip(claim.pairs, pairs)]
        holm(compared, pairs, paired)
        for c in compared:
            paper = c.pair.paper if c.pair.paper is None or not h.log else math.log(c.pair.paper)
            c.verdict = verdict(c.holm_low, c.holm_high, c.pair.op, paper, claim.min_difference)
            if c.n[0] < h.planned.get(c.pair.a, 0) or c.n[1] < h.planned.get(c.pair.b, 0):
                c.verdict = NOT_RUN  # the hypothesis is committed, its runs are not all in results/ yet
        out.append(Judged(claim, compared, min((c.verdict for c in compared), key=WEAKEST_FIRST.index)))
    return out


# ---------------------------------------------------------------- what is written


def _n(x: float, log: bool = False) -> str:
    if x != x:
        return "n/a"
    return f"{math.exp(x):.3g}" if log else f"{x:+.3g}"


def interval(d: float, low: float, high: float, log: bool) -> str:
    """"+2.81 [1.26, 4.37]", or with scale: log the ratio "x1.16 [0.809, 1.66]"."""
    if log:
        return f"x{_n(d, True)} [{_n(low, True)}, {_n(high, True)}]"
    return f"{_n(d)} [{_n(low)}, {_n(high)}]"


def paper_text(pair: Pair, log: bool) -> str:
    if pair.paper is None:
        return "-"
    return f"x{pair.paper:g}" if log else f"{pair.paper:+g}"


def report(h: Hypothesis, judged: list[Judged]) -> str:
    """The text `verdict FILE` prints."""
    how = [h.label()]
    if h.spec.get("best_over"):
        how.append(f"each arm at its best {', '.join(h.spec['best_over'])}")
    if h.log:
        how.append("ratios of geometric means")
    if h.spec.get("paired"):
        how.append("paired by seed")
    where = h.path.relative_to(ROOT) if h.path.is_relative_to(ROOT) else h.path
    lines = [f"{where}: sweep {h.sweep}, {', '.join(how)}"]
    if h.spec.get("part_of"):
        lines.append(f"  its runs serve the claim of {h.spec['part_of']}")
    for j in judged:
        m = len(j.pairs)
        lines.append(f"  claim '{j.claim.label}': {j.verdict}  (Holm's correction over its {m} pair"
                     f"{'s' if m > 1 else ''}{': none needed' if m == 1 else ''}; min difference "
                     f"{j.claim.min_difference if j.claim.min_difference is not None else 'not stated'})")
        for c in j.pairs:
            lines.append(f"    {str(c.pair):<34} n {c.n[0]}, {c.n[1]}  {interval(c.difference, c.low, c.high, h.log)} "
                         f"Welch 95%  p {c.p:.2g}  Holm {c.level:.4g}: "
                         f"{interval(c.difference, c.holm_low, c.holm_high, h.log)}  paper {paper_text(c.pair, h.log)}"
                         f"  -> {c.verdict}")
    if h.spec.get("stated_after_results"):
        lines.append(f"  stated after the results: {', '.join(map(str, h.spec['stated_after_results']))}")
    return "\n".join(lines)


def paper_verdict(judged: list[tuple[Hypothesis, list[Judged]]]) -> str:
    """The verdict text of one paper's claims, as its note and docs/claims.md write it: the word alone for
    one claim, else 'label: word; label: word'."""
    every = [j for _, js in judged for j in js]
    return every[0].verdict if len(every) == 1 else "; ".join(f"{j.claim.label}: {j.verdict}" for j in every)


def by_paper(all_judged: list[tuple[Hypothesis, list[Judged]]]) -> dict[str, list]:
    papers: dict[str, list] = {}
    for h, js in all_judged:
        papers.setdefault(h.paper_dir.name, []).append((h, js))
    return papers


def readme_table(all_judged) -> str:
    """One row a paper. The front door keeps it short: the title of its first claim that has run, the verdicts
    of the claims whose runs are in, and a count of those committed but not run yet (their labels and titles
    are in the notes and docs/claims.md)."""
    rows = ["| paper | the claim | verdict (`python -m common.claims verdict --all`) |", "|---|---|---|"]
    for name, items in by_paper(all_judged).items():
        if not any(js for _, js in items):
            continue
        h = items[0][0]
        ran = [(i, [j for j in js if j.verdict != NOT_RUN]) for i, js in items]
        ran = [(i, js) for i, js in ran if js]
        waiting = sum(j.verdict == NOT_RUN for _, js in items for j in js)
        titles = [i.spec["title"] for i, js in (ran or items) if js][:1]  # the paper's first; the note has the others
        done = [j for _, js in ran for j in js]
        said = done[0].verdict if len(done) == 1 and not waiting else "; ".join(f"{j.claim.label}: {j.verdict}" for j in done)
        verdict = "; ".join(filter(None, [said,
                                          f"{waiting} {'claim' if waiting == 1 else 'claims'} not run yet" if waiting else ""]))
        rows.append(f"| [{h.spec['paper']}](papers/{name}/README.md#the-claim-tested) | {'; '.join(titles)} | "
                    f"{verdict} |")
    return "\n".join(rows)


def pairs_table(all_judged) -> str:
    rows = ["| paper | claim: verdict | pair, as claimed | n | difference [95%, Welch] | Holm: level, interval "
            "| paper's | pair's verdict |", "|---|---|---|---|---|---|---|---|"]
    for h, judged in all_judged:
        for j in judged:
            for i, c in enumerate(j.pairs):
                first = i == 0
                link = f"{h.spec['paper']} ([{h.path.stem}]({os.path.relpath(hypothesis_file(h.path), ROOT / 'docs')}))"
                rows.append(
                    f"| {link if first else ''} "
                    f"| {j.claim.label + ': **' + j.verdict + '**' if first else ''} | {c.pair} | {c.n[0]}, {c.n[1]} "
                    f"| {interval(c.difference, c.low, c.high, h.log)} | {c.level:.4g}: "
                    f"{interval(c.difference, c.holm_low, c.holm_high, h.log)} | {paper_text(c.pair, h.log)} "
                    f"| {c.verdict} |")
    return "\n".join(rows)


def again_on_real_data(all_judged) -> list[tuple[tuple, tuple]]:
    """(first, again): each claim file FILE-fashion-mnist.yaml with claims of its own, and FILE.yaml beside
    it, the same claims on the data they first ran on; their claims are in the same order."""
    judged = {h.path: (h, js) for h, js in all_judged}
    out = []
    for h, js in all_judged:
        first = judged.get(h.path.with_name(h.path.stem.removesuffix(REAL) + ".yaml"))
        if h.path.stem.endswith(REAL) and js and first:
            if len(first[1]) != len(js):
                raise ConfigError(f"{h.path}: {len(js)} claims where {first[0].path.name} has {len(first[1])}: "
                                  "a claim run again on Fashion-MNIST keeps the order of the first file's")
            out.append((first, (h, js)))
    return out


def dataset_of(h: Hypothesis) -> str:
    import yaml

    dataset = (yaml.safe_load(h.path.read_text()).get("parameters") or {}).get("dataset") or {}
    return str(dataset.get("value", "its data"))


def real_data_table(all_judged) -> str:
    """One row a claim run again on Fashion-MNIST: its verdict on the first data and on Fashion-MNIST, and
    the pairs whose own verdict changed (a pair not run yet on Fashion-MNIST has not changed)."""
    rows = ["| paper | claim | first data | its verdict there | on Fashion-MNIST | pairs whose verdict changed |",
            "|---|---|---|---|---|---|"]
    for (h0, js0), (h1, js1) in again_on_real_data(all_judged):
        for j0, j1 in zip(js0, js1):
            before = {str(c.pair): c.verdict for c in j0.pairs}
            changed = [f"{c.pair}: {before[str(c.pair)]} to {c.verdict}" for c in j1.pairs
                       if before.get(str(c.pair), c.verdict) != c.verdict and c.verdict != NOT_RUN]
            after = j1.verdict if j1.verdict in (j0.verdict, NOT_RUN) else f"**{j1.verdict}**"
            link = f"[{h1.path.stem}]({os.path.relpath(hypothesis_file(h1.path), ROOT / 'docs')})"
            rows.append(f"| {h1.spec['paper']} ({link}) | {j0.claim.label} | {dataset_of(h0)} | {j0.verdict} | {after} "
                        f"| {'; '.join(changed) or '-'} |")
    return "\n".join(rows)


def blocks(all_judged) -> dict[str, str]:
    """{the name of a block's markers: the text between them}."""
    return {"claims": readme_table(all_judged), "claims:pairs": pairs_table(all_judged),
            "claims:real-data": real_data_table(all_judged)}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def replace_block(content: str, text: str, name: str, where: str = "the file") -> str:
    from common.docs import replace_between

    return replace_between(content, *markers(name), text, where)


def write_block(file: str, name: str, text: str) -> None:
    """Replace the text between a file's `<!-- NAME:start -->` and `<!-- NAME:end -->` markers, and say so."""
    path = ROOT / file
    path.write_text(replace_block(path.read_text(), text, name, file))
    print(f"wrote the {name} block of {file}")


def stale(all_judged, root: Path = ROOT) -> list[str]:
    """The files whose claims blocks are not what --write would write today."""
    return sorted({BLOCKS[name] for name, text in blocks(all_judged).items()
                   if (content := (root / BLOCKS[name]).read_text()) != replace_block(content, text, name, BLOCKS[name])})


VERDICT_LINE = re.compile(r"\*\*Verdict: (.+?)\.?\*\*", re.S)


def written_verdict(text: str) -> str | None:
    """The verdict text of a note's claim section (or of a docs/claims.md entry): `**Verdict: ...**`."""
    section = text.split("## The claim, tested", 1)[-1]
    match = VERDICT_LINE.search(section)
    return " ".join(match[1].split()) if match else None


# ---------------------------------------------------------------- what a claim script writes


UNRECORDED = "measured before claim scripts recorded their commit; see the file's git log"


def provenance(run_ids, saved: dict | None = None) -> dict:
    """What a file that a claim script writes records of its numbers: the commit they were measured at
    (tracking.git_commit: "-dirty" when tracked files had uncommitted changes) and the ids of the runs
    read. When only the summary is written again from the file's own numbers, `saved` is the file's
    provenance: it is kept, with the commit of this writing beside it (`summarised_at`)."""
    from common.tracking import git_commit

    if saved is None:
        return {"commit": git_commit(), "runs_read": sorted(run_ids)}
    return saved | {"summarised_at": git_commit()}


def saved_provenance(saved: dict, run_ids) -> dict:
    """The provenance a claim file holds, or, for a file written before they recorded one, its run ids
    and no commit."""
    return saved.get("provenance") or {"commit": None, "note": UNRECORDED, "runs_read": sorted(run_ids)}


# ---------------------------------------------------------------- the command


def judge_all(paths: list[Path], results_dir: Path) -> list[tuple[Hypothesis, list[Judged]]]:
    from common.tracking import local_results

    results = local_results(results_dir)
    return [(h, judge(h, results)) for h in map(load, paths)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m common.claims",
                                description="A claim's verdict from its hypothesis and its runs (docs/claims.md).")
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verdict", help="every pair the hypothesis names: difference, Welch's interval, Holm, verdict")
    v.add_argument("files", nargs="*", type=Path, help="claim sweep files (papers/NAME/claims/FILE.yaml)")
    v.add_argument("--all", action="store_true", help="every claim in papers/*/claims/")
    v.add_argument("--results-dir", type=Path, default=ROOT / "results", help="the local results store")
    v.add_argument("--write", action="store_true",
                   help="with --all: rewrite README.md's claims table and docs/claims.md's tables of pairs and of the "
                        "claims run again on Fashion-MNIST")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.all == bool(args.files):
            raise ConfigError("name claim sweep files, or give --all")
        if args.write and not args.all:
            raise ConfigError("--write writes the tables of every claim: give --all")
        all_judged = judge_all(sweep_files() if args.all else args.files, args.results_dir)
        print("\n\n".join(report(h, js) for h, js in all_judged))
        if args.write:
            for name, text in blocks(all_judged).items():
                write_block(BLOCKS[name], name, text)
    except (ConfigError, OSError) as e:
        print(f"claims: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
