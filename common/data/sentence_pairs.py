"""BERT's pre-training data: sentence pairs of a document-level corpus, masked (Devlin et al. 2019, Section 3.1
"Task #2: Next Sentence Prediction (NSP)" and "Pre-training data", Appendix A.1, A.2;
https://arxiv.org/abs/1810.04805), made as the released create_pretraining_data.py makes them.

"When choosing the sentences A and B for each pre-training example, 50% of the time B is the actual next
sentence that follows A (labeled as IsNext), and 50% of the time it is a random sentence from the corpus
(labeled as NotNext)." A sample is "[CLS] A [SEP] B [SEP]" (Figure 2), its segment ids 0 up to the first
[SEP] and 1 after it; A and B are each "an arbitrary span of contiguous text, rather than an actual
linguistic sentence" (Section 3): runs of whole sentences of one document ("it is critical to use a
document-level corpus"), the pair at most block_size tokens (Appendix A.2: "the combined length is <= 512
tokens"; 128 here, the length of the paper's first 90% of steps).

`pydoc-pairs` reads pydoc-rest's text (common.data.text: no passage of pydoc-topics, so that a model
pre-trained on it fine-tunes on passages it never read), each training topic a document; its test pairs are
pydoc's test topics'. `pydoc-segments` is the same text as single segments "[CLS] A [SEP]" with no NSP
label: the "No NSP" rows of Table 5 (facts["nsp"] False, which builds BERT without its NSP head).
`pydoc-ltr` is pydoc-segments for "a standard Left-to-Right (LTR) LM, rather than an MLM" (Section 5.1,
"LTR & No NSP"): the ids unmasked, each position labelled with the next token (the last real one with
none), and facts["causal"] True, which builds BERT's attention left-only; the masked-LM task then scores
next-token prediction at every real position. All three read pydoc's WordPiece (--tokenizer wordpiece: the
ids of pydoc-topics and of --dataset pydoc read with it).

As the released code (short_seq_prob 0.1, dupe_factor 10, random_seed 12345):
  - a document is split into sentences at ".", "!" or "?" before a space and at blank lines, its headings'
    underlines left out (the paper's Wikipedia: "we extract only the text passages and ignore lists,
    tables, and headers"), each sentence WordPiece-encoded;
  - per document a target length, block_size - 3 (- 2 for a single segment), or 10% of the time one drawn
    from 2 up to it; sentences gather into a chunk until it reaches the target or the document ends;
    A is its first 1 to n - 1 sentences, B the rest (IsNext), or, half of the time (always for a chunk of
    one sentence), sentences of another document from a random start up to the target (NotNext: the
    chunk's unused sentences start the next chunk); the longer of A and B loses a token at its front or
    back at random until the pair fits;
  - the text is read DUPE_FACTOR times, each time with its own pairs and masks (the test text too, so that
    its scores rest on ten times the predictions): the released code's static masks, drawn when the data
    is made (RoBERTa later drew them anew every epoch);
  - masks: common.data.mlm.mask_tokens on each sample alone, from a generator seeded by the sample's
    index, so that a sample is masked alike in every run, on every rank and after a resume, whatever
    batch it falls in; the data is the same for every --seed, as the other generated data sets.
"""

import random
import re
from functools import lru_cache

import torch
from torch.utils.data import Dataset

from common.data import text
from common.data.mlm import IGNORE_INDEX, mask_tokens
from common.errors import ConfigError

SEED = 12345  # create_pretraining_data.py's random_seed
SHORT_SEQ_PROB = 0.1  # of the documents whose target length is drawn shorter than the block
NOT_NEXT_PROB = 0.5  # of the pairs whose B is a random document's
DUPE_FACTOR = 10  # times the text is read, each with its own pairs and masks
IS_NEXT, NOT_NEXT = 0, 1  # the NSP labels, as the released code's and Hugging Face's next_sentence_label

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
UNDERLINE = re.compile(r"^\s*([*=~^-])\1+\s*$", re.M)  # a heading's underline: "*****", "====="


def sentences(document: str) -> list[str]:
    """A document's sentences: its paragraphs (split at blank lines, whitespace made single spaces) split
    after ".", "!" or "?"; headings' underlines left out."""
    out = []
    for paragraph in re.split(r"\n\s*\n", UNDERLINE.sub("", document)):
        out += [s for s in SENTENCE_END.split(" ".join(paragraph.split())) if s]
    return out


def pydoc_documents(split: str) -> list[str]:
    """pydoc-rest's documents: its training topics ("train"), or pydoc's test topics ("test"), in name order."""
    from pydoc_data.topics import topics

    train, test = text.pydoc_split()
    names = [n for n in train if n not in text.REST_HELD_OUT] if split == "train" else test
    return [topics[n].strip() for n in names]


def truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Shorten the longer of a and b by one token, at its front or its back at random, until they fit."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        del longer[0 if rng.random() < 0.5 else -1]


def document_pairs(documents: list[list[list[int]]], i: int, block_size: int, nsp: bool,
                   rng: random.Random) -> list[tuple[list[int], list[int] | None, int]]:
    """Document i's samples (A, B, NSP label) as create_instances_from_document makes them; B None and the
    label IS_NEXT for single segments (nsp False).

    Args:
        documents: every document of the split, each a list of sentences, each a list of token ids.
    """
    max_tokens = block_size - (3 if nsp else 2)  # room for [CLS], [SEP] (and [SEP])
    target = max_tokens if rng.random() >= SHORT_SEQ_PROB else rng.randint(2, max_tokens)
    document, samples, chunk, length, j = documents[i], [], [], 0, 0
    while j < len(document):
        chunk.append(document[j])
        length += len(document[j])
        if j == len(document) - 1 or length >= target:
            if not nsp:
                samples.append(([t for s in chunk for t in s][:max_tokens], None, IS_NEXT))
            else:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                a = [t for s in chunk[:a_end] for t in s]
                if len(chunk) == 1 or rng.random() < NOT_NEXT_PROB:
                    label, b = NOT_NEXT, []
                    for _ in range(10):  # another document (the released code's ten tries)
                        k = rng.randint(0, len(documents) - 1)
                        if k != i:
                            break
                    other = documents[k]
                    for s in other[rng.randint(0, len(other) - 1):]:
                        b += s
                        if len(b) >= target - len(a):
                            break
                    j -= len(chunk) - a_end  # the sentences left unused start the next chunk
                else:
                    label, b = IS_NEXT, [t for s in chunk[a_end:] for t in s]
                truncate_pair(a, b, max_tokens, rng)
                samples.append((a, b, label))
            chunk, length = [], 0
        j += 1
    return samples


@lru_cache(maxsize=4)
def pairs_of(split: str, block_size: int, vocab_size: int | None, nsp: bool) -> tuple[list, text.WordPiece]:
    """A split's samples (A, B, label), every document read DUPE_FACTOR times, and the WordPiece that encoded
    them (pydoc's)."""
    wp = text.make_tokenizer(tokenizer="wordpiece", vocab_size=vocab_size)
    documents = []
    for document in pydoc_documents(split):
        encoded = wp.tokenizer.encode_batch(sentences(document), add_special_tokens=False)
        documents.append([e.ids for e in encoded if e.ids])
    rng, samples = random.Random(SEED if split == "train" else SEED + 1), []
    for _ in range(DUPE_FACTOR):
        for i in range(len(documents)):
            samples += document_pairs(documents, i, block_size, nsp, rng)
    return samples, wp


class MaskedPairs(Dataset):
    """Samples ({"idx": (T,) the masked ids, "segments": (T,)}, {"labels": (T,), "next_sentence_label": ()}),
    T varying (`sizes`); single segments (B None) have no next_sentence_label.

    Args:
        samples: (A, B, label) token-id lists (common.data.sentence_pairs.pairs_of).
        wp: the WordPiece of the ids: its [CLS], [SEP], [MASK] and the ids masking never chooses.
        seed: sample k's masks are drawn from a generator seeded by seed + k.
    """

    def __init__(self, samples: list, wp: text.WordPiece, seed: int):
        self.wp, self.seed, self.nsp = wp, seed, samples[0][1] is not None
        self.ids, self.segments, self.labels = [], [], []
        for a, b, label in samples:
            A, B = [wp.cls_id, *a, wp.sep_id], ([*b, wp.sep_id] if b is not None else [])
            self.ids.append(torch.tensor(A + B))
            self.segments.append(torch.tensor([0] * len(A) + [1] * len(B)))
            self.labels.append(label)
        self.sizes = [len(ids) for ids in self.ids]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, k: int) -> tuple[dict, dict]:
        ids = self.ids[k][None]  # (1, T)
        g = torch.Generator().manual_seed(self.seed + k)
        inputs, labels = mask_tokens(ids, torch.ones_like(ids), self.wp.special_ids(), self.wp.mask_id, len(self.wp), g)
        targets = {"labels": labels[0]}
        if self.nsp:
            targets["next_sentence_label"] = torch.tensor(self.labels[k])
        return {"idx": inputs[0], "segments": self.segments[k]}, targets


class NextTokens(MaskedPairs):
    """Single segments for a left-to-right LM (Section 5.1, "LTR & No NSP"): ({"idx": (T,) the ids unmasked,
    "segments": (T,)}, {"labels": (T,)}), labels[t] = idx[t + 1] and the last position's IGNORE_INDEX (the
    masked LM's "not chosen": no prediction), so that the masked-LM loss is next-token prediction."""

    def __getitem__(self, k: int) -> tuple[dict, dict]:
        ids = self.ids[k]  # (T,) "[CLS] A [SEP]"
        labels = torch.full_like(ids, IGNORE_INDEX)
        labels[:-1] = ids[1:]  # the next token; [SEP] is the last one predicted
        return {"idx": ids, "segments": self.segments[k]}, {"labels": labels}


def name_of(nsp: bool, ltr: bool) -> str:
    return "pydoc-ltr" if ltr else "pydoc-pairs" if nsp else "pydoc-segments"


def check_tokenizer(tokenizer: str, nsp: bool, ltr: bool = False) -> None:
    if tokenizer != "wordpiece":
        raise ConfigError(f"--dataset {name_of(nsp, ltr)} is read in WordPiece tokens (its samples hold [CLS], [SEP] "
                          f"and [MASK]); use --tokenizer wordpiece, not {tokenizer}")


def load(block_size: int | None = None, tokenizer: str = "wordpiece", vocab_size: int | None = None, nsp: bool = True,
         ltr: bool = False, **_) -> tuple[MaskedPairs, MaskedPairs]:
    """The training and test samples (ltr: single segments labelled with their next tokens, nsp False); a
    ConfigError for another tokenizer than WordPiece."""
    check_tokenizer(tokenizer, nsp, ltr)
    block_size = block_size or text.BLOCK_SIZE
    if block_size < 8:
        raise ConfigError(f"--block-size {block_size}: a sentence pair needs room for [CLS], [SEP], [SEP] and a few "
                          f"tokens; use 8 or more")
    kind = NextTokens if ltr else MaskedPairs
    return tuple(kind(*pairs_of(split, block_size, vocab_size, nsp and not ltr), seed=seed)
                 for split, seed in (("train", 0), ("test", 1 << 32)))


def facts(tokenizer: str = "wordpiece", vocab_size: int | None = None, nsp: bool = True, ltr: bool = False,
          **_) -> dict:
    """pydoc's WordPiece's facts (vocab_size, its special ids, what decodes the ids), nsp: whether the
    samples are pairs with an NSP label (a BERT built for them has its NSP head), and causal: whether they
    are labelled for a left-to-right LM (a BERT built for them attends to the left only)."""
    check_tokenizer(tokenizer, nsp, ltr)
    return text.make_tokenizer(tokenizer="wordpiece", vocab_size=vocab_size).facts() | dict(nsp=nsp and not ltr,
                                                                                          causal=ltr)
