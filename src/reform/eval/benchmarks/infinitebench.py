"""∞-Bench (Zhang et al., 2024, "∞Bench: Extending Long Context Evaluation Beyond 100K Tokens") as REFORM runs
it (Table 3: 10 of its 12 tasks; Code.Run and Math.Calc are left out because no method scores above zero).

Everything that decides a score is the official code's, from github.com/OpenBMB/InfiniteBench (MIT):

* the files, read by their names (``DATA_NAME_TO_PATH`` of ``src/eval_utils.py``): one ``.jsonl`` per task
  with ``id``, ``context``, ``input``, ``answer`` and ``options``; an answer may be a string, a number or a
  list, as the released files have them;
* the prompts: ``yarn_mistral_templates`` of ``src/prompt.py``, the set its open models (Yarn-Mistral, Yi,
  ChatGLM3) were run with, filled as ``create_prompt`` fills them. REFORM needs the context apart from the
  question, so each prompt is split where its context ends: the text up to the end of the context is
  encoded, the rest is the question, and its last line (``The pass key is``, ``Answer:``) the answer
  prefix. Joined again they are the official prompt, character for character (``Row.layout`` ``verbatim``);
* the generation lengths: ``DATA_NAME_TO_MAX_NEW_TOKENS`` of ``src/eval_utils.py``;
* the scorers: ``get_score_one_*`` of ``src/compute_scores.py``, including their quirks (an En.MC answer
  that starts with ``(`` scores 0). En.Sum's ROUGE-Lsum comes from ``rouge-score``, the library under
  Hugging Face ``evaluate``'s ``rouge`` that the official code calls. The released files hold every answer
  in a list (``["71432"]``, ``[[4, 2]]`` for Math.Calc); each scorer takes its label's first item as
  ``get_score_one_passkey`` does, Retrieve.KV's included: the released ``get_score_one_kv_retrieval`` tests
  the list itself against the words and scores every row 0 (fixed so in InfiniteBench's pull request 23
  and the forks that run it, MInference's and InfLLM's). A number written as a string (files converted from
  the Hub's string-typed columns) is read as the number.

Methods that read a window's worth (``truncate``) keep the start and the end, the official middle
truncation (``truncate_input(..., manner="middle")``).

``infinitebench_synthetic.generate`` writes the six synthetic tasks by the official recipes, so a user
without the download can run them at any length.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..rows import Row
from .common import (BenchmarkFileError, json_lines, normalize_answer, normalize_zh_answer, split_at_context, spread,
                     token_count, token_f1)

TASKS = ("passkey", "number_string", "kv_retrieval", "longbook_sum_eng", "longbook_choice_eng", "longbook_qa_eng",
         "longbook_qa_chn", "longdialogue_qa_eng", "math_find", "math_calc", "code_run", "code_debug")
PAPER_TASKS = tuple(t for t in TASKS if t not in ("math_calc", "code_run"))       # REFORM Table 3

# src/eval_utils.py, DATA_NAME_TO_MAX_NEW_TOKENS
MAX_NEW_TOKENS = {"passkey": 6, "number_string": 12, "kv_retrieval": 50, "longbook_sum_eng": 1200,
                  "longbook_choice_eng": 40, "longbook_qa_eng": 40, "longbook_qa_chn": 40,
                  "longdialogue_qa_eng": 40, "math_find": 3, "math_calc": 30000, "code_run": 5, "code_debug": 5}

# src/prompt.py, yarn_mistral_templates, verbatim
TEMPLATES = {
    "passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information.\n\n{context}\n\n{input}\n\nThe pass key is",  # noqa: E501
    "number_string": "There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz you about the important information there.\n\n{context}\n\n{input}\n\nThe sequence of digits is",  # noqa: E501
    "kv_retrieval": "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}\n\n{input}",  # noqa: E501
    "longbook_sum_eng": "Summarize the book below.\n\n{context}\n\nSummary:",
    "longbook_choice_eng": "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe letter of the correct answer is",  # noqa: E501
    "longbook_qa_eng": "Read the book and answer the question. Be very concise in your answer.\n\n{context}\n\nQuestion: {question}\nAnswer:",  # noqa: E501
    "longbook_qa_chn": "阅读以下书籍然后回答问题。\n\n{context}\n\n问题：{question}\n答案：",
    "math_find": "{prefix}\n\n{context}\n\n{input}",
    "math_calc": "Let us calculate the intermediate values of an expression.\n\nExpression: 1 + 3 + 4\nValues: [1, 4, 8]\n\nExpression: 8 - 3 + 2 - 4\nValues: [8, 5, 7, 3]\n\nExpression: {context}\nValues:",  # noqa: E501
    "code_run": "There is a function called {func} in the following Python code.\n\n{context}\n\nPlease compute the exact value of {func_call}. The value of {func_call} is",  # noqa: E501
    "code_debug": "Following is a Python code where exactly one of the functions/methods has a deliberate error that makes it crash.\n\n{context}\n\nOptions:\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe correct option is:",  # noqa: E501
    "longdialogue_qa_eng": "Below is a dialogue script where one random occurrence of a character name is replaced with \"$$MASK$$\", and you should try to guess who that character is.\n\n{context}\n\nThe name that has been replaced with $$MASK$$ is likely",  # noqa: E501
}


# ------------------------------------------------------------------ prompts (src/eval_utils.py, create_prompt)
def prompt_fields(example: dict, task: str) -> dict:
    """The template's fields for ``example``, filled as ``create_prompt`` fills them."""
    fields = {"context": example["context"]}
    options = example.get("options") or []
    if task in ("longbook_choice_eng", "code_debug"):
        if len(options) < 4:
            raise ValueError(f"{task} needs four 'options', got {len(options)}")
        fields.update({f"OPTION_{letter}": options[i] for i, letter in enumerate("ABCD")})
    if task in ("longbook_choice_eng", "longbook_qa_eng", "longbook_qa_chn"):
        fields["question"] = example["input"]
    elif task == "code_run":
        calls = re.findall(r"func_[0-9]+\(\-?[0-9]+\)", example["input"])
        if not calls:
            raise ValueError("code_run's 'input' names no call like func_12(3)")
        fields.update(func_call=calls[0], func=calls[0].split("(")[0])
    elif task == "math_find":
        found = re.findall(r"The .+ of", example["input"])
        if not found:
            raise ValueError("math_find's 'input' names no target ('The ... of')")
        fields.update(prefix=f"What is {found[0].lower()[:-3]} in the following list?", input=example["input"])
    else:
        fields["input"] = example["input"]
    return fields


def official_prompt(example: dict, task: str) -> str:
    return TEMPLATES[task].format(**prompt_fields(example, task))


def split_prompt(example: dict, task: str) -> tuple[str, str, str]:
    """``(context, question, answer_prefix)``: the official prompt cut where its context ends, and the rest's
    last line taken as the answer prefix when a question remains before it. Their concatenation is
    ``official_prompt``."""
    fields = prompt_fields(example, task)
    before, after = TEMPLATES[task].split("{context}")
    return split_at_context(before.format(**fields), fields["context"], after.format(**fields))


def official_label(example: dict, task: str):
    """``get_answer``: the option text and its letter for the two multiple-choice tasks, else the answer."""
    answer = example["answer"]
    if task not in ("code_debug", "longbook_choice_eng"):
        return answer
    options = example.get("options") or []
    if isinstance(answer, list) and len(answer) == 2 and answer[1] in ("A", "B", "C", "D"):
        return answer
    text = answer[0] if isinstance(answer, list) and len(answer) == 1 else answer
    if not isinstance(text, str) or text not in options[:4]:
        raise ValueError(f"the answer {answer!r} is not one of the four options")
    return [text, "ABCD"[options.index(text)]]


# ------------------------------------------------------------------ scorers (src/compute_scores.py)
def as_list(label) -> list:
    return label if isinstance(label, list) else [label]


def first(label):
    """``if isinstance(label, list): label = label[0]``, the official scorers' first line."""
    return label[0] if isinstance(label, list) and label else label


def as_number(label) -> int | float:
    """A numeric label as the number it names; ``"42"`` and ``"4.5"`` as 42 and 4.5."""
    if isinstance(label, str):
        try:
            return int(label)
        except ValueError:
            try:
                return float(label)
            except ValueError:
                pass
    if isinstance(label, bool) or not isinstance(label, (int, float)):
        raise TypeError(f"the label must be a number, got {label!r}")
    return label


def qa_f1(pred: str, label) -> float:
    """En.QA: the best token F1 over the gold answers, after SQuAD's normalisation."""
    return max(token_f1(normalize_answer(pred).split(), normalize_answer(g).split()) for g in as_list(label))


def qa_f1_zh(pred: str, label) -> float:
    """Zh.QA: the best character F1 over the gold answers."""
    return max(token_f1(list(normalize_zh_answer(pred)), list(normalize_zh_answer(g))) for g in as_list(label))


def first_int(pred: str) -> str:
    return next((item for item in re.split("[^0-9]", pred) if item), "")


def words_after(pred: str, chars: str) -> list[str]:
    for c in chars:
        pred = pred.replace(c, " ")
    return pred.split()


def score_digits(pred: str, label) -> float:
    """passkey and number_string: the prediction's first run of digits is the label."""
    return float(str(first(label)) == first_int(pred))


def score_kv(pred: str, label) -> float:
    return float(str(first(label)) in words_after(pred, "\n:\"'.,?!{}"))


def score_code_run(pred: str, label) -> float:
    words = words_after(pred.strip(), "\n.`'\":")
    try:
        return float(bool(words) and as_number(first(label)) == int(words[-1]))
    except ValueError:
        return 0.0


def squeezed(pred: str, chars) -> str:
    """``chars`` (strings) replaced by spaces, runs of spaces made one."""
    for c in chars:
        pred = pred.replace(c, " ")
    while "  " in pred:
        pred = pred.replace("  ", " ")
    return pred


def after_phrase(pred: str, phrases) -> str | None:
    """The text one character past the first of ``phrases`` that occurs (tried in order), "" when the
    prediction ends there, None when none occurs: the answer-phrase rule of the two choice scorers."""
    for phrase in phrases:
        at = pred.find(phrase)
        if at != -1:
            return pred[at + len(phrase) + 1:]
    return None


def score_code_debug(pred: str, label) -> float:
    pred, (fn_name, letter) = pred.strip(), label
    if pred[:2] in (f"{letter}.", f"{letter}:"):
        return 1.0
    rest = after_phrase(squeezed(pred, ("\n", "`", "'", '"', "-", "*", "Option", "option")),
                        ("answer is:", "is:", "answer:", "correct option is:"))
    return float(bool(rest) and rest.startswith((letter, fn_name)))


def score_math_find(pred: str, label) -> float:
    label = as_number(first(label))
    found = re.search(r"\d+\.\d+|\d+", pred)
    if found is None:
        return 0.0
    if isinstance(label, int):       # the official int("4.5") raises on such a prediction: it scores 0 here
        return float("." not in found.group(0) and int(found.group(0)) == label)
    return float(float(found.group(0)) == label)


def score_dialogue(pred: str, label) -> float:
    return float(first(label) in [w.upper() for w in words_after(pred.strip(), "\n:\"'.,?!{}")])


def score_choice(pred: str, label) -> float:
    """En.MC: the first letter, else a letter after an answer phrase, else the first lone A-D word."""
    pred = pred.strip()
    if pred == "":
        return 0.0
    if pred[0] in "ABCD":
        return float(pred[0] in label)
    if pred in label:
        return 1.0
    pred = squeezed(pred, ("\n", '"', "'", ".", ",", "?", "!", "{", "}"))
    rest = after_phrase(pred, ("answer is:", "answer:", "answer is", "option is"))
    if rest is not None:
        return float(bool(rest) and any(rest.startswith(s) for s in label))
    return next((float(w in label) for w in pred.split() if w in "ABCD"), 0.0)


def score_sum(pred: str, label) -> float:
    """En.Sum: ROUGE-Lsum F1 (``evaluate``'s ``rouge``: rouge-score, no stemmer), the best gold summary."""
    from rouge_score import rouge_scorer
    scorer = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=False)
    return max(scorer.score(g, pred)["rougeLsum"].fmeasure for g in as_list(label))


def calc_values(label) -> list[int]:
    """Math.Calc's intermediate values, from ``[[4, 2]]`` as the released files nest them or ``[4, 2]``."""
    return label[0] if label and isinstance(label[0], list) else label


def score_math_calc(pred: str, label) -> float:
    """Math.Calc: the share of intermediate values right before the first wrong one (a non-GPT-4 model)."""
    label = calc_values(label)
    numbers = [int(item) for item in re.split("[^0-9]", pred) if item]
    right = 0
    for want, got in zip(label, numbers):
        if want != got:
            break
        right += 1
    return right / len(label)


SCORERS = {"passkey": score_digits, "number_string": score_digits, "kv_retrieval": score_kv,
           "code_run": score_code_run, "code_debug": score_code_debug, "math_find": score_math_find,
           "math_calc": score_math_calc, "longdialogue_qa_eng": score_dialogue, "longbook_choice_eng": score_choice,
           "longbook_qa_eng": qa_f1, "longbook_qa_chn": qa_f1_zh, "longbook_sum_eng": score_sum}


def score(task: str, prediction: str, label) -> float:
    """The official score of ``prediction`` on ``task`` (``get_score_one``), 0..1."""
    return float(SCORERS[task](prediction, label))


# ------------------------------------------------------------------ rows
def evidence(example: dict, task: str, label) -> list[str]:
    """What a gather must hold for the answer: the needle's sentence, the key's JSON pair or the right
    option's text; elsewhere the answers themselves (checked only where they occur once)."""
    context = example["context"]
    if task in ("passkey", "number_string"):
        line = next((ln for ln in context.split("\n") if str(first(label)) in ln), "")
        return [line] if line else []
    if task == "kv_retrieval":
        key = re.search(r'Key: "([^"]+)"', example["input"])
        return [f'"{key.group(1)}": "{first(label)}"'] if key else []
    if task in ("code_debug", "longbook_choice_eng"):
        return [label[0]]
    return []


def as_answers(label, task: str) -> list[str]:
    if task == "math_calc":
        return [", ".join(map(str, calc_values(label)))]     # the intermediate values as one answer
    return [str(x) for x in as_list(label)] or [""]


def read_examples(path: Path) -> list[dict]:
    examples = []
    for number, example in json_lines(path, "examples"):
        missing = [k for k in ("context", "input", "answer") if not isinstance(example, dict) or k not in example]
        if missing:
            raise BenchmarkFileError(f"{path} line {number}: missing {', '.join(missing)}")
        examples.append({"id": number - 1, **example})
    return examples


def check_tasks(tasks: list[str] | None) -> list[str]:
    chosen = list(PAPER_TASKS) if not tasks else tasks
    unknown = [t for t in chosen if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown ∞-Bench task(s) {', '.join(unknown)}; choose from {', '.join(TASKS)}")
    return chosen


def load_rows(data_dir: str | Path, tokenizer, tasks: list[str] | None = None, samples: int | None = None) -> list[Row]:
    """Rows of the official files in ``data_dir`` (``TASK.jsonl``), ``samples`` per task spread evenly; each
    row's length is its context's token count under ``tokenizer``."""
    data_dir, chosen = Path(data_dir), check_tasks(tasks)
    missing = [f"{t}.jsonl" for t in chosen if not (data_dir / f"{t}.jsonl").is_file()]
    if missing:
        raise BenchmarkFileError(f"{data_dir} lacks {', '.join(missing)} (the official file names; pick others "
                                 "with --tasks)")
    rows = []
    for task in chosen:
        path = data_dir / f"{task}.jsonl"
        examples = read_examples(path)
        for i in spread(len(examples), samples):
            example = examples[i]
            try:
                label = official_label(example, task)
                context, question, prefix = split_prompt(example, task)
            except (ValueError, KeyError, TypeError) as e:
                raise BenchmarkFileError(f"{path} example {example['id']}: {e}") from None
            rows.append(Row(context=context, question=question, answers=as_answers(label, task),
                            task=f"infinitebench/{task}", length=token_count(tokenizer, context), answer_prefix=prefix,
                            max_new_tokens=MAX_NEW_TOKENS[task], sample=i, layout="verbatim",
                            meta={"metric": "infinitebench", "label": label, "id": example["id"],
                                  "evidence": evidence(example, task, label)}))
    return rows
