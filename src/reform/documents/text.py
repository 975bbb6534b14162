"""Plain text, Markdown, reStructuredText and source code: the bytes decoded in whatever encoding they are
in (charset-normalizer where they are not UTF-8), sections at Markdown and reStructuredText headings."""

from __future__ import annotations

import codecs
import re

from .extracted import DocumentError, Extracted, Mark, clean

# suffix -> the language name a fenced code block carries (how code models see files in chat and in repos)
CODE = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".jsx": "jsx", ".ts": "typescript",
    ".tsx": "tsx", ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp",
    ".java": "java", ".kt": "kotlin", ".scala": "scala", ".go": "go", ".rs": "rust", ".rb": "ruby", ".php": "php",
    ".cs": "csharp", ".swift": "swift", ".m": "objectivec", ".sh": "bash", ".bash": "bash", ".zsh": "zsh",
    ".ps1": "powershell", ".sql": "sql", ".r": "r", ".lua": "lua", ".pl": "perl", ".pm": "perl", ".jl": "julia",
    ".hs": "haskell", ".ml": "ocaml", ".ex": "elixir", ".exs": "elixir", ".erl": "erlang", ".dart": "dart",
    ".vue": "vue", ".svelte": "svelte", ".zig": "zig", ".nim": "nim", ".f90": "fortran", ".toml": "toml",
    ".yaml": "yaml", ".yml": "yaml", ".json": "json", ".xml": "xml", ".css": "css", ".scss": "scss",
    ".ini": "ini", ".cfg": "ini", ".cmake": "cmake", ".mk": "make", ".gradle": "groovy", ".proto": "protobuf",
    ".tex": "latex", ".el": "elisp", ".clj": "clojure", ".groovy": "groovy", ".tf": "hcl",
}
CODE_NAMES = {"Makefile": "make", "Dockerfile": "dockerfile", "CMakeLists.txt": "cmake", "Rakefile": "ruby",
              "Gemfile": "ruby", "Justfile": "make"}
TEXT = {".txt", ".text", ".md", ".markdown", ".mdown", ".rst", ".rest", ".log", ".csv", ".tsv", ".adoc", ".org", ""}

BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def code_language(name: str) -> str | None:
    """The fence language of a source file's name, None for prose."""
    base = name.rsplit("/", 1)[-1]
    if base in CODE_NAMES:
        return CODE_NAMES[base]
    suffix = "." + base.rsplit(".", 1)[-1].lower() if "." in base else ""
    return CODE.get(suffix)


def decode(data: bytes, name: str) -> str:
    """``data`` as text: by its byte-order mark, as UTF-8, else in the encoding charset-normalizer detects;
    refused in one line when empty or binary."""
    if not data.strip():
        raise DocumentError(f"{name} is empty")
    for bom, encoding in BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError as e:
                raise DocumentError(f"{name} is not valid {encoding} (byte {e.start})") from None
    if b"\x00" in data[:1 << 20]:
        raise DocumentError(f"{name} looks binary (it contains NUL bytes) and is no format reform reads")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes
    found = from_bytes(data[:4 << 20])
    best = found.best()
    # Western text in a legacy code page reads nearly as well in several of them (cp1257 spells "crčme"
    # where cp1252 spells "crème"); among near-equals, prefer the one most text in the wild is in
    for match in found:
        if best is not None and match.encoding == "cp1252" and match.chaos <= best.chaos + 0.05:
            best = match
    if best is None or best.encoding is None:
        raise DocumentError(f"{name} is not text in any encoding charset-normalizer recognises")
    try:
        return data.decode(best.encoding)
    except (UnicodeDecodeError, LookupError):
        raise DocumentError(f"{name} is not valid {best.encoding}, the encoding it looks like") from None


ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t#]*$")
UNDERLINE = re.compile(r"^([=\-~^\"'`#*+<>:._])\1{2,}[ \t]*$")


def headings(text: str) -> list[tuple[int, str]]:
    """``(offset, title)`` of the Markdown (``# Title``, setext) and reStructuredText (underlined) headings."""
    found, offset, previous, fence = [], 0, None, False
    for line in text.splitlines(keepends=True):
        stripped = line.rstrip("\r\n")
        if stripped.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif not fence:
            if m := ATX.match(stripped):
                found.append((offset, m.group(2).strip()))
            elif (previous is not None and previous[1].strip() and UNDERLINE.match(stripped)
                  and len(stripped.strip()) >= len(previous[1].strip()) and not previous[1].startswith(" ")):
                found.append(previous)
        previous = (offset, stripped) if stripped.strip() else None
        offset += len(line)
    return found


def extract_text(data: bytes, name: str) -> Extracted:
    text = clean(decode(data, name))
    marks = [Mark(0, name)]
    if code_language(name) is None:
        for offset, title in headings(text):
            if offset == 0:
                marks[0] = Mark(0, name, None, title)
            else:
                marks.append(Mark(offset, name, None, title))
    return Extracted(text, marks, "code" if code_language(name) else "text")
