"""Every bad input gets one clear line and a non-zero exit (no model needed for these)."""

import pytest
from typer.testing import CliRunner

from reform.cli.main import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "ctx.txt"
    p.write_text("Some context. " * 20)
    return p


@pytest.mark.parametrize("content,msg", [
    (b"", "is empty"),
    (b"   \n\n", "is empty"),
    (b"abc\x00\x01\x02binary", "looks binary"),
    (b"%PDF-1.7\n" + b"0" * 64, "not a readable PDF"),
])
def test_bad_files(tmp_path, content, msg):
    p = tmp_path / "f.txt"
    p.write_bytes(content)
    r = run("ask", str(p), "--question", "What?")
    assert r.exit_code == 2 and msg in r.output


def test_missing_file_and_directory(tmp_path):
    r = run("ask", str(tmp_path / "nope.txt"), "-q", "What?")
    assert r.exit_code == 2 and "file not found" in r.output
    r = run("ask", str(tmp_path), "-q", "What?")          # a folder is one context: this one holds none
    assert r.exit_code == 2 and "no documents in" in r.output


def test_missing_question(text_file):
    r = run("ask", str(text_file))
    assert r.exit_code == 2 and "a question is required" in r.output
    r = run("ask", str(text_file), "-q", "  ")
    assert r.exit_code == 2 and "a question is required" in r.output


def test_unknown_model_paths(text_file, tmp_path):
    r = run("ask", str(text_file), "-q", "What?", "--model", str(tmp_path / "missing.gguf"))
    assert r.exit_code == 2 and "GGUF file not found" in r.output
    r = run("ask", str(text_file), "-q", "What?", "--model", str(tmp_path))
    assert r.exit_code == 2 and "not a model directory" in r.output


def test_unknown_hub_id_offline(text_file):   # conftest sets HF_HUB_OFFLINE=1
    r = run("ask", str(text_file), "-q", "What?", "--model", "no-such-org/no-such-model-xyz")
    assert r.exit_code == 2 and "HF_HUB_OFFLINE is set" in r.output and r.output.count("\n") == 1


def test_architecture_without_rotary_positions(text_file, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64)) \
        .save_pretrained(tmp_path / "gpt2")
    r = run("ask", str(text_file), "-q", "What?", "--model", str(tmp_path / "gpt2"))
    assert r.exit_code == 2 and "gpt2" in r.output and "no rotary position embedding" in r.output


def test_bad_dtype_and_method(text_file):
    r = run("ask", str(text_file), "-q", "What?", "--dtype", "int3")
    assert r.exit_code == 2 and "unknown dtype" in r.output
    r = run("ask", str(text_file), "-q", "What?", "--method", "full", "--cache-budget", "10")
    assert r.exit_code == 2 and "takes no chunk or budget" in r.output


def test_method_options_by_name(text_file):
    """--option KEY=VALUE reaches the method's config: unknown names and malformed items are refused
    before the model loads, with the options the method does take."""
    r = run("ask", str(text_file), "-q", "What?", "--method", "ilre", "--option", "windowz=3")
    assert r.exit_code == 2 and "takes no windowz option" in r.output and "--option dca=..." in r.output
    r = run("ask", str(text_file), "-q", "What?", "--method", "ilre", "--option", "dca")
    assert r.exit_code == 2 and "bad --option 'dca'" in r.output


def test_profile_flag(text_file):
    """--profile reaches reform's config; a bad name, or a method without profiles, is refused before
    the model loads."""
    r = run("ask", str(text_file), "-q", "What?", "--profile", "turbo")
    assert r.exit_code == 2 and "must be one of default, fast, got 'turbo'" in r.output
    r = run("ask", str(text_file), "-q", "What?", "--method", "h2o", "--profile", "fast")
    assert r.exit_code == 2 and "takes no --profile option" in r.output
    from reform.cli.common import parse_options
    assert parse_options(["segments=2"], "fast") == {"profile": "fast", "segments": 2}


def test_option_values_are_typed():
    from reform.cli.common import parse_options
    assert parse_options(["dca=true", "retrieval_layer=14", "weight=0.5", "heads=5:v:2"]) == \
        {"dca": True, "retrieval_layer": 14, "weight": 0.5, "heads": "5:v:2"}


def test_encode_and_ask_context_refusals(tmp_path, text_file):
    r = run("encode", str(text_file), "-o", str(text_file / "c.reform"))      # below a file: unwritable
    assert r.exit_code == 2 and "cannot write --out" in r.output and "is a file, not a folder" in r.output
    r = run("encode", str(text_file), "-o", str(tmp_path))
    assert r.exit_code == 2 and "is a folder; give a file name" in r.output
    r = run("ask", "-q", "What?")
    assert r.exit_code == 2 and "exactly one" in r.output
    r = run("ask", str(text_file), "--context", str(tmp_path / "c.reform"), "-q", "What?")
    assert r.exit_code == 2 and "exactly one" in r.output
    r = run("ask", "--context", str(tmp_path / "missing.reform"), "-q", "What?")
    assert r.exit_code == 2 and "saved context not found" in r.output
    r = run("ask", "--context", str(text_file), "-q", "What?")
    assert r.exit_code == 2 and "not a readable saved context" in r.output
    r = run("ask", "--context", str(text_file), "-q", "What?", "--recompute-budget", "512")
    assert r.exit_code == 2 and "cannot be combined with --context" in r.output
    r = run("ask", str(text_file), "-q", "What?", "--temperature", "9")
    assert r.exit_code == 2 and "temperature" in r.output


def test_encode_corpus_refusals(tmp_path, text_file):
    r = run("encode", str(text_file))
    assert r.exit_code == 2 and "give --out FILE (one document) or --store" in r.output
    r = run("encode", str(text_file), "-o", str(tmp_path / "a.reform"), "--store", str(tmp_path / "s"))
    assert r.exit_code == 2 and "give --out FILE (one document) or --store" in r.output
    r = run("encode", str(text_file), "-o", str(tmp_path / "a.reform"), "--ray")
    assert r.exit_code == 2 and "--ray encodes into a store" in r.output
    (tmp_path / "empty").mkdir()
    r = run("encode", str(tmp_path / "empty"), "--store", str(tmp_path / "s"))
    assert r.exit_code == 2 and "no documents in" in r.output
    r = run("encode", str(tmp_path / "missing"), "--store", str(tmp_path / "s"))
    assert r.exit_code == 2 and "file not found" in r.output
    r = run("encode", str(text_file), "--store", str(text_file / "below"))
    assert r.exit_code == 2 and "cannot use" in r.output and "context store" in r.output
    r = run("encode", str(text_file), "--store", "nosuch://bucket/x")
    assert r.exit_code == 2 and "Protocol not known" in r.output
    r = run("encode", str(text_file), "--store", str(tmp_path / "s"), "--method", "nope")
    assert r.exit_code == 2 and "unknown method 'nope'" in r.output


def test_encode_corpus_in_one_process_skips_stored_and_reports_failures(tiny_model_dir, tmp_path):
    import json
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_text("Alpha context. " * 30)
    (corpus / "sub" / "b.txt").write_text("Beta context, somewhat different. " * 30)
    (corpus / ".hidden.txt").write_text("skipped")
    args = ["encode", str(corpus), "--store", str(tmp_path / "store"), "--json", "--model", str(tiny_model_dir),
            "--heads", "1:v:0,2:q:3", "--chunk-size", "64", "--cache-budget", "96", "--recompute-budget", "128"]
    first = json.loads(run(*args).stdout)
    assert (first["documents"], first["encoded"], first["failed"]) == (2, 2, 0)
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == sorted(f"{r['key']}.reform"
                                                                            for r in first["results"])
    (corpus / "c.txt").write_bytes(b"\x00binary")
    r = run(*args)
    again = json.loads(r.stdout)
    assert r.exit_code == 1 and (again["encoded"], again["stored"], again["failed"]) == (0, 2, 1)
    assert [x["error"] for x in again["results"] if x["status"] == "failed"][0].endswith("looks binary (it contains "
                                                                                         "NUL bytes) and is no format "
                                                                                         "reform reads")


def test_documents_through_ask_and_encode_with_their_evidence(tiny_model_dir, tmp_path):
    """`reform ask book.pdf --evidence 3` prints passages with pages; `reform encode book.pdf -o` then
    `reform ask --context ... --json` gives evidence entries with `page`; a folder is one context."""
    import json
    from pathlib import Path
    data = Path(__file__).parent / "data" / "documents"
    opts = ["--model", str(tiny_model_dir), "--heads", "1:v:0,2:q:3", "--chunk-size", "128", "--cache-budget", "256",
            "--recompute-budget", "400", "--max-new-tokens", "3"]
    r = run("ask", str(data / "book.pdf"), "-q", "Who rowed out?", "--evidence", "3", *opts)
    assert r.exit_code == 0, r.output
    listed = [line for line in r.stdout.splitlines() if line.startswith("[")]
    assert r.stdout.count("Evidence (") == 1 and 1 <= len(listed) <= 3
    assert all(line.split("] ", 1)[1].startswith(str(data / "book.pdf") + ", page") for line in listed)
    saved = tmp_path / "book.reform"
    assert run("encode", str(data / "book.pdf"), "-o", str(saved), *opts[:-2]).exit_code == 0
    r = run("ask", "--context", str(saved), "-q", "Who rowed out?", "--json", "--max-new-tokens", "3")
    evidence = json.loads(r.stdout)["evidence"]
    assert r.exit_code == 0 and evidence and all(1 <= e["page"] <= 3 for e in evidence)
    r = run("ask", str(data), "-q", "Who rowed out?", "--json", *opts)           # the folder of all four formats
    documents = {e["document"] for e in json.loads(r.stdout)["evidence"]}
    assert r.exit_code == 0 and documents <= {"book.docx", "book.epub", "book.html", "book.pdf", "make.py"}
    r = run("ask", str(tmp_path / "missing.pdf"), "-q", "What?")
    assert r.exit_code == 2 and "file not found" in r.output


def test_documents_get_the_documents_method_unless_one_is_named():
    """`reform ask FILE` and `reform encode` run REFORM+RAG with dense and BM25 scores when no --method is
    given (docs/methods.md, "Documents"); other commands, or a method named, keep what was asked."""
    from reform.cli.common import LoadArgs
    docs = LoadArgs().load(documents=True)
    assert (docs["method"], docs["retriever"], docs["pool_passages"]) == ("reform+rag", "dense+bm25", True)
    assert LoadArgs(option=["retriever=bm25", "weight=0.3"]).load(documents=True) | {"model": None} == \
        docs | {"retriever": "bm25", "weight": 0.3}
    assert LoadArgs().load()["method"] == "reform" and "retriever" not in LoadArgs().load()
    named = LoadArgs(method="reform").load(documents=True)
    assert named["method"] == "reform" and "retriever" not in named
    assert LoadArgs(method="reform").method_flags_given() == ["--method"] and LoadArgs().method_flags_given() == []


def test_version_is_printed_on_its_own():
    from reform import __version__
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout == f"reform {__version__}\n"
    r = runner.invoke(app, ["--version", "ask", "nope.txt"])        # eager: before any command runs
    assert r.exit_code == 0 and r.stdout == f"reform {__version__}\n"


def test_closed_standard_input_is_one_line_not_a_traceback():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", "from reform.cli.main import main; main()", "ask", "-", "-q", "x"],
                       capture_output=True, text=True, preexec_fn=lambda: __import__("os").close(0), timeout=120)
    assert r.returncode == 2 and "standard input is closed" in r.stderr and "Traceback" not in r.stderr


def test_a_named_pipe_is_read_as_a_stream(tiny_model_dir, tmp_path):
    import os
    import threading
    fifo = tmp_path / "doc.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("The keeper's cat is named Maren. " * 10), daemon=True)
    writer.start()
    r = run("ask", str(fifo), "-q", "What is the cat named?", "--model", str(tiny_model_dir), "--heads", "1:v:0,2:q:3",
            "--chunk-size", "64", "--cache-budget", "128", "--recompute-budget", "200", "--max-new-tokens", "2", "--json")
    writer.join(timeout=30)
    assert r.exit_code == 0, r.output
