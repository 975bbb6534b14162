"""The documented tools in scripts/ (docs/tools.md) that have logic of their own: they run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_make_needle_files_writes_one_haystack_per_depth_with_its_needle(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_needle_files.py"), "--tokens", "2048",
                        "--depths", "0,0.5,1", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "needles.json").read_text())
    assert [row["depth"] for row in rows] == [0.0, 0.5, 1.0]
    for row in rows:
        text = Path(row["file"]).read_text()
        assert row["answer"] in text and 2048 <= row["tokens"] < 2048 * 1.15   # the haystack, plus the chat template
        at = text.index(row["answer"]) / len(text)
        assert abs(at - row["depth"]) < 0.1, (row["depth"], at)
    assert len({row["answer"] for row in rows}) == 3                # each depth its own needle


def test_every_script_is_documented():
    documented = (ROOT / "docs" / "tools.md").read_text()
    missing = [p.name for p in (ROOT / "scripts").iterdir() if f"`{p.name}`" not in documented]
    assert not missing, missing
