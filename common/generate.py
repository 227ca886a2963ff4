"""Sample text from a finished language-modeling run.

    python -m common.generate --run RUN_DIR --prompt "The " --tokens 200 --temperature 0.8 --top-k 40 --seed 0

The run's final weights (model.safetensors) continue the prompt token by token: each next token is drawn
from the softmax of the last logits divided by the temperature, restricted to the top k (0: all), with a
generator seeded by --seed, so a seed gives the same text every time. With the model's key-value cache
(`model(idx, past=..., use_cache=True) -> (logits, present)`) each new token costs one position; past
the model's positions the context is cut to its last `block_size` tokens and read afresh. The prompt is
encoded with the run's tokenizer (tokenizer.json in the run directory for --tokenizer bpe, whose
bytes cover any text, or wordpiece; else the data set's characters, where a character the vocabulary
never saw becomes <unk>, id 0), never an error.
"""

import argparse
import sys
from pathlib import Path

from common.errors import ConfigError
from common.export import load_run_of

# Nothing above imports torch: --help and a mistyped flag are answered at once.


def run_tokenizer(run_dir: Path, facts: dict):
    """What encodes a prompt and decodes the tokens: the tokenizer the run saved, else the data set's."""
    from common.data.text import codec

    saved = run_dir / "tokenizer.json"  # a BPE's or a WordPiece's, as the facts' level says
    return codec(facts | {"tokenizer": saved.read_text()} if saved.is_file() else facts)


def generate(model, prompt: list[int], tokens: int, temperature: float = 1.0, top_k: int = 0, seed: int = 0,
             cache: bool = True) -> list[int]:
    """The prompt's continuation: `tokens` new ids. cache=False reads the whole context at every step
    (the reference the cached path must equal)."""
    import torch

    from common.data.text import UNK

    g = torch.Generator().manual_seed(seed)
    block = model.block_size
    ids = torch.tensor([prompt or [UNK]], dtype=torch.long)  # (1, T)
    out, past, feed = [], None, ids[:, -block:]
    with torch.no_grad():
        for _ in range(tokens):
            if cache and past is not None and past[0][0].shape[2] >= block:  # the cache is full: start afresh
                past, feed = None, ids[:, -block:]
            if cache:
                logits, past = model(feed, past=past, use_cache=True)  # (1, t, V)
            else:
                logits = model(ids[:, -block:])
            logits = logits[0, -1].float() / max(temperature, 1e-6)  # (V,)
            if top_k:
                kth = logits.topk(min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(logits.softmax(-1), 1, generator=g)  # (1,)
            out.append(int(nxt))
            ids = torch.cat([ids, nxt[None]], dim=1)
            feed = nxt[None]  # (1, 1): the cache holds the rest
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m common.generate", description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="a finished language-modeling run directory")
    p.add_argument("--prompt", default="", help="the text to continue")
    p.add_argument("--tokens", type=int, default=200, help="new tokens to write (default 200)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="draw from the k most likely tokens (0: all)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        model, _, facts = load_run_of(Path(args.run), "language-modeling", "generate")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.tokens < 0 or args.temperature <= 0 or args.top_k < 0:
        print("error: --tokens and --top-k must be >= 0 and --temperature > 0", file=sys.stderr)
        return 2
    tokenizer = run_tokenizer(Path(args.run), facts)
    new = generate(model, tokenizer.encode(args.prompt), args.tokens, args.temperature, args.top_k, args.seed)
    print(args.prompt + tokenizer.decode(new))
    return 0


if __name__ == "__main__":
    sys.exit(main())
