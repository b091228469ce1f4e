"""The rewards on what a real model writes: SmolLM2-135M-Instruct's own answers, and generated prose after numbers.

A random model's outputs never look like a real one's: the base model answers arithmetic in prose ("15 is the only
positive integer that can be factored into 4 and"), which once made the math reward's unit-phrase pattern backtrack
forever in the calling process (issue 43). ``tests/fixtures/math/smollm2_answers.jsonl`` holds answers the real model
wrote in ``make learn``'s evaluations (before and after training: prose, restated problems, equations, bare numbers),
each with its gold and problem. Every one is scored three ways (the arithmetic task's reward; the math reward on the
answer boxed, with and without the problem), each within a CPU budget of the calling process (the part the worker
pool's hard timeout does not bound; :mod:`tests.cpu_budget`), and the verdicts must be the task's rules, not noise.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gapo.rewards import compute_score, compute_score_batch
from tests.cpu_budget import cpu_budget

# Every answer here is legitimate: the worker grades with room for a loaded machine (tests.math_pool_room; the default
# 3 s soft timeout fired on answer 69 in CI at f3832d1), while cpu_budget bounds what runs in the calling process.
pytestmark = pytest.mark.usefixtures("roomy_math_pool")

FIXTURE = Path(__file__).parent / "fixtures" / "math" / "smollm2_answers.jsonl"
ANSWERS = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
CPU_PER_ITEM_S = 2.0  # the calling process's share of one item; a few ms in practice
WORDS = ("is", "the", "only", "positive", "integer", "that", "can", "be", "factored", "into", "and", "cm", "units",
         "square", "per", "hour", "miles", "of", "sum", "answer", "\\text{", "}", "$", "=", "+", "^2", "/", "apples",
         "so", "we", "get", "total", "s", "m", "km", "degrees", "x", "\\,", ",", ".", "meters", "kg")


def prose_after_numbers(n: int = 200, seed: int = 0) -> list[str]:
    """``n`` answers of a number followed by 3-40 words, units and signs among them (what broke the reward)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 40))]
        out.append(f"{rng.randint(0, 999)} " + " ".join(words))
    return out


def _arithmetic_value(text: str):
    """The value of digits and + - * / (Python's grammar, numbers and operators only), or None if it is not one."""
    import ast
    import operator

    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(ast.dump(node))

    try:
        return value(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def test_the_fixture_is_real_model_text_of_every_kind():
    assert len(ANSWERS) >= 200
    responses = [a["response"] for a in ANSWERS]
    assert any(r.strip().isdigit() for r in responses)  # bare numbers
    assert any("=" in r for r in responses)  # equations
    assert sum(len(r.split()) > 5 for r in responses) >= 50  # prose
    assert {a["data_source"] for a in ANSWERS} >= {"gapo_arith_add1", "gapo_arith_add2"}


def test_every_real_answer_is_scored_within_budget_and_by_the_tasks_rules():
    paid = 0
    for item in ANSWERS:
        with cpu_budget(CPU_PER_ITEM_S):
            task = compute_score(item["data_source"], item["response"], item["ground_truth"],
                                 {"problem": item["problem"]})
            boxed = compute_score("math", f"\\boxed{{{item['response']}}}", item["ground_truth"],
                                  {"problem": item["problem"]})
            bare = compute_score("math", f"\\boxed{{{item['response']}}}", item["ground_truth"], {})
        assert not (task["timeout"] or boxed["timeout"] or bare["timeout"]), item
        # the task pays only the right number, or a true equation of arithmetic ending in it
        text = item["response"].strip()
        text = text[:-1].strip() if text.endswith(".") else text
        *sides, last = [side.strip() for side in text.split("=")]
        arithmetic = all(side and set(side) <= set("0123456789 +-*/()x.") for side in sides)
        if sides and arithmetic and last == item["ground_truth"]:
            values = {_arithmetic_value(side.replace("x", "*")) for side in sides}
            assert task["score"] == float(values == {int(last)}), (item, task)
        else:
            assert task["score"] == float(not sides and last == item["ground_truth"]), (item, task)
        # whatever the math reward pays, the task pays too when the text is short: the task only adds refusals
        if task["score"] == 1.0:
            assert boxed["score"] == 1.0, (item, boxed)
        paid += task["score"] == 1.0
    assert 0 < paid < len(ANSWERS)  # the fixture has right and wrong answers


@pytest.mark.parametrize("seed", [0, 1])
def test_prose_after_numbers_never_hangs_the_calling_process(seed):
    texts = prose_after_numbers(seed=seed)
    with cpu_budget(CPU_PER_ITEM_S * len(texts)):
        results = compute_score_batch(["math"] * len(texts), [f"\\boxed{{{t}}}" for t in texts],
                                      [t.split()[0] for t in texts], [None] * len(texts))
    assert len(results) == len(texts)
    # a number then words is not an answer, unless every word is a unit (the math reward reads 7 cm as 7)
    assert sum(r["score"] for r in results) < len(texts) / 4
    with cpu_budget(CPU_PER_ITEM_S * len(texts)):
        for t in texts:
            assert compute_score("gapo_arith_add2", t, t.split()[0], {})["score"] == 0.0
