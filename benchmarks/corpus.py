"""Deterministic, realistic-looking English sentences for benchmarks.

Sentences are built from a small grammar over a fixed vocabulary of common words (so a
WordPiece tokenizer splits them like ordinary prose), with a seeded RNG: the same seed always
gives the same sentences, on any machine and Python version (``random.Random`` with an
integer seed is stable across versions for ``randint``/``choice``).
"""

from __future__ import annotations

import random

DETERMINERS = ("the", "a", "every", "this", "that", "one", "another", "our", "their", "some")
ADJECTIVES = (
    "small", "large", "quiet", "busy", "old", "new", "bright", "careful", "local", "remote",
    "simple", "complex", "early", "late", "public", "private", "strong", "gentle", "rapid",
    "steady", "hidden", "open", "modern", "ancient", "shared", "single", "red", "green",
    "northern", "coastal", "digital", "patient", "curious", "heavy", "light", "warm", "cold",
)
NOUNS = (
    "server", "village", "teacher", "river", "report", "engineer", "garden", "network",
    "student", "market", "doctor", "window", "bridge", "library", "company", "painter",
    "question", "mountain", "kitchen", "contract", "museum", "farmer", "station", "letter",
    "request", "customer", "harbour", "forest", "meeting", "journalist", "machine", "child",
    "budget", "council", "hospital", "airport", "recipe", "storm", "orchestra", "database",
    "neighbour", "festival", "lawyer", "bicycle", "experiment", "manager", "schedule", "queue",
)
VERBS = (
    "found", "built", "opened", "watched", "described", "repaired", "visited", "followed",
    "changed", "moved", "reviewed", "answered", "carried", "measured", "painted", "closed",
    "explained", "protected", "delivered", "checked", "replaced", "studied", "ignored",
    "welcomed", "cleaned", "planned", "launched", "shared", "tested", "recorded",
)
PREPOSITIONS = ("near", "behind", "under", "across", "beside", "inside", "after", "before",
                "during", "around", "without", "through", "along", "above")
ADVERBS = ("quickly", "slowly", "again", "carefully", "finally", "yesterday", "often",
           "quietly", "suddenly", "eventually", "together", "early")
JOINERS = ("and", "but", "because", "while", "so", "although", "when", "after", "since")


def _noun_phrase(rng: random.Random) -> list[str]:
    words = [rng.choice(DETERMINERS)]
    if rng.random() < 0.6:
        words.append(rng.choice(ADJECTIVES))
    words.append(rng.choice(NOUNS))
    return words


def _clause(rng: random.Random) -> list[str]:
    words = [*_noun_phrase(rng), rng.choice(VERBS), *_noun_phrase(rng)]
    if rng.random() < 0.5:
        words += [rng.choice(PREPOSITIONS), *_noun_phrase(rng)]
    if rng.random() < 0.3:
        words.append(rng.choice(ADVERBS))
    return words


def sentence(rng: random.Random, n_words: int) -> str:
    """One sentence of exactly ``n_words`` words: clauses joined by conjunctions, with
    commas and a final full stop, like ordinary prose."""
    words = _clause(rng)
    while len(words) < n_words:
        words += [rng.choice(JOINERS), *_clause(rng)]
    words = words[:n_words]
    if words[-1] in JOINERS or words[-1] in PREPOSITIONS or words[-1] in DETERMINERS:
        words[-1] = rng.choice(NOUNS)
    text = " ".join(words)
    for joiner in ("but", "although", "while", "so"):
        text = text.replace(f" {joiner} ", f", {joiner} ")
    return text[0].upper() + text[1:] + "."


def sentences(count: int, *, seed: int = 0, min_words: int = 12,
              max_words: int = 40) -> list[str]:
    """``count`` sentences whose lengths are uniform in ``[min_words, max_words]`` words."""
    if count < 0 or not 1 <= min_words <= max_words:
        raise ValueError(f"bad corpus request: {count=} {min_words=} {max_words=}")
    rng = random.Random(seed)
    return [sentence(rng, rng.randint(min_words, max_words)) for _ in range(count)]
