"""The paper's math datasets: one registry of per-dataset field mappings, and the conversion to verl's RL parquet.

Every dataset becomes rows of verl's RL format (read by ``verl.utils.dataset.rl_dataset.RLHFDataset``)::

    data_source   str   the dataset's name below (the math reward dispatches on it)
    prompt        [{"role": "user", "content": <problem> + " " + INSTRUCTION}]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": <answer string>}
    extra_info    {"split", "index", "problem", "raw_answer", "solution", "level", "subject", "source_id"}

``extra_info`` has the same keys and types in every file (absent values are null), so verl can concatenate
several of these parquet files into one validation set. ``index`` is the row's position in the source, so a
row can be traced back even after rows with empty answers are dropped.

Hub copies: the ones DeepScaleR-style evaluations commonly load. Their column names were checked against
the hub dataset cards or against several independent loaders of the same copy, offline; what could not be
checked is noted at each spec. Any other copy with the same columns works through ``--source``.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gapo.data.parquet_io import data_root, row_schema, write_rows
from gapo.data.sources import hub_unavailable, is_local_source, local_file

# DeepScaleR's instruction, appended to every problem after one space: the only formatting the model is
# asked for; the math reward reads the final answer from the response's \boxed{...}.
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."

ABILITY = "math"


@dataclass(frozen=True)
class MathDatasetSpec:
    """Where one dataset lives on the hub and how its columns map onto verl's row.

    Attributes:
        data_source: The dataset's one name: CLI ``--dataset`` value, output file stem, and the rows'
            ``data_source`` (the math reward registers exactly these names).
        hub_name: Hugging Face hub dataset id, loaded with ``datasets.load_dataset``.
        split: Hub split to read (AIME24's only split is ``train``, even though it is a test set).
        role: ``extra_info["split"]`` of the rows: ``train`` for the RL training set, ``test`` for benchmarks.
        question_field: Column holding the problem statement.
        answer_field: Column holding the final answer (a string, a number, or a list of strings).
        alt_question_fields, alt_answer_fields: Other names the same column has in other copies of the dataset,
            tried in order when the main one is absent (OlympiadBench: ``final_answer`` or ``answer``).
        subset: Hub config name, if the dataset has several.
        solution_field, level_field, subject_field, id_field: Optional columns copied into ``extra_info``. One
            that the source lacks is written as null with a :class:`MissingColumnWarning` (never silently).
        strip_dollars: Unwrap answers written whole in ``$...$`` or ``$$...$$`` (OlympiadBench writes
            ``$\\frac{1}{2}$``); also on for the sets whose answers were not all seen (DeepScaleR, Minerva).
        expected_rows: Row count of the hub split (None if unknown); a hub split of another size gets a
            :class:`RowCountWarning`.
        note: What to know about this copy (shown by ``--help`` listings and in the row-count warning).
    """

    data_source: str
    hub_name: str
    split: str
    role: Literal["train", "test"]
    question_field: str
    answer_field: str
    subset: str | None = None
    solution_field: str | None = None
    level_field: str | None = None
    subject_field: str | None = None
    id_field: str | None = None
    strip_dollars: bool = False
    expected_rows: int | None = None
    alt_question_fields: tuple[str, ...] = ()
    alt_answer_fields: tuple[str, ...] = ()
    note: str = ""

    @property
    def optional_fields(self) -> dict[str, str]:
        """``{extra_info key: source column}`` of the optional columns this spec copies."""
        named = {"solution": self.solution_field, "level": self.level_field, "subject": self.subject_field,
                 "source_id": self.id_field}
        return {key: column for key, column in named.items() if column is not None}


class MissingColumnWarning(UserWarning):
    """An optional column of the spec is absent from the source: its ``extra_info`` key is null in every row."""


class RowCountWarning(UserWarning):
    """The hub split does not have the expected number of rows (another release of the dataset)."""


_SPECS = (
    # Training set. Columns problem / answer / solution: dataset card and several preprocessors agree.
    MathDatasetSpec(
        data_source="deepscaler", hub_name="agentica-org/DeepScaleR-Preview-Dataset", split="train",
        role="train", question_field="problem", answer_field="answer", solution_field="solution",
        strip_dollars=True, expected_rows=40315,
    ),
    # Card: id (int), problem, solution, answer (str), url, year; one split "train", 30 rows.
    MathDatasetSpec(
        data_source="aime24", hub_name="HuggingFaceH4/aime_2024", split="train", role="test",
        question_field="problem", answer_field="answer", solution_field="solution", id_field="id",
        expected_rows=30,
    ),
    # Loaders agree on split "test" with problem / answer / id (30 rows); the card itself was not seen.
    MathDatasetSpec(
        data_source="aime25", hub_name="math-ai/aime25", split="test", role="test",
        question_field="problem", answer_field="answer", id_field="id", expected_rows=30,
    ),
    # Loaders agree on split "test" with id / question / answer / url (40 rows, AMC 12 2023). The answer's
    # dtype was not seen; copies of the same data store it as float64 (27.0), which becomes "27".
    MathDatasetSpec(
        data_source="amc23", hub_name="math-ai/amc23", split="test", role="test",
        question_field="question", answer_field="answer", id_field="id", expected_rows=40,
        note="AMC 12 2023 only (40 problems): the AMC column of the Qwen2.5-Math / SimpleRL-style evaluations",
    ),
    # DeepScaleR's AMC set: rllm's rllm/data/test/math/amc.json (83 rows: problem, answer as float 142.0, url of
    # the AoPS wiki page, difficulty), AMC 12 2022 + 2023 (urls 2022_AMC_12A ... 2023_AMC_12B). That is the hub's
    # AI-MO/aimo-validation-amc (split "train", 83 rows: id, problem, answer (float), url), as several loaders
    # read it ("AMC (AMC-22 and AMC-23)"); DeepScaleR added only the difficulty column.
    MathDatasetSpec(
        data_source="amc22_23", hub_name="AI-MO/aimo-validation-amc", split="train", role="test",
        question_field="problem", answer_field="answer", id_field="id", expected_rows=83,
        note="AMC 12 2022 + 2023 (83 problems): DeepScaleR's `amc` (its README calls the column \"AMC 2023\")",
    ),
    # Card: problem, solution, answer, subject, level (int), unique_id; split "test", 500 rows.
    MathDatasetSpec(
        data_source="math500", hub_name="HuggingFaceH4/MATH-500", split="test", role="test",
        question_field="problem", answer_field="answer", solution_field="solution", level_field="level",
        subject_field="subject", id_field="unique_id", expected_rows=500,
    ),
    # Loaders agree on split "test" with question / answer (272 rows); the card itself was not seen.
    MathDatasetSpec(
        data_source="minerva", hub_name="math-ai/minervamath", split="test", role="test",
        question_field="question", answer_field="answer", strip_dollars=True, expected_rows=272,
    ),
    # OlympiadBench's text-only English math competition subset (OE_TO_maths_en_COMP): 675 problems (the
    # subset's size in OlympiadBench's release and in DeepScaleR's olympiad_bench.json; 674 is another
    # release's count). Copies disagree on columns: OlympiadBench's own (and Hothan/OlympiadBench) have
    # question, final_answer (a list of strings, answers in $...$), solution (a list), subfield, id;
    # DeepScaleR's has problem / answer (a list); others a string `answer`. math-ai/olympiadbench is one
    # test.jsonl of ~251 kB, about the size of the 675 questions and answers alone (the solutions would
    # add over 1 MB): expect its optional columns to be missing (warned, written as null).
    MathDatasetSpec(
        data_source="olympiadbench", hub_name="math-ai/olympiadbench", split="test", role="test",
        question_field="question", answer_field="final_answer", solution_field="solution",
        subject_field="subfield", id_field="id", strip_dollars=True, expected_rows=675,
        alt_question_fields=("problem",), alt_answer_fields=("answer",),
        note="OE_TO_maths_en_COMP has 675 problems; 674 is another release's count",
    ),
)

DATASETS: dict[str, MathDatasetSpec] = {spec.data_source: spec for spec in _SPECS}


def get_spec(name: str) -> MathDatasetSpec:
    """The registered spec of ``name``; a ``KeyError`` naming the valid choices otherwise."""
    try:
        return DATASETS[name]
    except KeyError:
        raise KeyError(f"unknown math dataset {name!r}; valid: {', '.join(DATASETS)}") from None


# --- reading the source (what a source is and how it resolves: gapo.data.sources) ---------------


def read_local_file(path: str | os.PathLike) -> list[dict]:
    """Rows of a ``.jsonl``, ``.json`` (a list of rows, or JSON lines as ``datasets`` writes) or ``.parquet``."""
    path = local_file(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # not one JSON document: JSON lines under a .json name
        if isinstance(data, list):
            return data
        if data is not None:
            raise ValueError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_hub(spec: MathDatasetSpec, hub_name: str | None = None) -> list[dict]:
    """Rows of the spec's hub split, in the hub's order."""
    name = hub_name or spec.hub_name
    try:
        import datasets

        ds = datasets.load_dataset(name, spec.subset, split=spec.split)
    except Exception as e:  # offline, gated, renamed: the library raises many different types
        raise hub_unavailable(name, spec.split, e) from e
    return ds.to_list()


def read_source(spec: MathDatasetSpec, source: str | os.PathLike | None = None) -> list[dict]:
    """Raw rows from ``source``: a local file, a hub dataset id, or (None) the spec's hub dataset."""
    if source is not None and is_local_source(source):
        return read_local_file(source)
    return read_hub(spec, None if source is None else str(source))


# --- conversion --------------------------------------------------------------------------------


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _scalar_answer(value: Any, strip_dollars: bool) -> str:
    if _is_missing(value):
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # 27.0 -> "27": numeric answer columns are read as floats
    text = str(value).strip()
    if strip_dollars:
        for fence in ("$$", "$"):  # only a whole-answer wrap: "$x$ or $y$" is left as it is
            inner = text[len(fence):-len(fence)]
            if len(text) > 2 * len(fence) and text.startswith(fence) and text.endswith(fence) and "$" not in inner:
                text = inner.strip()
                break
    return text


def normalize_answer(value: Any, *, strip_dollars: bool = False) -> str:
    """The ground-truth string of a raw answer cell; ``""`` when there is none.

    Strings are stripped (and unwrapped from ``$...$`` if ``strip_dollars``); integral floats lose their
    ``.0``; a list (OlympiadBench's ``final_answer``) keeps its non-empty elements, normalised the same
    way and joined with ``", "`` (a one-element list gives that element).
    """
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray":
        parts = [_scalar_answer(v, strip_dollars) for v in value]
        return ", ".join(p for p in parts if p)
    return _scalar_answer(value, strip_dollars)


def _text(value: Any) -> str | None:
    """Optional text column as a string (lists, e.g. OlympiadBench solutions, joined by blank lines)."""
    if _is_missing(value):
        return None
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray":
        return "\n\n".join(str(v) for v in value)
    return str(value)


def _raw(value: Any) -> str | None:
    """A raw answer cell as text, for the record: lists as JSON, numbers as Python writes them."""
    if _is_missing(value):
        return None
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray":
        return json.dumps([v for v in value], ensure_ascii=False)
    return str(value)


def _field(row: dict, field: str | None) -> str | None:
    return None if field is None else _text(row.get(field))


def make_prompt(problem: str) -> str:
    """The user message: the problem, one space, :data:`INSTRUCTION`."""
    return f"{problem.strip()} {INSTRUCTION}"


def _columns(raw_rows: list[dict]) -> set[str]:
    """Every column name the source's rows have (a JSON lines file may leave a null key out of some rows)."""
    columns: set[str] = set()
    for row in raw_rows:
        columns.update(row)
    return columns


def resolve_columns(spec: MathDatasetSpec, raw_rows: list[dict]) -> tuple[str, str, dict[str, str | None]]:
    """The (question, answer) columns this source uses (the spec's, else their alternatives) and the optional
    columns, ``{extra_info key: column, or None when the source lacks it}``.

    A missing optional column is a :class:`MissingColumnWarning`: its ``extra_info`` key will be null in every row.

    Raises:
        KeyError: no question or no answer column (lists the columns the source has).
    """
    columns = _columns(raw_rows)
    chosen, missing = [], []
    for main, alternatives in ((spec.question_field, spec.alt_question_fields),
                               (spec.answer_field, spec.alt_answer_fields)):
        found = next((c for c in (main, *alternatives) if c in columns), None)
        chosen.append(found or main)
        if found is None:
            missing.append(main if not alternatives else " or ".join(repr(c) for c in (main, *alternatives)))
    if raw_rows and missing:
        shown = [m if " or " in m else repr(m) for m in missing]
        raise KeyError(
            f"{spec.data_source}: source has no column(s) [{', '.join(shown)}]; it has {sorted(columns)}. "
            f"Expected the columns of {spec.hub_name}."
        )
    optional = {key: (column if column in columns else None) for key, column in spec.optional_fields.items()}
    absent = {key: spec.optional_fields[key] for key, column in optional.items() if column is None}
    if raw_rows and absent:
        warnings.warn(
            f"{spec.data_source}: the source has no column(s) {sorted(absent.values())}, so extra_info "
            f"{sorted(absent)} will be null in every row (columns present: {sorted(columns)})",
            MissingColumnWarning, stacklevel=3)
    return chosen[0], chosen[1], optional


def convert_rows(spec: MathDatasetSpec, raw_rows: list[dict]) -> tuple[list[dict], list[int]]:
    """verl rows of ``raw_rows`` in source order, and the source indices dropped for an empty answer or problem.

    Columns: see :func:`resolve_columns` (alternative names accepted; a missing optional column warns).

    Raises:
        KeyError: the question or answer column is missing (lists the columns the source has).
    """
    question_field, answer_field, optional = resolve_columns(spec, raw_rows)
    rows, dropped = [], []
    for index, raw in enumerate(raw_rows):
        problem = _text(raw.get(question_field)) or ""
        answer = normalize_answer(raw.get(answer_field), strip_dollars=spec.strip_dollars)
        if not answer or not problem.strip():
            dropped.append(index)
            continue
        rows.append({
            "data_source": spec.data_source,
            "prompt": [{"role": "user", "content": make_prompt(problem)}],
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {
                "split": spec.role,
                "index": index,
                "problem": problem.strip(),
                "raw_answer": _raw(raw.get(answer_field)),
                "solution": _field(raw, optional.get("solution")),
                "level": _field(raw, optional.get("level")),
                "subject": _field(raw, optional.get("subject")),
                "source_id": _field(raw, optional.get("source_id")),
            },
        })
    return rows, dropped


def load_rows(spec: MathDatasetSpec, source: str | os.PathLike | None = None, limit: int | None = None) -> list[dict]:
    """verl rows of one dataset from ``source`` (see :func:`read_source`); at most ``limit`` of them.

    Rows with an empty answer are dropped and reported on stdout.
    """
    rows, dropped = convert_rows(spec, read_source(spec, source))
    _report_dropped(spec, dropped)
    return rows if limit is None else rows[:limit]


def check_row_count(spec: MathDatasetSpec, rows_read: int, where: str) -> bool:
    """Whether a hub split has the spec's ``expected_rows``; a :class:`RowCountWarning` (also printed) if not."""
    if spec.expected_rows is None or rows_read == spec.expected_rows:
        return True
    message = (f"[{spec.data_source}] {rows_read} rows in {where}, {spec.expected_rows} expected"
               f"{f' ({spec.note})' if spec.note else ''}: another release of the dataset? Scores are then "
               f"not comparable with published ones")
    print(message, flush=True)
    warnings.warn(message, RowCountWarning, stacklevel=3)
    return False


def _report_dropped(spec: MathDatasetSpec, dropped: list[int]) -> None:
    if dropped:
        print(f"[{spec.data_source}] dropping {len(dropped)} row(s) with an empty answer or problem "
              f"(source indices {dropped[:10]}{' ...' if len(dropped) > 10 else ''})")


# --- writing -----------------------------------------------------------------------------------


# extra_info's math fields, after the split and index every family has (gapo.data.parquet_io.row_schema).
EXTRA_INFO = {"problem": "string", "raw_answer": "string", "solution": "string", "level": "string",
              "subject": "string", "source_id": "string"}


def parquet_schema():
    """One Arrow schema for every math dataset, so verl can concatenate the files: verl's row with
    :data:`EXTRA_INFO`."""
    return row_schema(EXTRA_INFO)


def to_parquet(rows: list[dict], path: str | os.PathLike) -> Path:
    """Write ``rows`` to ``path`` with the math schema (see :func:`gapo.data.parquet_io.write_rows`)."""
    return write_rows(rows, path, parquet_schema())


@dataclass(frozen=True)
class PrepareSummary:
    """What :func:`prepare` did: rows read from ``source``, dropped, written to ``path``."""

    data_source: str
    source: str
    rows_read: int
    rows_dropped: int
    rows_written: int
    path: Path

    def __str__(self) -> str:
        return (f"[{self.data_source}] read {self.rows_read} rows from {self.source}; dropped {self.rows_dropped} "
                f"(empty answer or problem); wrote {self.rows_written} rows to {self.path}")


def prepare(spec: MathDatasetSpec, source: str | os.PathLike | None = None, out_dir: str | os.PathLike | None = None,
            limit: int | None = None) -> PrepareSummary:
    """Convert one dataset to ``out_dir/<data_source>.parquet`` (default ``$GAPO_DATA_DIR/math``); print and
    return a summary."""
    where = str(source) if source is not None else f"hub {spec.hub_name} ({spec.split})"
    print(f"[{spec.data_source}] reading {where} ...", flush=True)
    raw = read_source(spec, source)
    rows, dropped = convert_rows(spec, raw)
    _report_dropped(spec, dropped)
    if source is None or not is_local_source(source):
        check_row_count(spec, len(raw), where)
    if limit is not None:
        rows = rows[:limit]
    path = to_parquet(rows, Path(out_dir or data_root() / "math") / f"{spec.data_source}.parquet")
    summary = PrepareSummary(spec.data_source, where, len(raw), len(dropped), len(rows), path)
    print(summary, flush=True)
    return summary
