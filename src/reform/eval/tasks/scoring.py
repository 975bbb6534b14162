"""Scorers: ``score(row, prediction)`` in 0..1, chosen by ``row.meta["metric"]``.

* ``string_match_all`` (RULER ``scripts/eval/synthetic/constants.py``): the fraction of gold strings that
  occur in the prediction, case-insensitive substring match. The default for rows without a metric.
* ``string_match_part`` (RULER's QA metric): 1 if any gold string occurs in the prediction.
* ``contains`` (NIAH): 1 if a gold string (the needle's value) occurs in the prediction, case-insensitive.
* ``babilong`` (BABILong ``babilong/metrics.py::compare_answers``): only the prediction's first sentence
  counts (text after ``<context>``, ``<example>`` or ``Question`` is cut off too); the task's labels
  (``row.meta["labels"]``, e.g. the six locations) that appear in it, less those named in the question,
  must be exactly the gold label. Labels are matched as whole words (BABILong uses substrings, which
  lets ``Mary`` match inside ``summary``).
* ``infinitebench``: ∞-Bench's official scorer for the row's task (:mod:`reform.eval.benchmarks.infinitebench`).
* ``longbench``: LongBench's metric for the row's dataset, or v2's answer extraction
  (:mod:`reform.eval.benchmarks.longbench`).
* ``repoeval``: RepoCoder's edit similarity (ES); ``details`` adds ``es`` and ``em`` to the record
  (:mod:`reform.eval.benchmarks.repoeval`).

Predictions are cleaned as RULER does: control characters become newlines and the ends are stripped.
"""

from __future__ import annotations

import re

from ..rows import Row

_CONTROL = re.compile(r"[\x00-\x1f]")


def clean(prediction: str) -> str:
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, answers: list[str]) -> float:
    text = clean(prediction).lower()
    return sum(a.lower() in text for a in answers) / len(answers) if answers else 0.0


def string_match_part(prediction: str, answers: list[str]) -> float:
    text = clean(prediction).lower()
    return float(any(a.lower() in text for a in answers))


def _words(text: str, labels) -> set[str]:
    return {lab for lab in labels if re.search(rf"\b{re.escape(lab)}\b", text)}


def babilong_match(prediction: str, answer: str, question: str, labels) -> float:
    text = clean(prediction).lower().split(".")[0]
    for cut in ("<context>", "<example>", "question"):
        text = text.split(cut)[0]
    labels = {lab.lower() for lab in labels} | {answer.lower()}
    found = _words(text, labels) - _words(question.lower(), labels)
    return float(found == {answer.lower()})


def choice_match(prediction: str, letter: str) -> float:
    """A multiple-choice answer: 1 if the prediction's first option letter (``B``, ``(B)``, ``B.``) is the gold one."""
    found = re.match(r"\W*([A-Z])\b", clean(prediction))
    return float(found is not None and found.group(1) == letter)


METRICS = ("string_match_all", "string_match_part", "contains", "babilong", "choice", "infinitebench", "repoeval", "longbench")


def score(row: Row, prediction: str) -> float:
    """The row's score for ``prediction`` under ``row.meta["metric"]`` (``string_match_all`` if unset)."""
    metric = row.meta.get("metric", "string_match_all")
    if metric == "string_match_all":
        return string_match_all(prediction, row.answers)
    if metric in ("string_match_part", "contains"):
        return string_match_part(prediction, row.answers)
    if metric == "babilong":
        return max((babilong_match(prediction, a, row.question, row.meta.get("labels", ())) for a in row.answers),
                   default=0.0)
    if metric == "choice":
        return max(choice_match(prediction, a) for a in row.answers)
    if metric == "repoeval":               # RepoCoder's edit similarity (EM: ``details``)
        from ..benchmarks.repoeval import edit_similarity
        return edit_similarity(row.answers[0], prediction)
    if metric == "longbench":              # eval.py's metric of the row's dataset, best over the answers
        from ..benchmarks.longbench import score as longbench_score
        return longbench_score(row.meta["dataset"], prediction, row.answers, row.meta.get("all_classes"))
    if metric == "infinitebench":          # the official scorer of the row's task, on its official label
        from ..benchmarks.infinitebench import score as infinitebench_score
        return infinitebench_score(row.task.split("/", 1)[1], prediction, row.meta["label"])
    raise ValueError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}")


def details(row: Row, prediction: str) -> dict:
    """Metrics a record carries beside its score: RepoEval's ``es`` and ``em``."""
    if row.meta.get("metric") != "repoeval":
        return {}
    from ..benchmarks.repoeval import edit_similarity, exact_match
    return {"es": edit_similarity(row.answers[0], prediction), "em": exact_match(row.answers[0], prediction)}
