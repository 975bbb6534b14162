"""Regenerate ``src/reform/data/prose.txt``, the built-in haystack prose, from the running Python's
``pydoc_data.topics`` (the help topics of the Python reference manual, PSF License).

The shipped file was made with CPython 3.11.7. Other Pythons ship other topics (3.12's differ in the
paragraphs six RULER tasks draw from), so eval rows are built from this frozen copy, never from the running
interpreter: the same command builds the same rows everywhere. Regenerating changes every stored row id.

    python scripts/make_prose.py > src/reform/data/prose.txt
"""

import re
import sys

from pydoc_data.topics import topics


def paragraphs() -> list[str]:
    paras = []
    for body in topics.values():
        for block in re.split(r"\n\s*\n", body):
            lines = [ln.strip() for ln in block.splitlines()]
            text = " ".join(ln for ln in lines if ln)
            # prose only: long enough, sentence punctuation, no code/table/markup lines
            if len(text) < 120 or not text.endswith(".") or any(
                    ln.startswith((">>>", "...", "+", "|", "=", "*", "-", "::")) for ln in lines) \
                    or text.count("(") > 4 or "**" in text:
                continue
            paras.append(text)
    return list(dict.fromkeys(paras))


if __name__ == "__main__":
    sys.stdout.write("\n\n".join(paragraphs()) + "\n")
