"""Can the small models read a table row when they are given only the right rows? The workbook questions of
docs/results/documents-office-ocr asked over six rows of the `ubuntu` sheet given directly (full attention,
no gather), as the Markdown table reform extracts (with and without its header) and as one record per row
(`column: value; ...`). Prints one line per model, layout and question.

    python scripts/labs/table_reading.py /tmp/e2e/releases.xlsx     # made by scripts/make_office_files.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from reform import Pipeline
from reform.documents import extract

QUESTIONS = [("Which Ubuntu version has the codename Trusty Tahr?", "14.04"),
             ("When was Ubuntu 14.04 LTS (Trusty Tahr) released?", "2014-04-17")]


def layouts(workbook: Path) -> dict[str, str]:
    lines = extract(workbook).text.split("## ubuntu", 1)[1].strip("\n").split("\n")
    header, rows = lines[:2], [line for line in lines[2:] if line.startswith(("| 12.", "| 13.", "| 14."))]
    columns = [c.strip() for c in header[0].strip("|").split("|")]
    records = ["; ".join(f"{c}: {v.strip()}" for c, v in zip(columns, row.strip("|").split("|"))) for row in rows]
    return {"rows": "\n".join(rows), "header and rows": "\n".join(["## ubuntu", *header, *rows]),
            "records": "\n".join(records)}


def main() -> None:
    contexts = layouts(Path(sys.argv[1]))
    for model in (None, "gemma-3-270m"):
        pipe = Pipeline.load(model, method="full")
        for layout, text in contexts.items():
            ctx = pipe.encode(text)
            for question, gold in QUESTIONS:
                answer = ctx.ask(question, max_new_tokens=24).text.replace("\n", " ")
                print(f"{pipe.model_name} | {layout} | {question} | {answer} | {'right' if gold in answer else 'wrong'}")


if __name__ == "__main__":
    main()
