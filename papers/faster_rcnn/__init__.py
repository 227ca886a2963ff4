"""Faster R-CNN: Ren, He, Girshick and Sun, 2015.

The spec (PAPER) and the rest are in spec.py, imported when first asked for (PEP 562), so that a tool in
this folder (`python -m papers.faster_rcnn.…`) answers --help without importing the model and torch."""

import importlib


def __getattr__(name: str):
    spec = importlib.import_module(f"{__name__}.spec")  # the model, and torch

    try:
        return getattr(spec, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
