"""RepoEval (Zhang et al., 2023, "RepoCoder"), REFORM's Table 4: repository-level code completion at line and
API level, scored by edit similarity (ES) and exact match (EM).

* **Official records**: RepoEval's ``.jsonl`` files, one completion task a line: ``prompt`` (the target
  file's left context) and ``metadata`` with ``task_id`` (``repo/N``), ``ground_truth``, ``fpath_tuple``
  (the file's path, the repository folder first), ``line_no`` (0-based, the first line to complete) and
  ``context_start_lineno`` (where ``prompt`` starts in the file). The repositories are the folders of
  RepoCoder's ``repositories/line_and_api_level.zip``, under ``--repos``.
* **The context** is the repository as a reader would hand it over: every other ``.py`` file of the
  repository with a ``# file: PATH`` header, sorted by path, then the target file's lines before the
  prompt's start. RepoCoder's leakage rule holds: nothing of the target file at or after ``line_no``. The
  question is the official ``prompt``, asked as a continuation (``Row.layout``): no turn closed, no label,
  the answer continues the code.
* **The metrics** are ``compute_score.py``'s, exactly: lines stripped, empty lines dropped, the prediction cut
  to as many lines as the target; EM is equality of those lines, ES is ``1 - editdistance / max(len)`` with
  the ``editdistance`` package RepoCoder uses. Records carry ``es`` and ``em``; ``score`` is ES.

``from_repo`` builds a RepoEval-style suite from any local Python repository, deterministically by seed:
line level takes non-trivial lines, API level takes statements that call a function or class defined in
another file of the repository (RepoEval's definition), found with ``ast``.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

from ..rows import Row
from .common import BenchmarkFileError, json_lines, spread, token_count

LEVELS = ("line", "api")
MAX_NEW_TOKENS = 64           # a line or one API call statement
PROMPT_CHARS = 6000           # the in-file left context asked as the question: about 1.5-2k tokens


# ------------------------------------------------------------------ metrics (RepoCoder compute_score.py)
def code_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def exact_match(target: str, prediction: str) -> float:
    want = code_lines(target)
    return float(code_lines(prediction)[:len(want)] == want)


def edit_similarity(target: str, prediction: str) -> float:
    import editdistance
    want = "\n".join(code_lines(target))
    got = "\n".join(code_lines(prediction)[:len(code_lines(target))])
    longest = max(len(want), len(got))
    return 1 - editdistance.eval(want, got) / longest if longest else 1.0


# ------------------------------------------------------------------ repositories
def repository_files(root: Path) -> dict[str, str]:
    """Every ``.py`` file under ``root`` by its path relative to ``root`` (RepoCoder's ``iterate_repository``),
    files that do not read as UTF-8 left out as RepoCoder leaves them."""
    files = {}
    for path in sorted(root.rglob("*.py")):
        if path.is_file():
            try:
                files[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
    return files


def repository_context(files: dict[str, str], target: str, head: str) -> str:
    """The other files with path headers, sorted, then the target file's ``head`` (its lines before the
    question) last."""
    parts = [f"# file: {path}\n{code}" for path, code in sorted(files.items()) if path != target]
    return "\n\n".join(parts + [f"# file: {target}\n{head}"])


def nearest_files(files: dict[str, str], target: str, tokens: dict[str, int], max_length: int,
                  head_tokens: int = 0) -> dict[str, str]:
    """The other files nearest the target in the folder tree (most path components in common, then by
    path) while their tokens and the target's ``head_tokens`` (its lines in the context) fit
    ``max_length``: a repository larger than the context a run can afford is cut by distance from the file
    being completed, never by what the answer needs. (Counting the target's whole file instead left
    contexts far below the cap beside a large target: 21k tokens of a 32k cap.)"""
    def shared(path: str) -> int:
        common = 0
        for a, b in zip(path.split("/")[:-1], target.split("/")[:-1]):
            if a != b:
                break
            common += 1
        return common
    kept, used = {}, head_tokens
    for path in sorted((p for p in files if p != target), key=lambda p: (-shared(p), p)):
        if used + tokens[path] > max_length:
            continue
        kept[path], used = files[path], used + tokens[path]
    return {**kept, target: files[target]}


def file_tokens(files: dict[str, str], tokenizer) -> dict[str, int]:
    return {path: token_count(tokenizer, code) for path, code in files.items()}


def task_row(task: dict, files: dict[str, str], level: str, sample: int, tokenizer,
             max_length: int | None = None, tokens: dict[str, int] | None = None) -> Row:
    """One completion task (RepoEval's record) as a row over its repository's files (the nearest of them
    within ``max_length`` tokens when given)."""
    meta = task["metadata"]
    target = "/".join(meta["fpath_tuple"][1:])
    if target not in files:
        raise ValueError(f"its file {target} is not in the repository folder")
    lines = files[target].splitlines()
    start, line_no = int(meta["context_start_lineno"]), int(meta["line_no"])
    if not 0 <= start <= line_no <= len(lines):
        raise ValueError(f"line_no {line_no} and context_start_lineno {start} do not fit {target} "
                         f"({len(lines)} lines)")
    head = "\n".join(lines[:start]) + ("\n" if start else "")
    if max_length is not None:
        files = nearest_files(files, target, tokens or file_tokens(files, tokenizer), max_length,
                              token_count(tokenizer, head))
    context = repository_context(files, target, head)
    prompt = task["prompt"]
    if not prompt.strip():
        raise ValueError("its prompt is empty")
    return Row(context=context, question=prompt, answers=[meta["ground_truth"]],
               task=f"repoeval/{level}", length=token_count(tokenizer, context),
               max_new_tokens=MAX_NEW_TOKENS, sample=sample, layout="continuation",
               meta={"metric": "repoeval", "task_id": meta["task_id"], "file": target, "line_no": line_no,
                     "evidence": []})


def read_tasks(path: Path) -> list[dict]:
    tasks = []
    for number, task in json_lines(path, "tasks"):
        meta = task.get("metadata") if isinstance(task, dict) else None
        need = ("task_id", "ground_truth", "fpath_tuple", "line_no", "context_start_lineno")
        if not isinstance(task.get("prompt") if isinstance(task, dict) else None, str) or not isinstance(meta, dict) \
                or any(k not in meta for k in need):
            raise BenchmarkFileError(f"{path} line {number}: a RepoEval task needs 'prompt' and 'metadata' with "
                                     f"{', '.join(need)}")
        tasks.append({**task, "line": number})
    return tasks


def load_rows(path: str | Path, repos: str | Path, tokenizer, samples: int | None = None,
              max_length: int | None = None) -> list[Row]:
    """Rows of an official RepoEval file over the repositories in ``repos``; ``samples`` spread evenly; each
    context within ``max_length`` tokens when given (``nearest_files``)."""
    path, repos = Path(path), Path(repos)
    tasks = read_tasks(path)
    level = "api" if "api" in path.name else "line"
    cache: dict[str, tuple[dict[str, str], dict[str, int] | None]] = {}
    rows = []
    for i in spread(len(tasks), samples):
        task = tasks[i]
        repo = task["metadata"]["task_id"].split("/")[0]
        if repo not in cache:
            if not (repos / repo).is_dir():
                raise BenchmarkFileError(f"{path} line {task['line']}: repository folder {repos / repo} not found")
            files = repository_files(repos / repo)
            cache[repo] = files, file_tokens(files, tokenizer) if max_length is not None else None
        try:
            rows.append(task_row(task, cache[repo][0], level, i, tokenizer, max_length, cache[repo][1]))
        except ValueError as e:
            raise BenchmarkFileError(f"{path} line {task['line']}: {e}") from None
    return rows


# ------------------------------------------------------------------ a RepoEval-style suite from a local repository
TRIVIAL = {"else:", "try:", "finally:", "pass", "return", "break", "continue", "}", "]", ")", "):", "},", "],",
           "),", '"""', "'''"}


def is_trivial(line: str) -> bool:
    s = line.strip()
    return len(s) < 8 or s in TRIVIAL or s.startswith(("#", "@", "import ", "from ", '"""', "'''"))


def defined_names(code: str) -> set[str]:
    """The functions and classes a file defines at its top level or in its classes."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return set()
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def called_name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def api_statements(code: str, elsewhere: set[str]) -> list[tuple[int, int]]:
    """``(first, last)`` 0-based lines of simple statements that call a name defined only in another file."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    own, found = defined_names(code), []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.Return)) \
                and node.end_lineno is not None and node.end_lineno - node.lineno < 4:
            names = {called_name(c) for c in ast.walk(node) if isinstance(c, ast.Call)}
            if any(n and n in elsewhere and n not in own for n in names):
                found.append((node.lineno - 1, node.end_lineno - 1))
    return sorted(set(found))


def candidates(files: dict[str, str], level: str) -> list[tuple[str, int, int]]:
    """``(file, first line, last line)`` of every completion target of ``level`` in the repository."""
    out = []
    if level == "api":
        defined = {path: defined_names(code) for path, code in files.items()}
        for path, code in files.items():
            elsewhere = set().union(*(names for other, names in defined.items() if other != path))
            out += [(path, a, b) for a, b in api_statements(code, elsewhere) if a >= 10]
    else:
        for path, code in files.items():
            lines, prose = code.splitlines(), docstring_lines(code)
            out += [(path, i, i) for i in range(10, len(lines)) if not is_trivial(lines[i]) and i not in prose]
    return out


def docstring_lines(code: str) -> set[int]:
    """0-based lines inside string statements (docstrings): prose, not code to complete."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return set(range(len(code.splitlines())))       # not Python we can read: no line of it is taken
    return {line for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for line in range(node.lineno - 1, (node.end_lineno or node.lineno))}


def from_repo(root: str | Path, level: str, samples: int, seed: int = 0) -> list[dict]:
    """RepoEval-format tasks drawn from the repository at ``root`` (``samples`` of them, by ``seed``): the
    target lines, the in-file left context of at most ``PROMPT_CHARS`` characters as the prompt."""
    root = Path(root)
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    if not root.is_dir():
        raise ValueError(f"repository folder not found: {root}")
    files = repository_files(root)
    if len(files) < 2:
        raise ValueError(f"{root} holds {len(files)} Python file(s); a repository needs at least two")
    found = candidates(files, level)
    if not found:
        raise ValueError(f"{root} has no {level}-level completion targets")
    picked = sorted(random.Random(f"{seed}-{level}").sample(found, min(samples, len(found))))
    tasks = []
    for n, (path, first, last) in enumerate(picked):
        lines = files[path].splitlines()
        start, size = first, 0
        while start > 0 and size + len(lines[start - 1]) + 1 <= PROMPT_CHARS:
            start -= 1
            size += len(lines[start]) + 1
        tasks.append({"prompt": "\n".join(lines[start:first]) + "\n",
                      "metadata": {"task_id": f"{root.name}/{n}", "ground_truth": "\n".join(lines[first:last + 1]),
                                   "fpath_tuple": [root.name, *path.split("/")], "line_no": first,
                                   "context_start_lineno": start}})
    return tasks


def repo_rows(root: str | Path, level: str, samples: int, seed: int, tokenizer, max_length: int | None = None) -> list[Row]:
    """``from_repo``'s tasks as rows, each repository context within ``max_length`` tokens when given."""
    root = Path(root)
    files = repository_files(root)
    tokens = file_tokens(files, tokenizer) if max_length is not None else None
    return [task_row(task, files, level, i, tokenizer, max_length, tokens)
            for i, task in enumerate(from_repo(root, level, samples, seed))]
