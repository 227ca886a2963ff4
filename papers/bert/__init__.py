"""BERT (Devlin et al., 2019): the model only, in papers/bert/model.py. Not registered yet: the masked-LM
task and the sentence-pair data it pre-trains on do not exist in common/ yet."""
