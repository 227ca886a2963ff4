"""Decoding a sequence-to-sequence model: greedy and beam search over one interface.

A seq2seq model (papers gru, seq2seq, bahdanau, transformer) has, besides its teacher-forced
`forward(src, src_lengths, tgt) -> logits (B, T, V)` (tgt: <s> then the target but its last token):

    encode(src, src_lengths) -> memory            whatever the decoder reads: tensors with the batch first
    decode_step(memory, tokens, state) -> (logits (B, V), state)
                                                  one step: `tokens` (B,) the previous output (<s> first),
                                                  `state` None at the first step; tensors with the batch first

Both searches stop when every sequence has written </s> (as `all_done` judges it: under fsdp, where
every decode_step gathers parameters across ranks, every rank must run as many steps, so it asks all
ranks) or after max_len tokens, and return
(B, L) token ids, </s> included, padded after it with pad_id. Beam search keeps `beam` hypotheses
per source and ranks finished ones by log-probability divided by each paper's length penalty
(`length_penalty(length) -> float`; 1 gives raw log-probabilities, as Sutskever et al.'s).
"""

from typing import Callable

import torch
from torch.utils._pytree import tree_map


def _select(tree, index: torch.Tensor):
    """Every tensor of a memory or state pytree indexed along its batch dimension."""
    return tree_map(lambda t: t.index_select(0, index) if torch.is_tensor(t) else t, tree)


def every(done: torch.Tensor) -> bool:
    """Decoding may stop: every sequence of this process is done."""
    return bool(done.all())


@torch.no_grad()
def greedy(model, src: torch.Tensor, src_lengths: torch.Tensor, max_len: int, bos_id: int, eos_id: int,
           pad_id: int = 0, all_done: Callable[[torch.Tensor], bool] = every) -> torch.Tensor:
    """The most likely token at every step: (B, L) ids."""
    memory = model.encode(src, src_lengths)
    B = src.shape[0]
    tokens = torch.full((B,), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    state, out = None, []
    for _ in range(max_len):
        logits, state = model.decode_step(memory, tokens, state)  # (B, V)
        tokens = logits.argmax(-1).masked_fill(done, pad_id)  # (B,)
        out.append(tokens)
        done |= tokens == eos_id
        if all_done(done):
            break
    return torch.stack(out, dim=1)  # (B, L)


def no_penalty(length: int) -> float:
    return 1.0


def gnmt_penalty(alpha: float) -> Callable[[int], float]:
    """Wu et al. 2016's length penalty lp(Y) = ((5 + |Y|) / 6)^alpha, which the Transformer uses
    with alpha = 0.6 (Vaswani et al., Section 6.1)."""
    return lambda length: ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_search(model, src: torch.Tensor, src_lengths: torch.Tensor, max_len: int, bos_id: int, eos_id: int,
                beam: int = 4, length_penalty: Callable[[int], float] = no_penalty, pad_id: int = 0,
                all_done: Callable[[torch.Tensor], bool] = every) -> torch.Tensor:
    """The best of `beam` hypotheses per source by log-probability / length_penalty(length): (B, L) ids.

    Every source keeps `beam` live hypotheses (its best continuations); one that writes </s> is
    finished with its score and leaves the beam. A source is done once it holds `beam` finished
    hypotheses none of which a live one could still beat (log-probabilities only fall), or at
    max_len, when its live hypotheses count as finished.
    """
    B, device = src.shape[0], src.device
    memory = _select(model.encode(src, src_lengths), torch.arange(B, device=device).repeat_interleave(beam))
    tokens = torch.full((B * beam,), bos_id, dtype=torch.long, device=device)
    scores = torch.zeros(B, beam, device=device)
    scores[:, 1:] = float("-inf")  # the beams of a source start as one hypothesis
    history = torch.zeros(B * beam, 0, dtype=torch.long, device=device)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    state, done = None, [False] * B
    for step in range(max_len):
        logits, state = model.decode_step(memory, tokens, state)  # (B * beam, V)
        logp = logits.float().log_softmax(-1).view(B, beam, -1)  # (B, beam, V)
        V = logp.shape[-1]
        total = (scores[..., None] + logp).view(B, -1)  # (B, beam * V)
        top, index = total.topk(2 * beam, dim=-1)  # twice the beam: some may finish
        new_scores = torch.full((B, beam), float("-inf"), device=device)
        origin = torch.zeros(B, beam, dtype=torch.long, device=device)
        chosen = torch.full((B, beam), pad_id, dtype=torch.long, device=device)
        for b in range(B):
            done[b] = done[b] or _is_done(finished[b], top[b, 0].item(), beam, length_penalty, max_len)
            if done[b]:
                continue  # its beams stay at -inf
            k = 0
            for value, flat in zip(top[b].tolist(), index[b].tolist()):
                if value == float("-inf"):
                    break
                src_beam, token = divmod(flat, V)
                if token == eos_id:
                    sequence = history[b * beam + src_beam].tolist() + [eos_id]
                    finished[b].append((value / length_penalty(len(sequence)), sequence))
                    continue
                new_scores[b, k], origin[b, k], chosen[b, k] = value, src_beam, token
                k += 1
                if k == beam:
                    break
        if all_done(torch.tensor(done)):
            scores = new_scores  # all -inf: only finished hypotheses remain
            break
        rows = (torch.arange(B, device=device)[:, None] * beam + origin).view(-1)  # (B * beam,)
        history = torch.cat([history.index_select(0, rows), chosen.view(-1, 1)], dim=1)
        state = _select(state, rows)
        tokens, scores = chosen.view(-1), new_scores
    return _best(finished, scores, history, length_penalty, eos_id, pad_id)


def _best(finished: list, scores: torch.Tensor, history: torch.Tensor, length_penalty: Callable[[int], float],
          eos_id: int, pad_id: int) -> torch.Tensor:
    """Each source's best hypothesis, finished or (at max_len) still live, as (B, L) ids padded with pad_id."""
    (B, beam), device = scores.shape, scores.device
    best = []
    for b in range(B):
        candidates = list(finished[b])
        for k in range(beam):  # at max_len the live hypotheses of a source not done count as finished
            if scores[b, k] > float("-inf"):
                sequence = history[b * beam + k].tolist()
                candidates.append((scores[b, k].item() / length_penalty(len(sequence)), sequence))
        best.append(max(candidates, key=lambda c: c[0])[1] if candidates else [eos_id])
    L = max(len(s) for s in best)
    out = torch.full((B, L), pad_id, dtype=torch.long, device=device)
    for b, sequence in enumerate(best):
        out[b, :len(sequence)] = torch.tensor(sequence, device=device)
    return out


def _is_done(finished: list, best_live: float, beam: int, length_penalty: Callable[[int], float],
             max_len: int) -> bool:
    """A source is done when it holds `beam` finished hypotheses and its best live one cannot beat the
    beam-th best of them: its log-probability (negative) can only fall, and its length penalty is at
    most the largest over the lengths left."""
    if len(finished) < beam:
        return False
    kth_best = sorted(c[0] for c in finished)[-beam]
    largest_penalty = max(length_penalty(n) for n in range(1, max_len + 1))
    return best_live / largest_penalty <= kth_best
