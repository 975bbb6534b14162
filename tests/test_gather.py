"""REFORM's gather stage on hand-made scores and embeddings."""

import pytest
import torch
import torch.nn.functional as F

from reform.methods.reform import gather_indices, max_pool, token_scores


def test_token_scores_is_max_over_query_of_mean_head_cosine():
    torch.manual_seed(0)
    n_heads, d, n, q = 3, 8, 50, 4
    ctx_raw, q_raw = torch.randn(n, n_heads, d), torch.randn(q, n_heads, d)
    ctx = F.normalize(ctx_raw, dim=-1).reshape(n, -1)
    qry = F.normalize(q_raw, dim=-1).reshape(q, -1)
    got = token_scores(ctx.half(), qry.half(), block=7) / n_heads
    ref = torch.stack([F.cosine_similarity(ctx_raw[:, None, h], q_raw[None, :, h], dim=-1)
                       for h in range(n_heads)]).mean(0).amax(-1)
    torch.testing.assert_close(got, ref, atol=2e-3, rtol=2e-3)


def test_max_pool_spreads_a_peak_over_the_window():
    s = torch.zeros(1000)
    s[500] = 1.0
    pooled = max_pool(s, 129)
    assert pooled.shape == s.shape
    assert (pooled[436:565] == 1).all() and pooled[435] == 0 and pooled[565] == 0


def test_gather_keeps_first_last_and_pooled_top_budget():
    torch.manual_seed(1)
    n, budget = 5000, 1000
    scores = torch.rand(n) * 0.1
    scores[2000:2100] = 1.0                                  # a relevant passage
    pooled = max_pool(scores, 129)
    idx = gather_indices(pooled, budget, 256, 256)
    kept = set(idx.tolist())
    assert len(idx) == budget and idx.tolist() == sorted(kept)
    assert set(range(256)) <= kept and set(range(n - 256, n)) <= kept
    assert set(range(2000 - 64, 2100 + 64)) <= kept           # passage plus its pooled neighbourhood
    rest = torch.tensor(sorted(kept - set(range(256)) - set(range(n - 256, n))))
    others = torch.ones(n, dtype=torch.bool)
    others[:256] = others[n - 256:] = False
    others[rest] = False
    assert pooled[rest].min() >= pooled[others].max()        # the free slots hold the best pooled scores


def test_gather_takes_everything_when_budget_covers_input():
    assert gather_indices(torch.rand(300), 300, 256, 256).tolist() == list(range(300))


def test_ordered_runs_reward_pieces_in_the_question_order():
    """A key whose pieces each occur elsewhere too scores highest only where they follow each other as in
    the question (REFORM's ``match_run``); blockwise equals whole."""
    from reform.methods.reform import ordered_run_scores
    n, q, run = 40, 6, 4
    sim = torch.zeros(n, q)
    for k in range(q):                       # the asked key, in order, at tokens 20..25
        sim[20 + k, k] = 1.0
    for t in range(0, 12):                   # the same pieces scattered out of order at tokens 0..11
        sim[t, (5 * t) % q] = 1.0
    context, query = sim, torch.eye(q)       # context @ query.T == sim
    scores = ordered_run_scores(context, query, run)
    assert scores.shape == (n,)
    assert torch.all(scores[20:26] == 1.0) and scores[:12].max() <= 0.5
    assert torch.equal(token_scores(context, query)[:12], torch.ones(12))   # the paper's max cannot tell
    assert torch.allclose(ordered_run_scores(context, query, run, block=7), scores)
    assert torch.allclose(ordered_run_scores(context, query, 1), token_scores(context, query))
    assert ordered_run_scores(context, query, 50).shape == (n,)             # a run longer than the question


def test_ordered_run_scores_equal_their_definition_on_random_states():
    """Every token's score is the best mean of ``run`` diagonal similarities (context t+k against question
    j+k) over the runs covering it, whatever the block size (blocks overlap by ``run - 1`` tokens)."""
    from reform.methods.reform import ordered_run_scores
    g = torch.Generator().manual_seed(0)
    context, query = F.normalize(torch.randn(37, 8, generator=g), dim=-1), F.normalize(torch.randn(9, 8, generator=g), dim=-1)
    sim, run = context @ query.T, 4
    starts = [max(sum(sim[t + k, j + k] for k in range(run)) / run for j in range(9 - run + 1)) for t in range(37 - run + 1)]
    expected = torch.stack([max(starts[max(0, t - run + 1):t + 1]) for t in range(37)])
    for block in (1, 5, 16, 1 << 13):
        assert torch.allclose(ordered_run_scores(context, query, run, block=block), expected, atol=1e-6)


def test_gather_variants_keep_the_budget_and_the_ends():
    import sys
    sys.path.insert(0, "tests")
    from conftest import CharTokenizer, tiny
    sys.path.insert(0, "scripts/labs")
    from gather_variants import VARIANTS
    from reform.pipeline import Pipeline
    pipe = Pipeline(tiny("llama"), CharTokenizer(), heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96,
                    recompute_budget=100, gather_keep=8, pool_window=9, query_aggregate="max")
    text = "VAR QXZ = 4711. The grass is green. " * 6 + "VAR KWY = VAR QXZ. The sky is blue. " * 6
    ctx = pipe.encode(text)
    part = pipe.templater.question("Which variables hold 4711?")
    n = ctx.ids.shape[0]
    for name, variant in VARIANTS.items():
        kept = variant(ctx, part)
        assert kept.numel() == 100 and torch.equal(kept, torch.sort(torch.unique(kept)).values), name
        assert set(range(8)) | set(range(n - 8, n)) <= set(kept.tolist()), name
    # on a max context the default gather is run_peaks=1; "paper" is the paper's whatever the context was
    # encoded with
    assert torch.equal(VARIANTS["runpeaks1"](ctx, part), ctx.method.select(ctx, part, None))
    from dataclasses import replace
    paper = type(ctx.method)(replace(ctx.method.config, run_peaks=0))
    assert torch.equal(VARIANTS["paper"](ctx, part), paper.select(ctx, part, None))
    # "rag" / "ragpeaks1" on a REFORM context are what REFORM+RAG itself gathers (run_peaks 0 / 1)
    for variant, peaks in (("rag", 0), ("ragpeaks1", 1)):
        hybrid = Pipeline(tiny("llama"), CharTokenizer(), method="reform+rag", run_peaks=peaks,
                          heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96, recompute_budget=100,
                          gather_keep=8, pool_window=9)
        own = hybrid.encode(text)
        assert torch.equal(VARIANTS[variant](ctx, part), own.method.select(own, part, None)), variant


def test_run_peaks_gather_the_best_ordered_run_the_paper_misses_and_nothing_else():
    """REFORM's ``run_peaks``: the window around the best ordered run is gathered where the paper's
    ranking leaves it (or part of it) out, the rest of the budget is the paper's; where the paper's gather
    already holds the run's window, the gather is exactly the paper's. On by default; at 0 (the paper's) saved options stay as before."""
    import sys
    from dataclasses import replace
    sys.path.insert(0, "tests")
    from conftest import CharTokenizer, tiny
    from reform.methods.options import options_json
    from reform.methods.reform import (PEAK_RUN, RUN_AFTER, RUN_BEFORE, ReformConfig, gather_indices,
                                       ordered_run_scores, raise_run_windows)
    from reform.pipeline import Pipeline
    from reform.stats import Timer
    # the rule itself, on made-up scores: 1000 tokens, budget 300, ends of 8
    c = ReformConfig(recompute_budget=300, gather_keep=8, pool_window=9)
    pooled = torch.linspace(1.0, 0.0, 1000)                   # the paper ranks the early tokens first
    paper = gather_indices(pooled, 300, 8, 8)
    for peak, missed in ((100, False), (700, True)):
        runs = torch.zeros(1000)
        runs[peak:peak + PEAK_RUN] = 1.0                      # one best run (a plateau: its first token is its peak)
        lifted = pooled.clone()
        raise_run_windows(lifted, runs, c, 1, only_missed=True)
        kept = gather_indices(lifted, 300, 8, 8)
        if not missed:
            assert torch.equal(kept, paper)
            continue
        window = set(range(peak - RUN_BEFORE, peak + RUN_AFTER + 1))
        assert window <= set(kept.tolist()) and not window & set(paper.tolist())
        assert set(paper.tolist()) - set(kept.tolist()) == set(paper[-len(window) - 8:-8].tolist())  # its weakest
    # a run in the always-kept start whose window runs on past it (a key kept, its value cut off): the
    # paper holds its best token but not its window, so the window is gathered
    pooled = torch.linspace(0.0, 1.0, 1000)                   # now the paper ranks the late tokens first
    paper, runs = gather_indices(pooled, 300, 8, 8), torch.zeros(1000)
    runs[3:3 + PEAK_RUN] = 1.0
    lifted = pooled.clone()
    raise_run_windows(lifted, runs, c, 1, only_missed=True)
    kept = set(gather_indices(lifted, 300, 8, 8).tolist())
    assert 3 in set(paper.tolist()) and 40 not in set(paper.tolist())
    assert set(range(0, 3 + RUN_AFTER + 1)) <= kept
    # through the pipeline: where the paper's gather (run_peaks=0) holds the best run's window, run_peaks
    # changes nothing; where a 9-token pool leaves part of it out, run_peaks gathers all of it
    text = "VAR QXZ = 4711. The grass is green. " * 8 + "VAR KWY = VAR QXZ. The sky is blue. " * 8
    for pool, budget, held in ((129, 300, True), (9, 200, False)):
        pipe = Pipeline(tiny("llama"), CharTokenizer(), heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96,
                        recompute_budget=budget, gather_keep=8, pool_window=pool, run_peaks=0)
        ctx = pipe.encode(text)
        part = pipe.templater.question("Which variables hold 4711?")
        runs = ordered_run_scores(ctx.state.data, ctx.method.query_embeddings(ctx, part), PEAK_RUN)
        paper = ctx.method.select(ctx, part, Timer())
        best = int(runs.argmax())
        window = set(range(max(0, best - RUN_BEFORE), best + RUN_AFTER + 1))
        peaks = type(ctx.method)(replace(ctx.method.config, run_peaks=1)).select(ctx, part, Timer())
        assert (window <= set(paper.tolist())) == held and window <= set(peaks.tolist())
        assert torch.equal(peaks, paper) == held
    assert "run_peaks" not in options_json(ctx.method.config)             # the paper's: saved as before
    assert options_json(replace(ctx.method.config, run_peaks=1))["run_peaks"] == 1
    assert Pipeline(tiny("llama"), CharTokenizer(), heads="1:v:0").method.config.run_peaks == 1  # the default
    with pytest.raises(ValueError, match="run_peaks of reform cannot be negative"):
        Pipeline(tiny("llama"), CharTokenizer(), heads="1:v:0", run_peaks=-1)


def test_query_baseline_lets_a_rare_question_word_outscore_one_that_matches_everywhere():
    """A question token that matches every window (a book's recurring name) scores as high at the window
    that answers as everywhere else; less its own high quantile over the context, the rare token that
    matches only the answering window decides, and the option is off (the paper's max) by default."""
    from dataclasses import fields, replace

    from reform.methods.options import options_json
    from reform.methods.reform import ReformConfig, query_offsets
    torch.manual_seed(0)
    d, n = 16, 4000
    common, rare = F.normalize(torch.randn(2, d), dim=-1)
    noise = F.normalize(torch.randn(n, d), dim=-1)
    context = F.normalize(0.9 * common + 0.45 * noise, dim=-1)        # every token close to the common word
    answer = 1234
    context[answer] = F.normalize(0.7 * rare + 0.7 * common, dim=-1)   # the window that answers has both
    query = torch.stack([common, rare])
    plain = token_scores(context, query)
    assert int(plain.argmax()) != answer                              # the common word wins somewhere else
    offsets = query_offsets(context, query, 0.999)
    assert offsets[0] > offsets[1]                                    # the common word's ordinary match is high
    assert int(token_scores(context, query, offsets).argmax()) == answer
    default = next(f for f in fields(ReformConfig) if f.name == "query_baseline").default
    assert default == 0.0 and "query_baseline" not in options_json(replace(ReformConfig(), query_baseline=0.0))
    from conftest import CharTokenizer, tiny
    from reform import Pipeline
    with pytest.raises(ValueError, match="query_baseline"):
        Pipeline(tiny("llama"), CharTokenizer(), heads="1:v:0", query_baseline=1.0, query_aggregate="max")
    pipe = Pipeline(tiny("llama"), CharTokenizer(), heads="1:v:0", query_baseline=0.99, query_aggregate="max")
    assert options_json(pipe.method.config)["query_baseline"] == 0.99


def test_recall_lab_answers_each_variant_from_its_own_gather(monkeypatch):
    """scripts/recall_lab.py answers a row once per gather variant: each answer is recomputed from the tokens
    that variant gathers (the answer path gathers through ``select_scored``), not from REFORM's own."""
    import importlib.util
    import sys
    sys.path.insert(0, "tests")
    from conftest import CharTokenizer, tiny
    from reform.eval.rows import Row
    sys.path.insert(0, "scripts/labs")
    import gather_variants as gather
    from reform.pipeline import Pipeline
    spec = importlib.util.spec_from_file_location("recall_lab", "scripts/recall_lab.py")
    lab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab)
    pipe = Pipeline(tiny("llama"), CharTokenizer(), heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96,
                    recompute_budget=100, gather_keep=8, pool_window=9)
    ctx = pipe.encode("The grass is green. " * 30 + "The magic number is 4711. " + "The sky is blue. " * 30)
    head = lambda c, part: torch.arange(100)                      # a variant unlike REFORM's gather
    monkeypatch.setitem(gather.VARIANTS, "head100", head)
    row = Row(context="", question="What is the magic number?", answers=["4711"], task="t", length=0)
    paper, mine = lab.answer(ctx, row, ["head100"], pipe.tokenizer.decode(ctx.ids.tolist()))
    assert mine["match_run"] == "head100" and "same_as_paper" not in mine
    assert mine["stats"]["recomputed_tokens"] == paper["stats"]["recomputed_tokens"]
    kept = {}
    original = type(ctx.method).start
    def spy(self, c, part, **kw):
        answering = original(self, c, part, **kw)
        kept[len(kept)] = answering.kept
        return answering
    monkeypatch.setattr(type(ctx.method), "start", spy)
    lab.answer(ctx, row, ["head100"], pipe.tokenizer.decode(ctx.ids.tolist()))
    assert torch.equal(kept[1].cpu(), torch.arange(100)) and not torch.equal(kept[0].cpu(), torch.arange(100))


def test_recall_lab_answers_rows_drawn_with_another_seed():
    """scripts/recall_lab.py regenerates the rows behind saved contexts to answer them: rows encoded with
    ``--seed 1`` come back as those rows (same ids, same text), not as seed 0's."""
    import importlib.util
    import sys
    sys.path.insert(0, "tests")
    from conftest import CharTokenizer
    from reform.eval.tasks import make_rows
    spec = importlib.util.spec_from_file_location("recall_lab", "scripts/recall_lab.py")
    lab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab)
    tok = CharTokenizer()
    drawn = make_rows("ruler", tok, [3000], 2, seed=1, tasks=["niah_single_1", "vt"])
    assert {r.id for r in drawn}.isdisjoint(r.id for r in make_rows("ruler", tok, [3000], 2, seed=0,
                                                                     tasks=["niah_single_1", "vt"]))
    metas = [{"id": r.id, "suite": "ruler", "seed": 1, "task": r.task, "length": r.length, "sample": r.sample}
             for r in drawn]
    found = lab.answer_rows(type("P", (), {"tokenizer": tok})(), metas)
    assert {i: r.context for i, r in found.items()} == {r.id: r.context for r in drawn}


def test_query_tokens_content_searches_with_the_question_words_that_carry_content():
    """``query_tokens="content"`` drops the question's stop words, whitespace and punctuation before the max
    (issue 69: RULER's instruction and line breaks match every document header); the tokens kept are the
    same rows of the question's embeddings as with ``all``. ``content`` is REFORM's default, and ``all``, the
    paper's, what a context saved before the option stands for and REFORM+RAG's default."""
    import sys
    sys.path.insert(0, "tests")
    from conftest import CharTokenizer, real_tokenizer, tiny
    from reform.methods.options import options_json
    from reform.methods.reform import content_tokens
    from reform.pipeline import Pipeline
    tok = real_tokenizer()
    ids = tok("\n\nWhat is the magic number of the lazy dog?", add_special_tokens=False)["input_ids"]
    words = [tok.decode([i]).strip() for i in ids]
    kept = {w for w, k in zip(words, content_tokens(tok, ids)) if k}
    assert {"the", "is", "?", ""} <= set(words) and kept and not kept & {"the", "is", "of", "?", ""}
    assert content_tokens(tok, tok("the the ?", add_special_tokens=False)["input_ids"]).all()    # none: all
    options = dict(heads="1:v:0,2:q:3", chunk_size=64, cache_budget=96, recompute_budget=100, pool_window=9)
    every, content = (Pipeline(tiny("llama"), CharTokenizer(), query_tokens=q, **options) for q in ("all", "content"))
    ctx = every.encode("VAR QXZ = 4711. The grass is green. " * 12)
    part = every.templater.question("xq !")
    full = every.method.query_embeddings(ctx, part)
    chars = torch.as_tensor(part.ids)[part.query_span].tolist()
    mask = content_tokens(ctx.pipeline.tokenizer, chars)
    tok = ctx.pipeline.tokenizer
    assert [tok.decode([c]) for c, k in zip(chars, mask) if k] == ["x", "q"]
    assert torch.equal(content.method.query_embeddings(ctx, part), full[mask])
    from reform.eval.explain import per_token_scores
    scores, _, texts = per_token_scores(content.encode("VAR QXZ = 4711. " * 12), part)
    assert texts == ["x", "q"] and scores.shape[1] == 2        # --explain names the tokens that searched
    assert every.method.config.query_tokens == "all" and "query_tokens" not in options_json(every.method.config)
    assert Pipeline(tiny("llama"), CharTokenizer(), heads="1:v:0").method.config.query_tokens == "content"
    assert Pipeline(tiny("llama"), CharTokenizer(), method="reform+rag", heads="1:v:0").method.config.query_tokens == "all"
    from reform.methods.options import options_from_json
    from reform.methods.reform import ReformConfig
    assert options_from_json(ReformConfig, {})["query_tokens"] == "all"      # saved before: asked as it was
    with pytest.raises(ValueError, match="query_tokens must be all or content"):
        Pipeline(tiny("llama"), CharTokenizer(), heads="1:v:0", query_tokens="nouns")


def test_maxsim_ranks_the_window_with_most_question_words_above_a_one_word_hub():
    """``query_aggregate="maxsim"``: a window scores by the mean over question tokens of each one's best
    cosine in it (ColBERT's MaxSim over the pooling window). A header repeated through the context matches
    one question word exactly, and the paper's max ranks it with the answer; the window holding the
    question's three words wins under maxsim. Blockwise equals the per-token definition."""
    from reform.methods.reform import window_maxsim
    n, window = 3000, 9
    query = torch.eye(3)                       # three question words, orthogonal
    context = torch.zeros(n, 3)
    context[::200, 0] = 1.0                    # the hub: word 0 exactly, every 200 tokens
    answer = 1500 + 3
    context[answer - 2] = torch.tensor([0.0, 0.8, 0.0])
    context[answer] = torch.tensor([0.7, 0.0, 0.0])
    context[answer + 2] = torch.tensor([0.0, 0.0, 0.8])
    paper = max_pool(token_scores(context, query), window)
    assert paper[answer] < paper[0]            # the hub's windows outrank the answer's
    scores = window_maxsim(context, query, window, block=64)
    assert int(scores.argmax()) in range(answer - 2, answer + 3) and scores.max() > scores[0] + 0.3
    sim = context @ query.T
    ref = torch.stack([max_pool(sim[:, j].contiguous(), window) for j in range(3)], 1).mean(1)
    torch.testing.assert_close(scores, ref)
    weighted = window_maxsim(context, query, window, torch.tensor([0.0, 1.0, 1.0]))
    torch.testing.assert_close(weighted, torch.stack(
        [max_pool(sim[:, j].contiguous(), window) for j in (1, 2)], 1).mean(1))
    # per-token offsets (a content-free question's scores) come off each token's cosines before the max
    offsets = torch.zeros(n)
    offsets[answer], offsets[::200] = 0.5, 0.1
    calibrated = window_maxsim(context, query, window, offsets=offsets, block=64)
    torch.testing.assert_close(calibrated, torch.stack(
        [max_pool((sim[:, j] - offsets).contiguous(), window) for j in range(3)], 1).mean(1))


def test_query_aggregate_maxsim_is_the_default_and_older_contexts_read_as_max():
    """``maxsim`` is REFORM's default since 2026-11-29; a context saved before it (no ``query_aggregate`` in
    its options) is asked with the paper's max, and REFORM+RAG keeps the max. ``maxsim_top`` takes the mean
    over each window's best question tokens only."""
    import sys
    sys.path.insert(0, "tests")
    from conftest import CharTokenizer, tiny
    from reform.methods.options import options_from_json
    from reform.methods.reform import ReformConfig, window_maxsim
    from reform.pipeline import Pipeline
    assert options_from_json(ReformConfig, {})["query_aggregate"] == "max"
    options = dict(heads="1:v:0,2:q:3", chunk_size=64, cache_budget=96, recompute_budget=100, pool_window=9)
    pipe = Pipeline(tiny("llama"), CharTokenizer(), **options)
    assert pipe.method.config.query_aggregate == "maxsim"
    assert Pipeline(tiny("llama"), CharTokenizer(), method="reform+rag", **options).method.config.query_aggregate == "max"
    ctx = pipe.encode("VAR QXZ = 4711. The grass is green. " * 12)
    part = pipe.templater.question("xq !")
    query = pipe.method.query_embeddings(ctx, part)
    torch.testing.assert_close(pipe.method.ranking(ctx, part, query), window_maxsim(ctx.state.data, query, 9))
    assert ctx.ask("xq !", max_new_tokens=2).kept.numel() == 100
    top = Pipeline(tiny("llama"), CharTokenizer(), maxsim_top=1, **options).method
    torch.testing.assert_close(top.ranking(ctx, part, query), window_maxsim(ctx.state.data, query, 9, top=1))
    torch.testing.assert_close(window_maxsim(ctx.state.data, query, 9, top=1),       # the best one: the paper's
                               max_pool(token_scores(ctx.state.data, query), 9))
    for bad, match in (({"query_aggregate": "mean"}, "query_aggregate must be max or maxsim"),
                       ({"query_baseline": 0.9}, "use them with query_aggregate=max"),
                       ({"match_run": 4}, "use them with query_aggregate=max"),
                       ({"maxsim_top": -1}, "maxsim_top of reform cannot be negative")):
        with pytest.raises(ValueError, match=match):
            Pipeline(tiny("llama"), CharTokenizer(), heads="1:v:0", **bad)


def test_an_instruction_is_read_before_the_question_but_not_searched_with():
    """``instruction`` (a benchmark's "Answer the question based on ..."): the prompt is the one the joined
    text makes, and the question's span, which the gather searches with, holds the question alone (without its
    ``Question:`` label); a row
    carries it to ``ask`` and keeps the id of its joined text."""
    import sys
    sys.path.insert(0, "tests")
    from conftest import CharTokenizer, tiny
    from reform.eval.rows import Row
    from reform.pipeline import Pipeline
    options = dict(heads="1:v:0,2:q:3", chunk_size=64, cache_budget=96, recompute_budget=100, pool_window=9)
    pipe = Pipeline(tiny("llama"), CharTokenizer(), **options)
    said, asked = "Only give the number.\n\n", "Question: what is QXZ?"
    for layout in ("question", "verbatim"):
        joined = pipe.templater.question(said + asked, " Answer:", layout=layout)
        split = pipe.templater.question(asked, " Answer:", layout=layout, instruction=said)
        if layout == "verbatim":
            assert split.ids == joined.ids
        tok = pipe.tokenizer
        assert tok.decode(split.ids[split.query_span]).strip() == "what is QXZ?"     # the label is read, not searched
        assert said.strip() in tok.decode(split.separator)
    ctx = pipe.encode("VAR QXZ = 4711. The grass is green. " * 12)
    plain = ctx.method.query_embeddings(ctx, pipe.templater.question(asked))
    told = ctx.method.query_embeddings(ctx, pipe.templater.question(asked, instruction=said))
    assert told.shape == plain.shape            # the instruction's words do not search
    with pytest.raises(TypeError, match="instruction must be text"):
        ctx.ask(asked, instruction=3)
    assert ctx.ask(asked, instruction=said, max_new_tokens=1).kept.numel() == 100
    row = dict(context="c", answers=["a"], task="t", length=1)
    assert Row(question=asked, instruction=said, **row).id == Row(question=said + asked, **row).id
