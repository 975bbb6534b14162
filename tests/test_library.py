"""A library of documents (``reform.library``, docs/library.md) on the tiny random-weight model: each document
encoded once into its own context, added and removed one at a time, asked together with evidence naming
the document; a library of one document scores its tokens exactly as that document's own context does."""

import json

import pytest
import torch

from reform import Pipeline
from reform.library import Library
from reform.library.catalog import Catalog
from reform.library.gather import gather

from conftest import CharTokenizer, tiny

OPTIONS = dict(heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96, recompute_budget=300)
WORDS = "apple river stone cloud maple harbor lantern violet copper meadow".split()


def filler(seed: int, n: int = 120) -> str:
    import random
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def pipe():
    return Pipeline(tiny("llama"), CharTokenizer(), **OPTIONS)


@pytest.fixture
def folder(tmp_path):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    for i in range(1, 4):
        (docs / f"doc{i}.md").write_text(f"# Part {i}\n\n{filler(i)}\n\nThe keeper of lighthouse {i} was named "
                                         f"Keeper{i}.\n\n{filler(10 + i)}\n")
    (docs / "sub" / "notes.txt").write_text(f"{filler(7)} The boat was called Marit. {filler(8)}")
    (docs / "blank.txt").write_text("   \n")
    (docs / "short.md").write_text("The harbour master was Ola.")     # shorter than the recompute budget
    return docs


def test_a_folder_is_one_document_per_file_each_encoded_once(pipe, folder, tmp_path):
    library = Library(pipe, tmp_path / "store")
    added = {a.name: a.status for a in library.add(folder)}
    assert added == {"doc1.md": "added", "doc2.md": "added", "doc3.md": "added", "sub/notes.txt": "added",
                     "short.md": "added", "blank.txt": "skipped"}
    assert [d.name for d in library.documents()] == ["doc1.md", "doc2.md", "doc3.md", "short.md", "sub/notes.txt"]
    keys = {d.name: d.key for d in library.documents()}
    assert all(library.store.has(k) for k in keys.values())
    encodes = []
    original = pipe.documents_method.encode
    pipe.documents_method.encode = lambda *a, **k: encodes.append(1) or original(*a, **k)
    try:
        assert {a.status for a in library.add(folder)} == {"unchanged", "skipped"} and encodes == []
        (folder / "doc2.md").write_text("# Part 2\n\nThe keeper of lighthouse 2 was named Oda.\n" + filler(2))
        again = {a.name: a.status for a in library.add(folder / "doc2.md")}
        assert again == {"doc2.md": "replaced"} and encodes == [1]       # adding one document encodes it alone
    finally:
        pipe.documents_method.encode = original
    assert not library.store.has(keys["doc2.md"])                       # the old content's context is gone
    assert library.remove(["doc3.md"]) == ["doc3.md"] and not library.store.has(keys["doc3.md"])
    with pytest.raises(ValueError, match="no document named 'doc9.md'.*it has 4: doc1.md, doc2.md, short.md, s"):
        library.remove(["doc9.md"])


def test_a_file_that_fails_is_reported_and_the_others_are_added(pipe, folder, tmp_path):
    bad = folder / "broken.pdf"
    bad.write_bytes(b"%PDF-1.7 truncated")
    library = Library(pipe, tmp_path / "store")
    results = {a.name: a for a in library.add([folder / "doc1.md", bad, folder / "doc2.md"])}
    assert results["broken.pdf"].status == "failed" and results["broken.pdf"].error
    assert "\n" not in results["broken.pdf"].error
    assert [d.name for d in library.documents()] == ["doc1.md", "doc2.md"]


def test_questions_gather_across_documents_and_evidence_names_each(pipe, folder, tmp_path):
    library = Library(pipe, tmp_path / "store")
    library.add(folder)
    answer = library.ask("Who was the keeper of lighthouse 2?", max_new_tokens=4)
    stages = answer.stats["library"]
    assert stages["documents"] == 5 and len(stages["candidates"]) == 5
    short = library.context(next(d.key for d in library.documents() if d.name == "short.md"))
    assert short.state is not None and short.state.data.shape[0] == short.ids.shape[0]   # embedded, however short
    assert set(stages["gathered_from"]) <= set(stages["candidates"])
    assert {p.document for p in answer.evidence} == set(stages["gathered_from"])
    assert all(p.text in library.context(next(d.key for d in library.documents() if d.name == p.document))
               .source.document.text for p in answer.evidence)
    assert answer.input_tokens <= pipe.documents_method.config.recompute_budget + 40
    only = library.ask("Who was the keeper of lighthouse 2?", documents=["doc1.md", "sub/notes.txt"],
                       candidates=1, max_new_tokens=4)
    assert len(only.stats["library"]["candidates"]) == 1
    assert {p.document for p in only.evidence} <= {"doc1.md", "sub/notes.txt"}
    with pytest.raises(ValueError, match="no document named 'nope.md'"):
        library.ask("Who?", documents=["nope.md"])
    with pytest.raises(ValueError, match="candidates must be"):
        library.ask("Who?", candidates=0)
    with pytest.raises(ValueError, match="is empty: add documents first"):
        Library(pipe, tmp_path / "other").ask("Who?")


def test_a_library_of_one_document_scores_as_its_own_context(pipe, folder, tmp_path):
    """The cross-document scores are the documents method's own: BM25 over the library's passages and dense
    cosine from the stored index give one document's tokens exactly the scores its context's gather gives."""
    library = Library(pipe, tmp_path / "store")
    library.add(folder / "doc1.md")
    doc = library.documents()[0]
    ctx = library.context(doc.key)
    question = "Who was the keeper of lighthouse 1?"
    part = pipe.templater.question(question)
    own = pipe.documents_method.scores(ctx, part)
    names, index = library.index({doc.name: doc})
    scores = index.scores(question)
    prefix = len(pipe.templater.prefix)
    n = ctx.ids.shape[0]
    (got,) = gather(pipe.documents_method, [(doc.name, ctx, scores, index.spans[0])], part, n, prefix)
    assert torch.equal(got.kept, torch.arange(prefix, n))
    torch.testing.assert_close(got.scores, own[prefix:], rtol=0, atol=1e-5)


def test_libraries_of_a_store_share_contexts_and_refuse_another_maker(pipe, folder, tmp_path):
    store = tmp_path / "store"
    first, second = Library(pipe, store, name="first"), Library(pipe, store, name="second")
    first.add(folder / "doc1.md")
    second.add([folder / "doc1.md", folder / "doc2.md"])
    key = first.documents()[0].key
    assert key == second.documents()[0].key and Catalog(first.store).names() == ["first", "second"]
    first.remove(["doc1.md"])
    assert first.store.has(key)                  # the second library still holds it
    second.remove(["doc1.md"])
    assert not first.store.has(key)
    other = Pipeline(tiny("llama"), CharTokenizer(), **{**OPTIONS, "recompute_budget": 256})
    with pytest.raises(ValueError, match="built with another documents method or its options"):
        Library(other, store, name="second").documents()
    with pytest.raises(ValueError, match="a library's name"):
        Library(pipe, store, name="../x")
    with pytest.raises(ValueError, match="keeps none"):
        Library(Pipeline(tiny("llama"), CharTokenizer(), method="h2o"), store)


def test_library_commands(tiny_model_dir, folder, tmp_path):
    from typer.testing import CliRunner

    from reform.cli.main import app
    run = lambda *args: CliRunner().invoke(app, list(args))
    store = str(tmp_path / "store")
    flags = ["--model", str(tiny_model_dir), "--heads", "1:v:0,2:q:3", "--chunk-size", "128", "--cache-budget",
             "256", "--recompute-budget", "400"]
    r = run("library", "add", str(folder), "--store", store, "--json", *flags)
    assert r.exit_code == 0, r.output
    added = json.loads(r.stdout)
    assert (added["added"], added["skipped"], added["documents"]) == (5, 1, 5)
    listed = json.loads(run("library", "list", "--store", store, "--json").stdout)
    assert [d["name"] for d in listed["documents"]] == ["doc1.md", "doc2.md", "doc3.md", "short.md", "sub/notes.txt"]
    r = run("ask", "--store", store, "-q", "Who kept lighthouse 3?", "--json", "--max-new-tokens", "3",
            "--documents", "doc3.md,doc1.md", *flags)
    assert r.exit_code == 0, r.output
    asked = json.loads(r.stdout)
    assert asked["evidence"] and {e["document"] for e in asked["evidence"]} <= {"doc3.md", "doc1.md"}
    assert asked["stats"]["library"]["documents"] == 2
    r = run("ask", "--store", store, "-q", "Who?", "--documents", "nine.md", *flags)
    assert r.exit_code == 2 and "no document named 'nine.md'" in r.output
    r = run("ask", "-q", "Who?", "--documents", "doc1.md", str(folder / "doc1.md"))
    assert r.exit_code == 2 and "--documents chooses documents of a library" in r.output
    r = run("ask", "--store", str(tmp_path / "empty"), "-q", "Who?", *flags)
    assert r.exit_code == 2 and "is empty: add documents first" in r.output
    assert run("library", "remove", "doc1.md", "--store", store).exit_code == 0
    r = run("library", "remove", "doc1.md", "--store", store)
    assert r.exit_code == 2 and "no document named 'doc1.md'" in r.output
    r = run("library", "add", str(tmp_path / "missing.pdf"), "--store", store, *flags)
    assert r.exit_code != 0 and "not found" in r.output


def test_encode_fills_a_library_that_ask_reads(tiny_model_dir, folder, tmp_path):
    """`reform encode DIR --store S --library L` prepares every document and enters them (as on Ray, in this
    process); `reform ask --store S --library L` asks them; a bad library name is refused before any work."""
    from typer.testing import CliRunner

    from reform.cli.main import app
    run = lambda *args: CliRunner().invoke(app, list(args))
    store = str(tmp_path / "store")
    flags = ["--model", str(tiny_model_dir), "--heads", "1:v:0,2:q:3", "--chunk-size", "128", "--cache-budget",
             "256", "--recompute-budget", "400"]
    r = run("encode", str(folder), "--store", store, "--library", "harbour", "--json", *flags)
    assert r.exit_code == 1, r.output          # blank.txt is no document (failed), the others are entered
    summary = json.loads(r.stdout)
    assert (summary["encoded"], summary["failed"], summary["entered"]) == (5, 1, 5)
    listed = json.loads(run("library", "list", "--store", store, "--library", "harbour", "--json").stdout)
    assert [d["name"] for d in listed["documents"]] == ["doc1.md", "doc2.md", "doc3.md", "short.md", "sub/notes.txt"]
    r = run("ask", "--store", store, "--library", "harbour", "-q", "Who kept lighthouse 3?", "--json",
            "--max-new-tokens", "3", *flags)
    assert r.exit_code == 0 and json.loads(r.stdout)["stats"]["library"]["documents"] == 5
    r = run("encode", str(folder), "--store", store, "--library", "../up", *flags)
    assert r.exit_code == 2 and "a library's name" in r.output
