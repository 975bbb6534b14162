"""The web page at ``/`` in a real headless browser (Debian's Chromium driven by Selenium) over loopback:
paste a document, watch it encode, ask, see the library's answer streamed in; then delete the context.
Skipped, with the reason, where no Chromium is installed (`apt-get install chromium chromium-driver`)."""

import shutil
import sys

import httpx
import pytest

from live_server import DOC, QUESTION, LiveServer, make_pipe

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Chromium and chromedriver "
                                "(Debian: apt-get install chromium chromium-driver)")


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def test_the_page_uploads_asks_and_deletes(store_dir, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    expected = make_pipe().encode(DOC).ask(QUESTION, max_new_tokens=10).text
    with LiveServer(make_pipe(), store_dir) as server:
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda d: d.find_element(By.ID, "model").text)           # the page read /v1/models
        # no context chosen yet: the model answers alone
        assert ask(browser, wait, QUESTION) == make_pipe().without_context().ask(QUESTION, max_new_tokens=10).text
        browser.execute_script("document.getElementById('document').value = arguments[0]", DOC)
        browser.find_element(By.ID, "upload").click()
        wait.until(lambda d: d.find_element(By.ID, "upload-status").get_attribute("data-state") in ("ready", "failed"))
        assert browser.find_element(By.ID, "upload-status").text.startswith("ready")
        rows = browser.find_elements(By.CSS_SELECTOR, "#contexts tbody tr")
        assert len(rows) == 1 and "ready" in rows[0].text
        assert ask(browser, wait, QUESTION) == expected
        browser.find_element(By.XPATH, "//button[text()='delete']").click()
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, "#contexts tbody tr"))
        assert httpx.get(f"{server.url}/v1/contexts").json()["data"] == []


def ask(browser, wait, question: str) -> str:
    """Ask ``question`` on the page (10 tokens at most); the streamed answer once done."""
    from selenium.webdriver.common.by import By
    before = len(browser.find_elements(By.CSS_SELECTOR, "#log .a"))
    field = browser.find_element(By.ID, "question")
    field.clear()
    field.send_keys(question)
    max_tokens = browser.find_element(By.ID, "max-tokens")
    max_tokens.clear()
    max_tokens.send_keys("10")
    browser.find_element(By.ID, "ask").click()
    answer = wait.until(lambda d: next((a for a in d.find_elements(By.CSS_SELECTOR, "#log .a")[before:]
                                        if a.get_attribute("data-state") in ("done", "failed")), None))
    assert answer.get_attribute("data-state") == "done", answer.get_attribute("textContent")
    return answer.get_attribute("textContent")


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "store"


def library_answer(tmp_path, files: list[tuple[str, bytes]], question: str):
    """What the library in Python answers over ``files`` (name, bytes): the web page's library must match."""
    from reform.library import Library
    folder = tmp_path / "files"
    folder.mkdir(exist_ok=True)
    for name, data in files:
        (folder / name).write_bytes(data)
    library = Library(make_pipe(), tmp_path / "library")
    library.add([folder / name for name, _ in files])
    return library.ask(question, max_new_tokens=10)


def drop_files(browser, wait, files: list[tuple[str, bytes, str]]) -> None:
    """A real drop event carrying the files (Files in a DataTransfer, as the browser makes them when files
    are dragged in); returns once each is listed by name and completed."""
    import base64
    from pathlib import Path

    drop = (Path(__file__).parent / "data" / "documents" / "drop.js").read_text()
    browser.execute_script(drop, [[base64.b64encode(data).decode(), name, media] for name, data, media in files])

    def listed(d):      # read in one script: the table is drawn anew while encodes run
        rows = d.execute_script("return [...document.querySelectorAll('#library tbody tr')]"
                                ".map((r) => [r.children[1].textContent, r.dataset.status, r.textContent])")
        return rows if len(rows) == len(files) and all(s != "in_progress" for _, s, _ in rows) else None
    rows = wait.until(listed)
    assert [name for name, _, _ in rows] == [name for name, _, _ in files]
    assert all(status == "completed" for _, status, _ in rows), rows


def where(p) -> str:
    """An evidence passage's place as the page shows it."""
    pages = f"{p.unit} {p.page}" if p.page_end == p.page else f"{p.unit}s {p.page}-{p.page_end}"
    return f"{p.document} · {p.section} · {pages}" if p.unit == "row" else f"{p.document} · {pages}"


PDF_MEDIA, XLSX_MEDIA = "application/pdf", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
MEDAL = "What number was engraved on the silver medal?"


def book_pdf() -> bytes:
    from pathlib import Path
    return (Path(__file__).parent / "data" / "documents" / "book.pdf").read_bytes()


def workbook() -> bytes:
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "data" / "documents"))
    from make import medal_workbook
    return medal_workbook()


@pytest.mark.parametrize("name, media", [("book.pdf", PDF_MEDIA), ("lights.xlsx", XLSX_MEDIA)])
def test_a_document_dropped_on_the_page_is_answered_with_its_evidence_and_places(store_dir, browser, name, media,
                                                                                 tmp_path):
    """A dropped file goes into the page's library (a vector store), is listed by name once encoded, and the
    answer is the Python library's, with its evidence's document and page (a workbook's: sheet and rows)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    data = book_pdf() if name == "book.pdf" else workbook()
    expected = library_answer(tmp_path, [(name, data)], MEDAL)
    with LiveServer(make_pipe(), store_dir) as server:
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda d: d.find_element(By.ID, "model").text)
        drop_files(browser, wait, [(name, data, media)])
        assert browser.find_element(By.ID, "chosen").text == "1 document of the library"
        assert ask(browser, wait, MEDAL) == expected.text
        shown = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#log .evidence li .where"))
        assert shown[0].text == where(expected.evidence[0]) and len(shown) == min(3, len(expected.evidence))


def test_three_dropped_files_are_listed_by_name_and_two_ticked_are_asked(store_dir, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    notes = ("The harbour log of 1923 names Maren as the keeper. " * 12).encode()
    files = [("book.pdf", book_pdf(), PDF_MEDIA), ("lights.xlsx", workbook(), XLSX_MEDIA),
             ("notes.md", notes, "text/markdown")]
    expected = library_answer(tmp_path, [("book.pdf", files[0][1]), ("notes.md", notes)], MEDAL)
    with LiveServer(make_pipe(), store_dir) as server:
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda d: d.find_element(By.ID, "model").text)
        drop_files(browser, wait, files)
        browser.execute_script("document.querySelectorAll('#library tbody tr')[1].querySelector('input').click()")  # the workbook
        assert browser.find_element(By.ID, "chosen").text == "2 documents of the library"
        assert ask(browser, wait, MEDAL) == expected.text
        shown = [e.text for e in wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#log .evidence li .where"))]
        assert shown == [where(p) for p in expected.evidence[:3]]
        assert all(s.split(" · ")[0] in ("book.pdf", "notes.md") for s in shown)
        assert any(s.startswith("book.pdf · page") for s in shown)
