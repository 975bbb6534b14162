"""OCR for pages without a text layer (scans) and images given as documents: RapidOCR (Apache-2.0) on ONNX
Runtime, with PaddleOCR's PP-OCRv6 detection and recognition models, which come inside its wheel (Apache-2.0,
its MODEL_LICENSES.md): nothing is downloaded. Text boxes are read back as lines, top to bottom, each line's
boxes left to right (docs/documents.md, "Scans")."""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time

from .extracted import DocumentError

MAX_SIDE = 2000        # pixels: RapidOCR's own input limit; a page is rendered to fit it
MAX_SCALE = 3.0        # at most 216 dpi from PDF points
MIN_SIDE = 16          # pixels: narrower than this is no page of text (a 1-pixel-wide image)
MAX_PIXELS = 40_000_000   # an image file is refused above this, before it is decoded

_engine = None
_engine_lock = threading.Lock()
_reading = threading.Lock()      # one page at a time per process: the engine is not known to be thread-safe
_progress: contextvars.ContextVar = contextvars.ContextVar("ocr_progress", default=None)


def engine():
    """The OCR engine, built once per process (loading the models takes a fraction of a second)."""
    global _engine
    with _engine_lock:
        if _engine is None:
            try:
                from rapidocr import RapidOCR
            except ImportError:
                raise DocumentError("OCR needs the rapidocr and onnxruntime packages (pip install rapidocr "
                                    "onnxruntime), or --ocr never") from None
            # no angle classifier: a document's lines stand upright, and the classifier flips some of them
            # (a warning box's line of the Debian Reference read upside down as "U -g in g ns o ...")
            _engine = RapidOCR(params={"Global.log_level": "error", "Global.use_cls": False})
        return _engine


@contextlib.contextmanager
def progress(callback):
    """Within this block, ``callback(done, total)`` is called after each page OCR reads."""
    token = _progress.set(callback)
    try:
        yield
    finally:
        _progress.reset(token)


def page_scale(width: float, height: float, where: str) -> float:
    """The render scale of a page of ``width`` x ``height`` points: as fine as OCR uses, refused in one line
    when the page is too narrow to hold text."""
    scale = min(MAX_SCALE, MAX_SIDE / max(width, height, 1e-6))
    if min(width, height) * scale < MIN_SIDE:
        raise DocumentError(f"{where} is {width:.0f} x {height:.0f} points, too narrow to hold text for OCR")
    return scale


def fit(image, where: str):
    """``image`` (PIL) in RGB, shrunk to ``MAX_SIDE``; refused in one line when too narrow to read."""
    if min(image.size) < MIN_SIDE:
        raise DocumentError(f"{where} is {image.size[0]} x {image.size[1]} pixels, too small to read by OCR")
    if max(image.size) > MAX_SIDE:
        ratio = MAX_SIDE / max(image.size)
        image = image.resize((max(1, round(image.size[0] * ratio)), max(1, round(image.size[1] * ratio))))
    return image.convert("RGB")


def lines(boxes, texts) -> list[str]:
    """Text boxes (four corner points each) as lines: boxes whose vertical middles fall within one another's
    height are one line, read left to right; lines top to bottom."""
    items = sorted(((min(p[1] for p in box), max(p[1] for p in box), min(p[0] for p in box), text)
                    for box, text in zip(boxes, texts) if text.strip()), key=lambda item: item[0])
    rows: list[list] = []
    for top, bottom, left, text in items:
        middle = (top + bottom) / 2
        row = rows[-1] if rows else None
        if row is not None and row[0] <= middle <= row[1]:
            row[2].append((left, text))
            row[0], row[1] = min(row[0], top), max(row[1], bottom)
        else:
            rows.append([top, bottom, [(left, text)]])
    return [" ".join(text for _, text in sorted(row[2], key=lambda cell: cell[0])) for row in rows]


def read(image, where: str) -> str:
    """The text OCR reads in ``image`` (PIL), as lines."""
    import numpy as np
    pixels = np.asarray(fit(image, where))
    ocr = engine()
    with _reading:
        result = ocr(pixels)
    if not result.txts:
        return ""
    return "\n".join(lines(result.boxes, result.txts))


class Pages:
    """OCR over a document's pages: the page count and seconds for the timings, progress after each page."""

    def __init__(self, total: int):
        self.total, self.done, self.seconds = total, 0, 0.0
        self.callback = _progress.get()

    def read(self, image, where: str) -> str:
        started = time.perf_counter()
        text = read(image, where)
        self.seconds += time.perf_counter() - started
        self.done += 1
        if self.callback is not None:
            self.callback(self.done, self.total)
        return text

    def timings(self) -> dict:
        """OCR's share of the timings; also hands the memory OCR's buffers held back to the system (glibc
        keeps a few hundred MB of freed arena otherwise: 480 MB resident after one page, 160 MB after this)."""
        release_memory()
        if not self.done:
            return {}
        return {"ocr_pages": self.done, "ocr_s_per_page": round(self.seconds / self.done, 3)}


def release_memory() -> None:
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):       # not glibc: nothing to hand back this way
        pass


def extract_image(data: bytes, name: str, limits):
    """An image given as a document (a scanned page; each frame of a multi-page TIFF a page), read by OCR."""
    import io

    from PIL import Image, ImageSequence, UnidentifiedImageError

    from .extracted import Builder
    try:
        image = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError):
        raise DocumentError(f"{name} is not an image PIL can read (PNG, JPEG, TIFF, ...)") from None
    width, height = image.size
    if width * height > MAX_PIXELS:        # checked from the header, before the pixels are decoded
        raise DocumentError(f"{name} is {width} x {height} pixels, over the limit of {MAX_PIXELS:,} for OCR")
    frames = getattr(image, "n_frames", 1)
    if frames > limits.max_ocr_pages:
        raise DocumentError(f"{name} has {frames:,} pages to read by OCR, over the limit of {limits.max_ocr_pages:,}")
    out, reader = Builder(name, limits, "image"), Pages(frames)
    try:
        for number, frame in enumerate(ImageSequence.Iterator(image), start=1):
            out.check_time()
            out.new_page(number)
            out.write(reader.read(frame, name if frames == 1 else f"{name}, page {number}"))
    except DocumentError:
        raise
    except (OSError, ValueError) as e:       # a truncated or damaged image, found while decoding it
        raise DocumentError(f"{name} is damaged: {e}") from None
    finally:
        release_memory()
    if out.size == 0 or not "".join(out.pieces).strip():
        raise DocumentError(f"{name} has no text that OCR can read")
    extracted = out.done()
    extracted.pages = frames
    extracted.timings.update(reader.timings())
    return extracted
