"""Translate with a finished sequence-to-sequence run, and draw its attention.

    python -m common.translate --run RUN_DIR "Tuesday, 3 March 2015" ["3/3/15" ...] [--beam N]

Prints each source's translation by the run's final weights (model.safetensors): greedy decoding,
or beam search with `--beam N` (and `--length-penalty ALPHA`). A character or word the vocabulary
never saw becomes <unk>, never an error. For a model that returns its attention weights
(`forward(src, src_lengths, tgt, return_attention=True)`, Bahdanau et al.'s), it also writes the
alignment of each translation as a PNG (`--attention FILE`, default RUN_DIR/attention-<k>.png): the
weight alpha_ij of every source token j (columns) for every output token i (rows), as the paper's
Figure 3 draws it.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import ConfigError
from common.export import load_run_of

# Nothing above imports torch: --help and a mistyped flag are answered at once.
if TYPE_CHECKING:
    import torch


def tokens(text: str, facts: dict) -> list[str]:
    """A source text as the data set's tokens: its characters, or its words (common.data.pairs)."""
    if facts.get("level") == "char":
        return list(text)
    from common.data.pairs import tokenize

    return tokenize(text)


def source_ids(text: str, facts: dict) -> list[int]:
    """The source vocabulary's ids of a text; <unk> for what it does not hold."""
    from common.data.dates import UNK  # the seq2seq data sets' <unk> (<pad> 0, <s> 1, </s> 2, <unk> 3)

    stoi = {s: i for i, s in enumerate(facts.get("src_itos", facts["itos"]))}
    return [stoi.get(t, UNK) for t in tokens(text, facts)] or [UNK]


def translate(model, facts: dict, texts: list[str], beam: int = 1, length_penalty: float = 0.0
              ) -> list[tuple[str, torch.Tensor | None, list[str], list[str]]]:
    """[(translation, attention (output tokens, source tokens) or None, source tokens, output tokens)]."""
    import torch

    from common import decode
    from common.tasks import get_task

    task = get_task("seq2seq", facts)
    out = []
    with torch.no_grad():
        for text in texts:
            src = torch.tensor([source_ids(text, facts)])
            lengths = torch.tensor([src.shape[1]])
            ids = dict(bos_id=facts["bos_id"], eos_id=facts["eos_id"], pad_id=facts["pad_id"])
            max_len = 2 * src.shape[1] + 10
            if beam > 1:
                penalty = decode.gnmt_penalty(length_penalty) if length_penalty else decode.no_penalty
                hyp = decode.beam_search(model, src, lengths, max_len, beam=beam, length_penalty=penalty, **ids)
            else:
                hyp = decode.greedy(model, src, lengths, max_len, **ids)
            hyp = hyp[0][hyp[0] != facts["pad_id"]]  # (L,), </s> included where it was written
            attention = None
            if "return_attention" in inspect.signature(model.forward).parameters:
                tgt = torch.cat([hyp.new_tensor([facts["bos_id"]]), hyp[:-1]])[None]  # what the decoder read
                _, attention = model(src, lengths, tgt, return_attention=True)  # (1, L, S)
                attention = attention[0]
            words = [facts["itos"][int(i)] for i in hyp]
            out.append((task.text(hyp), attention, tokens(text, facts) or ["<unk>"], words))
    return out


def draw_attention(attention: torch.Tensor, source: list[str], output: list[str], path: Path) -> Path:
    """The alignment picture: output tokens down, source tokens across, weight as grey level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    show = lambda t: "␣" if t == " " else t
    fig, ax = plt.subplots(figsize=(0.35 * len(source) + 1.5, 0.35 * len(output) + 1.2))
    ax.imshow(attention.numpy(), cmap="gray", vmin=0, vmax=1, aspect="equal")
    ax.set_xticks(range(len(source)), [show(t) for t in source])
    ax.set_yticks(range(len(output)), [show(t) for t in output])
    ax.xaxis.tick_top()
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m common.translate", description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="a finished seq2seq run directory")
    p.add_argument("texts", nargs="+", help="source texts to translate")
    p.add_argument("--beam", type=int, default=1, help="beam search of this width (default 1: greedy)")
    p.add_argument("--length-penalty", type=float, default=0.0, help="beam search's alpha (0: none)")
    p.add_argument("--attention", help="the attention picture's file (with several texts, -<k> is added)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        model, _, facts = load_run_of(Path(args.run), "seq2seq", "translate")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.beam < 1:
        print(f"error: --beam must be at least 1, got {args.beam}", file=sys.stderr)
        return 2
    results = translate(model, facts, args.texts, args.beam, args.length_penalty)
    for k, (text, (translation, attention, source, output)) in enumerate(zip(args.texts, results)):
        print(f"{text} -> {translation}")
        if attention is not None:
            path = Path(args.attention) if args.attention else Path(args.run) / "attention.png"
            if len(results) > 1:
                path = path.with_name(f"{path.stem}-{k}{path.suffix}")
            print(f"  attention: {draw_attention(attention, source, output, path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
