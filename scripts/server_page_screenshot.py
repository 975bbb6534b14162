"""A screenshot of `reform serve`'s web page in use, for the docs: starts the server (default model, a
fresh store), opens the page in headless Chromium (Selenium), drops the test book as PDF, Word and EPUB on
it at once (a real drop event) into its library, waits for their encodes, asks a question and saves the
page once the answer and its evidence are shown.

    python scripts/server_page_screenshot.py --out docs/results/server-page.png
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

BOOK = Path(__file__).resolve().parents[1] / "tests" / "data" / "documents" / "book.pdf"
QUESTION = "What number was engraved on the silver medal?"
DROP = (BOOK.parent / "drop.js").read_text()       # a real drop event, as the browser test makes it
FILES = [(".pdf", "application/pdf"), (".docx", "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
         (".epub", "application/epub+zip")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as store:
        server = subprocess.Popen([str(Path(sys.executable).parent / "reform"), "serve", "--port", str(port),
                                   "--store", store, "--no-access-log"], stderr=subprocess.DEVNULL)
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium")
        for flag in ("--headless=new", "--no-sandbox", "--window-size=1280,820"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        try:
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.5)
            driver.get(url + "/")
            wait = WebDriverWait(driver, 600)
            import base64
            files = [[base64.b64encode(BOOK.with_suffix(suffix).read_bytes()).decode(), "book" + suffix, media]
                     for suffix, media in FILES]
            driver.execute_script(DROP, files)
            wait.until(lambda d: d.execute_script(
                "const rows = [...document.querySelectorAll('#library tbody tr')];"
                f"return rows.length === {len(files)} && rows.every((r) => r.dataset.status !== 'in_progress')"))
            driver.find_element(By.ID, "question").send_keys(QUESTION)
            tokens = driver.find_element(By.ID, "max-tokens")
            tokens.clear()
            tokens.send_keys("32")
            driver.find_element(By.ID, "ask").click()
            wait.until(lambda d: any(a.get_attribute("data-state") in ("done", "failed")
                                     for a in d.find_elements(By.CSS_SELECTOR, "#log .a")))
            time.sleep(0.5)                         # the evidence is drawn from the last streamed chunk
            args.out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(args.out))
            print(driver.find_element(By.CSS_SELECTOR, "#log .a").get_attribute("textContent"))
        finally:
            driver.quit()
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
