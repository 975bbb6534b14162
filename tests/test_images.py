"""Images in the haystack: interleaved text and images through REFORM on a tiny random LLaVA.

The image positions travel as ids past the vocabulary whose input embeddings come from the model's own
vision code (``engine/vision.py``, ``Engine.input_rows``); with budgets covering the input REFORM must give
transformers' own tokens for the same text and images, and a saved context must answer the same."""

import pytest
import torch
from PIL import Image, ImageDraw

from reform.engine.layout import as_tensor
from reform.pipeline.inputs import tokenize_parts
from reform.pipeline import Pipeline

from conftest import tiny_vlm

WORDS = "The quick brown fox jumps over the lazy dog. What is the magic number? It is 42. "


def picture(colour, text="7"):
    image = Image.new("RGB", (40, 40), colour)
    ImageDraw.Draw(image).text((12, 12), text, fill=(255, 255, 255))
    return image


def placeholder_ids(pipe, ids):
    """The context's ids as the model's processor writes them: each image position its image token."""
    out = ids.clone()
    out[out >= pipe.engine.vocab] = pipe.engine.model.config.image_token_id
    return out


@pytest.fixture(scope="module")
def vlm():
    return tiny_vlm()


def make(vlm, **options):
    model, tok, processor = vlm
    opts = dict(heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96, recompute_budget=480)
    opts.update(options)
    return Pipeline(model, tok, processor=processor, **opts)


def parts():
    return [WORDS * 4, picture((200, 30, 30)), WORDS * 3, picture((30, 30, 200), "A"), WORDS * 4]


def test_interleaved_input_with_covering_budget_equals_transformers_generate(vlm):
    """Encoded in 64-token chunks on a 96-token cache (compressed, images included), then recomputed
    whole: the same greedy tokens as ``model.generate`` with the same images, and the same first logits."""
    pipe = make(vlm)
    ctx = pipe.encode(parts())
    n_images = int((ctx.ids >= pipe.engine.vocab).sum())
    assert n_images == 32 and ctx.image_rows.shape == (32, 64)
    assert ctx.ids.shape[0] > 3 * 96                       # longer than the cache: compression ran
    question = "What is the magic number?"
    answer = ctx.ask(question, max_new_tokens=8)
    part = pipe.templater.question(question)
    plain = torch.cat([placeholder_ids(pipe, ctx.ids), as_tensor(part.ids, "cpu")])
    pixels = pipe.processor(text="<image><image>", images=[parts()[1], parts()[3]], return_tensors="pt",
                            add_special_tokens=False)["pixel_values"]
    assert answer.stats["recomputed_tokens"] == plain.shape[0]
    with torch.no_grad():
        hf = pipe.engine.model.generate(input_ids=plain[None], pixel_values=pixels, max_new_tokens=8, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)[0, plain.shape[0]:].tolist()
    assert answer.tokens == hf[:len(answer.tokens)] and len(answer.tokens) > 0
    # the recompute's last logits are transformers' with these images, and not with the images swapped
    from reform.engine import KVCache
    from reform.stats import Timer
    prompt = pipe.method.prompt(ctx, part, Timer()).ids
    assert torch.equal(placeholder_ids(pipe, prompt), plain)
    with pipe.engine.input_rows(ctx.image_rows):
        ours = pipe.engine.logits(pipe.engine.prefill(prompt, KVCache.empty(4), chunk_size=100)[-1:])
    swapped = pipe.processor(text="<image><image>", images=[parts()[3], parts()[1]], return_tensors="pt",
                             add_special_tokens=False)["pixel_values"]
    with torch.no_grad():
        ref = pipe.engine.model(input_ids=plain[None], pixel_values=pixels).logits[0, -1:]
        other = pipe.engine.model(input_ids=plain[None], pixel_values=swapped).logits[0, -1:]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    assert (other - ref).abs().max() > 1e-3


def test_images_change_the_answer_path_and_a_saved_context_answers_the_same(vlm, tmp_path):
    pipe = make(vlm, recompute_budget=200)
    ctx = pipe.encode(parts())
    first = ctx.ask("What colour is the picture?", max_new_tokens=6)
    ctx.save(tmp_path / "mixed.reform")
    loaded = pipe.load_context(tmp_path / "mixed.reform")
    assert torch.equal(loaded.ids, ctx.ids) and torch.equal(loaded.image_rows, ctx.image_rows)
    again = loaded.ask("What colour is the picture?", max_new_tokens=6)
    assert again.tokens == first.tokens
    # another picture in the same place is another context: another content key
    other = tokenize_parts(pipe, [WORDS * 4, picture((30, 200, 30)), WORDS * 3, picture((30, 30, 200), "A"), WORDS * 4])
    assert torch.equal(other[0], ctx.ids)
    assert pipe.context_key(ctx.ids, image_rows=ctx.image_rows) != pipe.context_key(other[0], image_rows=other[1])


def test_image_parts_from_files_and_bytes(vlm, tmp_path):
    import io
    pipe = make(vlm)
    path = tmp_path / "red.png"
    picture((200, 30, 30)).save(path)
    buffer = io.BytesIO()
    picture((200, 30, 30)).save(buffer, format="PNG")
    a, rows_a = tokenize_parts(pipe, [WORDS, path])
    b, rows_b = tokenize_parts(pipe, [WORDS, buffer.getvalue()])
    assert torch.equal(a, b) and torch.equal(rows_a, rows_b)


@pytest.mark.parametrize("bad,message", [
    ([WORDS, 42], "must be text .* or an image"),
    ([], "non-empty list"),
    ([WORDS, b"not an image"], "not an image PIL can read"),
])
def test_bad_parts_are_refused_in_one_line(vlm, bad, message):
    from reform.documents import DocumentError
    with pytest.raises((TypeError, ValueError, DocumentError), match=message):
        tokenize_parts(make(vlm), bad)


def test_text_models_and_text_methods_refuse_images(vlm, tiny_model, tokenizer):
    with pytest.raises(ValueError, match="takes no images"):
        Pipeline(tiny_model, tokenizer, heads="1:v:0").encode([WORDS, picture((1, 2, 3))])
    with pytest.raises(ValueError, match="reads the context as text and cannot take images"):
        Pipeline(vlm[0], vlm[1], processor=vlm[2], method="rag-bm25").encode(parts())


def test_reform_ask_takes_image_files_among_its_inputs(tiny_vlm_dir, tiny_model_dir, tmp_path):
    """``reform ask notes.txt red.png more.txt -q ...`` on a saved tiny LLaVA: one JSON answer over text and
    an image; an image for a text-only model, or a missing or broken image, is one line and exit 2."""
    import json
    from typer.testing import CliRunner
    from reform.cli.main import app
    notes, more, image, broken = (tmp_path / n for n in ("notes.txt", "more.txt", "red.png", "broken.png"))
    notes.write_text(WORDS * 4)
    more.write_text(WORDS * 3)
    picture((200, 30, 30)).save(image)
    broken.write_bytes(b"not a png")
    common = ["-q", "What is the magic number?", "--max-new-tokens", "4", "--heads", "1:v:0,2:k:1", "--json"]
    r = CliRunner().invoke(app, ["ask", str(notes), str(image), str(more), *common, "--model", str(tiny_vlm_dir)])
    assert r.exit_code == 0, r.output
    answer = json.loads(r.output.strip().splitlines()[-1])
    assert answer["input_tokens"] > 16 and answer["method"] == "reform"
    for files, model, message in (([notes, image], tiny_model_dir, "takes no images"),
                                  ([notes, tmp_path / "gone.png"], tiny_vlm_dir, "image not found"),
                                  ([notes, broken], tiny_vlm_dir, "not an image PIL can read")):
        r = CliRunner().invoke(app, ["ask", *map(str, files), *common, "--model", str(model), "--ocr", "never"])
        assert r.exit_code == 2 and message in r.output, r.output
    # a text-only model with --ocr auto (the default): the image is a page, read by OCR, named in the evidence
    r = CliRunner().invoke(app, ["ask", str(notes), str(image), *common, "--model", str(tiny_model_dir)])
    assert r.exit_code == 0, r.output
    answer = json.loads(r.output.strip().splitlines()[-1])
    assert answer["stats"]["ocr_pages"] == 1 and "notes.txt" in {e["document"] for e in answer["evidence"]}


def data_url(image) -> str:
    import base64
    import io
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_openai_client_sends_image_parts_to_reform_serve(vlm, tmp_path):
    """The official ``openai`` client over loopback: a document with an image in a system message and a
    question with an image of its own; the answer is the library's for the same parts. Bad images and
    images for a text-only model are 400s in the OpenAI error shape."""
    import openai
    from live_server import LiveServer, make_pipe
    red, blue = picture((200, 30, 30)), picture((30, 30, 200), "A")
    messages = [{"role": "system", "content": [{"type": "text", "text": WORDS * 4},
                                               {"type": "image_url", "image_url": {"url": data_url(red)}},
                                               {"type": "text", "text": WORDS * 3}]},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(blue)}},
                                             {"type": "text", "text": "What is the magic number?"}]}]
    pipe = make(vlm, recompute_budget=200)
    expected = pipe.encode([WORDS * 4, red, WORDS * 3, "\n\n", blue]).ask("What is the magic number?", max_new_tokens=6)
    assert expected.text and expected.stats["recomputed_tokens"] > 32
    with LiveServer(pipe, tmp_path / "store") as server:
        client = server.client()
        got = client.chat.completions.create(model="reform", messages=messages, max_tokens=6)
        assert got.choices[0].message.content == expected.text
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="reform", messages=messages, max_tokens=6, stream=True) if c.choices)
        assert streamed == expected.text
        for bad, words in (({"url": "https://example.com/cat.png"}, "must be a data URL"),
                           ({"url": "data:image/png;base64,@@@"}, "not valid base64"),
                           ({"url": "data:image/png;base64,aGVsbG8="}, "not an image")):
            with pytest.raises(openai.BadRequestError, match=words):
                client.chat.completions.create(model="reform", max_tokens=4, messages=[
                    {"role": "user", "content": [{"type": "image_url", "image_url": bad},
                                                 {"type": "text", "text": "What is this?"}]}])
    with LiveServer(make_pipe(), tmp_path / "text-store") as server:
        with pytest.raises(openai.BadRequestError, match="takes no images"):
            server.client().chat.completions.create(model="reform", messages=messages, max_tokens=4)


def test_mm_niah_rows_hold_their_images_and_the_needle_image(tokenizer):
    from reform.eval.rows import IMAGE_MARK
    from reform.eval.tasks import make_rows
    rows = make_rows("mm-niah", tokenizer, [3000], 1, depths=[0.0, 1.0])
    assert {r.task for r in rows} == {"mm-niah/retrieval-text-needle", "mm-niah/retrieval-image-needle"}
    for row in rows:
        parts = row.content()
        assert len(row.images) == 3 == row.context.count(IMAGE_MARK) == sum(not isinstance(p, str) for p in parts)
    text_rows = [r for r in rows if r.task.endswith("text-needle")]
    assert all(r.answers[0] in r.context for r in text_rows)
    image_rows = [r for r in rows if r.task.endswith("image-needle")]
    assert [r.meta["needle_image"] for r in image_rows] == [0, 2]
    assert all(r.answers[0] not in r.context for r in image_rows)       # the number is only in the image
    again = make_rows("mm-niah", tokenizer, [3000], 1, depths=[0.0, 1.0])
    assert [r.id for r in again] == [r.id for r in rows]                   # seeded: the same rows


def test_reform_eval_mm_niah_runs_end_to_end_with_recall_per_row(tiny_vlm_dir, tmp_path):
    import json
    from typer.testing import CliRunner
    from reform.cli.main import app
    out = tmp_path / "mm"
    r = CliRunner().invoke(app, ["eval", "mm-niah", "--methods", "reform,truncate", "--lengths", "2k", "--samples",
                                 "1", "--depths", "0,1", "--model", str(tiny_vlm_dir), "--out", str(out)])
    assert r.exit_code == 0, r.output
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(rec["status"] == "ok" for rec in records)
    assert all(rec["context_tokens"] > 2000 + 2 * 16 - 50 for rec in records)
    for rec in records:
        assert rec["recall"] in (0.0, 1.0)
        if rec["task"].endswith("image-needle"):
            assert 0.0 <= rec["needle_image_kept"] <= 1.0 and rec["recall"] == float(rec["needle_image_kept"] == 1.0)
    assert "Gold recall" in (out / "results.md").read_text()


def test_mm_niah_jsonl_rows_are_read_with_their_images(tiny_vlm_dir, tmp_path):
    """MM-NIAH's own format: a text-needle row and a multiple-choice row are run; a row that asks with an
    image is refused by line."""
    import json
    from typer.testing import CliRunner
    from reform.cli.main import app
    from reform.eval.jsonl import RowFileError, read_rows
    (tmp_path / "images").mkdir()
    for i, colour in enumerate([(200, 30, 30), (30, 200, 30)]):
        picture(colour).save(tmp_path / "images" / f"{i}.png")
    good = [{"id": 0, "images_list": ["images/0.png", "images/1.png"], "question": "What is the magic number?",
             "context": WORDS * 3 + "<image>" + WORDS + "The magic number is 4821. " + "<image>" + WORDS,
             "answer": "4821", "meta": {"placed_depth": 0.6, "context_length": 200, "choices": None}},
            {"id": 1, "images_list": ["images/1.png"], "question": "Which number was said?",
             "context": WORDS * 2 + "<image>" + "The number 17 was said. " + WORDS, "answer": 1,
             "meta": {"placed_depth": 0.5, "choices": ["12", "17", "30"]}}]
    data = tmp_path / "retrieval-text.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in good))
    rows = read_rows(data)
    assert rows[0].task == "mm-niah/retrieval-text" and rows[0].depth == 0.6 and len(rows[0].images) == 2
    assert rows[1].answers == ["B"] and "B. 17" in rows[1].question and rows[1].meta["metric"] == "choice"
    r = CliRunner().invoke(app, ["eval", "jsonl", str(data), "--methods", "reform", "--model", str(tiny_vlm_dir),
                                 "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    records = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [rec["status"] for rec in records] == ["ok", "ok"]
    bad = dict(good[0], question="Which of these is in the text? <image>", images_list=["images/0.png"] * 3)
    data.write_text(json.dumps(bad) + "\n")
    with pytest.raises(RowFileError, match="line 1: its question asks with images"):
        read_rows(data)


def test_choice_scoring():
    from reform.eval.rows import Row
    from reform.eval.tasks.scoring import score
    row = Row("ctx", "q", ["B"], "t", 0, meta={"metric": "choice"})
    assert [score(row, p) for p in ("B", "(B) 17", " B. seventeen", "A", "Because", "")] == [1, 1, 1, 0, 0, 0]


def test_past_the_window_the_answer_is_transformers_over_the_gathered_positions():
    """An interleaved input over twice the model's window: REFORM gathers some text and image positions
    (images possibly in part) and its answer is ``model.generate`` over exactly those positions' input
    embeddings, the image rows included."""
    from reform.stats import Timer
    model, tok, processor = tiny_vlm(window=256)
    pipe = Pipeline(model, tok, processor=processor, heads="1:v:0,2:q:3,1:k:1", chunk_size=48, cache_budget=64,
                    recompute_budget=160)
    parts = []
    for i, colour in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30)]):
        parts += [WORDS * 4, picture(colour, str(i))]
    ctx = pipe.encode(parts + [WORDS])
    assert ctx.ids.shape[0] > 2 * 256
    question = "What colour is picture 2?"
    answer = ctx.ask(question, max_new_tokens=8)
    prompt = pipe.method.prompt(ctx, pipe.templater.question(question), Timer()).ids
    images = prompt >= pipe.engine.vocab
    assert images.any(), "the gather kept no image position: the check below would be text only"
    with torch.no_grad():
        embeds = model.get_input_embeddings()(prompt.masked_fill(images, 0))
        embeds[images] = ctx.image_rows[prompt[images] - pipe.engine.vocab]
        hf = model.generate(inputs_embeds=embeds[None], max_new_tokens=8, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0].tolist()
    assert answer.tokens == hf[:len(answer.tokens)] and answer.tokens


def test_a_checkpointed_encode_with_images_resumes_only_with_the_same_images(vlm, tmp_path):
    """Same text and image count, other pictures: the same ids, another input. The checkpoint says so
    (methods/checkpoint.py) instead of mixing the first pictures' state into the second's."""
    from reform import Checkpoint
    from reform.store import ContextFileError
    pipe = make(vlm, recompute_budget=200)
    whole = pipe.encode(parts())
    assert whole.ids.shape[0] > 3 * 64                     # several chunks to stop between
    path = tmp_path / "x.partial"

    def stop(done, total):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        pipe.encode(parts(), checkpoint=Checkpoint(path, every_s=0, on_saved=stop))
    other = parts()
    other[1] = picture((30, 200, 30))
    with pytest.raises(ContextFileError, match="checkpoint of another input"):
        pipe.encode(other, checkpoint=path)
    resumed = pipe.encode(parts(), checkpoint=path)
    assert torch.equal(resumed.state.data, whole.state.data) and torch.equal(resumed.image_rows, whole.image_rows)
    assert not path.exists()
