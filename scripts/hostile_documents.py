"""Hostile documents against a real `reform serve` (default model, a fresh store) over loopback: each is
uploaded to /v1/contexts as a multipart file; the table records the status and error the server answers,
the server's peak resident memory during that upload over its idle resident memory (the peak is reset
before each upload through /proc/PID/clear_refs), and whether a chat is still answered afterwards.

    python scripts/hostile_documents.py --out docs/results/documents-hostile

The files: a DOCX and an EPUB whose members unpack to 1 GiB of zeros (1 MB on disk), a PDF cut in the
middle, a PDF encrypted with a password, a blank image-only PDF (a scan), a PDF of 10,000 pages, HTML
holding 5 MB of scripts and no text, a workbook declaring every cell of a sheet, a workbook of 68 MB of
shared strings, a deck of 10,000 slides, a 1-pixel-wide page image, a PDF of 5,000 image pages, a damaged
workbook and a PNG without text. The server runs with ``--ocr always``, so every page of every PDF is
one OCR would read.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import httpx

BOOK = Path(__file__).resolve().parents[1] / "tests" / "data" / "documents" / "book.pdf"
sys.path.insert(0, str(BOOK.parent))
from make import zipped  # noqa: E402  (tests/data/documents/make.py)


def bomb(member: str, mimetype: bytes | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        if mimetype:
            z.writestr(zipfile.ZipInfo("mimetype"), mimetype, compress_type=zipfile.ZIP_STORED)
        with z.open(member, "w", force_zip64=True) as f:
            zeros = b"\0" * (1 << 20)
            for _ in range(1024):
                f.write(zeros)
    return buf.getvalue()


def office_and_scans() -> list[tuple[str, bytes, str]]:
    from PIL import Image
    sheet = (b'<?xml version="1.0"?><worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
             b'<dimension ref="A1:XFD1048576"/><sheetData/></worksheet>')
    strings = b"<sst>" + b"<si><t>a</t></si>" * 4_000_000 + b"</sst>"
    slides = {f"ppt/slides/slide{i}.xml": b"<p:sld/>" for i in range(1, 10_001)}
    sliver = io.BytesIO()
    Image.new("RGB", (1, 4000), "white").save(sliver, "PNG")
    images = io.BytesIO()
    dot = Image.new("RGB", (8, 8), "black")
    dot.save(images, "PDF", save_all=True, append_images=[dot] * 4_999)
    return [("dimensions.xlsx", zipped({"xl/workbook.xml": b"<workbook/>", "xl/worksheets/sheet1.xml": sheet}),
             "a workbook whose sheet declares A1:XFD1048576"),
            ("shared-strings.xlsx", zipped({"xl/workbook.xml": b"<workbook/>", "xl/sharedStrings.xml": strings}),
             "a workbook of 4 million shared strings (68 MB unpacked)"),
            ("10000-slides.pptx", zipped({"ppt/presentation.xml": b"<p/>", **slides}), "a deck of 10,000 slides"),
            ("sliver.png", sliver.getvalue(), "a page image 1 pixel wide"),
            ("5000-images.pdf", images.getvalue(), "5,000 image pages (OCR always)")]


def files() -> list[tuple[str, bytes, str]]:
    from PIL import Image
    from pypdf import PdfWriter
    pdf = BOOK.read_bytes()
    locked = PdfWriter(clone_from=io.BytesIO(pdf))
    locked.encrypt(user_password="secret", owner_password="owner")
    locked_bytes = io.BytesIO()
    locked.write(locked_bytes)
    scan = io.BytesIO()
    Image.new("RGB", (1240, 1754), "white").save(scan, "PDF")
    huge = PdfWriter()
    for _ in range(10_000):
        huge.add_blank_page(width=595, height=842)
    huge_bytes = io.BytesIO()
    huge.write(huge_bytes)
    scripts = b"<html><head><script>" + b"var a = 1;" * 500_000 + b"</script></head><body><nav>menu</nav></body></html>"
    sheet = io.BytesIO()
    with zipfile.ZipFile(sheet, "w") as z:
        z.writestr("xl/workbook.xml", "<workbook/>")
    png = io.BytesIO()
    Image.new("RGB", (64, 64), "red").save(png, "PNG")
    return [("zip-bomb.docx", bomb("word/document.xml"), "a DOCX whose document.xml unpacks to 1 GiB"),
            ("zip-bomb.epub", bomb("OEBPS/chapter.xhtml", b"application/epub+zip"), "an EPUB whose chapter unpacks to 1 GiB"),
            ("truncated.pdf", pdf[: len(pdf) // 2], "the test book's PDF cut in half"),
            ("encrypted.pdf", locked_bytes.getvalue(), "the test book encrypted with a user password"),
            ("scan.pdf", scan.getvalue(), "an image-only PDF (a blank A4 scan)"),
            ("10000-pages.pdf", huge_bytes.getvalue(), "10,000 blank pages"),
            ("scripts.html", scripts, "5 MB of scripts and no text"),
            ("sheet.xlsx", sheet.getvalue(), "a workbook with no sheets"),
            ("photo.png", png.getvalue(), "an image without text"), *office_and_scans()]


def rss_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = tempfile.mkdtemp(prefix="reform-hostile-")
    server = subprocess.Popen([sys.executable, "-m", "reform", "serve", "--host", "127.0.0.1", "--port", str(port),
                               "--store", store, "--ocr", "always"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        chat = {"model": "reform", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]}
        httpx.post(url + "/v1/chat/completions", json=chat, timeout=300).raise_for_status()     # warm
        idle = rss_kb(server.pid, "VmRSS")
        rows = []
        for name, data, what in files():
            Path(f"/proc/{server.pid}/clear_refs").write_text("5")          # reset the peak (VmHWM)
            t = time.perf_counter()
            r = httpx.post(url + "/v1/contexts", files={"file": (name, data)}, timeout=600)
            seconds = time.perf_counter() - t
            peak = rss_kb(server.pid, "VmHWM")
            answered = httpx.post(url + "/v1/chat/completions", json=chat, timeout=300).status_code == 200
            error = r.json().get("error", {}).get("message") if r.status_code >= 400 else f"accepted: {r.text[:80]}"
            rows.append({"file": name, "what": what, "bytes": len(data), "status": r.status_code, "error": error,
                         "seconds": round(seconds, 2), "peak_over_idle_mb": round((peak - idle) / 1024, 1),
                         "server_answers_after": answered})
            print(json.dumps(rows[-1]), flush=True)
        (args.out / "results.json").write_text(json.dumps({"idle_rss_mb": round(idle / 1024, 1), "rows": rows,
                                                           "cpu": cpu()}, indent=1))
        lines = [f"Idle resident memory of the server: {idle / 1024:.0f} MB ({cpu()}).", "",
                 "| file | what | size | status | error | peak RSS over idle | answers after |",
                 "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| `{r['file']}` | {r['what']} | {r['bytes'] / 1e6:.2f} MB | {r['status']} | {r['error']} | "
                         f"{r['peak_over_idle_mb']:+.0f} MB | {'yes' if r['server_answers_after'] else 'NO'} |")
        (args.out / "results.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    finally:
        server.terminate()
        server.wait(30)


def cpu() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return "unknown CPU"


if __name__ == "__main__":
    main()
