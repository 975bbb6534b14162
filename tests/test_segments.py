"""REFORM's experimental segment-parallel encode (``segments`` = S): how the input is cut, that the first
segment is exactly the sequential encode's prefix, that S = 1 is the sequential encode, that the result
does not depend on where or in which order segments run (``Pipeline.segment_runner``), and that progress
counts every input token once."""

import pytest
import torch

from reform.methods.reform import segment_pieces
from reform.pipeline import Pipeline

from conftest import CharTokenizer, tiny

TEXT = " ".join(f"Line {i}: the key for box {i} is {i * 7919 % 10007}." for i in range(120))   # ~4.5k tokens
QUESTION = "What is the key for box 42?"
OPTIONS = dict(heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96, recompute_budget=200)


def make(**kw):
    return Pipeline(tiny("llama"), CharTokenizer(), **{**OPTIONS, **kw})


@pytest.mark.parametrize("n,segments,anchor", [(1000, 4, 64), (1000, 1, 64), (130, 8, 64), (64, 3, 64), (777, 5, 32)])
def test_segment_pieces_cover_the_input_once_after_an_anchor(n, segments, anchor):
    ids = torch.arange(n)
    pieces = segment_pieces(ids, segments, anchor)
    assert len(pieces) == min(segments, -(-n // anchor))
    kept = torch.cat([p[skip:] for p, skip, _ in pieces])
    assert torch.equal(kept, ids)                                   # every token once, in order
    assert [last for _, _, last in pieces] == [False] * (len(pieces) - 1) + [True]
    for i, (p, skip, _) in enumerate(pieces):
        assert skip == (0 if i == 0 else anchor)
        assert torch.equal(p[:skip], ids[:skip])                    # later segments start with the anchor
    sizes = [len(p) - skip for p, skip, _ in pieces]
    assert max(sizes) - min(sizes) <= anchor or len(pieces) == 1    # balanced to a chunk


def test_one_segment_is_the_sequential_encode_and_the_first_segment_its_prefix():
    pipe, split = make(), make(segments=3)
    ctx, ctx3 = pipe.encode(TEXT), split.encode(TEXT)
    assert torch.equal(make(segments=1).encode(TEXT).state.data, ctx.state.data)
    first = len(segment_pieces(ctx.ids, 3, 64)[0][0])
    assert torch.equal(ctx3.state.data[:first], ctx.state.data[:first])
    assert ctx3.state.data.shape == ctx.state.data.shape
    assert not torch.equal(ctx3.state.data[first:], ctx.state.data[first:])   # later segments saw less
    assert pipe.context_key(ctx.ids) != split.context_key(ctx.ids)            # a different encode, a different key
    assert split.encode(TEXT).ask(QUESTION, max_new_tokens=6).tokens == ctx3.ask(QUESTION, max_new_tokens=6).tokens


def test_segments_give_the_same_context_wherever_and_in_whatever_order_they_run(tmp_path):
    local, remote = make(segments=4), make(segments=4)     # ``remote``: another copy of the model

    def runner(pieces):                                     # last segment first, on the other copy
        done = {i: remote.method.encode_segment(remote, p, skip, keep_cache=last)
                for i, (p, skip, last) in reversed(list(enumerate(pieces)))}
        return [done[i] for i in range(len(pieces))]

    expected = local.encode(TEXT)
    local.segment_runner = runner
    got = local.encode(TEXT)
    assert torch.equal(got.state.data, expected.state.data)
    assert got.ask(QUESTION, max_new_tokens=6).tokens == expected.ask(QUESTION, max_new_tokens=6).tokens
    got.save(tmp_path / "split.reform")                     # the option travels with the saved context
    again = local.load_context(tmp_path / "split.reform")
    assert again.method.config.segments == 4
    assert again.ask(QUESTION, max_new_tokens=6).tokens == expected.ask(QUESTION, max_new_tokens=6).tokens


def test_progress_counts_every_token_once():
    pipe, seen = make(segments=3), []
    ctx = pipe.encode(TEXT, seen.append)
    assert sum(seen) == ctx.ids.shape[0]


def test_segments_must_be_positive():
    with pytest.raises(ValueError, match="segments must be at least 1"):
        make(segments=0)
