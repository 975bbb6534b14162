"""LongBench (Bai et al., 2024), the benchmark ILRe and ReAttention report, from its official files, prompts and
metrics (github.com/THUDM/LongBench, MIT).

**v1** (``LongBench/``): one ``DATASET.jsonl`` per dataset (``DATASET_e.jsonl`` for LongBench-E) with
``input``, ``context``, ``answers``, ``length``, ``all_classes`` and ``_id``.

* Prompts: ``config/dataset2prompt.json``, verbatim, split where the context ends (the question and answer
  cue after it, ``common.split_at_context``). Like ``pred.py``, the six few-shot and code datasets (trec,
  triviaqa, samsum, lsht, lcc, repobench-p) are not wrapped in a chat turn: they are asked as
  continuations; the rest close the turn before the answer cue.
* Generation lengths: ``config/dataset2maxlen.json``.
* Metrics: ``metrics.py`` through ``eval.py``'s ``dataset2metric``: the best over the gold answers, and for
  trec, triviaqa, samsum and lsht only the prediction's first line. ROUGE-L comes from ``rouge`` (the
  package LongBench imports), Chinese words from ``jieba``. ``code_sim_score``'s ``fuzz.ratio`` comes from
  ``rapidfuzz`` instead of the GPL ``fuzzywuzzy``: the same Levenshtein ratio, rounded to a whole percent
  as fuzzywuzzy rounds it, 0 for an empty string as fuzzywuzzy answers.

**v2** (``data.json``): multiple choice over ``context`` with ``question``, ``choice_A``..``choice_D`` and
``answer`` (a letter), asked with ``prompts/0shot.txt`` and scored by ``pred.py``'s ``extract_answer``
("The correct answer is (B)"), 128 new tokens. Rows are greedy where the official runs sample at 0.1.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..rows import Row
from .common import (BenchmarkFileError, json_lines, normalize_answer, normalize_zh_answer, split_at_context, spread,
                     token_count, token_f1)

# config/dataset2prompt.json, verbatim
PROMPTS = {
    "narrativeqa": "You are given a story, which can be either a novel or a movie script, and a question. Answer the question asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: {context}\n\nNow, answer the question based on the story asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:",  # noqa: E501
    "qasper": "You are given a scientific article and a question. Answer the question as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question based on the above article as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:",  # noqa: E501
    "multifieldqa_en": "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",  # noqa: E501
    "multifieldqa_zh": "阅读以下文字并用中文简短回答：\n\n{context}\n\n现在请基于上面的文章回答下面的问题，只告诉我答案，不要输出任何其他字词。\n\n问题：{input}\n回答：",  # noqa: E501
    "hotpotqa": "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",  # noqa: E501
    "2wikimqa": "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",  # noqa: E501
    "musique": "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",  # noqa: E501
    "dureader": "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。\n\n问题：{input}\n回答：",
    "gov_report": "You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:",  # noqa: E501
    "qmsum": "You are given a meeting transcript and a query containing a question or instruction. Answer the query in one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting transcript in one or more sentences.\n\nQuery: {input}\nAnswer:",  # noqa: E501
    "multi_news": "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:",  # noqa: E501
    "vcsum": "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结：",
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}",
    "triviaqa": "Answer the question based on the given passage. Only give me the answer and do not output any other words. The following are some examples.\n\n{context}\n\n{input}",  # noqa: E501
    "samsum": "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}",
    "lsht": "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}",
    "passage_count": "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully read these paragraphs and determine how many unique paragraphs there are after removing duplicates. In other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\nPlease enter the final count of unique paragraphs after removing duplicates. The output format should only contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: ",  # noqa: E501
    "passage_retrieval_en": "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number of the paragraph that the abstract is from. The answer format must be like \"Paragraph 1\", \"Paragraph 2\", etc.\n\nThe answer is: ",  # noqa: E501
    "passage_retrieval_zh": "以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}\n\n下面是一个摘要\n\n{input}\n\n请输入摘要所属段落的编号。答案格式必须是\"段落1\"，\"段落2\"等格式\n\n答案是：",  # noqa: E501
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}
DATASETS = tuple(PROMPTS)
# config/dataset2maxlen.json
MAX_NEW_TOKENS = {"narrativeqa": 128, "qasper": 128, "multifieldqa_en": 64, "multifieldqa_zh": 64, "hotpotqa": 32,
                  "2wikimqa": 32, "musique": 32, "dureader": 128, "gov_report": 512, "qmsum": 512, "multi_news": 512,
                  "vcsum": 512, "trec": 64, "triviaqa": 32, "samsum": 128, "lsht": 64, "passage_count": 32,
                  "passage_retrieval_en": 32, "passage_retrieval_zh": 32, "lcc": 64, "repobench-p": 64}
NO_CHAT = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")       # pred.py: asked without a chat turn
FIRST_LINE = ("trec", "triviaqa", "samsum", "lsht")                          # eval.py: the first line is scored


# ------------------------------------------------------------------ metrics.py
def qa_f1_score(prediction: str, truth: str, **_) -> float:
    return token_f1(normalize_answer(prediction).split(), normalize_answer(truth).split())


def zh_words(text: str) -> list[str]:
    import jieba
    jieba.setLogLevel(60)          # no "Building prefix dict" chatter on stderr
    return [w for w in (normalize_zh_answer(t) for t in jieba.cut(text, cut_all=False)) if w]


def qa_f1_zh_score(prediction: str, truth: str, **_) -> float:
    return token_f1(zh_words(prediction), zh_words(truth))


def rouge_score(prediction: str, truth: str, **_) -> float:
    from rouge import Rouge
    try:
        return Rouge().get_scores([prediction], [truth], avg=True)["rouge-l"]["f"]
    except Exception:            # metrics.py's bare except: an empty text (rouge raises on it) scores 0
        return 0.0


def rouge_zh_score(prediction: str, truth: str, **_) -> float:
    import jieba
    jieba.setLogLevel(60)
    return rouge_score(" ".join(jieba.cut(prediction, cut_all=False)), " ".join(jieba.cut(truth, cut_all=False)))


def classification_score(prediction: str, truth: str, all_classes=(), **_) -> float:
    matched = [c for c in all_classes if c in prediction]
    for term in matched:         # metrics.py removes from the list it walks (skipping the next term): kept as is
        if term in truth and term != truth:
            matched.remove(term)
    return 1.0 / len(matched) if truth in matched else 0.0


def count_score(prediction: str, truth: str, **_) -> float:
    numbers = re.findall(r"\d+", prediction)
    return sum(str(n) == str(truth) for n in numbers) / len(numbers) if numbers else 0.0


def retrieval_score(prediction: str, truth: str, pattern: str = r"Paragraph (\d+)", **_) -> float:
    wanted = re.findall(pattern, truth)[0]
    numbers = re.findall(r"\d+", prediction)
    return sum(n == wanted for n in numbers) / len(numbers) if numbers else 0.0


def retrieval_zh_score(prediction: str, truth: str, **_) -> float:
    return retrieval_score(prediction, truth, pattern=r"段落(\d+)")


def fuzz_ratio(a: str, b: str) -> int:
    """fuzzywuzzy's ``fuzz.ratio`` with python-Levenshtein: the InDel ratio in whole percent, 0 if either
    string is empty."""
    from rapidfuzz import fuzz
    return int(round(fuzz.ratio(a, b))) if a and b else 0


def code_sim_score(prediction: str, truth: str, **_) -> float:
    line = next((ln for ln in prediction.lstrip("\n").split("\n")
                 if "`" not in ln and "#" not in ln and "//" not in ln), "")
    return fuzz_ratio(line, truth) / 100


METRICS = {"narrativeqa": qa_f1_score, "qasper": qa_f1_score, "multifieldqa_en": qa_f1_score,
           "multifieldqa_zh": qa_f1_zh_score, "hotpotqa": qa_f1_score, "2wikimqa": qa_f1_score,
           "musique": qa_f1_score, "dureader": rouge_zh_score, "gov_report": rouge_score, "qmsum": rouge_score,
           "multi_news": rouge_score, "vcsum": rouge_zh_score, "trec": classification_score,
           "triviaqa": qa_f1_score, "samsum": rouge_score, "lsht": classification_score,
           "passage_retrieval_en": retrieval_score, "passage_count": count_score,
           "passage_retrieval_zh": retrieval_zh_score, "lcc": code_sim_score, "repobench-p": code_sim_score}


def score(dataset: str, prediction: str, answers: list[str], all_classes=()) -> float:
    """``eval.py``'s ``scorer`` for one prediction: the best over the gold answers."""
    if dataset == "v2":
        return float(extract_answer(prediction) == answers[0])
    if dataset in FIRST_LINE:
        prediction = prediction.lstrip("\n").split("\n")[0]
    return max((METRICS[dataset](prediction, truth, all_classes=all_classes or ()) for truth in answers),
               default=0.0)


# ------------------------------------------------------------------ v2 (prompts/0shot.txt, pred.py)
V2_PROMPT = ("Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\n"
             "What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n"
             "(D) $C_D$\n\nFormat your response as follows: \"The correct answer is (insert answer here)\".")
V2_MAX_NEW_TOKENS = 128


def extract_answer(response: str) -> str | None:
    response = response.replace("*", "")
    found = re.search(r"The correct answer is \(([A-D])\)", response) or \
        re.search(r"The correct answer is ([A-D])", response)
    return found.group(1) if found else None


def v2_prompt(item: dict) -> str:
    text = V2_PROMPT.replace("$DOC$", item["context"].strip()).replace("$Q$", item["question"].strip())
    for letter in "ABCD":
        text = text.replace(f"$C_{letter}$", item[f"choice_{letter}"].strip())
    return text


# ------------------------------------------------------------------ rows
def v1_rows(path: Path, dataset: str, tokenizer, samples: int | None) -> list[Row]:
    items = read_items(path, ("input", "context", "answers"))
    before, after = PROMPTS[dataset].split("{context}")
    rows = []
    for i in spread(len(items), samples):
        item = items[i]
        answers = item["answers"] if isinstance(item["answers"], list) else [item["answers"]]
        if not answers or not all(isinstance(a, str) for a in answers):
            raise BenchmarkFileError(f"{path} line {item['line']}: 'answers' must be a list of strings")
        context, question, prefix = split_at_context(before, item["context"], after.format(input=item["input"]))
        rows.append(Row(context=context, question=question, answers=answers, task=f"longbench/{dataset}",
                        length=token_count(tokenizer, context), answer_prefix=prefix,
                        max_new_tokens=MAX_NEW_TOKENS[dataset], sample=i,
                        layout="continuation" if dataset in NO_CHAT else "verbatim",
                        meta={"metric": "longbench", "dataset": dataset, "id": item.get("_id"),
                              "all_classes": item.get("all_classes") or [], "evidence": []}))
    return rows


def v2_rows(path: Path, tokenizer, samples: int | None) -> list[Row]:
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BenchmarkFileError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    need = ("context", "question", "choice_A", "choice_B", "choice_C", "choice_D", "answer")
    if not isinstance(items, list) or not items:
        raise BenchmarkFileError(f"{path}: LongBench v2's data.json is a non-empty JSON list")
    rows = []
    for i in spread(len(items), samples):
        item = items[i]
        missing = [k for k in need if not isinstance(item, dict) or not isinstance(item.get(k), str)]
        if missing or item["answer"] not in ("A", "B", "C", "D"):
            raise BenchmarkFileError(f"{path} item {i}: needs text {', '.join(need)} and an answer A-D")
        before, _, after = v2_prompt({**item, "context": "\x00"}).partition("\x00")
        context, question, prefix = split_at_context(before, item["context"].strip(), after)
        rows.append(Row(context=context, question=question, answers=[item["answer"]],
                        task=f"longbench-v2/{item.get('domain', 'all')}",
                        length=token_count(tokenizer, context), answer_prefix=prefix,
                        max_new_tokens=V2_MAX_NEW_TOKENS, sample=i, layout="verbatim",
                        meta={"metric": "longbench", "dataset": "v2", "id": item.get("_id"),
                              "difficulty": item.get("difficulty"), "evidence": []}))
    return rows


def read_items(path: Path, need: tuple[str, ...]) -> list[dict]:
    items = []
    for number, item in json_lines(path, "rows"):
        if not isinstance(item, dict) or any(not isinstance(item.get(k), (str, list)) for k in need):
            raise BenchmarkFileError(f"{path} line {number}: a LongBench row needs {', '.join(need)}")
        items.append({**item, "line": number})
    return items


def load_rows(data: str | Path, tokenizer, datasets: list[str] | None = None, samples: int | None = None,
              extended: bool = False) -> list[Row]:
    """v1: the ``DATASET.jsonl`` files in the folder ``data`` (``DATASET_e.jsonl`` with ``extended``), all
    21 datasets by default; v2: ``data`` is its ``data.json``. ``samples`` per dataset, spread evenly."""
    data = Path(data)
    files = check_files(data, datasets, extended)
    if data.is_file():
        return v2_rows(data, tokenizer, samples)
    return [row for d, path in files.items() for row in v1_rows(path, d, tokenizer, samples)]


def check_files(data: Path, datasets: list[str] | None, extended: bool) -> dict[str, Path]:
    """The v1 files to read by dataset (none for v2's data.json); a wrong name or a missing file is refused
    before any model loads."""
    if data.is_file():
        if datasets or extended:
            raise ValueError("LongBench v2 (a data.json file) has no datasets or LongBench-E to choose")
        return {}
    chosen = list(datasets or DATASETS)
    unknown = [d for d in chosen if d not in DATASETS]
    if unknown:
        raise ValueError(f"unknown LongBench dataset(s) {', '.join(unknown)}; choose from {', '.join(DATASETS)}")
    files = {d: data / f"{d}{'_e' if extended else ''}.jsonl" for d in chosen}
    missing = [p.name for p in files.values() if not p.is_file()]
    if missing:
        raise BenchmarkFileError(f"{data} lacks {', '.join(missing)} (pick others with --datasets)")
    return files
