"""REFORM's gather without its pieces (``min_run``, methods/whole_runs.py): the top-budget gather's short runs
are dropped and their budget grows the runs kept, on hand-made scores and through a tiny model."""

import pytest
import torch

from reform.methods.reform import ReformConfig, gather_indices, gather_tokens
from reform.methods.whole_runs import whole_runs


def runs_of(keep: torch.Tensor) -> list[tuple[int, int]]:
    breaks = (keep[1:] != keep[:-1] + 1).nonzero().flatten() + 1
    return [(int(r[0]), int(r[-1]) + 1) for r in torch.tensor_split(keep, breaks.tolist())]


def comb_scores() -> torch.Tensor:
    """Two strong passages (100-159, 400-429) and a comb of 4-token pieces (700-779) that the top-budget
    gather takes because their scores sit just above the background's."""
    scores = torch.linspace(0.0, 0.1, 1000)
    scores[100:160] = 1.0
    scores[400:430] = 0.9
    for start in range(700, 780, 8):
        scores[start:start + 4] = 0.5
    return scores


def test_the_pieces_go_and_their_budget_grows_the_runs_kept():
    scores, forced = comb_scores(), torch.zeros(1000, dtype=torch.bool)
    keep = gather_indices(scores, 130, 0, 0)
    assert runs_of(keep) == [(100, 160), (400, 430)] + [(s, s + 4) for s in range(700, 780, 8)]
    kept = whole_runs(scores, keep, 8, forced)
    assert kept.numel() == keep.numel() and kept.tolist() == sorted(set(kept.tolist()))    # the same budget
    runs = runs_of(kept)
    assert len(runs) == 2 and all(b - a >= 8 for a, b in runs)
    assert set(range(100, 160)) | set(range(400, 430)) <= set(kept.tolist())
    grown = set(kept.tolist()) - set(keep.tolist())
    # 40 tokens of pieces: ten steps of one token on each side of both runs
    assert grown == set(range(90, 100)) | set(range(160, 170)) | set(range(390, 400)) | set(range(430, 440))


def test_forced_ends_stay_and_long_runs_are_left_alone():
    scores, forced = comb_scores(), torch.zeros(1000, dtype=torch.bool)
    forced[:3] = forced[-3:] = True                      # ends shorter than min_run are kept all the same
    keep = gather_indices(scores, 136, 3, 3)
    kept = whole_runs(scores, keep, 8, forced)
    assert kept.numel() == 136 and {0, 1, 2, 997, 998, 999} <= set(kept.tolist())
    long_only = gather_indices(scores, 90, 0, 0)          # both passages, no piece
    assert torch.equal(whole_runs(scores, long_only, 8, torch.zeros(1000, dtype=torch.bool)), long_only)
    pieces_only = torch.tensor([1, 2, 10, 11])           # nothing long enough to grow from: the gather as it was
    assert torch.equal(whole_runs(scores, pieces_only, 8, torch.zeros(1000, dtype=torch.bool)), pieces_only)


def test_a_gap_between_two_runs_is_filled_once_and_growth_stops_at_the_edges():
    scores = torch.zeros(20)
    keep = torch.tensor([0, 1, 2, 3, 5, 6, 7, 8, 18, 19])    # a one-token gap at 4 and a piece at 18-19
    kept = whole_runs(scores, keep, 4, torch.zeros(20, dtype=torch.bool))
    assert kept.tolist() == list(range(10))               # 4 taken once, and 9: the budget of 10 tokens
    rising = torch.arange(20.0)                           # one token of room, two edges: the better one
    assert whole_runs(rising, torch.tensor([0, 5, 6, 7]), 3, torch.zeros(20, dtype=torch.bool)).tolist() == [5, 6, 7, 8]
    assert whole_runs(-rising, torch.tensor([0, 5, 6, 7]), 3, torch.zeros(20, dtype=torch.bool)).tolist() == [4, 5, 6, 7]


def test_min_run_is_an_option_of_reform_checked_before_any_work():
    c = ReformConfig(recompute_budget=130, gather_keep=0, pool_window=9, min_run=8)
    assert torch.equal(gather_tokens(comb_scores(), c), whole_runs(comb_scores(), gather_indices(comb_scores(), 130, 0, 0),
                                                                   8, torch.zeros(1000, dtype=torch.bool)))
    paper = ReformConfig(recompute_budget=130, gather_keep=0, pool_window=9)
    assert paper.min_run == 0 and torch.equal(gather_tokens(comb_scores(), paper), gather_indices(comb_scores(), 130, 0, 0))
    from conftest import CharTokenizer, tiny
    from reform.pipeline import Pipeline
    with pytest.raises(ValueError, match="option min_run of reform cannot be negative, got -1"):
        Pipeline(tiny("llama"), CharTokenizer(), heads="1:v:0", min_run=-1)


def test_a_tiny_model_answers_from_whole_runs():
    """Through the pipeline: every run of what REFORM recomputes is at least ``min_run`` long, at the same
    budget as without, and the answer is recomputed from that gather."""
    from conftest import CharTokenizer, tiny
    from reform.pipeline import Pipeline
    options = dict(heads="1:v:0,2:q:3", chunk_size=64, cache_budget=96, recompute_budget=100, gather_keep=8,
                   pool_window=9, run_peaks=0)
    text = "".join(f"VAR Q{i:02d} = {4711 + i}. The grass is green. " for i in range(30))
    paper, whole = (Pipeline(tiny("llama"), CharTokenizer(), min_run=m, **options) for m in (0, 6))
    part = paper.templater.question("Q07 Q21 Q13 ?")
    keep_paper = paper.method.select(paper.encode(text), part, None)
    ctx = whole.encode(text)
    keep_whole = whole.method.select(ctx, part, None)
    assert keep_whole.numel() == keep_paper.numel() == 100
    assert all(b - a >= 6 for a, b in runs_of(keep_whole))
    assert sum(b - a < 6 for a, b in runs_of(keep_paper)) > 10      # the paper's gather had pieces to drop
    assert torch.equal(ctx.ask("Q07 Q21 Q13 ?", max_new_tokens=2).kept, keep_whole)     # what it recomputed


def test_a_library_gathers_whole_runs_across_its_documents(tmp_path):
    """The library's gather over several documents (``library/gather.py``) takes ``min_run`` as one context's
    gather does, at the same budget."""
    import copy
    import dataclasses
    from conftest import CharTokenizer, tiny
    from reform.library import Library
    from reform.library.gather import gather
    from reform.pipeline import Pipeline
    pipe = Pipeline(tiny("llama"), CharTokenizer(), heads="1:v:0,2:q:3", chunk_size=64, cache_budget=96,
                    recompute_budget=300)
    (tmp_path / "a.md").write_text("".join(f"VAR Q{i:02d} = {4711 + i}. The grass is green. " for i in range(30)))
    library = Library(pipe, tmp_path / "store")
    library.add(tmp_path / "a.md")
    doc = library.documents()[0]
    ctx, question = library.context(doc.key), "Q07 Q21 Q13 ?"
    _, index = library.index({doc.name: doc})
    documents = [(doc.name, ctx, index.scores(question), index.spans[0])]
    kept = {}
    for m in (0, 6):
        method = copy.copy(pipe.documents_method)
        method.config = dataclasses.replace(method.config, min_run=m)
        (got,) = gather(method, documents, pipe.templater.question(question), 100, len(pipe.templater.prefix))
        kept[m] = got.kept
    assert kept[0].numel() == kept[6].numel() == 100
    assert any(b - a < 6 for a, b in runs_of(kept[0])) and all(b - a >= 6 for a, b in runs_of(kept[6]))
