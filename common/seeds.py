"""Results over seeds: which runs are the same experiment, what one number each gives, and the
mean, standard deviation and 95% interval of those numbers.

Runs that differ only in their seed (or in how they ran: strategy, logging, where they wrote) are
repeats of one configuration; a sweep's runs are grouped by their combination without the seed.
The number a run gives is its final metric, another of its final metrics (`correct`, `map_50`), the
last value of a curve it logged (`train/epoch_accuracy`; `X/error` is 1 - `X/accuracy`), or the
epochs it took to reach a target on a curve (`train/error<=0.25`). Intervals are Student's t
(scipy), differences between two configurations Welch's, ratios Welch's on the logarithms.
"""

import json
import math
import re
from pathlib import Path
from typing import NamedTuple

# config keys that say how a run ran or where it wrote, not what it computed (lr_in_use and warmup_in_use:
# run-time values that older runs' configs hold)
RUN_ONLY = {"seed", "out", "results_dir", "wandb", "wandb_project", "log_every", "num_workers", "ckpt_every",
            "keep_ckpts", "profile", "download", "strategy", "compile", "compile_mode", "compile_backend",
            "lr_in_use", "warmup_in_use"}
LOWER_IS_BETTER = ("loss", "mse", "error", "perplexity", "bits_per_char")
REACH = re.compile(r"\s*([\w/.-]+)\s*(<=|>=)\s*([-+0-9.eE]+)\s*")


class Summary(NamedTuple):
    """The mean of n values, their standard deviation (n - 1 in the denominator), and the 95% interval of
    the mean (Student's t with n - 1 degrees of freedom); std and the interval are nan for one value."""

    mean: float
    std: float
    n: int
    low: float
    high: float


def summarize(values: list[float]) -> Summary:
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return Summary(mean, math.nan, n, math.nan, math.nan)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)
    return Summary(mean, std, n, mean - half, mean + half)


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its 95% interval (Welch's t); nan bounds when either has one value."""
    from scipy import stats

    sa, sb = summarize(a), summarize(b)
    if sa.n < 2 or sb.n < 2:
        return sa.mean - sb.mean, math.nan, math.nan
    va, vb = sa.std ** 2 / sa.n, sb.std ** 2 / sb.n
    se = math.sqrt(va + vb)
    if se == 0:
        return sa.mean - sb.mean, sa.mean - sb.mean, sa.mean - sb.mean
    df = (va + vb) ** 2 / (va ** 2 / (sa.n - 1) + vb ** 2 / (sb.n - 1))
    half = stats.t.ppf(0.975, df) * se
    return sa.mean - sb.mean, sa.mean - sb.mean - half, sa.mean - sb.mean + half


def ratio(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """The ratio of the geometric means of a and b and its 95% interval (Welch's t on the logarithms);
    None unless every value is positive."""
    if min(a + b) <= 0:
        return None
    return tuple(math.exp(x) for x in welch([math.log(v) for v in a], [math.log(v) for v in b]))


# ---------------------------------------------------------------- which runs repeat one configuration


def configuration(r: dict) -> str:
    """What a run computed, as a key: its paper, data set and config without RUN_ONLY's keys (a key
    missing from an older run's config takes today's default)."""
    from common.config import TrainConfig

    defaults = {k: v for k, v in TrainConfig(paper=r["paper"]).to_dict().items() if k not in RUN_ONLY}
    config = {k: v for k, v in (r.get("config") or {}).items() if k in defaults}
    return json.dumps({"paper": r["paper"], "flavor": r["flavor"], "dataset": r["dataset"]} | defaults | config,
                      sort_keys=True)


def combination(r: dict) -> dict:
    """A sweep run's parameters without its seed."""
    return {k: v for k, v in (r.get("sweep") or {}).get("combination", {}).items() if k != "seed"}


def describe(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


# ---------------------------------------------------------------- the number a run gives


def lower_is_better(metric: str) -> bool:
    return metric.rsplit("/", 1)[-1].endswith(LOWER_IS_BETTER)


def series(r: dict, key: str) -> list[tuple[int, float]]:
    """(step, value) of a curve the run logged: from its result's curves, else from its run directory's
    metrics.jsonl; `X/error` is 1 - `X/accuracy` (so `train/error` and `train/epoch_error` are the
    papers' training error)."""
    if key.endswith("error") and not key.endswith("accuracy"):
        accuracy = series(r, key[: -len("error")] + "accuracy")
        if accuracy:
            return [(step, 1 - v) for step, v in accuracy]
    if key in r.get("curves", {}):
        return [tuple(point) for point in r["curves"][key]]
    path = Path(r.get("run_dir", "")) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(row["step"], row[key]) for row in rows if key in row]


def value(r: dict, metric: str | None = None) -> float | None:
    """The run's number: its final metric (metric None or the task's), another final metric, or a curve's
    last value; None where the run has none of them."""
    if metric is None or metric == r["metric"]:
        return r["final"]
    if metric in r.get("final_metrics", {}):
        return r["final_metrics"][metric]
    points = series(r, metric)
    return points[-1][1] if points else None


def parse_reach(text: str) -> tuple[str, str, float]:
    """`train/error<=0.25` -> ("train/error", "<=", 0.25); ValueError when malformed."""
    match = REACH.fullmatch(text)
    if not match:
        raise ValueError(f"--reach takes CURVE<=VALUE or CURVE>=VALUE (e.g. 'train/error<=0.25'), got '{text}'")
    return match[1], match[2], float(match[3])


def reach(r: dict, key: str, op: str, target: float, unit: str = "epochs") -> float | None:
    """The epochs (steps / steps per epoch) the run took until a point of curve `key` first reached the
    target, or with unit "minutes" the wall time to that step at the run's mean rate (wall_s x step / steps:
    the evaluations before it included, as a speedrun's clock counts them); None if it never did."""
    per_epoch = r.get("steps_per_epoch") or r["steps"] / r["epochs"]
    for step, v in series(r, key):
        if (v <= target) if op == "<=" else (v >= target):
            return r["wall_s"] * step / r["steps"] / 60 if unit == "minutes" else step / per_epoch
    return None
