"""Make the document fixtures of tests/test_documents.py with the real tools users' files come from:
the book as HTML (written here), printed to PDF by Debian's Chromium (``--print-to-pdf``: its running
header and footer on every page), written as DOCX by python-docx, and packed as an EPUB by the spec
(mimetype first and stored, META-INF/container.xml, an OPF whose spine orders the chapters).

    python tests/data/documents/make.py          # needs chromium on the PATH and python-docx

The office files of tests/test_documents_office.py are made at test time by LibreOffice (``make_workbook``,
``make_deck``), and the scans of tests/test_documents_ocr.py from the Debian Reference's PDF (``make_scan``).
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHAPTERS = [
    ("1. The lighthouse keeper", [
        "Maren Alvesund kept the lighthouse at Skarvhella for thirty-one winters.",
        "Every evening she wound the clockwork that turned the lens, a Fresnel lens of the second order "
        "made in Paris in 1887.",
        "The supply boat came on the first Tuesday of each month and brought paraffin, flour and letters.",
    ]),
    ("2. The storm of 1923", [
        "In the storm of November 1923 the steamer Vigdis lost her rudder south of the reef.",
        "Maren rowed out twice in the keeper's boat and brought eleven sailors to the rocks below the tower.",
        "The harbour master of Bodø later gave her a silver medal engraved with the number 11.",
    ]),
    ("3. The last light", [
        "The lighthouse was automated in 1958, and the keeper's house was closed that spring.",
        "The old lens now stands in the maritime museum in Trondheim, in the second hall on the left.",
        "Maren's logbooks, forty-two volumes, were given to the county archive by her nephew Einar.",
    ]),
]
FILLER = ("The sea around the islands was grey in winter and green in summer, and the wind rarely rested. "
          "Gulls nested on the ledges below the gallery, and the fog horn sounded in every thick weather. ")


def html() -> str:
    body = []
    for i, (title, facts) in enumerate(CHAPTERS):
        brk = ' style="break-before: page"' if i else ""
        paras = "".join(f"<p>{FILLER * 3}</p><p>{fact}</p>" for fact in facts)
        body.append(f"<section{brk}><h2>{title}</h2>{paras}</section>")
    return ("<!DOCTYPE html><html><head><title>The Keeper of Skarvhella</title><style>body{font:12pt serif}"
            "</style><script>var tracking = 'not content';</script></head><body>"
            "<nav class='navheader'><a href='#'>Home</a> | <a href='#'>Next chapter</a></nav>"
            "<main><h1>The Keeper of Skarvhella</h1>" + "".join(body) + "</main>"
            "<div class='navfooter'>Copyright notice and site navigation</div></body></html>")


def make_pdf(source: Path, out: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={HERE / '.chromium'}", f"--print-to-pdf={out}", source.as_uri()],
                   check=True, capture_output=True)
    shutil.rmtree(HERE / ".chromium", ignore_errors=True)


def make_docx(out: Path) -> None:
    from docx import Document
    doc = Document()
    doc.add_heading("The Keeper of Skarvhella", 0)
    for title, facts in CHAPTERS:
        doc.add_heading(title, 1)
        for fact in facts:
            doc.add_paragraph(FILLER)
            doc.add_paragraph(fact)
    table = doc.add_table(rows=3, cols=2)
    for row, (a, b) in zip(table.rows, [("Year", "Event"), ("1887", "Lens made in Paris"), ("1958", "Automated")]):
        row.cells[0].text, row.cells[1].text = a, b
    doc.save(out)


def make_epub(out: Path) -> None:
    chapters = [(f"ch{i + 1}.xhtml", title, facts) for i, (title, facts) in enumerate(CHAPTERS)]
    with zipfile.ZipFile(out, "w") as z:
        z.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml", '<?xml version="1.0"?><container version="1.0" '
                   'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles><rootfile '
                   'full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles></container>')
        # the manifest lists the chapters backwards; the spine says the reading order
        items = "".join(f'<item id="c{i}" href="text/{name}" media-type="application/xhtml+xml"/>'
                        for i, (name, _, _) in reversed(list(enumerate(chapters))))
        spine = "".join(f'<itemref idref="c{i}"/>' for i in range(len(chapters)))
        z.writestr("OEBPS/content.opf", '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" '
                   'version="3.0" unique-identifier="id"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/">'
                   '<dc:identifier id="id">skarvhella</dc:identifier><dc:title>The Keeper of Skarvhella</dc:title>'
                   f'<dc:language>en</dc:language></metadata><manifest>{items}</manifest><spine>{spine}</spine></package>')
        for name, title, facts in chapters:
            paras = "".join(f"<p>{FILLER}</p><p>{fact}</p>" for fact in facts)
            z.writestr(f"OEBPS/text/{name}", '<?xml version="1.0" encoding="utf-8"?><html '
                       f'xmlns="http://www.w3.org/1999/xhtml"><head><title>{title}</title></head><body>'
                       f"<h2>{title}</h2>{paras}</body></html>")


def zipped(members: dict[str, bytes]) -> bytes:
    """A zip of ``members`` (name -> bytes), deflated: the shape of hostile office files."""
    import io
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def medal_workbook() -> bytes:
    """A workbook written by openpyxl: 60 rows of lights on one sheet, the book's medal on a second."""
    import io

    from openpyxl import Workbook
    book = Workbook()
    book.active.title = "Lights"
    for i in range(60):
        book.active.append([f"Light {i}", f"Keeper {i}", 1900 + i])
    medals = book.create_sheet("Medals")
    medals.append(["year", "medal"])
    medals.append([1923, "A silver medal engraved with the number 11"])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def soffice_convert(source: Path, out_dir: Path, target: str, *filters: str) -> Path:
    """``source`` converted by headless LibreOffice into ``out_dir`` as ``target`` (xlsx, pptx...)."""
    soffice = shutil.which("soffice") or shutil.which("libreoffice")
    out_dir = out_dir.resolve()
    profile = out_dir / ".libreoffice"
    subprocess.run([soffice, f"-env:UserInstallation={profile.as_uri()}", "--headless", *filters,
                    "--convert-to", target, "--outdir", str(out_dir), str(source)], check=True, capture_output=True,
                   timeout=300)
    shutil.rmtree(profile, ignore_errors=True)
    return out_dir / f"{source.stem}.{target}"


RELEASES = Path("/usr/share/distro-info")      # Debian's distro-info-data: debian.csv and ubuntu.csv (ISC)


def make_workbook(out_dir: Path) -> Path:
    """releases.xlsx written by LibreOffice: a sheet per CSV of distro-info-data (dates as dates), and a
    formula column, ``days supported`` = eol - release, whose values LibreOffice computes and caches."""
    import csv
    from xml.sax.saxutils import escape
    ns = " ".join(f'xmlns:{k}="urn:oasis:names:tc:opendocument:xmlns:{v}"' for k, v in [
        ("office", "office:1.0"), ("table", "table:1.0"), ("text", "text:1.0"), ("of", "of:1.2"),
        ("number", "datastyle:1.0"), ("style", "style:1.0")])
    styles = ('<office:automatic-styles><number:date-style style:name="N1"><number:year number:style="long"/>'
              '<number:text>-</number:text><number:month number:style="long"/><number:text>-</number:text>'
              '<number:day number:style="long"/></number:date-style><style:style style:name="date" '
              'style:family="table-cell" style:data-style-name="N1"/></office:automatic-styles>')

    def cell(value: str) -> str:
        if len(value) == 10 and value[4] == value[7] == "-":
            return (f'<table:table-cell table:style-name="date" office:value-type="date" office:date-value="{value}">'
                    f"<text:p>{value}</text:p></table:table-cell>")
        return f'<table:table-cell office:value-type="string"><text:p>{escape(value)}</text:p></table:table-cell>'
    sheets = []
    for name in ("debian", "ubuntu"):
        rows = []
        for r, row in enumerate(csv.reader((RELEASES / f"{name}.csv").open()), start=1):
            cells = "".join(cell(v) for v in row[:6])
            if r == 1:
                cells += cell("days supported")
            elif len(row) > 5 and row[4] and row[5]:
                cells += f'<table:table-cell table:formula="of:=[.F{r}]-[.E{r}]" office:value-type="float"/>'
            rows.append(f"<table:table-row>{cells}</table:table-row>")
        sheets.append(f'<table:table table:name="{name}">{"".join(rows)}</table:table>')
    source = out_dir / "releases.fods"
    source.write_text(f'<?xml version="1.0" encoding="UTF-8"?><office:document {ns} office:version="1.2" '
                      'office:mimetype="application/vnd.oasis.opendocument.spreadsheet">' + styles +
                      f'<office:body><office:spreadsheet>{"".join(sheets)}</office:spreadsheet></office:body>'
                      '</office:document>')
    return soffice_convert(source, out_dir, "xlsx")


def make_deck(out_dir: Path) -> Path:
    """book.pptx: the book's PDF imported by LibreOffice Impress, one slide per page."""
    shutil.copy(HERE / "book.pdf", out_dir / "book.pdf")
    return soffice_convert(out_dir / "book.pdf", out_dir, "pptx", "--infilter=impress_pdf_import")


def make_scan(source: Path, pages: list[int], out: Path, dpi: int = 150) -> Path:
    """``pages`` (1-based) of the PDF ``source`` rendered to images (pypdfium2) and wrapped back as a PDF
    with no text layer, as a scanner writes one."""
    import pypdfium2 as pdfium
    pdf = pdfium.PdfDocument(str(source))
    images = [pdf[p - 1].render(scale=dpi / 72).to_pil().convert("RGB") for p in pages]
    images[0].save(out, "PDF", resolution=dpi, save_all=True, append_images=images[1:])
    pdf.close()
    return out


if __name__ == "__main__":
    (HERE / "book.html").write_text(html())
    make_pdf(HERE / "book.html", HERE / "book.pdf")
    make_docx(HERE / "book.docx")
    make_epub(HERE / "book.epub")
    for p in sorted(HERE.glob("book.*")):
        print(p.name, p.stat().st_size)
