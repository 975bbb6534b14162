"""docs/results/ stays navigable: every run folder has a README, something cites each one, and the index
(docs/results/README.md, written by scripts/results_index.py) lists exactly the folders with their
models, machines and citing pages as they are now. The landed column comes from git and is left to the
script (a shallow clone cannot tell it)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("results_index", ROOT / "scripts" / "results_index.py")
index = importlib.util.module_from_spec(spec)
spec.loader.exec_module(index)


def without_landed(text: str) -> list[str]:
    """The index's rows with the landed column blanked."""
    return [re.sub(r"^(\| [^|]+ \|)[^|]+\|", r"\1 |", line) for line in text.splitlines() if line.startswith("| [")]


def test_every_run_folder_has_a_readme_and_is_cited():
    runs = index.folders()
    assert len(runs) > 40
    assert [r.name for r in runs if not (r / "README.md").exists()] == []
    assert [r.name for r in runs if not index.cited_by(r)] == []


def test_the_index_lists_every_run_as_it_is():
    written = (ROOT / "docs" / "results" / "README.md").read_text()
    assert without_landed(written) == without_landed(index.render()), \
        "docs/results/README.md is out of date: run python scripts/results_index.py"
    assert len(without_landed(written)) == len(index.folders())


def test_the_index_reads_model_and_machine_from_a_runs_own_files(tmp_path, monkeypatch):
    run = tmp_path / "eval-demo"
    run.mkdir()
    (run / "config.json").write_text('{"model": "google/gemma-3-270m", "machine": {"cpu": "AMD EPYC", "cpu_bf16": []}}')
    (run / "README.md").write_text("# A demo run\n")
    assert index.describe(run) == ("Gemma 3 270M", "AMD EPYC (AVX2 only)")
    (run / "README.md").write_text("# A demo run on one NVIDIA H200, beside the 2-core Zen 5 machine\n")
    assert index.describe(run) == ("Gemma 3 270M", "NVIDIA H200, AMD EPYC Zen 5")
