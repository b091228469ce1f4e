"""A response's first move (its entrance) and how diverse a group's entrances are (pure python, no torch).

The first move of a response is its first ``m`` response tokens (``m`` = ``entrance_tokens``), or, with
``until_newline``, its tokens up to and including the first token whose text holds a newline, at most ``m`` of
them (those ids: `newline_token_ids` of the run's tokenizer). A response shorter than that is its own first move (an empty response has the empty move ``()``).

For one group (the rollouts of one prompt, or the n samples of one evaluation problem) of size k with c
successes:

    distinct_frac          = (number of distinct first moves) / k                       in [1/k, 1]
    unique_success_frac    = (successes whose first move no other member took) / c      (c >= 1 only)

``distinct_frac`` is breadth at the entrance (1: every rollout opened differently; 1/k: all opened alike).
``unique_success_frac`` asks whether the group's successes came through entrances only they found (the rare
openings a fixed clip would suppress) or through the common one.

The evaluator also splits pass@k at the entrance (`majority_entrance`): over all n samples vs over the samples
that share the problem's most common first move. The gap is the breadth that lives in the other entrances.

Used by the trainers through `gapo.exploration` (tensors to moves, sums over a step) and by the evaluator
(`eval.records`, `eval.report`), so training-time and offline numbers are the same computation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Hashable, Sequence
from typing import NamedTuple

# m's default. A reasoning response's first 8 tokens are about one clause (5-6 English words): long enough that
# the opening's choice (restate, set up an equation, try a case, write code) differs between rollouts that differ
# in approach, short enough that sampling noise further down has not yet made every rollout distinct, which would
# pin distinct_frac at 1 whatever the policy does (docs/metrics.md, "choosing m").
DEFAULT_ENTRANCE_TOKENS = 8

Move = tuple  # a first move: a tuple of token ids


def first_move(token_ids: Sequence[int], m: int, newline_ids: Container[int] | None = None) -> Move:
    """The first move of one response.

    Args:
        token_ids: the response's token ids (real tokens only, in order; at least its first m).
        m: at most this many tokens (>= 1).
        newline_ids: with "until newline": the ids whose decoded text holds a newline; the move ends after the
            first of them. None: exactly the first m tokens.

    Returns:
        A tuple of at most m token ids (fewer for a shorter response, or a newline before m).
    """
    head = [int(t) for t in token_ids[:m]]
    if newline_ids is not None:
        for i, token in enumerate(head):
            if token in newline_ids:
                return tuple(head[: i + 1])
    return tuple(head)


class GroupEntrances(NamedTuple):
    """One group's entrance counts: its size k, distinct first moves, successes c, and the successes whose first
    move no other member of the group took."""

    size: int
    distinct: int
    successes: int
    unique_successes: int

    @property
    def distinct_frac(self) -> float:
        """Distinct first moves / group size."""
        return self.distinct / self.size

    @property
    def unique_success_frac(self) -> float | None:
        """Successes with a first move of their own / successes; None without successes."""
        return self.unique_successes / self.successes if self.successes else None


def group_entrances(moves: Sequence[Hashable], success: Sequence[bool]) -> GroupEntrances:
    """Entrance counts of one group from its members' first moves and success flags (same order).

    Raises:
        ValueError: an empty group, or moves and flags of different lengths.
    """
    if len(moves) != len(success):
        raise ValueError(f"{len(moves)} first moves for {len(success)} success flags")
    if not moves:
        raise ValueError("a group needs at least one member")
    counts = Counter(moves)
    ok = [bool(s) for s in success]
    return GroupEntrances(
        size=len(moves),
        distinct=len(counts),
        successes=sum(ok),
        unique_successes=sum(1 for move, s in zip(moves, ok) if s and counts[move] == 1),
    )


def majority_entrance(moves: Sequence[Hashable]) -> list[int]:
    """Indices of the samples that share the most common first move.

    Ties between equally common moves go to the move that appears first in sample order (never to the one with
    more successes: the split must not look at correctness).
    """
    if not moves:
        return []
    counts = Counter(moves)
    top = max(counts.values())
    chosen = next(move for move in moves if counts[move] == top)
    return [i for i, move in enumerate(moves) if move == chosen]


_NEWLINE_IDS: dict[tuple, frozenset[int]] = {}  # newline_token_ids's cache: (tokenizer name, vocab size) -> ids


def newline_token_ids(tokenizer) -> frozenset[int]:
    """The token ids whose decoded text holds a newline (``first_move``'s ``newline_ids`` for "until newline").

    Every id of the vocabulary (added tokens included) is decoded once, in one ``batch_decode`` call (about a second
    for a 150k vocabulary), and the set is cached per (tokenizer name, vocabulary size) for the process.
    """
    size = len(tokenizer)
    key = (getattr(tokenizer, "name_or_path", None) or id(tokenizer), size)
    if key not in _NEWLINE_IDS:
        texts = tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False)
        _NEWLINE_IDS[key] = frozenset(i for i, text in enumerate(texts) if "\n" in text)
    return _NEWLINE_IDS[key]
