"""Dates to translate: a date written in one of many human styles -> its ISO form, character by character.

"Tuesday, 3 March 2015", "3/3/15", "March 3rd, '15", "mardi 3 mars 2015", "03.03.2015" ... -> "2015-03-03".
Every pair is a date between 1950-01-01 and 2049-12-31 in one of the styles below (English,
French, German and Spanish month and weekday names; two-digit years mean 1950-2049; numeric
styles are US month/day or European day.month as each style says). The source is the written
date, the target its ISO form. Fixed seeds give the same 20,000 training and 2,000 test pairs
every time, and no test date (the day itself, in any style) is a training date, so the test
split measures reading dates, not recalling them.

Character level: one vocabulary over the sources and targets of both splits' alphabets (every
character the generator can write), with four specials: <pad> 0, <s> 1 (the decoder's first
input), </s> 2 (the end of every target), <unk> 3 (a character never seen, typed by a user).
"""

import datetime
import random
from functools import lru_cache

import torch
from torch.utils.data import Dataset

TRAIN_SIZE, TEST_SIZE = 20_000, 2_000
SEED = 0
FIRST, LAST = datetime.date(1950, 1, 1), datetime.date(2049, 12, 31)
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
PAD, BOS, EOS, UNK = range(4)

MONTHS = {
    "en": ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"),
    "fr": ("janvier", "février", "mars", "avril", "mai", "juin", "juillet", "août", "septembre", "octobre",
           "novembre", "décembre"),
    "de": ("Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September", "Oktober",
           "November", "Dezember"),
    "es": ("enero", "febrero", "marzo", "abril", "mayo", "junio", "julio", "agosto", "septiembre", "octubre",
           "noviembre", "diciembre"),
}
WEEKDAYS = {  # Monday first, as date.weekday() counts
    "en": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "fr": ("lundi", "mardi", "mercredi", "jeudi", "vendredi", "samedi", "dimanche"),
    "de": ("Montag", "Dienstag", "Mittwoch", "Donnerstag", "Freitag", "Samstag", "Sonntag"),
    "es": ("lunes", "martes", "miércoles", "jueves", "viernes", "sábado", "domingo"),
}


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st, ..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def styles(d: datetime.date) -> list[str]:
    """Every way this generator writes the date d."""
    en, fr, de, es = (MONTHS[k][d.month - 1] for k in ("en", "fr", "de", "es"))
    wd = {k: WEEKDAYS[k][d.weekday()] for k in WEEKDAYS}
    y, yy, m, day = d.year, f"{d.year % 100:02d}", d.month, d.day
    return [
        f"{wd['en']}, {day} {en} {y}",  # Tuesday, 3 March 2015
        f"{day} {en} {y}",  # 3 March 2015
        f"{en} {day}, {y}",  # March 3, 2015
        f"{en} {ordinal(day)}, '{yy}",  # March 3rd, '15
        f"{wd['en'][:3]} {en[:3]} {day:02d} {y}",  # Tue Mar 03 2015
        f"{day} {en[:3]} {y}",  # 3 Mar 2015
        f"{en[:3].upper()} {day}, {y}",  # MAR 3, 2015
        f"the {ordinal(day)} of {en} {y}",  # the 3rd of March 2015
        f"{m}/{day}/{yy}",  # 3/3/15, US
        f"{m:02d}/{day:02d}/{y}",  # 03/03/2015, US
        f"{day:02d}.{m:02d}.{y}",  # 03.03.2015, European
        f"{day}.{m}.{yy}",  # 3.3.15, European
        f"{y}/{m:02d}/{day:02d}",  # 2015/03/03
        f"{y}{m:02d}{day:02d}",  # 20150303
        f"{wd['fr']} {day} {fr} {y}",  # mardi 3 mars 2015
        f"le {day} {fr} {y}",  # le 3 mars 2015
        f"{wd['de']}, {day}. {de} {y}",  # Dienstag, 3. März 2015
        f"{day}. {de} {y}",  # 3. März 2015
        f"{wd['es']}, {day} de {es} de {y}",  # martes, 3 de marzo de 2015
        f"{day} de {es} de {y}",  # 3 de marzo de 2015
    ]


NUM_STYLES = len(styles(FIRST))


def alphabet() -> str:
    """Every character a source or target can hold, sorted: what the vocabulary is built from (the
    styles of every month's first day, every day of January and a week of days cover every name,
    suffix and separator; digits and "-" are the rest)."""
    chars = set("0123456789-")
    days = [datetime.date(2015, m, 1) for m in range(1, 13)] + [datetime.date(2015, 1, d) for d in range(1, 32)]
    for d in days:
        for text in styles(d):
            chars.update(text)
    return "".join(sorted(chars))


class Vocab:
    """Characters <-> ids: the four specials, then `chars` in order."""

    def __init__(self, chars: str):
        self.itos = [*SPECIALS, *chars]
        self.stoi = {c: i for i, c in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        """Ids of the characters; <unk> for a character the vocabulary does not hold."""
        return [self.stoi.get(c, UNK) for c in text]


@lru_cache(maxsize=1)
def vocab() -> Vocab:
    return Vocab(alphabet())


class Dates(Dataset):
    """(source ids (S,), target ids (T,) ending with </s>) pairs; `sizes` holds each source's length
    for bucketing, `texts` the (source, target) strings."""

    def __init__(self, texts: list[tuple[str, str]]):
        v = vocab()
        self.texts = texts
        self.sources = [torch.tensor(v.encode(s), dtype=torch.int64) for s, _ in texts]
        self.targets = [torch.tensor(v.encode(t) + [EOS], dtype=torch.int64) for _, t in texts]
        self.sizes = [len(s) for s in self.sources]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sources[i], self.targets[i]


@lru_cache(maxsize=1)
def load(**_) -> tuple[Dates, Dates]:
    """The training and test pairs: distinct dates drawn without replacement, the first TEST_SIZE for
    the test split, each written in a style drawn at random."""
    rng = random.Random(SEED)
    days = rng.sample(range((LAST - FIRST).days + 1), TRAIN_SIZE + TEST_SIZE)
    pairs = []
    for k in days:
        d = FIRST + datetime.timedelta(days=k)
        pairs.append((rng.choice(styles(d)), d.isoformat()))
    return Dates(pairs[TEST_SIZE:]), Dates(pairs[:TEST_SIZE])


def facts(**_) -> dict:
    """What a model is built for: one vocabulary for sources and targets (its strings, character level),
    its padding, start and end ids; and the length of every target, where decoding may stop."""
    v = vocab()
    return dict(src_vocab=len(v), tgt_vocab=len(v), pad_id=PAD, bos_id=BOS, eos_id=EOS, itos=list(v.itos),
                level="char", max_target_length=len("2015-03-03") + 1)  # every target: an ISO date and </s>
