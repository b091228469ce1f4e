r"""LaTeX an answer may hold that math-verify misreads: formatting to strip, operators and relations to screen.

Three jobs, all before math-verify sees the answer (:mod:`gapo.rewards.math.answer` calls them):

- :func:`unicode_math` writes Unicode math as the LaTeX it stands for (``√2`` -> ``\sqrt{2}``, ``π`` -> ``\pi``,
  ``≥`` -> ``\geq``, ``°`` -> ``^{\circ}``), so the screens below and the whitelist of
  :mod:`gapo.rewards.math.understood` see macros;
- :func:`strip_formatting` removes what changes how an answer looks, not what it says: colour
  (``\textcolor{red}{7}``, ``\color{red}``, ``\colorbox``, ``\fcolorbox``), weight and style (``\bm``,
  ``\boldsymbol``, ``\textbf``, ``\textsf``, ``\texttt``, ``\mathsf``, ...), emphasis and underline
  (``\emph``, ``\underline``, ``\uline``), size and style declarations (``\large``, ``\bf``,
  ``\displaystyle``, ``\big``), and spacing (``\hspace{1em}``, ``\quad``, ``\phantom{0}``: invisible). Nested
  wrappers are unwrapped to a fixed point: ``\textcolor{red}{\underline{\frac{1}{2}}}`` is ``\frac{1}{2}``. math-verify
  reads ``\mathbf{7}`` but scores ``\textcolor{red}{7}`` or ``\bm{7}`` as nothing.
- :func:`operator_error` decides, per macro, what a relation or operator math-verify does not evaluate may
  be: math-verify reads ``7 \mid 8`` as 8, ``\geq 7`` as 7, ``\ne 7`` as 7, ``15 \bmod 8`` as 8. Per macro:

  * evaluated where it has a value: ``a \bmod n``, ``a \mod n``, ``a \pmod{n}`` and a solved congruence
    ``x \equiv a \pmod{n}`` with integer literals are their residue (``15 \bmod 8`` is 7);
  * refused where it is a statement or a value-less operator: divisibility, congruence, parallel,
    similarity, subset, implication, logic, the circled and starred operators, ... (``UNKNOWN_OPERATOR``,
    reason ``unknown_operator``), unless a gold answer holds the same macro (then the gold asks for that
    kind of statement, and math-verify compares them as before);
  * a relation with no side, ``\geq 7`` or ``7 <``, is refused (``sideless_relation``): "at least 7" is not
    7, as ``x \geq 7`` is not. ``= 7`` is 7 (it says the value), as ``x = 7`` is;
  * a negation with no left side, ``\ne 7``, ``\not 7``, ``\neg 7``, is refused (``negated``); with a left
    side (``x \neq 1``) the worker's relation rules apply, as before.

  Membership ``\in`` is a value only with a variable on its left (``x \in (1, 2)``; ``7 \in 8`` is read as 8).
  Set operators ``\cup \cap \setminus`` are left to the worker, which refuses them when the parse is not a
  set (``7 \cup 8`` read as 8); ``^\circ`` is a degree sign, any other ``\circ`` a composition.
"""

from __future__ import annotations

import re

# ---- formatting ----

# name -> number of leading arguments dropped; the next argument is kept (the wrapped content)
WRAPPERS = {
    **dict.fromkeys(("textbf", "textit", "textsl", "textsf", "texttt", "textup", "textmd", "emph", "underline",
                     "uline", "uuline", "uwave", "bm", "boldsymbol", "pmb", "mathbf", "mathit", "mathsf", "mathtt",
                     "mathnormal", "hbox"), 0),
    "textcolor": 1, "colorbox": 1, "fcolorbox": 2,
}
# removed with their one argument: a declaration's value, or invisible content
DROPPED_WITH_ARGUMENT = ("color", "hspace", "vspace", "phantom", "hphantom", "vphantom")
# declarations without an argument
DECLARATIONS = ("bf", "it", "rm", "sf", "tt", "sl", "em", "bfseries", "itshape", "mdseries", "upshape", "normalfont",
                "tiny", "scriptsize", "footnotesize", "small", "normalsize", "large", "Large", "LARGE", "huge",
                "Huge", "displaystyle", "textstyle", "scriptstyle", "scriptscriptstyle",
                # delimiter sizes and spacing: ``\big(1, 2\big)`` is (1, 2); ``7 \quad 8`` is two numbers (screened)
                "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "biggl", "biggr", "Biggl", "Biggr",
                "limits", "nolimits", "quad", "qquad", "enspace", "enskip", "thinspace", "medspace", "thickspace")
_BRACE_OR_ESCAPE = re.compile(r"[{}\\]")
_MACRO = re.compile(r"\\([A-Za-z]+)\*?(?![A-Za-z])")
_OPTIONAL = re.compile(r"\s*\[[^\]]*\]")  # \textcolor[rgb]{...}{...}
_PLAIN = re.compile(r"^\s*[0-9A-Za-z.]+\s*$")


def match_braces(text: str, open_pos: int) -> int | None:
    """Index just past the ``}`` closing the ``{`` at ``open_pos``; ``None`` if it never closes."""
    depth = 0
    pos = open_pos
    while True:
        m = _BRACE_OR_ESCAPE.search(text, pos)
        if m is None:
            return None
        if m.group() == "\\":
            pos = m.end() + 1  # skip the escaped character: \{ \} \\ do not count
            continue
        depth += 1 if m.group() == "{" else -1
        pos = m.end()
        if depth == 0:
            return pos


def _argument(text: str, pos: int) -> tuple[str, int] | None:
    """(content, end) of the TeX argument at ``pos`` (spaces skipped): a braced group or one character."""
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    if pos >= len(text):
        return None
    if text[pos] != "{":
        if text[pos] == "\\":
            m = _MACRO.match(text, pos)
            return (m.group(), m.end()) if m else (text[pos:pos + 2], pos + 2)
        return text[pos], pos + 1
    end = match_braces(text, pos)
    return None if end is None else (text[pos + 1:end - 1], end)  # unclosed: None, left as it is


def _strip_once(text: str) -> str:
    out, pos = [], 0
    for m in _MACRO.finditer(text):
        if m.start() < pos:
            continue
        name = m.group(1)
        if m.start() > 0 and text[m.start() - 1] == "\\":  # ``\\bf`` is a line break then "bf"
            continue
        if name in WRAPPERS:
            end = m.end()
            opt = _OPTIONAL.match(text, end)
            if opt and name in ("textcolor", "colorbox", "fcolorbox"):
                end = opt.end()
            args = []
            for _ in range(WRAPPERS[name] + 1):
                arg = _argument(text, end)
                if arg is None:
                    break
                args.append(arg[0])
                end = arg[1]
            if len(args) != WRAPPERS[name] + 1:
                continue
            # a braced group keeps the content's own grouping (``2^\textbf{12}`` is 2^{12}), except for a plain
            # run of digits or letters not under ^ or _ (``\textbf{1}\textbf{7}`` is 17, not {1}{7})
            before = text[pos:m.start()]
            keep = not _PLAIN.match(args[-1]) or before.rstrip().endswith(("^", "_"))
            out += [before, "{" if keep else "", args[-1], "}" if keep else ""]
            pos = end
        elif name in DROPPED_WITH_ARGUMENT:
            end = m.end()
            opt = _OPTIONAL.match(text, end)
            if opt and name == "color":
                end = opt.end()
            arg = _argument(text, end)
            if arg is None:
                continue
            out += [text[pos:m.start()], " "]
            pos = arg[1]
        elif name in DECLARATIONS:
            out += [text[pos:m.start()], " "]
            pos = m.end()
    out.append(text[pos:])
    return "".join(out)


# Unicode relation and operator signs (NFKC keeps them) as the macros the screen below knows
UNICODE_OPERATORS = {
    "\u2265": "\\geq ", "\u2264": "\\leq ", "\u2260": "\\neq ", "\u2248": "\\approx ", "\u2223": "\\mid ",
    "\u2224": "\\nmid ", "\u2225": "\\parallel ", "\u2226": "\\nparallel ", "\u22a5": "\\perp ", "\u2192": "\\to ",
    "\u21d2": "\\Rightarrow ", "\u27f9": "\\implies ", "\u21d4": "\\iff ", "\u27fa": "\\iff ", "\u2194": "\\leftrightarrow ",
    "\u2227": "\\wedge ", "\u2228": "\\vee ", "\u00ac": "\\neg ", "\u2295": "\\oplus ", "\u2297": "\\otimes ",
    "\u2218": "\\circ ", "\u2217": "\\ast ", "\u22c6": "\\star ", "\u2261": "\\equiv ", "\u2262": "\\not\\equiv ",
    "\u2245": "\\cong ", "\u223c": "\\sim ", "\u2241": "\\nsim ", "\u2243": "\\simeq ", "\u221d": "\\propto ",
    "\u226a": "\\ll ", "\u226b": "\\gg ", "\u227a": "\\prec ", "\u227b": "\\succ ", "\u2282": "\\subset ",
    "\u2286": "\\subseteq ", "\u2283": "\\supset ", "\u2287": "\\supseteq ", "\u2284": "\\not\\subset ",
    "\u2288": "\\nsubseteq ", "\u2208": "\\in ", "\u2209": "\\notin ", "\u220b": "\\ni ", "\u220c": "\\not\\ni ",
    "\u222a": "\\cup ", "\u2229": "\\cap ", "\u2216": "\\setminus ", "\u226e": "\\nless ", "\u226f": "\\ngtr ",
    "\u2270": "\\nleq ", "\u2271": "\\ngeq ", "\u22a2": "\\vdash ", "\u2234": "\\therefore ", "\u2235": "\\because ",
    "\u21a6": "\\mapsto ", "\u2250": "\\doteq ", "\u225c": "\\triangleq ", "\u2272": "\\lesssim ", "\u2273": "\\gtrsim ",
    "\u2276": "\\lessgtr ", "\u2277": "\\gtrless ", "\u00d7": "\\times ", "\u00f7": "\\div ", "\u00b7": "\\cdot ",
    "\u22c5": "\\cdot ", "\u00b1": "\\pm ", "\u2213": "\\mp ", "\u221e": "\\infty ",
}
# Unicode values as their macros: pi and the Greek letters latex2sympy knows, big operators, the empty set, angles
_GREEK_CODES = {"alpha": 0x3B1, "beta": 0x3B2, "gamma": 0x3B3, "delta": 0x3B4, "epsilon": 0x3B5, "zeta": 0x3B6,
                "eta": 0x3B7, "theta": 0x3B8, "iota": 0x3B9, "kappa": 0x3BA, "lambda": 0x3BB, "mu": 0x3BC, "nu": 0x3BD,
                "xi": 0x3BE, "omicron": 0x3BF, "pi": 0x3C0, "rho": 0x3C1, "varsigma": 0x3C2, "sigma": 0x3C3,
                "tau": 0x3C4, "upsilon": 0x3C5, "phi": 0x3C6, "chi": 0x3C7, "psi": 0x3C8, "omega": 0x3C9,
                "Gamma": 0x393, "Delta": 0x394, "Theta": 0x398, "Lambda": 0x39B, "Xi": 0x39E, "Pi": 0x3A0,
                "Sigma": 0x3A3, "Upsilon": 0x3A5, "Phi": 0x3A6, "Psi": 0x3A8, "Omega": 0x3A9, "vartheta": 0x3D1,
                "varphi": 0x3D5, "varpi": 0x3D6, "varrho": 0x3F1, "varepsilon": 0x3F5}
UNICODE_OPERATORS.update({chr(code): f"\\{name} " for name, code in _GREEK_CODES.items()})
UNICODE_OPERATORS.update({"\u2211": "\\sum ", "\u220f": "\\prod ", "\u222b": "\\int ", "\u2205": "\\emptyset ",
                          "\u2220": "\\angle ", "\u25b3": "\\triangle ", "\u2206": "\\Delta ", "\u2126": "\\Omega "})
_UNICODE_OPERATOR = re.compile("[" + "".join(UNICODE_OPERATORS) + "]")
# √2, ∛(x+1), 2√3: the radical's argument is braced (``\\sqrt12`` would be math-verify's \\sqrt{1}2)
_RADICALS = {"\u221a": "\\sqrt", "\u221b": "\\sqrt[3]", "\u221c": "\\sqrt[4]"}
_RADICAL = re.compile("[" + "".join(_RADICALS) + "]")
_RADICAL_ARGUMENT = re.compile(r"\s*(\d+(?:\.\d+)?|[A-Za-z]|\\[A-Za-z]+)")
_OTHER_SIGNS = {"\u00b0": "^{\\circ}", "\u2032": "'", "\u2033": "''"}  # degree, prime, double prime


def _radical(text: str, pos: int) -> tuple[str, int]:
    """(LaTeX of the radical at ``pos``, end): its argument a braced or parenthesised group, a number, a letter."""
    macro, start = _RADICALS[text[pos]], pos + 1
    while start < len(text) and text[start] == " ":
        start += 1
    if start < len(text) and text[start] in "({":
        close, depth = {"(": ")", "{": "}"}[text[start]], 0
        for end in range(start, len(text)):
            depth += {text[start]: 1, close: -1}.get(text[end], 0)
            if depth == 0:
                return f"{macro}{{{text[start + 1:end]}}}", end + 1
    m = _RADICAL_ARGUMENT.match(text, pos + 1)
    return (f"{macro}{{{m.group(1)}}}", m.end()) if m else (macro + " ", pos + 1)


def unicode_operators(text: str) -> str:
    """``≥ 7`` -> ``\\geq 7``: each sign of ``UNICODE_OPERATORS`` as its macro (what it means, screened below)."""
    return _UNICODE_OPERATOR.sub(lambda m: UNICODE_OPERATORS[m.group()], text) if not text.isascii() else text


def unicode_math(text: str) -> str:
    """Unicode math as LaTeX, before anything parses it: the signs and values of ``UNICODE_OPERATORS`` as macros,
    radicals with their argument braced (``√2`` -> ``\\sqrt{2}``, ``∛(x+1)`` -> ``\\sqrt[3]{x+1}``), a degree sign
    as ``^{\\circ}``, primes as ``'``. Whatever non-ASCII is left is not understood
    (:mod:`gapo.rewards.math.understood`)."""
    if text.isascii():
        return text
    for sign, rep in _OTHER_SIGNS.items():
        text = text.replace(sign, rep)
    text = text.replace("^^", "^")  # ``45^°``
    pos = 0
    while m := _RADICAL.search(text, pos):
        pos = m.start()
        rep, end = _radical(text, pos)
        text = text[:pos] + rep + text[end:]
        pos += len(rep)
    return unicode_operators(text)


def strip_formatting(text: str) -> str:
    """``text`` without colour, weight, emphasis, underline, size and spacing macros (see the module docstring);
    wrappers nested in each other are all unwrapped. A group ``{...}`` left around a number is dropped."""
    if "\\" not in text:
        return text
    for _ in range(32):  # each pass unwraps one level; 32 is far beyond any answer under the length cap
        stripped = _strip_once(text)
        if stripped == text:
            break
        text = stripped
    text = _unbrace(text)
    return text.strip()


def _unbrace(text: str) -> str:
    """``{7}`` -> ``7`` and ``{\\frac{1}{2}}`` -> ``\\frac{1}{2}`` when the whole answer is one braced group."""
    while text.strip().startswith("{"):
        t = text.strip()
        arg = _argument(t, 0)
        if arg is None or arg[1] != len(t):
            break
        text = arg[0]
    return text


# ---- operators and relations ----

SIDELESS, NEGATED, UNKNOWN = "sideless_relation", "negated", "unknown_operator"
RELATIONS = ("<", ">", "\\lt", "\\gt", "\\le", "\\leq", "\\ge", "\\geq", "\\leqslant", "\\geqslant", "\\ne", "\\neq",
             "\\approx", "\\sim", "\\simeq", "\\cong", "\\equiv", "\\propto", "\\ll", "\\gg", "\\prec", "\\succ",
             "\\preceq", "\\succeq", "\\subset", "\\subseteq", "\\subsetneq", "\\supset", "\\supseteq", "\\supsetneq",
             "\\in", "\\ni", "\\notin", "\\mid", "\\nmid", "\\to", "\\rightarrow", "\\Rightarrow", "\\implies",
             "\\iff", "\\Leftrightarrow", "\\leftrightarrow", "\\mapsto", "\\perp", "\\parallel", "\\doteq",
             "\\nless", "\\ngtr", "\\nleq", "\\ngeq", "\\lesssim", "\\gtrsim", "\\lessgtr", "\\gtrless",
             "\\triangleq", "\\asymp", "\\nsim", "\\ncong", "\\nparallel", "\\nsubseteq", "\\nsupseteq")
NEGATIONS = ("\\ne", "\\neq", "\\not", "\\neg", "\\lnot", "\\nmid", "\\notin", "\\nless", "\\ngtr", "\\nleq",
             "\\ngeq", "\\nsim", "\\ncong", "\\nparallel", "\\nsubseteq", "\\nsupseteq")
# statements and value-less operators: never a value; refused unless a gold holds the macro
UNKNOWN_OPERATOR = frozenset((
    "mid", "nmid", "divides", "equiv", "not", "neg", "lnot", "perp", "parallel", "nparallel", "cong", "ncong", "simeq",
    "sim", "nsim", "approx", "propto", "doteq", "ll", "gg", "prec", "succ", "preceq", "succeq", "subset", "subseteq",
    "subsetneq", "supset", "supseteq", "supsetneq", "nsubseteq", "nsupseteq", "sqsubset", "sqsupset", "ni", "owns",
    "to", "rightarrow", "longrightarrow", "Rightarrow", "Longrightarrow", "implies", "impliedby", "iff",
    "Leftrightarrow", "leftrightarrow", "Longleftrightarrow", "mapsto", "gets", "leftarrow", "Leftarrow", "wedge",
    "vee", "land", "lor", "oplus", "otimes", "ominus", "odot", "oslash", "bullet", "ast", "star", "circledast",
    "diamond", "backslash", "colon", "vdots", "wr", "amalg", "sqcup", "sqcap", "uplus", "vdash", "models",
    "therefore", "because", "bmod", "mod", "pmod", "pod", "lesssim", "gtrsim", "nless", "ngtr", "nleq", "ngeq",
    "circ", "lessgtr", "gtrless", "triangleq", "asymp", "bowtie", "vDash", "Vdash", "rightleftharpoons",
    "leftrightarrows", "eqsim", "backsim", "circeq", "eqcirc", "sqsubseteq", "sqsupseteq", "notin",
))
_INFIX_FUNCTIONS = ("gcd", "lcm")  # ``\gcd(7, 8)`` is a value; ``7 \gcd 8`` is not
_TEXT_ARG = re.compile(r"\\(?:text|operatorname|mathrm)\s*\{[^{}]*\}")
_INT = r"(-?\d+)"
_MOD_ARG = r"\s*(?:\{\s*(\d+)\s*\}|(\d+))"
_MOD_WORD = r"(?:\\(?:bmod|mod)(?![A-Za-z])|\\(?:text|mathrm|operatorname)\s*\{\s*mod\s*\})"
_RESIDUE = re.compile(rf"^{_INT}\s*(?:\\[ ,;]\s*)*(?:\\left)?\(?\s*{_MOD_WORD}{_MOD_ARG}\s*(?:\\right)?\)?\s*$")
_RESIDUE_P = re.compile(rf"^{_INT}\s*(?:\\pmod|\\pod){_MOD_ARG}\s*$")
_CONGRUENCE = re.compile(rf"^[A-Za-z]\s*\\equiv\s*{_INT}\s*(?:\\pmod|\\pod|\\bmod|\\mod){_MOD_ARG}\s*$")
_PERCENT_INFIX = re.compile(r"(?:\\%|(?<!\\)%)\s*(?:[0-9A-Za-z(]|\\(?!right|\\|[,;:! ]))")
_DEGREE = re.compile(r"\^\s*(?:\{\s*\\circ\s*\}|\\circ(?![A-Za-z]))")
_RELATIONS_LONGEST_FIRST = sorted(RELATIONS, key=len, reverse=True)
_RELATION_TOKEN = re.compile("|".join(re.escape(r) + ("(?![A-Za-z])" if r[0] == "\\" else "")
                                      for r in _RELATIONS_LONGEST_FIRST))
# membership that says something: a variable (or a tuple of them) in a set, the whole answer
_MEMBERSHIP = re.compile(r"^\s*(?:[A-Za-z]|\\[A-Za-z]+|\(\s*[A-Za-z](?:\s*,\s*[A-Za-z])*\s*\))\s*\\in(?![A-Za-z])")
_SPACING = re.compile(r"^(?:\s|\\[,;:! ]|\\quad(?![A-Za-z])|\\qquad(?![A-Za-z]))+")


def evaluate_modulo(answer: str) -> str:
    """``15 \\bmod 8`` / ``15 \\pmod{8}`` / ``x \\equiv 15 \\pmod 8`` -> ``7``; other answers unchanged."""
    for pattern in (_RESIDUE, _RESIDUE_P, _CONGRUENCE):
        m = pattern.match(answer)
        if m:
            value, modulus = int(m.group(1)), int(m.group(2) or m.group(3))
            return str(value % modulus) if modulus > 0 else answer
    return answer


def _macros(text: str) -> set[str]:
    """Names of the macros of ``text``, outside ``\\text{}``-like arguments; a degree sign is not ``\\circ``."""
    text = _DEGREE.sub(" ", _TEXT_ARG.sub(" ", text))
    names = set()
    for m in _MACRO.finditer(text):
        name = m.group(1)
        if name in _INFIX_FUNCTIONS and not re.match(r"\s*(?:\(|\\left)", text[m.end():]):
            name = f"infix {name}"
        names.add(name)
    if _PERCENT_INFIX.search(text):
        names.add("mod")  # ``7 \\% 8``: a percent sign between two values is a programmer's modulo
    if "\\{" in text or "\\lbrace" in text:
        names.discard("mid")  # set-builder notation: ``\{x \mid x > 0\}``
    elif text.replace("\\|", "").count("|") % 2:
        names.add("mid")  # an odd number of bars: ``7 | 8`` (divides), not ``|x|``
    return names


def _top_level_items(text: str) -> list[str]:
    """``text`` split at commas outside brackets and braces."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0 and (i == 0 or text[i - 1] != "\\"):
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def _leading_relation(item: str) -> str | None:
    item = _SPACING.sub("", item)
    m = _RELATION_TOKEN.match(item)
    return m.group() if m else None


def _trailing_relation(item: str) -> str | None:
    item = item.rstrip()
    for rel in _RELATIONS_LONGEST_FIRST:
        if item.endswith(rel) and not (rel[0] == "\\" and item[:-len(rel)].endswith("\\")):
            return rel
    return None


def _gold_forms(golds: list[str]) -> tuple[set[str], set[str]]:
    macros, leading = set(), set()
    for gold in golds:
        macros |= _macros(gold)
        leading |= {r for r in map(_leading_relation, _top_level_items(gold)) if r}
    return macros, leading


def operator_error(answer: str, golds: list[str]) -> str:
    """Why ``answer`` is not a value math-verify may grade ('' if none); see the module docstring."""
    gold_macros, gold_leading = _gold_forms(golds)
    for item in _top_level_items(answer):
        lead = _leading_relation(item)
        if lead and lead not in gold_leading:
            return NEGATED if lead in NEGATIONS else SIDELESS
        stripped = _SPACING.sub("", item)
        for neg in ("\\not", "\\neg", "\\lnot"):
            if stripped.startswith(neg) and re.match(r"(?![A-Za-z])", stripped[len(neg):]) and \
                    neg[1:] not in gold_macros:
                return NEGATED
        trail = _trailing_relation(item)
        if trail and item.strip() != trail:
            return SIDELESS
    macros = _macros(answer) - gold_macros
    unknown = {m for m in macros if m in UNKNOWN_OPERATOR or m.startswith("infix ")}
    if "in" in macros and not _MEMBERSHIP.match(answer):
        unknown.add("in")  # ``x \in (1, 2)`` is solved; ``7 \in 8`` is read as 8
    return UNKNOWN if unknown else ""
