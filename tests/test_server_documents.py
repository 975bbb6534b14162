"""Documents through `reform serve` over loopback, spoken to by the official `openai` client: file parts in
chats (a PDF as a data URL, or a `file_id` from `client.files.create`), multipart uploads of any supported
type to /v1/contexts, the /v1/files endpoints, and the evidence of answers (`reform.evidence`), equal to
the library's; unsupported and damaged files refused with 415 and 400, the server still answering after."""

import base64
import time
from pathlib import Path

import httpx
import openai
import pytest

from reform.documents import extract_bytes

from live_server import LiveServer, make_pipe, wait_status

PDF = (Path(__file__).parent / "data" / "documents" / "book.pdf").read_bytes()
Q = "What number was engraved on the silver medal?"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with LiveServer(make_pipe(), tmp_path_factory.mktemp("store")) as server:
        yield server


@pytest.fixture(scope="module")
def library():
    """The answer and evidence the library gives for the same document and question."""
    answer = make_pipe().encode(extract_bytes(PDF, "book.pdf")).ask(Q, max_new_tokens=8)
    return answer.text, [p.to_json() for p in answer.evidence]


def file_chat(part: dict, **kw) -> dict:
    return dict(model="reform", max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "file", "file": part}, {"type": "text", "text": Q}]}], **kw)


def data_url(data: bytes, media: str = "application/pdf") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def test_a_pdf_in_a_chat_is_answered_with_its_evidence_as_the_library_answers(live, library):
    client = live.client()
    part = {"file_data": data_url(PDF), "filename": "book.pdf"}
    whole = client.chat.completions.create(**file_chat(part))
    reform = whole.model_extra["reform"]
    assert (whole.choices[0].message.content, reform["evidence"]) == library
    assert reform["evidence"] and {e["document"] for e in reform["evidence"]} == {"book.pdf"}
    assert all(1 <= e["page"] <= 3 for e in reform["evidence"])
    chunks = list(client.chat.completions.create(**file_chat(part), stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    last = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert text == library[0] and last.model_extra["reform"]["evidence"] == library[1]
    assert last.model_extra["reform"]["encoded"] is False           # the first chat stored it


def test_files_create_then_a_chat_naming_its_file_id(live, library, tmp_path):
    client = live.client()
    path = tmp_path / "book.pdf"
    path.write_bytes(PDF)
    made = client.files.create(file=open(path, "rb"), purpose="user_data")
    assert made.id.startswith("file-") and made.bytes == len(PDF) and made.filename == "book.pdf"
    assert client.files.retrieve(made.id).filename == "book.pdf"
    assert made.id in [f.id for f in client.files.list().data]
    assert client.files.content(made.id).read() == PDF
    answer = client.chat.completions.create(**file_chat({"file_id": made.id}))
    assert (answer.choices[0].message.content, answer.model_extra["reform"]["evidence"]) == library
    assert client.files.delete(made.id).deleted
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.files.retrieve(made.id)
    with pytest.raises(openai.NotFoundError, match="file .* not found"):
        client.chat.completions.create(**file_chat({"file_id": made.id}))


def test_multipart_uploads_of_documents_to_contexts(live, library):
    r = httpx.post(f"{live.url}/v1/contexts", files={"file": ("book.pdf", PDF, "application/pdf")}, timeout=60)
    assert r.status_code in (200, 202), r.text
    key = r.json()["id"]
    deadline = time.time() + 120
    while httpx.get(f"{live.url}/v1/contexts/{key}").json()["status"] != "ready":
        assert time.time() < deadline
        time.sleep(0.2)
    answer = live.client().chat.completions.create(model="reform", max_tokens=8, extra_body={"context_id": key},
                                                   messages=[{"role": "user", "content": Q}])
    assert (answer.choices[0].message.content, answer.model_extra["reform"]["evidence"]) == library
    raw = httpx.post(f"{live.url}/v1/contexts", content=PDF, headers={"content-type": "application/pdf"}, timeout=60)
    assert raw.status_code in (200, 202) and raw.json()["id"] != key     # another name: another map, another id


def test_a_workbook_and_a_deck_uploaded_are_answered_with_rows_and_slides_as_evidence(live):
    import io
    import sys

    from pptx import Presentation
    sys.path.insert(0, str(Path(__file__).parent / "data" / "documents"))
    from make import medal_workbook
    deck = Presentation()
    for title in ("The keeper", "The storm of 1923"):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = "A silver medal engraved with the number 11." if "storm" in title else "Maren."
    pptx = io.BytesIO()
    deck.save(pptx)
    client = live.client()
    for name, data, unit in (("lights.xlsx", medal_workbook(), "row"), ("talk.pptx", pptx.getvalue(), "slide")):
        made = client.files.create(file=(name, data), purpose="user_data")
        answer = client.chat.completions.create(**file_chat({"file_id": made.id}))
        evidence = answer.model_extra["reform"]["evidence"]
        assert evidence and {e["document"] for e in evidence} == {name} and {e["unit"] for e in evidence} == {unit}
        medal = [e for e in evidence if "number 11" in e["text"]]
        # the tiny model's budget holds the whole file: one passage from the first row or slide to the medal's
        assert medal and medal[0]["page_end"] == 2 and (unit == "slide" or medal[0]["section"] == "Medals")


def test_unsupported_and_damaged_files_are_refused_and_the_server_goes_on(live):
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
    r = httpx.post(f"{live.url}/v1/contexts", files={"file": ("photo.png", png, "image/png")})
    assert r.status_code == 400 and "not an image PIL can read" in r.json()["error"]["message"]
    r = httpx.post(f"{live.url}/v1/files", files={"file": ("sheet.xlsx", b"PK\x03\x04" + b"\x00" * 40)},
                   data={"purpose": "user_data"})
    assert r.status_code == 400 and "not a valid Excel (XLSX) file" in r.json()["error"]["message"]
    r = httpx.post(f"{live.url}/v1/contexts", files={"file": ("backup.7z", b"7z\xbc\xaf\x27\x1c" + b"\x00" * 40)})
    assert r.status_code == 415 and "an archive" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="not a readable PDF"):
        live.client().chat.completions.create(**file_chat({"file_data": data_url(PDF[:4000]), "filename": "cut.pdf"}))
    with pytest.raises(openai.BadRequestError, match="file_data is not valid base64"):
        live.client().chat.completions.create(**file_chat({"file_data": "data:application/pdf;base64,@@@"}))
    r = httpx.post(f"{live.url}/v1/files", files={"file": ("book.pdf", PDF)})
    assert r.status_code == 400 and "purpose" in r.json()["error"]["message"]
    ok = live.client().chat.completions.create(model="reform", max_tokens=4,
                                               messages=[{"role": "user", "content": "Say hello."}])
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_a_pdf_gets_the_same_gather_and_evidence_from_the_server_as_from_reform_ask(tiny_model_dir, tmp_path):
    """One documents policy everywhere (docs/documents.md): `reform serve` without --method encodes a PDF with
    the documents method that `reform ask FILE` runs, and answers with the same evidence; plain text in a chat
    keeps REFORM."""
    import json

    from typer.testing import CliRunner

    from reform.cli.common import LoadArgs, pipeline_from
    from reform.cli.main import app
    from reform.methods import DOCUMENTS_METHOD
    flags = dict(model=str(tiny_model_dir), heads="1:v:0,2:q:3", chunk_size=128, cache_budget=256, recompute_budget=400)
    path = tmp_path / "book.pdf"
    path.write_bytes(PDF)
    r = CliRunner().invoke(app, ["ask", str(path), "-q", Q, "--json", "--max-new-tokens", "8",
                                 *[f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]])
    assert r.exit_code == 0, r.output
    asked = json.loads(r.stdout)
    assert asked["method"] == DOCUMENTS_METHOD[0] and asked["evidence"]
    pipe = pipeline_from(LoadArgs(**flags).load(documents=None))      # what `reform serve` loads
    assert pipe.policy == {"text": "reform", "documents": DOCUMENTS_METHOD[0]}
    with LiveServer(pipe, tmp_path / "store") as server:
        client = server.client()
        made = client.files.create(file=("book.pdf", PDF), purpose="user_data")
        served = client.chat.completions.create(**file_chat({"file_id": made.id}))
        reform = served.model_extra["reform"]
        assert [(e["text"], e["page"], e["section"]) for e in reform["evidence"]] == \
            [(e["text"], e["page"], e["section"]) for e in asked["evidence"]]
        assert served.choices[0].message.content == asked["answer"]
        health = httpx.get(f"{server.url}/health").json()
        assert (health["method"], health["documents_method"]) == ("reform", DOCUMENTS_METHOD[0])
        methods = {c.get("method") for c in httpx.get(f"{server.url}/v1/contexts").json()["data"]}
        plain = client.chat.completions.create(model="reform", max_tokens=4, messages=[
            {"role": "system", "content": "The keeper's boat was called Marit. " * 30},
            {"role": "user", "content": "What was the boat called?"}])
        assert plain.choices[0].message.content is not None
        after = {c.get("method") for c in httpx.get(f"{server.url}/v1/contexts").json()["data"]}
    assert methods == {DOCUMENTS_METHOD[0]} and after == {DOCUMENTS_METHOD[0], "reform"}


def test_a_page_of_100000_nested_divs_is_read_not_a_500(live):
    """Client input never raises in the server (issue 100): the HTML walk is iterative."""
    page = "<html><body>" + "<div>" * 100_000 + "The keeper's number is 11." + "</div>" * 100_000 + "</body></html>"
    r = httpx.post(f"{live.url}/v1/contexts", files={"file": ("deep.html", page.encode(), "text/html")}, timeout=120)
    assert r.status_code in (200, 202), r.text
    with httpx.Client(base_url=live.url, timeout=60) as http:
        status = wait_status(http, r.json()["id"], "ready")
    assert status["tokens"] > 0
