"""BERT: Devlin, Chang, Lee and Toutanova, 2019.

The spec (PAPER) and the rest are in spec.py, imported when first asked for (papers.spec_on_demand),
so that a tool in this folder (`python -m papers.bert.…`) answers --help without importing the model and torch."""

from papers import spec_on_demand

__getattr__ = spec_on_demand(__name__)
