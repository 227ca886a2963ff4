"""The command line's value types: numbers in a range, switches, --model-kwargs' KEY=VALUE items, and a
parser whose error is one line. The flags themselves are generated from common.config's sections."""

import argparse
import ast
import re
import typing

from common.choices import LORA_TARGETS
from common.errors import ConfigError

class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line on stderr and exit code 2, with no usage block."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


def _number(kind: type, minimum: float, inclusive: bool, also: str = ""):
    word = {(int, False): "a positive integer", (int, True): "an integer >= 0",
            (float, False): "a positive number", (float, True): "a number >= 0"}[kind, inclusive]
    word = f"{word} {also}".strip()

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {word}, got '{text}'") from None
        if value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"expected {word}, got '{text}'")
        return value

    parse.__name__ = word
    return parse


positive_int = _number(int, 0, inclusive=False)
non_negative_int = _number(int, 0, inclusive=True)
positive_float = _number(float, 0, inclusive=False)
non_negative_float = _number(float, 0, inclusive=True)


def batch_size_arg(text: str) -> int | str:
    return "auto" if text == "auto" else _number(int, 0, inclusive=False, also="or auto")(text)


batch_size_arg.__name__ = "a positive integer or auto"


def fraction_arg(text: str) -> float:
    value = _number(float, 0, inclusive=False, also="up to 1")(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a positive number up to 1, got '{text}'")
    return value


fraction_arg.__name__ = "a positive number up to 1"


def lora_targets_arg(text: str) -> str:
    """--lora-targets: a comma list of q, k, v and o (the paper's W_q, W_k, W_v, W_o), each named once, or qkv
    (one update over a fused W_qkv) in the place of q, k and v; the text as given."""
    names = [t.strip() for t in text.split(",")]
    unknown = [t for t in names if t not in LORA_TARGETS]
    if unknown or len(set(names)) < len(names) or ("qkv" in names and {"q", "k", "v"} & set(names)):
        what = f"unknown '{unknown[0]}'" if unknown else "each once, qkv in the place of q, k and v"
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(LORA_TARGETS)} ({what}), got '{text}'")
    return text


lora_targets_arg.__name__ = "a comma list of q, k, v, o, or qkv"


def boolean(text: str) -> bool:
    """A switch's value, for `--compile=True` as a W&B sweep writes a boolean parameter."""
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


# One KEY=VALUE, or several in one argument separated by spaces ("cell=rnn hidden_size=64", as one
# W&B sweep value holds them); a value may hold spaces itself: "widths=(16, 32)".
_KWARG = re.compile(r"\s+(?=[A-Za-z_]\w*=)")
_LITERALS = (bool, int, float, str, type(None))


def parse_model_kwargs(items: list[str]) -> dict:
    """{name: value} of --model-kwargs KEY=VALUE ...: each value read as a Python literal (an int, a
    float, True/False, None, a quoted string, or a tuple of them, kept as a list, as JSON keeps it),
    true/false in any case as the booleans (as the boolean flags read them: shift=false), and as a plain
    string where it is none of these (activation=tanh). ValueError for a malformed item."""
    kwargs = {}
    for item in (part for text in items for part in _KWARG.split(text.strip()) if part):
        key, eq, text = item.partition("=")
        if not eq or not key.isidentifier():
            raise ValueError(f"--model-kwargs takes KEY=VALUE items, got '{item}'")
        if key in kwargs:
            raise ValueError(f"--model-kwargs gives {key} twice")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = {"true": True, "false": False}.get(text.lower(), text)
        if isinstance(value, (tuple, list)) and all(isinstance(v, _LITERALS) for v in value):
            value = list(value)
        elif not isinstance(value, _LITERALS):
            raise ValueError(f"--model-kwargs {item}: a value is a number, True, False, None, a string, or a "
                             f"tuple of them")
        kwargs[key] = value
    return kwargs


def describe_kwargs(kwargs: dict) -> str:
    """activation=tanh, widths=(16, 32): model arguments as a flavor column and a log line show them."""
    show = lambda v: f"({', '.join(map(repr, v))})" if isinstance(v, list) else v if isinstance(v, str) else repr(v)
    return ", ".join(f"{k}={show(v)}" for k, v in kwargs.items())


class ModelKwargs(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        try:
            given = parse_model_kwargs(values)
        except ValueError as e:
            raise argparse.ArgumentError(self, str(e)) from None
        earlier = getattr(namespace, self.dest, {})
        twice = sorted(earlier.keys() & given.keys())
        if twice:
            raise argparse.ArgumentError(self, f"--model-kwargs gives {twice[0]} twice")
        setattr(namespace, self.dest, earlier | given)
