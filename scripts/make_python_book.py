"""One long book from Python 3.11's documentation (Debian's python3.11-doc): the Tutorial, the Language
Reference, the FAQ, "Python Setup and Usage" and "Extending and Embedding", each chapter's HTML extracted by
reform's own HTML reader, in the order of each part's table of contents, joined into one text file.

    python scripts/make_python_book.py /tmp/python-book.txt
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HTML = Path("/usr/share/doc/python3.11/html")
PARTS = ("tutorial", "reference", "faq", "using", "extending")


def chapters(part: str) -> list[Path]:
    """The part's chapters in its table of contents' order."""
    index = (HTML / part / "index.html").read_text()
    names = dict.fromkeys(re.findall(r'href="([a-z_0-9-]+\.html)', index))
    return [HTML / part / n for n in names if (HTML / part / n).exists()]


def main() -> None:
    from reform.documents import extract
    out = Path(sys.argv[1])
    texts = [extract(path).text for part in PARTS for path in chapters(part)]
    out.write_text("\n\n".join(texts))
    print(f"{len(texts)} chapters, {sum(map(len, texts)):,} characters -> {out}")


if __name__ == "__main__":
    main()
