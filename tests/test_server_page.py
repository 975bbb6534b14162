"""The web page at ``/`` in a real headless browser (Debian's Chromium driven by Selenium) over loopback:
paste a document, watch it encode, ask, see the library's answer streamed in; then delete the context.
Skipped, with the reason, where no Chromium is installed (`apt-get install chromium chromium-driver`)."""

import shutil
import sys

import httpx
import pytest

from test_server import DOC, QUESTION, LiveServer, make_pipe

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


@pytest.mark.parametrize("name, media", [("book.pdf", "application/pdf"), (
    "lights.xlsx", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet")])
def test_a_document_dropped_on_the_page_is_answered_with_its_evidence_and_places(store_dir, browser, name, media):
    """A real drop event carrying the file (a File in a DataTransfer, as the browser makes it when a file is
    dragged in) is uploaded as it is; the answer shows the library's evidence with document and page (a
    workbook's: sheet and rows)."""
    import base64
    from pathlib import Path

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from reform.documents import extract_bytes
    sys.path.insert(0, str(Path(__file__).parent / "data" / "documents"))
    from make import medal_workbook
    pdf = (Path(__file__).parent / "data" / "documents" / "book.pdf").read_bytes() if name == "book.pdf" \
        else medal_workbook()
    question = "What number was engraved on the silver medal?"
    expected = make_pipe().encode(extract_bytes(pdf, name)).ask(question, max_new_tokens=10)
    with LiveServer(make_pipe(), store_dir) as server:
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda d: d.find_element(By.ID, "model").text)
        drop = (Path(__file__).parent / "data" / "documents" / "drop.js").read_text()
        browser.execute_script(drop, base64.b64encode(pdf).decode(), name, media)
        assert browser.find_element(By.ID, "file-name").text.startswith(name)
        browser.find_element(By.ID, "upload").click()
        wait.until(lambda d: d.find_element(By.ID, "upload-status").get_attribute("data-state") in ("ready", "failed"))
        assert browser.find_element(By.ID, "upload-status").text.startswith("ready")
        assert ask(browser, wait, question) == expected.text
        shown = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#log .evidence li .where"))
        top = expected.evidence[0]
        pages = f"{top.unit} {top.page}" if top.page_end == top.page else f"{top.unit}s {top.page}-{top.page_end}"
        where = f"{name} · {top.section} · {pages}" if top.unit == "row" else f"{name} · {pages}"
        assert shown[0].text == where and len(shown) == min(3, len(expected.evidence))
