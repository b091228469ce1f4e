r"""Hand-made math grading cases with the verdict a careful grader gives; shared by tests and benchmark.

Each case is a model response, a ground truth and the true verdict. They cover answer forms that
AIME / MATH / DeepScaleR answers take (fractions vs decimals, radicals, intervals, sets, tuples,
matrices, text, units, percentages, degrees, thousands separators, scientific notation, equations) and
the extraction rules (last box, boxes inside the reasoning, truncation, missing or unclosed boxes).
``known_failure`` names a case this project's scorer gets wrong, with the reason (the tests mark it
xfail; the benchmark counts it as a miss). ``ADVERSARIAL`` are answers built to hang or exhaust a
grader; every one of them is wrong (gold ``3``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MathCase:
    name: str
    response: str
    gold: Any  # str, int or list of acceptable answers, as datasets store it
    correct: bool  # the verdict a careful grader gives
    require_think: bool = False
    known_failure: str = ""  # non-empty: this project's scorer disagrees, and why


def _r(answer: str) -> str:
    """A typical reasoning-model response ending in ``answer`` (thinking, then a short solution)."""
    return ("<think>\nLet me set up the problem. Try 2 + 2 = 4, then check the case n = 10.\n"
            "So the value should be what I found.\n</think>\n\nThe computation gives "
            f"$\\boxed{{{answer}}}$.")


PMAT = r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}"

CASES: list[MathCase] = [
    # --- numbers ---
    MathCase("int_exact", _r("42"), "42", True),
    MathCase("int_wrong", _r("41"), "42", False),
    MathCase("int_gold_as_int", _r("42"), 42, True),
    MathCase("frac_vs_decimal", _r("0.5"), r"\frac{1}{2}", True),
    MathCase("decimal_vs_frac", _r(r"\frac12"), "0.5", True),
    MathCase("repeating_decimal_cut", _r("0.333"), r"\frac{1}{3}", False),
    MathCase("dfrac", _r(r"\dfrac{3}{4}"), r"\frac{3}{4}", True),
    MathCase("tfrac_no_braces", _r(r"\tfrac34"), r"\frac{3}{4}", True),
    MathCase("slash_fraction", _r("3/4"), r"\frac34", True),
    MathCase("unreduced_fraction", _r(r"\frac{6}{8}"), r"\frac{3}{4}", True),
    MathCase("negative", _r("-7"), "-7", True),
    MathCase("sign_error", _r("7"), "-7", False),
    MathCase("minus_in_numerator", _r(r"\frac{-1}{2}"), r"-\frac{1}{2}", True),
    MathCase("trailing_zero", _r("2.50"), "2.5", True),
    MathCase("integer_as_float", _r("3.0"), "3", True),
    MathCase("thousands_commas", _r("1,000,000"), "1000000", True),
    MathCase("thousands_thin_space", _r(r"10\,000"), "10000", True),
    MathCase("thousands_braced_comma", _r("10{,}000"), "10000", True),
    MathCase("thousands_in_gold", _r("10000"), r"10,\!000", True),
    MathCase("off_by_one_million", _r("1000001"), "1000000", False),
    MathCase("big_int_exact", _r("123456789012"), "123456789012", True),
    MathCase("big_int_last_digit", _r("123456789013"), "123456789012", False),
    MathCase("sci_times", _r(r"1.5 \times 10^{6}"), "1500000", True),
    MathCase("sci_e_notation", _r("1.5e6"), "1500000", True),
    MathCase("mixed_number", _r(r"3\frac{1}{2}"), r"\frac{7}{2}", True),
    MathCase("dollar_amount", _r(r"\$18.90"), "18.90", True),
    MathCase("percent_in_pred", _r(r"25\%"), "25", True),
    MathCase("percent_in_gold", _r("25"), r"25\%", True),
    MathCase("degrees_circ", _r(r"30^\circ"), "30", True),
    MathCase("degree_sign", _r("45°"), "45", True),
    MathCase("unit_text", _r(r"12 \text{ cm}"), "12", True),
    MathCase("unit_area", _r(r"50\text{ m}^2"), "50", True),
    MathCase("unit_mbox", _r(r"5 \mbox{ hours}"), "5", True),
    MathCase("approx_of_radical", _r(r"\approx 1.414"), r"\sqrt{2}", False),
    # --- symbolic ---
    MathCase("radical_equivalent", _r(r"\sqrt{12}"), r"2\sqrt{3}", True),
    MathCase("radical_as_decimal", _r("3.464"), r"2\sqrt{3}", False),
    MathCase("pi_as_decimal", _r("6.28"), r"2\pi", False),
    MathCase("pi_slash", _r(r"\pi/2"), r"\frac{\pi}{2}", True),
    MathCase("rationalised", _r(r"\frac{1}{\sqrt{3}}"), r"\frac{\sqrt{3}}{3}", True),
    MathCase("sqrt_no_braces", _r(r"\sqrt2"), r"\sqrt{2}", True),
    MathCase("polynomial_factored", _r("(x+1)^2"), "x^2+2x+1", True),
    MathCase("polynomial_wrong", _r("(x-1)^2"), "x^2+2x+1", False),
    MathCase("complex_reordered", _r("4i+3"), "3+4i", True),
    MathCase("infinity", _r(r"\infty"), r"\infty", True),
    # --- intervals, sets, tuples, matrices, relations ---
    MathCase("interval", _r("(1,3]"), "(1, 3]", True),
    MathCase("interval_wrong_bracket", _r("[1,3]"), "(1, 3]", False),
    MathCase("interval_union", _r(r"(-\infty,0)\cup(1,+\infty)"), r"(-\infty, 0) \cup (1, \infty)", True),
    MathCase("set_reordered", _r(r"\{3,2,1\}"), r"\{1,2,3\}", True),
    MathCase("set_left_right", _r(r"\left\{1, 2\right\}"), r"\{1,2\}", True),
    MathCase("solutions_reordered", _r("-3, 2"), "2, -3", True),
    MathCase("solutions_one_missing", _r("2"), "2, -3", False),
    MathCase("tuple_reordered", _r("(2, 1)"), "(1, 2)", False),
    MathCase("tuple_left_right", _r(r"\left(1, 2\right)"), "(1, 2)", True),
    MathCase("matrix", _r(r"\begin{pmatrix}1&2\\3&4\end{pmatrix}"), PMAT, True),
    MathCase("matrix_entry_wrong", _r(r"\begin{pmatrix}1&2\\3&5\end{pmatrix}"), PMAT, False),
    MathCase("interval_for_inequality", _r(r"(2, \infty)"), "x > 2", True),
    MathCase("equation_for_value", _r("x = 3"), "3", True),
    MathCase("equation_wrong_value", _r("x = 4"), "3", False),
    MathCase("relation_for_interval", _r(r"k \geq 2"), r"[2, \infty)", True),
    MathCase("line_rearranged", _r("2x - y + 1 = 0"), "y = 2x + 1", True),
    MathCase("plus_minus", _r(r"\pm 2"), "2, -2", True),
    MathCase("factorial_value", _r("5!"), "120", True),
    MathCase("empty_set_forms", _r(r"\varnothing"), r"\emptyset", True),
    MathCase("hedged_or", _r(r"3 \text{ or } 4"), "3", False),
    MathCase("hedged_list", _r("3, 4, 5"), "3", False),
    MathCase("pair_vs_set", _r(r"\{1, 2\}"), "(1, 2)", False,
             known_failure="math-verify matches a set against the gold's tuple/interval (order is lost)"),
    MathCase("float_tolerance", _r("0.1000001"), "0.1", False,
             known_failure="math-verify rounds floats to 6 decimals before comparing"),
    MathCase("sqrt_minus_one", _r(r"\sqrt{-1}"), "i", True,
             known_failure="math-verify reads a bare gold 'i' as a symbol, not the imaginary unit"),
    # --- text answers ---
    MathCase("text_answer", _r(r"\text{Monday}"), r"\text{Monday}", True),
    MathCase("text_wrong", _r(r"\text{Tuesday}"), r"\text{Monday}", False),
    MathCase("choice_parenthesised", _r("(C)"), "C", True),
    MathCase("choice_wrong", _r("D"), "C", False),
    MathCase("number_in_text", _r(r"\text{3}"), "3", True),
    MathCase("answer_inside_sentence", _r(r"\text{The answer is } 7"), "7", True),
    # --- extraction: which box counts ---
    MathCase("last_box_counts_right", r"First guess $\boxed{5}$. Wait, recheck: it is $\boxed{3}$.", "3", True),
    MathCase("last_box_counts_wrong", r"So $\boxed{3}$. Actually no, $\boxed{5}$.", "3", False),
    MathCase("box_only_in_thinking", "<think>so \\boxed{3}</think>\nThe answer is 3.", "3", False),
    MathCase("thinking_box_wrong_final_right", "<think>maybe \\boxed{5}</think>\nSo \\boxed{3}.", "3", True),
    MathCase("thinking_box_right_final_wrong", "<think>maybe \\boxed{3}</think>\nSo \\boxed{5}.", "3", False),
    MathCase("no_box", "The answer is 3.", "3", False),
    MathCase("truncated_thinking", "<think>\nLet me see... \\boxed{3} is likely, but", "3", False),
    MathCase("closing_tag_only", "Let me see...\n</think>\nSo \\boxed{3}.", "3", True),
    MathCase("require_think_no_tag", "Let me see... so \\boxed{3} is likely, but", "3", False, require_think=True),
    MathCase("reopened_thinking", "<think>a</think> So <think> hmm \\boxed{3}", "3", False),
    MathCase("nested_braces", _r(r"\frac{\sqrt{2}}{2}"), r"\frac{\sqrt2}{2}", True),
    MathCase("fbox", r"Hence \fbox{7}.", "7", True),
    MathCase("boxed_without_braces", r"Hence $\boxed 7$.", "7", True),
    MathCase("double_boxed", r"Hence $\boxed{\boxed{7}}$.", "7", True),
    MathCase("last_box_unclosed", r"So $\boxed{7}$, no wait: $\boxed{8", "7", False),
    MathCase("empty_box", r"So $\boxed{}$.", "7", False),
    MathCase("period_inside_box", r"So $\boxed{7.}$", "7", True),
    MathCase("gold_boxed", _r("7"), r"\boxed{7}", True),
    MathCase("gold_list_any", _r(r"\frac{1}{2}"), ["0.5", "1/2"], True),
    MathCase("long_reasoning_numbers", "Check 12, 13 and 14. " * 200 + r"Final: $\boxed{14}$.", "14", True),
]

# Answers built to hang or exhaust a grader: power towers, giant factorials, deep nesting, huge
# strings. Gold "3" for all, so every one must score 0 (and return within the test's time bound).
ADVERSARIAL: dict[str, str] = {
    "power_tower_braces": r"\boxed{9^{9^{9^{9}}}}",
    "power_tower_flat": r"\boxed{9^9^9^9}",
    "power_tower_2": r"\boxed{2^{2^{2^{2^{2^{2}}}}}}",
    "power_memory": r"\boxed{2^{2^{100}}}",
    "factorial_million": r"\boxed{(10^6)!}",
    "factorial_of_power": r"\boxed{(10^{10})!}",
    "parentheses_3000": r"\boxed{" + "(" * 3000 + "1" + ")" * 3000 + "}",
    "parentheses_40": r"\boxed{" + "(" * 40 + "1" + ")" * 40 + "}",
    "braces_30": r"\boxed{" + "{" * 30 + "1" + "}" * 30 + "}",
    "huge_answer": r"\boxed{" + "1+" * 200_000 + "1}",
    "huge_response_no_box": "9" * 2_000_000,
    "many_boxes": r"\boxed{1}" * 100_000,
}
