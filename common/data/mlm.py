"""Masking for a masked language model, as BERT does it (Devlin et al. 2019, Section 3.1 "Task #1: Masked
LM", Appendix A.1; https://arxiv.org/abs/1810.04805).

"We simply mask some percentage of the input tokens at random, and then predict those masked tokens ...
we mask 15% of all WordPiece tokens in each sequence at random." Since [MASK] never appears in
fine-tuning, a chosen token is not always [MASK]: "If the i-th token is chosen, we replace the i-th token
with (1) the [MASK] token 80% of the time (2) a random token 10% of the time (3) the unchanged i-th token
10% of the time. Then, T_i will be used to predict the original token with cross entropy loss."

A data transform, not a model's: RoBERTa, ALBERT and ELECTRA mask the same way, so it lives in common/data
beside the collate functions, where a masked-LM data set (static masks, as BERT's create_pretraining_data.py
writes them once, or dynamic ones drawn again each epoch, as RoBERTa's) calls it.
"""

import torch

IGNORE_INDEX = -100  # the label of a position not chosen: F.cross_entropy's default ignore_index
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1  # of the chosen tokens; the remaining 0.1 stay unchanged


def mask_tokens(ids: torch.Tensor, attention_mask: torch.Tensor, special_ids, mask_id: int, vocab_size: int,
                generator: torch.Generator, p: float = 0.15,
                max_predictions: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masked-LM inputs and labels of a batch of token ids.

    In each sequence, the candidates are its real tokens (attention_mask 1) that are not special; as the
    released create_pretraining_data.py does, exactly max(1, round(p n)) of its n candidates are chosen,
    uniformly at random (at most max_predictions, its max_predictions_per_seq: 20 at 128 tokens, 80 at
    512), so that every sequence with a candidate has a token to predict. (The released code counts n
    with [CLS] and the [SEP]s; here n counts only the candidates.) Of the chosen, 80% become [MASK], 10% a
    token drawn uniformly from the vocabulary but the special ids (the released code draws from the whole
    vocabulary, specials included), 10% stay as they are; a drawn token may be the original one (1 in
    vocab_size - len(special_ids)), as in the released code.

    Args:
        ids: (B, T) token ids; not changed.
        attention_mask: (B, T) bool or 0/1, 1 on real tokens, 0 on padding.
        special_ids: the ids never chosen nor drawn ([PAD], [CLS], [SEP], [MASK]; [UNK] too where the
            tokenizer lists it: HF's collator never masks it, the released code may).
        mask_id: [MASK]'s id.
        vocab_size: V; a random token is one of range(V) but special_ids.
        generator: the torch.Generator of every draw (on ids' device): the same state, the same masks.
        p: the share of candidates chosen (0.15).
        max_predictions: the most positions chosen in a sequence; None: no limit.

    Returns:
        inputs: (B, T) the ids with the chosen positions replaced.
        labels: (B, T) the original ids at the chosen positions, IGNORE_INDEX elsewhere.
    """
    device = ids.device
    specials = torch.as_tensor(list(special_ids), dtype=ids.dtype, device=device)
    candidate = attention_mask.bool() & ~torch.isin(ids, specials)  # (B, T)
    n = candidate.sum(1)  # (B,) candidates of each sequence
    k = torch.minimum(torch.round(n.double() * p).long().clamp(min=1), n)  # (B,) max(1, round(p n)), at most n
    if max_predictions is not None:
        k = k.clamp(max=max_predictions)

    # a random order of each sequence's candidates, the other positions after them: the first k are chosen
    order = torch.rand(ids.shape, generator=generator, device=device).masked_fill(~candidate, 2.0)  # (B, T)
    rank = order.argsort(dim=1).argsort(dim=1)  # (B, T) each position's place in that order
    chosen = rank < k[:, None]  # (B, T)

    u = torch.rand(ids.shape, generator=generator, device=device)  # (B, T) which of the three a chosen gets
    to_mask = chosen & (u < MASK_SHARE)
    to_random = chosen & (u >= MASK_SHARE) & (u < MASK_SHARE + RANDOM_SHARE)
    ordinary = torch.ones(vocab_size, dtype=torch.bool, device=device)
    ordinary[specials[specials < vocab_size]] = False
    pool = ordinary.nonzero().squeeze(1)  # (V',) the ids a random token is drawn from
    drawn = pool[torch.randint(len(pool), ids.shape, generator=generator, device=device)]  # (B, T)

    inputs = torch.where(to_mask, mask_id, torch.where(to_random, drawn, ids))  # (B, T)
    labels = torch.where(chosen, ids, IGNORE_INDEX)  # (B, T)
    return inputs, labels
