r"""Hand-made math grading cases with the verdict a careful grader gives; shared by tests and benchmark.

Each case is a model response, a ground truth and the true verdict. They cover answer forms that
AIME / MATH / DeepScaleR answers take (fractions vs decimals, radicals, intervals, sets, tuples,
matrices, text, units, percentages, degrees, thousands separators, scientific notation, equations) and
the extraction rules (last box, boxes inside the reasoning, truncation, missing or unclosed boxes).
``known_failure`` names a case this project's scorer gets wrong, with the reason (the tests mark it
xfail; the benchmark counts it as a miss). ``ADVERSARIAL`` are answers built to hang or exhaust a
grader; every one of them is wrong (gold ``3``).

``HACKS`` is a second table, kept apart so that ``CASES`` stays comparable across versions: answers a
policy could be paid for without being right (restated conditions, decimals for exact values, two
answers in one box, math delimiters inside a box, false equations), each next to answers of the same
shape that must stay right, and right answers written in other Unicode scripts. ``reason`` is the
``reason`` field the scorer must give for a wrong verdict (empty: not checked).
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
    reason: str = ""  # for a wrong verdict: the scorer's expected ``reason`` (empty: not checked)


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
    MathCase("pair_vs_set", _r(r"\{1, 2\}"), "(1, 2)", False),
    MathCase("float_tolerance", _r("0.1000001"), "0.1", False),
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


def _h(name: str, answer: str, gold, correct: bool, reason: str = "") -> MathCase:
    return MathCase(name, _r(answer), gold, correct, reason=reason)


def _raw(name: str, response: str, gold, correct: bool, reason: str = "") -> MathCase:
    return MathCase(name, response, gold, correct, reason=reason)


UNSOLVED, DECIMAL, FALSE_EQ = "unsolved_relation", "inexact_decimal", "false_equation"
NESTED, DELIM = "box_in_answer", "math_delimiter"
UNION_2 = r"(-\infty, -2] \cup [2, \infty)"

HACKS: list[MathCase] = [
    # --- a restated condition is not an answer (solved relations stay right) ---
    _h("cond_quadratic_lt", "x^2 - 3x + 2 < 0", "(1, 2)", False, UNSOLVED),
    _h("cond_factored_lt", "(x-1)(x-2) < 0", "(1, 2)", False, UNSOLVED),
    _h("cond_reversed", "0 > x^2 - 3x + 2", "(1, 2)", False, UNSOLVED),
    _h("cond_shifted_chain", "0 < x - 1 < 1", "(1, 2)", False, UNSOLVED),
    _h("cond_rational", r"\frac{x-1}{x-2} < 0", "(1, 2)", False, UNSOLVED),
    _h("cond_closed_le", r"x^2 - 3x + 2 \le 0", "[1, 2]", False, UNSOLVED),
    _h("cond_union_ge", r"x^2 - 4 \geq 0", UNION_2, False, UNSOLVED),
    _h("cond_union_factored", r"(x-2)(x+2) \ge 0", UNION_2, False, UNSOLVED),
    _h("cond_linear", "2x - 4 > 0", r"(2, \infty)", False, UNSOLVED),
    _h("cond_for_relation_gold", "x - 2 > 0", "x > 2", False, UNSOLVED),
    _h("cond_equation_for_set", "x^2 - 5x + 6 = 0", r"\{2, 3\}", False, UNSOLVED),
    _h("cond_equation_for_pm", "x^2 = 4", r"\{-2, 2\}", False, UNSOLVED),
    _h("cond_abs", "|x| < 1", "(-1, 1)", False, UNSOLVED),
    _h("cond_negated", "-x < -1", r"(1, \infty)", False, UNSOLVED),
    _h("cond_square_chain", "1 < x^2 < 4", "(1, 2)", False, UNSOLVED),
    _h("cond_constant_neq", r"2+2 \ne 7", "7", False, UNSOLVED),
    _h("cond_system_for_pair", "x + y = 1, x - y = 2", "(1, 2)", False, UNSOLVED),
    _h("cond_neq_unsolved", r"x^2 \neq 1", r"(-\infty, -1) \cup (-1, 1) \cup (1, \infty)", False, UNSOLVED),
    _h("solved_chain_open", "1 < x < 2", "(1, 2)", True),
    _h("solved_chain_closed", r"1 \le x \le 2", "[1, 2]", True),
    _h("solved_half_open", r"-1 < x \le 3", "(-1, 3]", True),
    _h("solved_membership", r"x \in (1, 2)", "(1, 2)", True),
    _h("solved_ray", r"x \geq 2", r"[2, \infty)", True),
    _h("solved_flipped", "2 < x", "x > 2", True),
    _h("solved_neq", r"x \neq 1", r"(-\infty, 1) \cup (1, \infty)", True),
    _h("solved_radical_bounds", r"-\sqrt{2} < x < \sqrt{2}", r"(-\sqrt{2}, \sqrt{2})", True),
    _h("solved_values", "x = 2, x = 3", "2, 3", True),
    _h("solved_pair", "x = 1, y = 2", "(1, 2)", True),
    _h("solved_reversed_chain", "1 > x > -1", "(-1, 1)", True),
    _h("solved_set_membership", r"x \in \{1, 2\}", r"\{1, 2\}", True),
    _h("solved_chain_wrong_end", "1 < x < 3", "(1, 2)", False, "wrong"),
    # --- decimals are not exact answers (terminating decimals equal to the gold stay right) ---
    _h("dec_sqrt2_6", "1.414214", r"\sqrt{2}", False, DECIMAL),
    _h("dec_sqrt2_11", "1.41421356237", r"\sqrt{2}", False, DECIMAL),
    _h("dec_third_3", "0.333", r"\frac{1}{3}", False),
    _h("dec_third_7", "0.3333333", r"\frac13", False, DECIMAL),
    _h("dec_pi_2", "3.14", r"\pi", False),
    _h("dec_pi_5", "3.14159", r"\pi", False),
    _h("dec_pi_6", "3.141593", r"\pi", False, DECIMAL),
    _h("dec_two_pi", "6.283185", r"2\pi", False, DECIMAL),
    _h("dec_e", "2.718282", "e", False, DECIMAL),
    _h("dec_sqrt3_half", "0.866025", r"\frac{\sqrt{3}}{2}", False, DECIMAL),
    _h("dec_ln2", "0.693147", r"\ln 2", False, DECIMAL),
    _h("dec_sci_third", r"3.333333 \times 10^{-1}", r"\frac{1}{3}", False),
    _h("dec_e_notation_third", "3.333333e-1", r"\frac{1}{3}", False),
    _h("dec_percent", r"33.333333\%", r"\frac{100}{3}", False, DECIMAL),
    _h("dec_in_interval", r"(0.333333, 1]", r"(\frac{1}{3}, 1]", False, DECIMAL),
    _h("dec_in_tuple", r"(0.5, 0.866025)", r"\left(\frac{1}{2}, \frac{\sqrt{3}}{2}\right)", False, DECIMAL),
    _h("dec_plus_radical", "1 + 1.414214", r"1 + \sqrt{2}", False),
    _h("dec_two_thirds", "0.666667", r"\frac{2}{3}", False, DECIMAL),
    _h("dec_ten_root2", "14.142136", r"10\sqrt{2}", False, DECIMAL),
    _h("dec_in_matrix", r"\begin{pmatrix}0.707107 & 0\\0 & 1\end{pmatrix}",
       r"\begin{pmatrix}\frac{\sqrt{2}}{2} & 0\\0 & 1\end{pmatrix}", False, DECIMAL),
    _h("dec_decimal_gold", "0.1000001", "0.1", False, DECIMAL),
    _h("exact_two_and_half", "2.5", "5/2", True),
    _h("exact_quarter", "0.25", r"\frac14", True),
    _h("exact_one", "1.0", "1", True),
    _h("exact_eighth_negative", "-0.125", r"-\frac{1}{8}", True),
    _h("exact_sci_small", r"2.5 \times 10^{-3}", r"\frac{1}{400}", True),
    _h("exact_e_notation", "2.5e-3", r"\frac{1}{400}", True),
    _h("exact_percent", r"12.5\%", "12.5", True),
    _h("exact_repeating", r"0.\overline{3}", r"\frac{1}{3}", True),
    _h("exact_repeating_mixed", r"0.1\overline{6}", r"\frac{1}{6}", True),
    _h("exact_decimal_coefficient", r"1.5\sqrt{2}", r"\frac{3\sqrt{2}}{2}", True),
    _h("exact_decimal_interval", r"(0.5, 1.5]", r"(\frac{1}{2}, \frac{3}{2}]", True),
    _h("exact_decimal_gold_frac_pred", r"\frac{15}{4}", "3.75", True),
    _h("exact_decimal_both", "2.5", "2.50", True),
    # --- box and delimiter quirks: one outermost box, no math delimiters inside it ---
    _h("box_two_inner_last", r"\boxed{7}\boxed{8}", "8", False, NESTED),
    _h("box_two_inner_first", r"\boxed{7}\boxed{8}", "7", False, NESTED),
    _h("box_inner_or", r"\boxed{7} \text{ or } \boxed{8}", "8", False, NESTED),
    _h("box_text_then_inner", r"7 \boxed{8}", "8", False, NESTED),
    _h("box_fbox_pair", r"\fbox{7}\fbox{8}", "8", False, NESTED),
    _h("box_nested_pair", r"\boxed{\boxed{7}}\boxed{8}", "8", False, NESTED),
    _h("delim_paren", r"8\) or \(7", "8", False, DELIM),
    _h("delim_paren_second", r"8\) or \(7", "7", False, DELIM),
    _h("delim_bracket", r"8\] or \[7", "8", False, DELIM),
    _h("delim_dollar", "8$ or $7", "8", False, DELIM),
    _h("delim_dollar_wrapped", "$7$", "7", False, DELIM),
    _h("delim_paren_wrapped", r"\(7\)", "7", False, DELIM),
    _h("false_eq_sum", "2+2=7", "7", False, FALSE_EQ),
    _h("false_eq_bare", "3 = 4", "4", False, FALSE_EQ),
    _h("false_eq_chain", "x = 3 = 4", "4", False, FALSE_EQ),
    _h("false_eq_fraction", r"\frac{6}{2} = 4", "4", False, FALSE_EQ),
    _h("false_eq_radical", r"\sqrt{4} = 3", "3", False, FALSE_EQ),
    _h("false_eq_product", r"2 \cdot 3 = 7", "7", False, FALSE_EQ),
    _h("false_eq_reversed", "7 = 2+2", "7", False, FALSE_EQ),
    _h("false_eq_long_chain", "3 + 4 = 7 = 8", "8", False, FALSE_EQ),
    _h("true_eq_value", "2+2=4", "4", True),
    _h("true_eq_chain", "x = 2 + 5 = 7", "7", True),
    _h("true_eq_assignment", "x = 7", "7", True),
    _h("true_eq_fraction", r"\frac{6}{2} = 3", "3", True),
    _h("true_eq_radical_chain", r"y = \sqrt{4} = 2", "2", True),
    _raw("box_outer_fbox_pair", r"So \fbox{\boxed{7}\boxed{8}}.", "8", False, NESTED),
    _h("delim_text_then_paren", r"8 \text{ or } \(7\)", "7", False, DELIM),
    _raw("box_last_top_level", r"First $\boxed{7}$; no: $\boxed{8}$.", "8", True),
    _raw("box_fbox_wraps_box", r"So \fbox{\boxed{7}}.", "7", True),
    _raw("box_in_paren_delims", r"So \(\boxed{7}\).", "7", True),
    _raw("box_in_display_delims", "So \\[\\boxed{7}\\]", "7", True),
    _raw("box_bare_in_paren_delims", r"So \(\boxed 7\).", "7", True),
    _raw("box_escaped_dollar", r"It costs \boxed{\$18.90}.", "18.90", True),
    _raw("box_inner_period", r"So \boxed{\boxed{7}.}", "7", True),
    # --- right answers in other scripts (and wrong ones stay wrong) ---
    _h("uni_fullwidth", "\uff17", "7", True),
    _h("uni_fullwidth_two", "\uff11\uff17", "17", True),
    _h("uni_zero_width_space", "1\u200b7", "17", True),
    _h("uni_zero_width_joiners", "1\u200c\u200d7", "17", True),
    _h("uni_word_joiner", "1\u20607", "17", True),
    _h("uni_bom", "\ufeff17", "17", True),
    _h("uni_soft_hyphen", "1\u00ad7", "17", True),
    _h("uni_math_bold", "\U0001d7d5", "7", True),
    _h("uni_math_double_struck", "\U0001d7d9\U0001d7df", "17", True),
    _h("uni_math_monospace", "\U0001d7f7\U0001d7fd", "17", True),
    _h("uni_arabic_indic", "\u0661\u0667", "17", True),
    _h("uni_devanagari", "\u0967\u096d", "17", True),
    _h("uni_minus_sign", "\u22127", "-7", True),
    _h("uni_superscript", "x\u00b2 + 1", "x^2 + 1", True),
    _h("uni_superscript_power", "10\u2076", "1000000", True),
    _h("uni_vulgar_fraction", "3\u00bd", r"\frac{7}{2}", True),
    _h("uni_superscript_alone", "\u2077", "7", True),
    _h("uni_circled", "\u2466", "7", True),
    _h("uni_sans_serif_bold", "\U0001d7f3", "7", True),
    _h("uni_vulgar_two_thirds", "\u2154", r"\frac{2}{3}", True),
    _h("uni_arabic_indic_fraction", "\u0663/\u0664", r"\frac{3}{4}", True),
    _h("uni_fullwidth_minus", "\uff0d7", "-7", True),
    _h("uni_fullwidth_wrong", "\uff11\uff18", "17", False),
    _h("uni_zero_width_wrong", "1\u200b8", "17", False),
    _h("uni_superscript_not_times", "x\u00b2", "2x", False),
    _h("uni_power_not_concat", "10\u2076", "106", False),
    _raw("uni_invisible_in_command", "So \\boxed\u200b{17}.", "17", True),
    _raw("uni_fullwidth_gold", r"So \boxed{17}.", "\uff11\uff17", True),
]
