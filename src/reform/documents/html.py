"""HTML (and the XHTML chapters of an EPUB): the main text in reading order, headings kept as Markdown
headings and as sections; scripts, styles, forms and navigation dropped (BeautifulSoup, MIT)."""

from __future__ import annotations

import re

from .extracted import Builder, Extracted, Limits

DROP = {"script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "embed", "form", "button",
        "select", "input", "textarea", "nav", "head", "meta", "link", "map", "audio", "video"}
# class or id words of navigation: DocBook's navheader/navfooter, menus, breadcrumbs, skip links, cookie banners
# headerlink: the pilcrow Sphinx puts after every heading (a permalink, not text)
NAVIGATION = re.compile(r"(^|[-_ ])(nav|navbar|navheader|navfooter|navigation|menu|breadcrumbs?|sidebar|skip|"
                        r"cookie|banner|toolbar|pagination|toc|headerlink)($|[-_ ])", re.I)
BLOCK = {"p", "div", "section", "article", "main", "aside", "header", "footer", "blockquote", "pre", "ul", "ol",
         "li", "dl", "dt", "dd", "table", "tr", "figure", "figcaption", "address", "details", "summary", "hr",
         "body", "html", "caption", "thead", "tbody", "tfoot", "center", "fieldset"}
HEADING = {f"h{i}": i for i in range(1, 7)}
CELL = {"td", "th"}


def parser() -> str:
    try:
        import lxml  # noqa: F401
        return "lxml"
    except ImportError:
        return "html.parser"


def is_navigation(tag) -> bool:
    if tag.get("role") in ("navigation", "banner", "search"):
        return True
    words = " ".join(tag.get("class") or []) + " " + (tag.get("id") or "")
    return bool(NAVIGATION.search(words.strip())) if words.strip() else False


class _Walker:
    def __init__(self, out: Builder):
        self.out, self.line = out, []

    def flush(self) -> None:
        text = " ".join("".join(self.line).split())
        self.line = []
        if text:
            self.out.paragraph(text)

    def walk(self, root) -> None:
        """``root``'s text in reading order. An explicit stack, not recursion: a page of 100,000 nested
        ``<div>`` is text like any other."""
        from bs4 import Comment, NavigableString, Tag
        stack = [(root, iter(root.children))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                if node.name in BLOCK or node.name == "[document]":
                    self.flush()
                continue
            if isinstance(child, Comment):
                continue
            if isinstance(child, NavigableString):
                self.line.append(str(child))
                continue
            if not isinstance(child, Tag):
                continue
            name = child.name.lower()
            if name in DROP or is_navigation(child) or child.get("hidden") is not None:
                continue
            if name in HEADING:
                self.flush()
                self.out.heading(child.get_text(" "), HEADING[name])
            elif name == "pre":
                self.flush()
                self.out.paragraph(child.get_text())
            elif name == "br":
                self.line.append("\n")
            elif name == "tr":
                self.flush()
                cells = [" ".join(c.get_text(" ").split()) for c in child.find_all(CELL, recursive=False)]
                if any(cells):
                    self.out.paragraph(" | ".join(cells))
            else:
                if name in BLOCK:
                    self.flush()
                stack.append((child, iter(child.children)))


def extract_html(data: bytes | str, name: str, limits: Limits = Limits(), out: Builder | None = None) -> Extracted:
    """The main text of one HTML page; with ``out``, written into it (an EPUB's chapters) and not finished."""
    import warnings

    from bs4 import BeautifulSoup, XMLParsedAsHTMLWarning
    with warnings.catch_warnings():        # XHTML (an EPUB's chapters) reads as HTML as it should
        warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
        soup = BeautifulSoup(data, parser())
    root = soup.find("main") or soup.find(attrs={"role": "main"}) or soup.find("article") or soup.body or soup
    builder = out or Builder(name, limits, "html")
    title = soup.title.get_text(" ").strip() if soup.title else ""
    if title and not root.find(list(HEADING)):
        builder.heading(title, 1)
    walker = _Walker(builder)
    walker.walk(root)
    walker.flush()
    return builder.done() if out is None else None
