"""A resumed evaluation folder never mixes rows answered with two different head sets under one label: a
preset (or a preset file) can change while the method's label and config hash stay the same."""

import json

import pytest

from reform.eval.records import read_predictions
from reform.eval.rows import Row
from reform.eval.runner import run_eval
from reform.model import LoadedModel

from conftest import CharTokenizer, tiny

HAY = "The quick brown fox jumps over the lazy dog. " * 9


def rows(n):
    return [Row(context=HAY, question=f"Where is item {i}?", answers=["fox"], task="niah", length=400, depth=0.0,
                max_new_tokens=2, sample=i) for i in range(n)]


def run(out, preset, n, **kw):
    method = ("reform", dict(heads=str(preset), chunk_size=64, cache_budget=96, recompute_budget=200))
    return run_eval(rows(n), methods=[method], out_dir=out, model_name="tiny", scorer=lambda row, p: 1.0,
                    loader=lambda: LoadedModel(tiny(), CharTokenizer(), "tiny"), plots=False, **kw)


def test_a_preset_changed_under_a_resumed_folder_is_refused(tmp_path):
    preset, out = tmp_path / "heads.json", tmp_path / "run"
    preset.write_text(json.dumps({"model": "tiny", "heads": ["1:v:0", "2:q:3"]}))
    run(out, preset, 1)
    run(out, preset, 1)                         # nothing left to answer: no model, nothing to compare
    before = {p.name: p.read_text() for p in out.iterdir() if p.is_file()}
    preset.write_text(json.dumps({"model": "tiny", "heads": ["1:k:1"]}))
    with pytest.raises(ValueError, match=r"holds reform\(.*heads.json.*\) rows answered with other options than it "
                                         r"resolves to now \(heads: \['1:v:0', '2:q:3'\] then, \['1:k:1'\] now\)"):
        run(out, preset, 2)
    assert {p.name: p.read_text() for p in out.iterdir() if p.is_file()} == before     # the folder is as it was

    run(out, preset, 2, resume=False)           # --fresh answers every row with the heads of now
    config = json.loads((out / "config.json").read_text())
    assert config["methods"][0]["resolved"]["heads"] == ["1:k:1"]
    assert len(read_predictions(out / "predictions.jsonl")) == 2


def test_the_same_heads_resume_as_before(tmp_path):
    preset, out = tmp_path / "heads.json", tmp_path / "run"
    preset.write_text(json.dumps({"model": "tiny", "heads": ["1:v:0", "2:q:3"]}))
    run(out, preset, 1)
    run(out, preset, 2)
    assert [r["sample"] for r in read_predictions(out / "predictions.jsonl")] == [0, 1]
