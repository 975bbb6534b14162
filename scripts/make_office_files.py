"""Real files of the kinds reform reads since it reads scans, spreadsheets and slides, made by real tools
from Debian's packages, for asking them end to end (docs/results/documents-office-ocr):

- ``scan.pdf``: pages 28-37 of the Debian Reference's PDF rendered to 150-dpi images (pypdfium2) and
  wrapped back as a PDF without a text layer;
- ``debian-ch1.pptx``: the same pages imported by LibreOffice Impress, one slide per page;
- ``releases.xlsx``: distro-info-data's debian.csv and ubuntu.csv as two sheets, written by LibreOffice
  Calc, with a formula column (days supported);
- ``countries.csv``: iso-codes' ISO 3166-1 countries written as a CSV in cp1252.

    python scripts/make_office_files.py OUT_DIR      # needs debian-reference-en, LibreOffice, distro-info-data, iso-codes
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data" / "documents"))
import make  # noqa: E402

DEBIAN_PDF = Path("/usr/share/debian-reference/debian-reference.en.pdf")
COUNTRIES = Path("/usr/share/iso-codes/json/iso_3166-1.json")
PAGES = range(28, 38)


def main() -> None:
    from pypdf import PdfReader, PdfWriter
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    make.make_scan(DEBIAN_PDF, list(PAGES), out / "scan.pdf")
    part = PdfWriter()
    reader = PdfReader(str(DEBIAN_PDF))
    for page in PAGES:
        part.add_page(reader.pages[page - 1])
    part.write(str(out / "debian-ch1.pdf"))
    make.soffice_convert(out / "debian-ch1.pdf", out, "pptx", "--infilter=impress_pdf_import")
    make.make_workbook(out)
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\r\n")
    writer.writerow(["alpha_2", "alpha_3", "numeric", "name", "official_name"])
    for c in json.loads(COUNTRIES.read_text())["3166-1"]:
        writer.writerow([c["alpha_2"], c["alpha_3"], c["numeric"], c["name"], c.get("official_name", "")])
    (out / "countries.csv").write_bytes(rows.getvalue().encode("cp1252", errors="replace"))
    for path in sorted(out.iterdir()):
        print(path.name, path.stat().st_size)


if __name__ == "__main__":
    main()
