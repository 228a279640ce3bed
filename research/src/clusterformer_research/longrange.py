"""Synthetic long-context QA whose answers need two facts that lie far apart.

Every context is a sequence of short sentences of three kinds:

* link facts, ``"Zorvan lives with Melka."``;
* place facts, ``"Melka lives in Tarsk."``;
* filler sentences without names, ``"The market was quiet that morning."``.

Facts come in chains: a link fact ``X lives with Y`` and a place fact ``Y lives in Z``. All link
facts lie on one side of the context and all place facts on the other, at least ``min_gap_tokens``
tokens apart, so no window holds a link fact together with any place fact (a window that sees a
place fact cannot rule it out by a nearby link fact either). Every name occurs in one chain only and
every place once per context.

``kind="longrange"`` asks ``"Where does X live?"``: the answer ``Z`` sits in a sentence that
does not mention ``X``, and the sentence linking ``X`` to ``Y`` is far away, so no single
window can answer it. ``kind="local"`` asks ``"Where does Y live?"`` about the same kind of
context: one sentence answers it, which checks that a sliding-window model learns the
surface task at all. ``kind="mention"`` asks ``"Who is Y with a home?"``: the answer is the name
itself where its place fact mentions it. It teaches a model trained from scratch to match a name
in the question with the same name in the context, the step that both other kinds build on
(without it, small models trained from scratch stay at chance on ``local`` for thousands of steps).

``kind="twin"`` is a one-hop long-range task over contexts of fillers and ``num_facts`` place facts
``"P lives in T."`` about distinct people, where one place occurs twice and every other once. It asks
``"Which place has two residents?"``: the answer is the place named in two facts, which lie at least
``min_gap_tokens`` apart (and at most ``max_gap_tokens``, when given). A window that sees one of the two
facts cannot tell it from the once-named places; a layer that brings both mentions together can.

Names are drawn from small fixed pools (each name is one token of the tokenizer built by
:func:`build_longrange_tokenizer`), sentences follow fixed
templates, and every example depends only on ``(seed, kind, index)``.

Lengths are measured in approximate tokens: words plus punctuation marks, i.e. the pieces of
the byte-level pre-tokenizer. Each piece becomes at least one BPE token, so gaps counted this
way are lower bounds on gaps in real tokens.

The library (``hf_clusterformer``) does not generate these sets: ``python -m clusterformer_research.longrange`` writes
one split as a SQuAD-format file (`write_squad_file`), which ``clusterformer train`` / ``evaluate`` read with
``--train_file`` / ``--validation_file``; ``--tokenizer_dir`` saves the tokenizer whose names are single tokens
(`build_longrange_tokenizer`), for ``--tokenizer_name``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hf_clusterformer.data import approx_token_count, build_tokenizer, squad_features

if TYPE_CHECKING:
    import datasets
    from transformers import RobertaTokenizerFast

__all__ = [
    "KINDS",
    "WORD_PERSON_NAMES",
    "WORD_PLACE_NAMES",
    "PERSON_NAMES",
    "PLACE_NAMES",
    "build_longrange_tokenizer",
    "generate_longrange_dataset",
    "load_longrange_dataset",
    "longrange_corpus",
    "main",
    "squad_json",
    "write_squad_file",
]

KINDS = ("longrange", "local", "mention", "twin")
_KIND_IDS = {"longrange": 0, "local": 1, "mention": 2, "twin": 3}
_SPLIT_IDS = {"train": 0, "validation": 1, "test": 2}

_ONSETS = "B D F G H J K L M N P R S T V Z".split()
_VOWELS = "a e i o u".split()
_PERSON_ENDINGS = "ran lek mir dov vin sal ten bok nis gar".split()
_PLACE_ENDINGS = "rsk ndor lmar thia vik".split()


def _name_pool(endings: Sequence[str], size: int, seed: int) -> tuple[str, ...]:
    names = [o + v + e for o, v, e in itertools.product(_ONSETS, _VOWELS, endings)]
    chosen = np.random.default_rng(seed).choice(len(names), size=size, replace=False)
    return tuple(sorted(names[i] for i in chosen))


PERSON_NAMES: tuple[str, ...] = _name_pool(_PERSON_ENDINGS, 400, 1)
"""Fixed pool of person names (two syllables, five letters)."""
PLACE_NAMES: tuple[str, ...] = _name_pool(_PLACE_ENDINGS, 200, 2)
"""Fixed pool of place names."""

WORD_PERSON_NAMES: tuple[str, ...] = tuple(
    "Adam Ahmed Alan Ali Alice Anna Arthur Ben Boris Brian Carl Charles Clara Craig Dale Dan Daniel David Edward "
    "Emma Eric Ethan Fred George Glen Greg Hans Harry Hassan Helen Henry Igor Ivan Jack James Jane Jason Jim Joe "
    "John Kate Kevin Kyle Laura Lee Leo Lucy Luke Martin Mary Michael Neil Noah Oliver Omar Owen Paul Peter Richard "
    "Robert Ross Ryan Sam Sarah Scott Sean Simon Susan Thomas Tim Tom Walter William Yuki".split()
)
"""Common first names, each one token of BERT's uncased WordPiece vocabulary (``names="words"``)."""
WORD_PLACE_NAMES: tuple[str, ...] = tuple(
    "Amsterdam Athens Atlanta Auckland Austin Baghdad Bangkok Beijing Belfast Berlin Bogota Bordeaux Boston Bristol "
    "Brussels Budapest Cairo Cambridge Caracas Cardiff Chicago Copenhagen Dallas Delhi Denver Detroit Dublin "
    "Edinburgh Florence Geneva Glasgow Hamburg Havana Helsinki Houston Kabul Lagos Leeds Lima Lisbon Liverpool London "
    "Lyon Madrid Manchester Manila Marseille Melbourne Memphis Miami Milan Montreal Moscow Mumbai Munich Nairobi "
    "Naples Nashville Oslo Oxford Paris Perth Phoenix Portland Prague Rome Santiago Seattle Seoul Shanghai Stockholm "
    "Sydney Tehran Tokyo Toronto Tunis Turin Venice Vienna Warsaw Zurich".split()
)
"""Well-known cities, each one token of BERT's uncased WordPiece vocabulary (``names="words"``)."""
_NAME_POOLS = {"invented": (PERSON_NAMES, PLACE_NAMES), "words": (WORD_PERSON_NAMES, WORD_PLACE_NAMES)}

_LINK = "{} lives with {}."
_PLACE = "{} lives in {}."
_QUESTION = "Where does {} live?"
_MENTION = "Who is {} with a home?"
_TWIN = "Which place has two residents?"
_FACT_LEN = 5  # approximate tokens of both fact templates: name, lives, with|in, name, "."

def _build_fillers() -> tuple[list[str], list[str]]:
    nouns = "market river road square library bridge forest garden harbour school".split()
    adjectives = "quiet busy cold crowded calm bright wet loud".split()
    times = ["that morning", "in spring", "all week", "at dusk", "last year", "every evening"]
    people = "farmers traders children travellers sailors students".split()
    verbs = "gathered worked rested talked waited sang".split()
    winds = ["A cold wind blew over the hills.", "A warm rain fell on the fields.",
             "A thick fog covered the valley.", "A light snow fell on the roofs."]
    short = [f"The {n} was {a}." for n in nouns for a in adjectives]
    long = [f"The {n} was {a} {t}." for n in nouns for a in adjectives for t in times]
    long += [f"Many {p} {v} near the {n}." for p in people for v in verbs for n in nouns]
    long += [f"Nobody remembers when the old {n} was built." for n in nouns]
    long += winds
    return short, long


_SHORT_FILLERS, _LONG_FILLERS = _build_fillers()
_FILLERS = _SHORT_FILLERS + _LONG_FILLERS
_FILLER_LEN = np.array([approx_token_count(s) for s in _FILLERS])
#: Filler indices in a fixed shuffled order: ``num_fillers=N`` draws from the first N (``twin`` only).
_FILLER_ORDER = np.random.default_rng(3).permutation(len(_FILLERS))
assert all(approx_token_count(s) == _FACT_LEN for s in _SHORT_FILLERS)
assert approx_token_count(_LINK.format("Zorvan", "Melka")) == _FACT_LEN
assert approx_token_count(_PLACE.format("Melka", "Tarsk")) == _FACT_LEN
assert not set(PERSON_NAMES) & set(PLACE_NAMES)


def _layout(
    rng: np.random.Generator, target: int, min_gap: int, fact_fraction: float, max_chains: int
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """Choose sentence kinds and pair fact slots into chains, link and place facts ``min_gap`` apart.

    Returns the filler index of every sentence (-1 for facts), sentence start positions in
    approximate tokens, and the chains as (link sentence, place sentence) index pairs.
    """
    mean_len = fact_fraction * _FACT_LEN + (1 - fact_fraction) * float(_FILLER_LEN.mean())
    n = int(target / mean_len * 1.3) + 16
    while True:
        is_fact = rng.random(n) < fact_fraction
        is_fact[0] = False  # open with a filler so the first name carries a leading space
        filler = rng.integers(len(_FILLERS), size=n)
        lengths = np.where(is_fact, _FACT_LEN, _FILLER_LEN[filler])
        ends = np.cumsum(lengths)
        if ends[-1] >= target:
            break
        n *= 2
    used = int(np.searchsorted(ends, target)) + 1
    is_fact, filler, lengths = is_fact[:used], filler[:used], lengths[:used]
    starts = ends[:used] - lengths

    # Link facts go on one side of a random cut and place facts on the other, with at least
    # ``min_gap`` tokens between the two groups: no window then sees a link fact together with any
    # place fact, so a window cannot rule a place out because the asked name's link fact is near.
    slots = np.flatnonzero(is_fact)
    s = starts[slots]
    pairs: list[tuple[int, int]] = []
    if len(slots) >= 2:
        lo, hi = int(s[0]) + _FACT_LEN, max(int(s[-1]) - min_gap, int(s[0]) + _FACT_LEN)
        quarter = (hi - lo) // 4  # cut in the middle half, so both sides hold facts
        cut = int(rng.integers(lo + quarter, hi - quarter + 1))
        before = slots[s + _FACT_LEN <= cut]
        after = slots[s >= cut + min_gap]
        count = min(len(before), len(after), max_chains)
        if count:
            first = rng.choice(before, size=count, replace=False)
            second = rng.choice(after, size=count, replace=False)
            links_first = rng.random() < 0.5
            pairs = [(int(a), int(b)) if links_first else (int(b), int(a)) for a, b in zip(first, second)]

    # Fact slots left without a partner become five-token fillers: positions do not move.
    paired = {k for pair in pairs for k in pair}
    kinds = np.where(is_fact, -1, filler)
    for k in slots:
        if int(k) not in paired:
            kinds[k] = rng.integers(len(_SHORT_FILLERS))
    return kinds, starts, pairs


def _generate_one(
    rng: np.random.Generator,
    kind: str,
    context_tokens: tuple[int, int],
    min_gap: int,
    fact_fraction: float,
    max_chains: int,
) -> tuple[str, str, str, int]:
    for _ in range(100):
        target = int(rng.integers(context_tokens[0], context_tokens[1] + 1))
        kinds, _, pairs = _layout(rng, target, min_gap, fact_fraction, max_chains)
        if pairs:
            break
    else:  # pragma: no cover - ruled out by the argument checks
        raise RuntimeError("could not place a single chain; raise context_tokens")

    people = rng.choice(len(PERSON_NAMES), size=2 * len(pairs), replace=False)
    places = rng.choice(len(PLACE_NAMES), size=len(pairs), replace=False)
    sentences = [_FILLERS[k] if k >= 0 else "" for k in kinds]
    for c, (link, place) in enumerate(pairs):
        x, y = PERSON_NAMES[people[2 * c]], PERSON_NAMES[people[2 * c + 1]]
        sentences[link] = _LINK.format(x, y)
        sentences[place] = _PLACE.format(y, PLACE_NAMES[places[c]])

    gold = int(rng.integers(len(pairs)))
    x, y = PERSON_NAMES[people[2 * gold]], PERSON_NAMES[people[2 * gold + 1]]
    place_sentence = pairs[gold][1]
    offset = sum(len(t) for t in sentences[:place_sentence]) + place_sentence
    if kind == "mention":  # the name itself, where its place fact mentions it
        return _MENTION.format(y), " ".join(sentences), y, offset
    answer = PLACE_NAMES[places[gold]]
    answer_start = offset + len(y) + len(" lives in ")
    question = _QUESTION.format(x if kind == "longrange" else y)
    return question, " ".join(sentences), answer, answer_start


def _balanced_twin_layout(
    rng: np.random.Generator, context_tokens: tuple[int, int], min_gap: int, max_gap: int | None, num_facts: int,
    fillers_pool: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Facts spread evenly (one per 1/num_facts of the context, at a random place in it); the pair is fact ``k`` and
    fact ``k + num_facts / 2`` for a uniform ``k``, so every fact slot is in the pair with probability
    ``2 / num_facts`` and no fact position is favoured. Returns (kinds, starts, first, second) as `_generate_twin`."""
    half = num_facts // 2
    for _ in range(1000):
        target = int(rng.integers(context_tokens[0], context_tokens[1] + 1))
        segment = target / num_facts
        kinds: list[int] = []
        for _segment in range(num_facts):
            fillers, total = [], _FACT_LEN
            while total < segment:
                fillers.append(int(fillers_pool[rng.integers(len(fillers_pool))]))
                total += int(_FILLER_LEN[fillers[-1]])
            fillers.insert(int(rng.integers(len(fillers) + 1)), -1)
            kinds += fillers
        kinds_array = np.array(kinds)
        lengths = np.where(kinds_array < 0, _FACT_LEN, _FILLER_LEN[np.maximum(kinds_array, 0)])
        starts = np.cumsum(lengths) - lengths
        facts = np.flatnonzero(kinds_array < 0)
        first = int(rng.integers(num_facts - half))
        second = first + half
        gap = int(starts[facts[second]] - starts[facts[first]] - _FACT_LEN)
        if gap >= min_gap and (max_gap is None or gap <= max_gap):
            return kinds_array, starts, first, second
    raise ValueError(
        f"no evenly spread context of {context_tokens} approximate tokens put facts {half} apart {min_gap}-{max_gap} "
        "tokens apart; make the context about twice the gap"
    )


def _generate_twin(
    rng: np.random.Generator,
    context_tokens: tuple[int, int],
    min_gap: int,
    max_gap: int | None,
    num_facts: int,
    names: str = "invented",
    placement: str = "gap",
    target: str = "first",
    num_places: int | None = None,
    num_fillers: int | None = None,
    question: str = "",
) -> tuple[str, str, str, list[int]]:
    """One ``twin`` example: (question, context, answer, both answer offsets, the training target first)."""
    person_names, place_names = _NAME_POOLS[names]
    place_names = place_names[:num_places]
    fillers_pool = np.arange(len(_FILLERS)) if num_fillers is None else _FILLER_ORDER[:num_fillers]
    if placement == "balanced":
        kinds, starts, first, second = _balanced_twin_layout(rng, context_tokens, min_gap, max_gap, num_facts,
                                                             fillers_pool)
        facts = np.flatnonzero(kinds < 0)
        return _fill_twin(rng, kinds, facts, first, second, num_facts, person_names, place_names, target, question)
    for _ in range(1000):
        length = int(rng.integers(context_tokens[0], context_tokens[1] + 1))
        fillers = []
        total = 0
        while total < length - num_facts * _FACT_LEN:
            fillers.append(int(fillers_pool[rng.integers(len(fillers_pool))]))
            total += int(_FILLER_LEN[fillers[-1]])
        kinds = np.array(fillers + [-1] * num_facts)[rng.permutation(len(fillers) + num_facts)]
        lengths = np.where(kinds < 0, _FACT_LEN, _FILLER_LEN[np.maximum(kinds, 0)])
        starts = np.cumsum(lengths) - lengths
        facts = np.flatnonzero(kinds < 0)
        gaps = starts[facts][None, :] - (starts[facts][:, None] + _FACT_LEN)  # tokens strictly between i < j
        ok = np.triu(gaps >= min_gap, k=1)
        if max_gap is not None:
            ok &= gaps <= max_gap
        ok |= ok.T
        # a uniformly drawn fact, then a partner at the right distance: no fact position is favoured more than
        # the gap forces (drawing uniformly over pairs would favour the first and last facts)
        first = int(rng.integers(num_facts))
        partners = np.flatnonzero(ok[first])
        if len(partners):
            first, second = sorted((first, int(rng.choice(partners))))
            break
    else:
        raise ValueError(
            f"no context of {context_tokens} approximate tokens placed two facts {min_gap}-{max_gap} tokens apart; "
            "widen context_tokens or the gap range"
        )
    return _fill_twin(rng, kinds, facts, first, second, num_facts, person_names, place_names, target, question)


def _fill_twin(rng, kinds, facts, first, second, num_facts, person_names, place_names, target, question):
    """Write the sentences of a twin layout: fact slots ``first`` and ``second`` name the same place."""
    people = rng.choice(len(person_names), size=num_facts, replace=False)
    places = [place_names[i] for i in rng.choice(len(place_names), size=num_facts - 1, replace=False)]
    others = [i for i in range(num_facts) if i not in (first, second)]
    fact_places = [""] * num_facts
    fact_places[first] = fact_places[second] = places[0]
    for slot, place in zip(others, places[1:]):
        fact_places[slot] = place
    sentences = [_FILLERS[k] if k >= 0 else "" for k in kinds]
    for slot, sentence in enumerate(facts):
        sentences[sentence] = _PLACE.format(person_names[people[slot]], fact_places[slot])
    offsets = np.cumsum([0] + [len(t) + 1 for t in sentences])
    answer_starts = [int(offsets[facts[i]]) + len(sentences[facts[i]]) - len(places[0]) - 1 for i in (first, second)]
    if target == "later":
        answer_starts.reverse()
    return question or _TWIN, " ".join(sentences), places[0], answer_starts


def _check_args(
    kind: str, context_tokens: tuple[int, int], min_gap_tokens: int, fact_fraction: float
) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    lo, hi = context_tokens
    if not 0 < lo <= hi:
        raise ValueError(f"context_tokens must satisfy 0 < min <= max, got {context_tokens}")
    if min_gap_tokens < 0:
        raise ValueError(f"min_gap_tokens must be >= 0, got {min_gap_tokens}")
    if lo < min_gap_tokens + 4 * _FACT_LEN + 20:
        raise ValueError(
            f"context_tokens min {lo} is too short for two facts {min_gap_tokens} tokens apart; "
            f"use at least {min_gap_tokens + 4 * _FACT_LEN + 20}"
        )
    if not 0 < fact_fraction <= 1:
        raise ValueError(f"fact_fraction must be in (0, 1], got {fact_fraction}")


def generate_longrange_dataset(
    num_examples: int,
    seed: int = 0,
    context_tokens: tuple[int, int] = (2000, 8000),
    kind: str = "longrange",
    *,
    min_gap_tokens: int = 300,
    fact_fraction: float = 0.5,
    max_chains: int | None = None,
    split: str = "train",
    max_gap_tokens: int | None = None,
    num_facts: int = 16,
    names: str = "invented",
    placement: str = "gap",
    target: str = "first",
    num_places: int | None = None,
    num_fillers: int | None = None,
    question: str = "",
) -> list[dict[str, Any]]:
    """Generate SQuAD-format records ``{"id", "title", "question", "context", "answers"}``.

    Args:
        num_examples: number of records.
        seed: base seed; record ``i`` depends only on ``(seed, kind, split, i)``, so a
            longer list extends a shorter one.
        context_tokens: inclusive range of context lengths in approximate tokens.
        kind: ``"longrange"`` (two-hop, facts far apart), ``"local"`` (one sentence) or ``"mention"``
            (find the asked name's place fact; a curriculum for training from scratch).
        min_gap_tokens: least number of approximate tokens strictly between any link fact and
            any place fact; the default 300 exceeds a 256-token window.
        fact_fraction: share of sentences drawn as facts (the rest are fillers).
        max_chains: cap on chains per context (default: as many as the name pools allow).
        split: name mixed into the seed so that splits never share records.
        max_gap_tokens: ``twin`` only: most approximate tokens between the two facts naming the answer (e.g. within
            one window, for a near version of the task).
        num_facts: ``twin`` only: place facts per context (``num_facts - 1`` distinct places; chance is
            ``1 / (num_facts - 1)``).
        names: ``twin`` only: ``"invented"`` (the pools above; several tokens each, sharing pieces) or ``"words"``
            (common first names and cities, one token each in BERT's uncased vocabulary).
        placement: ``twin`` only: ``"gap"`` (facts anywhere; a uniform fact, then a partner at the right distance,
            which favours the first and last facts) or ``"balanced"`` (facts spread evenly, the pair ``num_facts / 2``
            facts apart from a uniform start: every fact slot is in the pair equally often).
        target: ``twin`` only: which mention is listed first in ``answer_start`` (the one training takes):
            ``"first"`` or ``"later"``.
        num_places: ``twin`` only: draw places from the first ``num_places`` names of the pool (None: all of it);
            at least ``num_facts - 1``.
        num_fillers: ``twin`` only: draw filler sentences from a fixed set of this many (None: all).
        question: ``twin`` only: the question asked (default ``"Which place has two residents?"``).
    """
    _check_args(kind, context_tokens, min_gap_tokens, fact_fraction)
    if num_examples < 0:
        raise ValueError(f"num_examples must be >= 0, got {num_examples}")
    max_chains = _max_chains(max_chains)
    _check_twin_options(kind, num_facts, names, placement, target, min_gap_tokens, max_gap_tokens)
    if num_places is not None and not num_facts - 1 <= num_places <= len(_NAME_POOLS[names][1]):
        raise ValueError(f"num_places must be in [{num_facts - 1}, {len(_NAME_POOLS[names][1])}], got {num_places}")
    split_id = _split_id(split)
    records = []
    for i in range(num_examples):
        rng = np.random.default_rng([seed, _KIND_IDS[kind], split_id, i])
        if kind == "twin":
            question, context, answer, starts = _generate_twin(
                rng, context_tokens, min_gap_tokens, max_gap_tokens, num_facts, names, placement, target, num_places,
                num_fillers, question,
            )
        else:
            question, context, answer, start = _generate_one(
                rng, kind, context_tokens, min_gap_tokens, fact_fraction, max_chains
            )
            starts = [start]
        records.append(_record(f"{kind}-{split}", seed, i, question, context, answer, starts))
    return records


def _max_chains(max_chains: int | None) -> int:
    """``max_chains``, checked; ``None``: as many chains as the name pools allow."""
    cap = min(len(PLACE_NAMES), len(PERSON_NAMES) // 2)
    max_chains = cap if max_chains is None else max_chains
    if not 0 < max_chains <= cap:
        raise ValueError(f"max_chains must be in [1, {cap}], got {max_chains}")
    return max_chains


def _check_twin_options(
    kind: str, num_facts: int, names: str, placement: str, target: str, min_gap_tokens: int, max_gap_tokens: int | None
) -> None:
    """Raise `ValueError` naming the option for invalid ``twin`` options (and their choices for every kind)."""
    if kind == "twin" and not 3 <= num_facts <= len(PLACE_NAMES):
        raise ValueError(f"num_facts must be in [3, {len(PLACE_NAMES)}], got {num_facts}")
    for option, value, choices in (("names", names, tuple(_NAME_POOLS)), ("placement", placement, ("gap", "balanced")),
                                   ("target", target, ("first", "later"))):
        if value not in choices:
            raise ValueError(f"{option} must be one of {choices}, got {value!r}")
    if kind == "twin" and num_facts > min(len(p) for p in _NAME_POOLS[names]) + 1:
        raise ValueError(f"num_facts {num_facts} is more than the {names!r} name pools hold")
    if max_gap_tokens is not None and max_gap_tokens < min_gap_tokens:
        raise ValueError(f"max_gap_tokens ({max_gap_tokens}) must be >= min_gap_tokens ({min_gap_tokens})")


def _split_id(split: str) -> int:
    """The number a split mixes into the seed: 0, 1, 2 for train, validation, test; other names by their bytes."""
    split_id = _SPLIT_IDS.get(split)
    if split_id is None:
        split_id = int.from_bytes(split.encode()[:8].ljust(8, b"\0"), "little")
    return split_id


def _record(
    name: str, seed: int, index: int, question: str, context: str, answer: str, starts: list[int]
) -> dict[str, Any]:
    """The SQuAD-format record ``index`` of ``name`` (``kind-split``): one answer text per mention offset."""
    return {
        "id": f"{name}-{seed}-{index}",
        "title": f"{name}-{index}",
        "question": question,
        "context": context,
        "answers": {"text": [answer] * len(starts), "answer_start": starts},
    }


def longrange_corpus(num_examples: int = 200, seed: int = 0,
                     context_tokens: tuple[int, int] = (2000, 4000)) -> list[str]:
    """Texts for training a tokenizer: generated contexts and questions of both kinds,
    plus one question per pooled name so every name is seen."""
    texts: list[str] = []
    for kind in ("longrange", "local", "mention"):  # twin contexts hold the same sentences
        for r in generate_longrange_dataset(num_examples, seed, context_tokens, kind,
                                            split="tokenizer"):
            texts += [r["question"], r["context"]]
    texts += [_QUESTION.format(name) for name in PERSON_NAMES] + [_TWIN]
    texts += [_PLACE.format(PERSON_NAMES[0], place) for place in PLACE_NAMES]
    return texts


def load_longrange_dataset(
    kind: str = "longrange",
    train_size: int = 2000,
    validation_size: int = 200,
    seed: int = 0,
    context_tokens: tuple[int, int] = (2000, 8000),
    **kwargs: Any,
) -> datasets.DatasetDict:
    """Build a ``datasets.DatasetDict`` with ``train`` and ``validation`` splits.

    Extra keyword arguments go to :func:`generate_longrange_dataset`.
    """
    import datasets

    features = squad_features()
    splits = {
        name: datasets.Dataset.from_list(
            generate_longrange_dataset(size, seed, context_tokens, kind, split=name, **kwargs),
            features=features,
        )
        for name, size in (("train", train_size), ("validation", validation_size))
    }
    return datasets.DatasetDict(splits)



def build_longrange_tokenizer(
    vocab_size: int = 1300,
    seed: int = 0,
    num_examples: int = 100,
    save_dir: str | os.PathLike[str] | None = None,
) -> RobertaTokenizerFast:
    """Tokenizer for the generated long-range data: every pooled name is a single token
    (`hf_clusterformer.data.build_tokenizer` on `longrange_corpus`)."""
    return build_tokenizer(longrange_corpus(num_examples, seed), vocab_size, save_dir)


# -- SQuAD-format files ---------------------------------------------------------------------------------------------


def squad_json(records: Sequence[dict[str, Any]], version: str = "longrange") -> dict[str, Any]:
    """Records in the official nested SQuAD v1.1 layout, one article (titled by the record) per record:
    ``{"version", "data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers"}]}]}]}``."""
    return {
        "version": version,
        "data": [
            {
                "title": record["title"],
                "paragraphs": [
                    {
                        "context": record["context"],
                        "qas": [
                            {
                                "id": record["id"],
                                "question": record["question"],
                                "answers": [
                                    {"text": text, "answer_start": start}
                                    for text, start in zip(
                                        record["answers"]["text"], record["answers"]["answer_start"]
                                    )
                                ],
                            }
                        ],
                    }
                ],
            }
            for record in records
        ],
    }


def write_squad_file(records: Sequence[dict[str, Any]], path: str | os.PathLike[str], overwrite: bool = False) -> Path:
    """Write records as a file that ``clusterformer train`` / ``evaluate`` read (``--train_file``,
    ``--validation_file``): ``.json`` in the nested SQuAD layout (`squad_json`), ``.jsonl`` as one flat record a
    line. An existing file is replaced only with ``overwrite`` (`FileExistsError` otherwise)."""
    path = Path(path)
    if path.suffix not in (".json", ".jsonl"):
        raise ValueError(f"{path} must end in .json (nested SQuAD layout) or .jsonl (one record a line).")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass --overwrite to replace it.")
    if path.suffix == ".jsonl":
        text = "".join(json.dumps(record) + "\n" for record in records)
    else:
        text = json.dumps(squad_json(records))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m clusterformer_research.longrange``: write one split of a generated set as a SQuAD-format file
    (and, with ``--tokenizer_dir``, the tokenizer whose names are single tokens) for the library's training command::

        python -m clusterformer_research.longrange --kind local --split train --num_examples 2000 --out train.json \\
            --tokenizer_dir tokenizer
        python -m clusterformer_research.longrange --kind local --split validation --num_examples 200 --out dev.json
        clusterformer train --train_file train.json --validation_file dev.json --tokenizer_name tokenizer ...

    Errors are one line on stderr, exit status 2.
    """
    parser = argparse.ArgumentParser(prog="python -m clusterformer_research.longrange",
                                     description=main.__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("--kind", choices=KINDS, default="longrange", help="question kind (default: %(default)s)")
    parser.add_argument("--out", default=None, help="file to write: .json (nested SQuAD layout) or .jsonl")
    parser.add_argument("--split", default="train", help="split name mixed into the seed (default: %(default)s)")
    parser.add_argument("--num_examples", type=int, default=2000, help="records (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context_tokens", type=int, nargs=2, default=(2000, 8000), metavar=("MIN", "MAX"),
                        help="context lengths in approximate tokens (default: 2000 8000)")
    parser.add_argument("--min_gap_tokens", type=int, default=300,
                        help="least distance between the facts a question joins (default: %(default)s)")
    parser.add_argument("--max_gap_tokens", type=int, default=None, help="twin: most distance between the mentions")
    parser.add_argument("--fact_fraction", type=float, default=0.5, help="share of sentences drawn as facts")
    parser.add_argument("--max_chains", type=int, default=None, help="chains per context (default: all that fit)")
    parser.add_argument("--num_facts", type=int, default=16, help="twin: place facts per context")
    parser.add_argument("--names", choices=tuple(_NAME_POOLS), default="invented", help="twin: name pools")
    parser.add_argument("--placement", choices=("gap", "balanced"), default="gap", help="twin: fact placement")
    parser.add_argument("--target", choices=("first", "later"), default="first", help="twin: the trained mention")
    parser.add_argument("--tokenizer_dir", default=None,
                        help="also save the tokenizer of the generated text here (every name one token)")
    parser.add_argument("--vocab_size", type=int, default=1300, help="--tokenizer_dir: vocabulary size")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    args = parser.parse_args(argv)
    if args.out is None and args.tokenizer_dir is None:
        parser.error("give --out (the data file), --tokenizer_dir, or both")
    try:
        if args.out is not None:
            records = generate_longrange_dataset(
                args.num_examples, args.seed, tuple(args.context_tokens), args.kind,
                min_gap_tokens=args.min_gap_tokens, fact_fraction=args.fact_fraction, max_chains=args.max_chains,
                split=args.split, max_gap_tokens=args.max_gap_tokens, num_facts=args.num_facts, names=args.names,
                placement=args.placement, target=args.target,
            )
            path = write_squad_file(records, args.out, overwrite=args.overwrite)
            print(f"{len(records)} {args.kind} records ({args.split}) written to {path}")
        if args.tokenizer_dir is not None:
            build_longrange_tokenizer(args.vocab_size, seed=args.seed, save_dir=args.tokenizer_dir)
            print(f"tokenizer saved to {args.tokenizer_dir}")
    except (OSError, ValueError) as error:
        print(f"{parser.prog}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
