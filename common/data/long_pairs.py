"""Long sentences to translate: a toy English -> French, word by word, 5 to 49 source words.

"the big red cats often see a small house near the old bridge" ->
"les chats rouges grands voient souvent une maison petite près du pont ancien".
Every pair is a sentence of a small grammar (below) and its translation by fixed rules. Source lengths
are spread evenly: every length from 5 to 49 words has the same number of sentences in each split
(training 240 a length, 10,800 pairs; test 20 a length, 900 pairs, 100 in each 5-word bin 5-9, 10-14,
..., 45-49), drawn from fixed seeds, the same every time, in about 2 s; no source is in both
splits or twice in one. It exists for Figure 2 of Bahdanau et al. 2015, BLEU against source length:
RNNsearch (attention) holds up on long sentences where the RNN Encoder-Decoder (one fixed-length
summary vector) falls off; the dates are too short (6 to 35 characters) to show it.

The grammar. A sentence is 1 to 8 clauses joined by conjunctions (and, but, while, because, so,
then); a clause is subject, [adverb,] verb, object, [preposition and noun phrase]; a noun phrase is a
determiner (the or a; plural: the or some), [a number, two to ten, after a plural "the" only], 0 to 2
adjectives, a noun. The verb agrees with its subject ("sees" / "see"). A sentence of L words is made
by drawing how many clauses (uniformly among those that fit L) and spreading the words beyond minimal
clauses over the clauses' optional slots at random. 65 nouns (singular and plural), 40 adjectives,
38 verbs (two forms), 9 numbers, 6 adverbs, 9 prepositions, 6 conjunctions, 3 determiners: 279
source words.

The rules (`translate`), which need a whole noun phrase and some reordering, so that no model can copy:
- every word has its dictionary translation (a noun its French singular or plural, a verb its third
  person singular or plural);
- adjectives follow the noun, in mirror order (the adjective next to the noun stays next to it):
  "the big red car" -> "la voiture rouge grande";
- agreement with the noun, which comes last in the source phrase: the article takes its gender and
  number (the -> le / la / les, a -> un / une, some -> des), each adjective too (grand / grande /
  grands / grandes);
- the adverb follows the verb: "often sees" -> "voit souvent";
- "near" is "près de", and "de le" contracts to "du", "de les" to "des", "de des" to "de": "near the
  bridge" -> "près du pont"; "while" is "pendant que", "because" "parce que".
Targets are 5 to 54 words, at most 1.15 times their source's length.

Word level: a source vocabulary (279 words) and a target vocabulary (377), each every word the grammar
can write in its language, sorted, after the four specials <pad> 0, <s> 1 (the decoder's first input),
</s> 2 (the end of every target), <unk> 3 (a typed word the grammar lacks).

The training set's size is what one epoch of `python train.py --paper bahdanau --dataset long-pairs`
(tiny, batch 64) trains in about 90 s on this repository's 2-core CPU while another run holds it
(load average 5): 121 samples/s with one thread (OMP_NUM_THREADS=1, as `common.sweep --parallel 2`
gives each run) over a 60-step probe, 149 in its last 10 steps, so 10,800 pairs take about 89 s, and
evaluating the 900 test pairs about 15 s more (untrained, decoding then to twice the source's length). With
torch's two threads on the busy machine it ran at 10 to 15 samples/s (the threads contend with the
other runs). The RNN Encoder-Decoder (`--paper gru`, tiny): 518 samples/s, 21 s an epoch.
"""

import random
from functools import lru_cache

import torch
from torch.utils.data import Dataset

MIN_LENGTH, MAX_LENGTH = 5, 49  # source words
TRAIN_PER_LENGTH, TEST_PER_LENGTH = 240, 20
LENGTHS = range(MIN_LENGTH, MAX_LENGTH + 1)
TRAIN_SIZE, TEST_SIZE = TRAIN_PER_LENGTH * len(LENGTHS), TEST_PER_LENGTH * len(LENGTHS)
BIN = 5  # words per length bin (Figure 2's x axis, binned)
MAX_TARGET = 54  # words of the longest target of either split (tested)
SEED = 0
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
PAD, BOS, EOS, UNK = range(4)

# ---------------------------------------------------------------- the dictionary

# English singular, English plural, French singular, French plural, gender; five words an entry
_NOUNS = """
cat cats chat chats m          dog dogs chien chiens m          horse horses cheval chevaux m
bird birds oiseau oiseaux m    book books livre livres m        tree trees arbre arbres m
garden gardens jardin jardins m   train trains train trains m   boat boats bateau bateaux m
man men homme hommes m         child children enfant enfants m  boy boys garçon garçons m
king kings roi rois m          doctor doctors médecin médecins m   neighbour neighbours voisin voisins m
teacher teachers professeur professeurs m   soldier soldiers soldat soldats m
farmer farmers fermier fermiers m   merchant merchants marchand marchands m   lion lions lion lions m
wolf wolves loup loups m       fox foxes renard renards m       rabbit rabbits lapin lapins m
castle castles château châteaux m   bridge bridges pont ponts m   village villages village villages m
market markets marché marchés m   field fields champ champs m    river rivers fleuve fleuves m
cake cakes gâteau gâteaux m    knife knives couteau couteaux m  hat hats chapeau chapeaux m
coat coats manteau manteaux m  basket baskets panier paniers m
house houses maison maisons f  car cars voiture voitures f      table tables table tables f
chair chairs chaise chaises f  flower flowers fleur fleurs f    woman women femme femmes f
girl girls fille filles f      queen queens reine reines f      city cities ville villes f
street streets rue rues f      door doors porte portes f        window windows fenêtre fenêtres f
letter letters lettre lettres f   apple apples pomme pommes f   star stars étoile étoiles f
mountain mountains montagne montagnes f   forest forests forêt forêts f   road roads route routes f
lamp lamps lampe lampes f      box boxes boîte boîtes f         song songs chanson chansons f
story stories histoire histoires f   cow cows vache vaches f    goat goats chèvre chèvres f
hen hens poule poules f        beach beaches plage plages f     island islands île îles f
church churches église églises f   school schools école écoles f   kitchen kitchens cuisine cuisines f
dress dresses robe robes f
""".split()
NOUNS = [tuple(_NOUNS[i:i + 5]) for i in range(0, len(_NOUNS), 5)]

# English, then French masculine singular, or its four forms m.sg f.sg m.pl f.pl where not regular
ADJECTIVES = [tuple(row.split()) for row in """
big grand
small petit
red rouge
green vert
blue bleu
black noir
white blanc blanche blancs blanches
old ancien ancienne anciens anciennes
new nouveau nouvelle nouveaux nouvelles
happy heureux heureuse heureux heureuses
sad triste
strong fort
heavy lourd
quiet silencieux silencieuse silencieux silencieuses
loud bruyant
cold froid
hot chaud
clean propre
dirty sale
rich riche
poor pauvre
tall haut
short court
long long longue longs longues
round rond
empty vide
full plein
slow lent
fast rapide
brave courageux courageuse courageux courageuses
clever intelligent
lazy paresseux paresseuse paresseux paresseuses
proud fier fière fiers fières
tired fatigué
strange étrange
gentle doux douce doux douces
yellow jaune
grey gris grise gris grises
beautiful beau belle beaux belles
young jeune
""".strip().splitlines()]

# English singular, English plural, French singular, French plural
VERBS = [tuple(row.split()) for row in """
sees see voit voient
likes like aime aiment
finds find trouve trouvent
takes take prend prennent
watches watch regarde regardent
follows follow suit suivent
carries carry transporte transportent
paints paint peint peignent
draws draw dessine dessinent
buys buy achète achètent
sells sell vend vendent
opens open ouvre ouvrent
closes close ferme ferment
builds build construit construisent
breaks break casse cassent
washes wash lave lavent
hears hear entend entendent
knows know connaît connaissent
loves love adore adorent
hates hate déteste détestent
helps help aide aident
calls call appelle appellent
visits visit visite visitent
meets meet rencontre rencontrent
pushes push pousse poussent
pulls pull tire tirent
hides hide cache cachent
keeps keep garde gardent
forgets forget oublie oublient
seeks seek cherche cherchent
chases chase chasse chassent
catches catch attrape attrapent
throws throw lance lancent
eats eat mange mangent
reads read lit lisent
writes write écrit écrivent
protects protect protège protègent
greets greet salue saluent
""".strip().splitlines()]

NUMBERS = dict(two="deux", three="trois", four="quatre", five="cinq", six="six", seven="sept", eight="huit",
               nine="neuf", ten="dix")
ADVERBS = dict(often="souvent", always="toujours", sometimes="parfois", rarely="rarement", already="déjà",
               soon="bientôt")
PREPOSITIONS = {"with": "avec", "under": "sous", "behind": "derrière", "for": "pour", "without": "sans",
                "on": "sur", "in": "dans", "toward": "vers", "near": "près de"}
CONJUNCTIONS = {"and": "et", "but": "mais", "while": "pendant que", "because": "parce que", "so": "donc",
                "then": "puis"}
DETERMINERS = ("the", "a", "some")  # the (singular or plural), a (singular), some (plural)
ARTICLES = {("the", "m", False): "le", ("the", "f", False): "la", ("the", "m", True): "les", ("the", "f", True): "les",
            ("a", "m", False): "un", ("a", "f", False): "une", ("some", "m", True): "des", ("some", "f", True): "des"}
CONTRACTED = {"le": "du", "les": "des", "des": "de"}  # "de" + article: "de le" -> "du", "de des" -> "de"


def adjective_forms(row: tuple[str, ...]) -> dict[tuple[str, bool], str]:
    """(gender, plural) -> the French form of an adjective row: the four given, or the regular ones
    (feminine + "e" unless the word ends in "e", plural + "s" unless it ends in "s" or "x")."""
    if len(row) == 5:
        m, f, mp, fp = row[1:]
    else:
        m = row[1]
        f = m if m.endswith("e") else m + "e"
        mp = m if m.endswith(("s", "x")) else m + "s"
        fp = f + "s"
    return {("m", False): m, ("f", False): f, ("m", True): mp, ("f", True): fp}


NOUN = {}  # English form -> (French form, gender, plural)
for en, en_pl, fr, fr_pl, gender in NOUNS:
    NOUN[en], NOUN[en_pl] = (fr, gender, False), (fr_pl, gender, True)
ADJECTIVE = {row[0]: adjective_forms(row) for row in ADJECTIVES}
VERB = {}  # English form -> French form
for en, en_pl, fr, fr_pl in VERBS:
    VERB[en], VERB[en_pl] = fr, fr_pl
WORDS = NUMBERS | ADVERBS | PREPOSITIONS | CONJUNCTIONS | VERB  # the words translated on their own

# ---------------------------------------------------------------- the translation rule


def noun_phrase(words: list[str]) -> list[str]:
    """The French of an English noun phrase (determiner, [number], adjectives, noun): the article and
    the adjectives agree with the noun, the adjectives follow it in mirror order."""
    det, *middle, noun = words
    fr, gender, plural = NOUN[noun]
    number = [NUMBERS[w] for w in middle if w in NUMBERS]
    adjectives = [ADJECTIVE[w][gender, plural] for w in middle if w in ADJECTIVE]
    return [ARTICLES[det, gender, plural], *number, fr, *adjectives[::-1]]


def translate(source: str) -> str:
    """The target of a source sentence of the grammar, by the rules above (KeyError for a word the
    grammar lacks)."""
    words, out, i = source.split(), [], 0
    while i < len(words):
        w = words[i]
        if w in DETERMINERS:  # a noun phrase runs to its noun
            j = next(k for k in range(i, len(words)) if words[k] in NOUN)
            phrase = noun_phrase(words[i:j + 1])
            if out and out[-1] == "de" and phrase[0] in CONTRACTED:  # "près de" + "le pont" -> "près du pont"
                out[-1], phrase = CONTRACTED[phrase[0]], phrase[1:]
            out += phrase
            i = j + 1
        elif w in ADVERBS:  # "often sees" -> "voit souvent"
            out += [VERB[words[i + 1]], ADVERBS[w]]
            i += 2
        else:
            out += WORDS[w].split()
            i += 1
    return " ".join(out)


# ---------------------------------------------------------------- the grammar

CLAUSE_MIN = 5  # det noun verb det noun
SLOTS = 3  # of a noun phrase: a number and two adjectives
PP_WORDS = 3  # preposition det noun
CLAUSE_MAX = CLAUSE_MIN + SLOTS + 1 + SLOTS + PP_WORDS + SLOTS  # 18: every slot, the adverb and a full PP


def phrase(rng: random.Random, slots: list[str]) -> tuple[list[str], bool]:
    """An English noun phrase with the optional slots chosen ("number", "adjective"), and whether it is
    plural."""
    nouns = rng.choice(NOUNS)
    adjectives = rng.sample(list(ADJECTIVE), slots.count("adjective"))
    if "number" in slots:
        return ["the", rng.choice(list(NUMBERS)), *adjectives, nouns[1]], True
    plural = rng.random() < 0.5
    det = rng.choice(("the", "some") if plural else ("the", "a"))
    return [det, *adjectives, nouns[plural]], plural


def clause(rng: random.Random, n: int) -> list[str]:
    """An English clause of exactly n words (CLAUSE_MIN to CLAUSE_MAX)."""
    extra = n - CLAUSE_MIN
    with_pp = extra > SLOTS + 1 + SLOTS or (extra >= PP_WORDS and rng.random() < 0.5)
    extra -= PP_WORDS * with_pp
    phrases = ("subject", "object", "pp") if with_pp else ("subject", "object")
    slots = [(p, kind) for p in phrases for kind in ("number", "adjective", "adjective")] + [("verb", "adverb")]
    chosen = rng.sample(slots, extra)  # the optional words this clause has
    which = lambda part: [kind for p, kind in chosen if p == part]
    subject, plural = phrase(rng, which("subject"))
    verb = rng.choice(VERBS)[plural]
    words = subject + [rng.choice(list(ADVERBS))] * bool(which("verb")) + [verb] + phrase(rng, which("object"))[0]
    if with_pp:
        words += [rng.choice(list(PREPOSITIONS))] + phrase(rng, which("pp"))[0]
    return words


def sentence(rng: random.Random, length: int) -> str:
    """An English sentence of exactly `length` words: k clauses (uniformly among the k that fit) joined by
    conjunctions, the words beyond k minimal clauses spread over the clauses at random."""
    fits = [k for k in range(1, length + 1) if k * CLAUSE_MIN + k - 1 <= length <= k * CLAUSE_MAX + k - 1]
    k = rng.choice(fits)
    sizes = [CLAUSE_MIN] * k
    for _ in range(length - (k * CLAUSE_MIN + k - 1)):
        sizes[rng.choice([c for c in range(k) if sizes[c] < CLAUSE_MAX])] += 1
    words = clause(rng, sizes[0])
    for n in sizes[1:]:
        words += [rng.choice(list(CONJUNCTIONS))] + clause(rng, n)
    return " ".join(words)


# ---------------------------------------------------------------- vocabularies and the data set


def source_words() -> list[str]:
    """Every word the grammar writes in English, sorted."""
    return sorted({*DETERMINERS, *NOUN, *ADJECTIVE, *WORDS})


def target_words() -> list[str]:
    """Every word a translation can hold, sorted."""
    words = {*ARTICLES.values(), *CONTRACTED.values(), *(fr for fr, _, _ in NOUN.values())}
    words |= {form for forms in ADJECTIVE.values() for form in forms.values()}
    words |= {w for text in WORDS.values() for w in text.split()}
    return sorted(words)


class Vocab:
    """Words <-> ids: the four specials, then `words` in order."""

    def __init__(self, words: list[str]):
        self.itos = [*SPECIALS, *words]
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        """Ids of the text's words (split at spaces); <unk> for a word the vocabulary does not hold."""
        return [self.stoi.get(w, UNK) for w in text.split()]


@lru_cache(maxsize=1)
def vocabularies() -> tuple[Vocab, Vocab]:
    """The (source, target) vocabularies."""
    return Vocab(source_words()), Vocab(target_words())


class LongPairs(Dataset):
    """(source ids (S,), target ids (T,) ending with </s>) pairs; `sizes` holds each source's length
    (its words) for bucketing and binning, `texts` the (source, target) strings."""

    def __init__(self, texts: list[tuple[str, str]]):
        src, tgt = vocabularies()
        self.texts = texts
        self.sources = [torch.tensor(src.encode(s), dtype=torch.int64) for s, _ in texts]
        self.targets = [torch.tensor(tgt.encode(t) + [EOS], dtype=torch.int64) for _, t in texts]
        self.sizes = [len(s) for s in self.sources]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sources[i], self.targets[i]


def draw(per_length: int, seed: int, taken: set[str]) -> list[tuple[str, str]]:
    """per_length new sentences of every length, with their translations, in order of length; each
    source is added to `taken` and none drawn is in it already."""
    rng, pairs = random.Random(seed), []
    for length in LENGTHS:
        drawn = 0
        while drawn < per_length:
            s = sentence(rng, length)
            if s not in taken:
                taken.add(s)
                pairs.append((s, translate(s)))
                drawn += 1
    return pairs


@lru_cache(maxsize=1)
def load(**_) -> tuple[LongPairs, LongPairs]:
    """The training and test pairs: the test sentences drawn first (seed SEED), then the training ones
    (seed SEED + 1), none of them a test sentence; the training pairs shuffled (fixed seed)."""
    taken: set[str] = set()
    test = draw(TEST_PER_LENGTH, SEED, taken)
    train = draw(TRAIN_PER_LENGTH, SEED + 1, taken)
    random.Random(SEED + 2).shuffle(train)
    return LongPairs(train), LongPairs(test)


def facts(**_) -> dict:
    """What a model is built for: the sizes of the source and target vocabularies, the padding, start
    and end ids, the target words (itos, for reading outputs), the source words and their ids (src_itos,
    src_stoi, for encoding typed text), word level, and max_target_length: decoding stops after the
    longest target's MAX_TARGET words and </s> (rather than at twice the source's length and 10)."""
    src, tgt = vocabularies()
    return dict(src_vocab=len(src), tgt_vocab=len(tgt), pad_id=PAD, bos_id=BOS, eos_id=EOS, itos=list(tgt.itos),
                src_itos=list(src.itos), src_stoi=dict(src.stoi), level="word", max_target_length=MAX_TARGET + 1)


def length_bin(length: int) -> int:
    """The first length of a source length's BIN-word bin: 5 for 5 to 9, 10 for 10 to 14, ..."""
    return MIN_LENGTH + (length - MIN_LENGTH) // BIN * BIN
