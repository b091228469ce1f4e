"""The evaluator's entrance metrics (gapo/entrance.py through eval/records.py and eval/report.py): distinct first
moves, the majority entrance's size and pass@k, unique-entrance successes, against values computed by hand from a
samples file; records without first moves; the --entrance-tokens check; records' `entrance` from real generation."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction

import pytest

from tests.eval_helpers import ROOT, prepare_math

# First moves (token-id tuples). C sorts after D, so a tie-break by the smallest move would pick D, not C.
A, B, C, D = (5, 6), (5, 7), (9, 9), (1, 1)
E, F, G, H = (2,), (3,), (4,), (6,)
EMPTY = ()  # an empty response's first move

# Benchmark "b", n = 4: per problem, (first move, correct) of samples 0..3.
PROBLEMS = [
    # P0: A A B A. Majority A (3 samples, 1 correct: sample 3); B's one sample is correct and unique.
    [(A, False), (A, False), (B, True), (A, True)],
    # P1: C D D C, a tie (2 and 2): the first in sample order, C, is the majority; both successes are D's.
    [(C, False), (D, True), (D, True), (C, False)],
    # P2: four distinct moves, a tie of 1s: E (sample 0, wrong) is the majority; F's success is unique.
    [(E, False), (F, True), (G, False), (H, False)],
    # P3: one move for all: the majority is every sample.
    [(A, True), (A, True), (A, False), (A, False)],
    # P4: A () A (), no success; tie to A.
    [(A, False), (EMPTY, False), (A, False), (EMPTY, False)],
]
# By hand, per problem (n = 4):
#   distinct / n:            P0 2/4, P1 2/4, P2 4/4, P3 1/4, P4 2/4   -> mean 2.75 / 5 = 0.55
#   n_maj / n:               P0 3/4, P1 2/4, P2 1/4, P3 4/4, P4 2/4   -> mean 3.0 / 5 = 0.6
#   (n_maj, c_maj):          P0 (3, 1), P1 (2, 0), P2 (1, 0), P3 (4, 2), P4 (2, 0)
#   unique successes / c:    P0 1/2 (B yes, sample 3's A no), P1 0/2 (D twice), P2 1/1, P3 0/2; P4 has c = 0
#                            -> mean over the 4 problems with a success: (0.5 + 0 + 1 + 0) / 4 = 0.375
#   majority pass@1 = c_maj / n_maj:            1/3, 0, 0, 1/2, 0            -> (5/6) / 5 = 1/6
#   majority pass@2 = 1 - C(n-c, 2) / C(n, 2):  P0 1 - C(2,2)/C(3,2) = 2/3; P1 0; P2 k capped at 1: 0;
#                                               P3 1 - C(2,2)/C(4,2) = 5/6; P4 0  -> (2/3 + 5/6) / 5 = 0.3
#   majority pass@4, k capped at n_maj:         P0 pass@3 = 1; P1 pass@2 = 0; P2 pass@1 = 0; P3 pass@4 = 1;
#                                               P4 pass@2 = 0                     -> 2 / 5 = 0.4
#   all-sample pass@1 = c / 4:                  2/4, 2/4, 1/4, 2/4, 0         -> 1.75 / 5 = 0.35 (not 1/6)
#   all-sample pass@4:                          1, 1, 1, 1, 0                 -> 0.8 (not 0.4)
# With the tie in P1 broken towards D (the successes' move, or the smaller tuple), P1's (n_maj, c_maj) would be
# (2, 2) and majority pass@1 (1/3 + 1 + 0 + 1/2 + 0) / 5 = 11/30; with P2's tie broken to F, 2/6 + ... != 1/6.
HAND = {"distinct_frac_mean": 0.55, "majority_size_mean": 0.6, "unique_success_frac_mean": 0.375,
        "majority_pass@k": {"1": Fraction(1, 6), "2": Fraction(3, 10), "4": Fraction(2, 5)}}


def _records():
    recs = []
    for p, samples in enumerate(PROBLEMS):
        for i, (move, ok) in enumerate(samples):
            recs.append({"benchmark": "b", "problem": p, "sample": i, "response": "...", "correct": ok,
                         "finish_reason": "stop", "response_tokens": 8, "entrance": list(move)})
    for p in range(2):  # an older run's records: no `entrance`
        for i in range(4):
            recs.append({"benchmark": "old", "problem": p, "sample": i, "response": "...", "correct": i == 0,
                         "finish_reason": "stop", "response_tokens": 8})
    return recs


def _write_run(out, records, label="hand"):
    out.mkdir(parents=True, exist_ok=True)
    run = {"model": "m", "n": 4, "coverage_threshold": 0.05, "label": label, "entrance_tokens": 2,
           "entrance_until_newline": False,
           "benchmarks": {"b": {"path": "b.parquet", "problems_total": 5}, "old": {"path": "o.parquet",
                                                                                    "problems_total": 2}}}
    (out / "run.json").write_text(json.dumps(run))
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return out


def test_entrance_metrics_of_a_hand_built_samples_file_match_hand_computed_values(tmp_path):
    from eval.report import rebuild_reports
    from gapo.entrance import majority_entrance

    records = _records()
    summary = rebuild_reports(_write_run(tmp_path / "run", records[::-1]))  # file order must not matter
    b = summary["benchmarks"]["b"]
    got = b["entrance"]
    assert (got["tokens"], got["until_newline"], got["problems"], got["problems_with_success"]) == (2, False, 5, 4)
    assert got["distinct_frac_mean"] == pytest.approx(HAND["distinct_frac_mean"], abs=1e-15)
    assert got["majority_size_mean"] == pytest.approx(HAND["majority_size_mean"], abs=1e-15)
    assert got["unique_success_frac_mean"] == pytest.approx(HAND["unique_success_frac_mean"], abs=1e-15)
    assert got["majority_pass@k"] == {k: float(v) for k, v in HAND["majority_pass@k"].items()}  # exact
    assert b["pass@k"]["1"] == pytest.approx(0.35) and b["pass@k"]["4"] == pytest.approx(0.8)  # all samples differ
    assert got["majority_pass@k"]["1"] != pytest.approx(11 / 30)  # what the tie to D would give
    # the same majority as gapo.entrance.majority_entrance over the samples in order
    for samples in PROBLEMS:
        chosen = majority_entrance([m for m, _ in samples])
        assert chosen == [i for i, (m, _) in enumerate(samples) if m == samples[chosen[0]][0]]
    assert [samples[majority_entrance([m for m, _ in samples])[0]][0] for samples in PROBLEMS] == [A, C, E, A, A]
    # records without first moves: no entrance block, n/a in the tables, pass@k as before
    assert "entrance" not in summary["benchmarks"]["old"]
    assert summary["benchmarks"]["old"]["pass@k"]["1"] == 0.25
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["benchmarks"]["b"]["entrance"]["majority_pass@k"]["2"] == 0.3


def test_problem_stats_keep_first_move_counts_whatever_the_record_order():
    """The store's per-problem counts (never responses) give the same majority as the records in sample order:
    P1 written D-first still has C (sample 0) as its majority."""
    from eval.records import ProblemStats

    recs = [r for r in _records() if r["benchmark"] == "b" and r["problem"] == 1]
    shuffled = [recs[2], recs[1], recs[3], recs[0]]  # D, D, C, C
    stats = ProblemStats.of(shuffled)
    assert stats.moves == {D: [2, 2, 1], C: [2, 0, 0]}  # per move: samples, correct, first sample
    assert stats.majority() == (2, 0)
    group = stats.entrances()
    assert (group.size, group.distinct, group.successes, group.unique_successes) == (4, 2, 2, 0)
    merged = ProblemStats.of(shuffled[:2])
    merged.merge(ProblemStats.of(shuffled[2:]))
    assert merged == stats
    old = ProblemStats.of([{**r, "entrance": None} if r["sample"] == 3 else r for r in recs])
    assert not old.has_entrances and old.majority() is None and old.entrances() is None


def test_tables_report_and_plot_show_the_entrance_numbers(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from eval.__main__ import main
    from eval.report import comparison_tables, load_run

    run = _write_run(tmp_path / "run", _records())
    assert main(["report", str(run)]) == 0
    md = (run / "results.md").read_text()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip().strip("|").split("|")[1:]]
            for line in md.splitlines() if line.startswith("| ")}
    assert rows["pass@1"] == ["35.0", "25.0", "30.0"]
    assert rows["pass@1, majority entrance"] == ["16.7", "n/a", "n/a"]  # 1/6; avg n/a: "old" has none
    assert rows["pass@4, majority entrance"] == ["40.0", "n/a", "n/a"]
    assert rows["entrance distinct (%)"] == ["55.0", "n/a", "n/a"]
    assert rows["majority entrance share (%)"] == ["60.0", "n/a", "n/a"]
    assert rows["unique-entrance successes (%)"] == ["37.5", "n/a", "n/a"]
    assert "first move = the first 2 response tokens" in md and "k capped at their count" in md

    other = _write_run(tmp_path / "other", [r for r in _records() if r["benchmark"] == "old"], label="older")
    main(["report", str(other)])
    text = comparison_tables([load_run(run), load_run(other)])
    assert "| hand, majority entrance | 16.7 | n/a | n/a |" in text
    assert "| older, majority entrance | n/a | n/a | n/a |" in text
    assert "| hand | 2 tokens | 55.0 | n/a | n/a |" in text

    figures = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **kw: (figures.append(fig), save(fig, *a, **kw))[1])
    assert main(["plot", str(run), str(other), "--out", str(tmp_path / "c.png")]) == 0
    fig = figures[-1]
    ax = next(a for a in fig.axes if a.get_title() == "b")
    solid, dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"], \
        [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert len(solid) == 1 and len(dashed) == 1 and solid[0].get_color() == dashed[0].get_color()
    assert list(dashed[0].get_ydata()) == pytest.approx([100 / 6, 30, 40])
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert {"hand", "pass@k, all samples", "pass@k, majority entrance"} <= set(legend)


def test_entrance_tokens_below_one_is_a_clear_error_at_start(tmp_path):
    """Before any model loads (the model does not exist): argparse's exit code 2, the flag, the value, the fix."""
    from eval.__main__ import eval_parser
    from eval.runner import EvalConfig
    from gapo.entrance import DEFAULT_ENTRANCE_TOKENS

    args = eval_parser().parse_args(["--model", "m", "--bench", "b"])
    assert (args.entrance_tokens, args.entrance_until_newline) == (DEFAULT_ENTRANCE_TOKENS, False)
    args = eval_parser().parse_args(["--model", "m", "--bench", "b", "--entrance-tokens", "3",
                                     "--entrance-until-newline"])
    assert (args.entrance_tokens, args.entrance_until_newline) == (3, True)
    for bad in ("0", "-3", "two"):
        proc = subprocess.run([sys.executable, "-m", "eval", "--model", str(tmp_path / "none"), "--bench", "x",
                               "--backend", "hf", "--entrance-tokens", bad], cwd=ROOT, capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 2, proc.stderr
        assert f"argument --entrance-tokens: got '{bad}'" in proc.stderr and "integer >= 1" in proc.stderr
        assert "--entrance-tokens 8 (the default)" in proc.stderr
    with pytest.raises(ValueError, match=r"entrance_tokens = 0 \(--entrance-tokens\).*integer >= 1"):
        EvalConfig(model="m", benchmarks=["b"], out=str(tmp_path), entrance_tokens=0)


class HeadsBackend:
    """Answers from fixed texts (every token a character of the tiny tokenizer), with their token ids as heads."""

    name = "heads"

    def __init__(self, tokenizer, texts, head_tokens):
        self.ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        self.texts, self.head_tokens = texts, head_tokens

    def generate(self, requests):
        from eval.generate import Completion

        return [[Completion(self.texts[i % len(self.texts)], len(self.ids[i % len(self.ids)]), "stop",
                            self.ids[i % len(self.ids)][:self.head_tokens]) for i in range(len(r.seeds))]
                for r in requests]

    def close(self):
        pass


def test_newline_mode_cuts_the_first_move_after_its_newline_and_resume_checks_the_setting(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    from gapo.entrance import newline_token_ids
    from eval.runner import EvalConfig, evaluate

    tok = AutoTokenizer.from_pretrained(tiny_model)
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    assert newline_token_ids(tok) == frozenset(newline)  # the char-level vocabulary has one newline token
    texts = ["ab\ncdef", "abcdefgh", "\nabc"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    data = prepare_math(tmp_path / "math", limit=1)
    specs = [str(data / "aime24.parquet")]
    kw = {"model": str(tiny_model), "benchmarks": specs, "n": 3, "max_new_tokens": 8, "progress": False}
    factory = lambda name, path, sampling, **k: HeadsBackend(tok, texts, k["head_tokens"])
    evaluate(EvalConfig(out=str(tmp_path / "nl"), entrance_tokens=5, entrance_until_newline=True, **kw),
             backend_factory=factory)
    recs = [json.loads(x) for x in (tmp_path / "nl" / "samples.jsonl").read_text().splitlines()]
    assert [r["entrance"] for r in recs] == [ids[0][:3], ids[1][:5], ids[2][:1]]  # "ab\n", "abcde", "\n"
    run = json.loads((tmp_path / "nl" / "run.json").read_text())
    assert (run["entrance_tokens"], run["entrance_until_newline"]) == (5, True)

    evaluate(EvalConfig(out=str(tmp_path / "m"), entrance_tokens=5, **kw), backend_factory=factory)
    recs = [json.loads(x) for x in (tmp_path / "m" / "samples.jsonl").read_text().splitlines()]
    assert [r["entrance"] for r in recs] == [i[:5] for i in ids]
    with pytest.raises(SystemExit, match=r"entrance_tokens: recorded 5, now 4"):
        evaluate(EvalConfig(out=str(tmp_path / "m"), entrance_tokens=4, **kw), backend_factory=factory)
    with pytest.raises(SystemExit, match=r"entrance_until_newline: recorded False, now True"):
        evaluate(EvalConfig(out=str(tmp_path / "m"), entrance_tokens=5, entrance_until_newline=True, **kw),
                 backend_factory=factory)
    # an older run (run.json without the entrance settings, records without `entrance`) resumes: n/a there
    old = json.loads((tmp_path / "m" / "run.json").read_text())
    for key in ("entrance_tokens", "entrance_until_newline"):
        old.pop(key)
    (tmp_path / "m" / "run.json").write_text(json.dumps(old))
    lines = [json.loads(x) for x in (tmp_path / "m" / "samples.jsonl").read_text().splitlines()]
    (tmp_path / "m" / "samples.jsonl").write_text("".join(
        json.dumps({k: v for k, v in r.items() if k != "entrance"}) + "\n" for r in lines))
    summary = evaluate(EvalConfig(out=str(tmp_path / "m"), entrance_tokens=5, **kw), backend_factory=factory)
    assert "entrance" not in summary["benchmarks"]["aime24"]


def test_hf_records_carry_the_first_m_response_token_ids(tmp_path, tiny_model):
    """Real generation with the tiny model (HF backend): each record's `entrance` is the first m token ids of its
    response (regenerated with every token kept), and with "until newline" those ids cut after a newline token."""
    from eval.data import load_benchmarks
    from eval.generate import (
        HFBackend,
        Request,
        SamplingConfig,
        encode_prompt,
        render_prompt,
        sample_seed,
    )
    from eval.runner import EvalConfig, evaluate
    from gapo.entrance import first_move, newline_token_ids
    from gapo.smoke.task import make_dataset

    val = make_dataset(tmp_path / "smoke", n_train=1, n_val=3)["val"]
    n, new, m = 4, 12, 3
    hf = HFBackend(str(tiny_model), SamplingConfig(0.6, 0.95, new), batch_size=n, head_tokens=new)
    full = {}
    for p in load_benchmarks([str(val)])[0].problems:
        seeds = [sample_seed(0, p.benchmark, p.index, i) for i in range(n)]
        comps = hf.generate([Request(encode_prompt(hf.tokenizer, render_prompt(hf.tokenizer, p.prompt)), seeds)])[0]
        for i, comp in enumerate(comps):
            assert len(comp.head_ids) == comp.tokens  # every response token kept (EOS included)
            assert hf.tokenizer.decode(comp.head_ids, skip_special_tokens=True) == comp.text
            full[(p.index, i)] = comp.head_ids
    newline = newline_token_ids(hf.tokenizer)
    for until_newline in (False, True):
        out = tmp_path / f"out_{until_newline}"
        evaluate(EvalConfig(model=str(tiny_model), benchmarks=[str(val)], out=str(out), n=n, batch_size=n,
                            max_new_tokens=new, backend="hf", entrance_tokens=m if not until_newline else new,
                            entrance_until_newline=until_newline, progress=False))
        recs = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
        assert len(recs) == 3 * n
        for r in recs:
            ids = full[(r["problem"], r["sample"])]
            want = ids[:m] if not until_newline else list(first_move(ids, new, newline))
            assert r["entrance"] == want, r
        summary = json.loads((out / "summary.json").read_text())
        assert summary["benchmarks"]["val"]["entrance"]["tokens"] == (new if until_newline else m)
