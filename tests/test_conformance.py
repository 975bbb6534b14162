"""The conformance contract: every decoder model type transformers ships is equal to transformers or refused
up front; never accepted and different. Families people run on long documents must be equal, and REFORM
must run on each at 4x its window; sliding-window layers stay exact under compression."""

import pytest
import torch

from reform.conformance import VARIANTS, VISION_VARIANTS, WINDOW, all_variants, build, check, check_images
from reform.engine import KVCache, UnsupportedModelError
from reform.engine.layout import as_tensor
from reform.pipeline import Pipeline

from conftest import CharTokenizer   # byte-level ids 0..127 fit the conformance configs' 128-token vocabulary

# the families people run on long documents, each of which must be "equal"; falcon and deepseek_v3 are refused
REQUIRED = [name for name in VARIANTS if VARIANTS[name][0] not in ("falcon", "deepseek_v3")]
OTHERS = [name for name in all_variants() if name not in REQUIRED]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_family_equals_transformers(name):
    model_type, overrides = VARIANTS[name]
    r = check(name, model_type, overrides)
    assert r.status == "equal", f"{name}: {r.status} {r.detail}"
    assert r.one_shot <= 1e-4 and r.chunked <= 1e-4 and r.tokens_equal


@pytest.mark.parametrize("name", OTHERS)
def test_every_other_model_type_is_equal_or_refused(name):
    model_type, overrides = all_variants()[name]
    r = check(name, model_type, overrides)
    if r.status == "not built":
        pytest.skip(f"{name} cannot be built offline with tiny sizes: {r.detail}")
    assert r.status in ("equal", "refused"), f"{name}: accepted and different: {r.detail}"
    if r.status == "refused":
        assert r.detail.startswith("model type '") and "\n" not in r.detail   # one line, names the type


def test_refusal_happens_before_any_work_and_says_why():
    model = build("deepseek_v3")
    with pytest.raises(UnsupportedModelError, match="multi-head latent attention"):
        Pipeline(model, CharTokenizer())


TEXT = "".join(f"Record {i}: the value of key {i * 7 % 97} is {i * 13 % 89}. " for i in range(40))   # ~1.9k bytes


@pytest.mark.parametrize("name", REQUIRED)
def test_reform_runs_at_four_times_the_window(name):
    model_type, overrides = VARIANTS[name]
    model = build(model_type, overrides)
    pipe = Pipeline(model, CharTokenizer(), heads="1:v:0,2:k:1", chunk_size=64, cache_budget=64, recompute_budget=96)
    text = TEXT[:4 * WINDOW + 40]
    ctx = pipe.encode(text)
    assert ctx.ids.shape[0] > 4 * WINDOW
    question = "What is the value of key 14?"
    answer = ctx.ask(question, max_new_tokens=4)
    assert answer.stats["recomputed_tokens"] == 96 + len(pipe.templater.question(question).ids)
    assert ctx.cache.length <= 64 + 64     # the encode stayed inside the window


def hf_greedy(model, ids, n):
    out = model.generate(ids[None], max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[0]:].tolist()


SLIDING = ["mistral (sliding window)", "gemma3 (5 local : 1 global)"]


@pytest.mark.parametrize("name", SLIDING)
def test_reform_with_covering_budget_equals_hf_past_the_sliding_window(name):
    model_type, overrides = VARIANTS[name]
    model = build(model_type, overrides)
    pipe = Pipeline(model, CharTokenizer(), heads="1:v:0,2:k:1", chunk_size=48, cache_budget=64, recompute_budget=200)
    ctx = pipe.encode(TEXT[:150])                  # 151 tokens: past the sliding window of 32
    part = pipe.templater.question("What is key 7?")
    answer = ctx.ask("What is key 7?", max_new_tokens=6)
    plain = torch.cat([ctx.ids, as_tensor(part.ids, "cpu")])
    assert answer.stats["recomputed_tokens"] == plain.shape[0]
    assert answer.tokens == hf_greedy(model, plain, 6)[:len(answer.tokens)]


@pytest.mark.parametrize("name", SLIDING)
def test_sliding_layers_keep_only_their_window_and_stay_exact_under_compression(name):
    """H2O with a cache budget covering the input: global layers keep everything, sliding layers are trimmed
    to their window by the engine (not by the policy), and the answer equals HF's on the whole input."""
    model_type, overrides = VARIANTS[name]
    model = build(model_type, overrides)
    pipe = Pipeline(model, CharTokenizer(), method="h2o", chunk_size=48, cache_budget=200)
    ctx = pipe.encode(TEXT[:190])
    window = overrides["sliding_window"]
    sliding = set(pipe.engine.shape.sliding_layers)
    assert sliding          # Mistral: every layer slides; Gemma 3: five of six
    for i, lc in enumerate(ctx.cache.layers):
        if i in sliding:
            assert lc.window == window and lc.length < ctx.ids.shape[0]
        else:
            assert lc.window is None and lc.length == ctx.ids.shape[0]
    part = pipe.templater.question("What is key 7?")
    answer = ctx.ask("What is key 7?", max_new_tokens=6)
    plain = torch.cat([ctx.ids, as_tensor(part.ids, "cpu")])
    assert answer.tokens == hf_greedy(model, plain, 6)[:len(answer.tokens)]


def test_sliding_window_attention_reads_only_the_window():
    from reform.engine.attention import causal_attention
    torch.manual_seed(0)
    q, k, v = torch.randn(4, 6, 8), torch.randn(2, 20, 8), torch.randn(2, 20, 8)
    got = causal_attention(q, k, v, 14, 0.3, window=5, softcap=2.0)
    kr, vr = k[[0, 0, 1, 1]], v[[0, 0, 1, 1]]
    qp, kp = (14 + torch.arange(6))[:, None], torch.arange(20)[None]
    mask = (kp <= qp) & (kp > qp - 5)
    logits = torch.tanh(q @ kr.transpose(1, 2) * 0.3 / 2.0) * 2.0
    ref = logits.masked_fill(~mask, float("-inf")).softmax(-1) @ vr
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_trimmed_sliding_cache_gives_the_same_logits_as_the_untrimmed_one():
    model = build(*VARIANTS["mistral (sliding window)"])
    from reform.engine import Engine
    engine = Engine(model)
    ids = torch.randint(3, 120, (400,), generator=torch.Generator().manual_seed(0))
    cache = KVCache.empty(engine.shape.n_layers)
    logits = [engine.logits(engine.forward(ids[s:s + 50], cache)) for s in range(0, 400, 50)]
    assert max(lc.length for lc in cache.layers) < 400       # trimmed to the window (+ slack)
    with torch.no_grad():
        ref = model(ids[None]).logits[0]
    torch.testing.assert_close(torch.cat(logits), ref, atol=1e-4, rtol=1e-4)


def test_a_model_computing_something_the_engine_does_not_run_is_refused():
    """The load-time check guards model types that do not exist yet: a model whose forward scales its
    logits in code the engine never runs is refused, not run wrongly."""
    from transformers import LlamaForCausalLM
    from reform.engine import Engine

    class ScaledLlama(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 1.5
            return out

    model = ScaledLlama(build("llama").config).eval()
    with pytest.raises(UnsupportedModelError, match="logits differ from the model's own forward"):
        Engine(model)


def test_guessed_heads_say_which_and_how_to_compute_real_ones():
    from reform.heads import resolve_heads
    from reform.engine import model_shape
    shape = model_shape(build("llama"))
    with pytest.warns(UserWarning, match=r"guessing heads 1:v:0,1:v:1 .*reform heads select --model my/model"):
        resolve_heads(None, "my/model", shape)


def test_reform_models_prints_the_table(monkeypatch, tmp_path):
    from typer.testing import CliRunner
    import reform.conformance
    from reform.cli.main import app
    monkeypatch.setattr(reform.conformance, "VARIANTS", {k: VARIANTS[k] for k in ("llama", "deepseek_v3")})
    monkeypatch.setattr(reform.conformance, "VISION_VARIANTS",
                        {k: VISION_VARIANTS[k] for k in ("llava (CLIP)", "qwen2_vl (with images)")})
    r = CliRunner().invoke(app, ["models", "-o", str(tmp_path / "models.md")])
    assert r.exit_code == 0, r.output
    assert "1 equal, 1 refused" in r.output and "| llama | **equal to transformers** |" in r.output
    assert "With images" in r.output and "| llava (CLIP) | **equal to transformers** |" in r.output
    assert "multi-head latent attention" in (tmp_path / "models.md").read_text()
    (tmp_path / "blocker").write_text("a file, not a folder")
    r = CliRunner().invoke(app, ["models", "-o", str(tmp_path / "blocker" / "models.md")])
    assert r.exit_code == 2 and "cannot write --out" in r.output


def test_half_precision_is_judged_against_fp32_and_the_weights_come_back_untouched():
    """In bf16 the load check runs the model's own forward in fp32 (one layer at a time) as the truth;
    afterwards every weight is the very same bf16 tensor, tied ones still tied."""
    from reform.engine import Engine
    from reform.engine.load_check import float32_weights
    model = build("llama").to(torch.bfloat16)
    model.lm_head.weight = model.model.embed_tokens.weight                 # tied, as in SmolLM2 and Gemma
    before = {n: (p.data_ptr(), p.dtype) for n, p in model.named_parameters()}     # the very same storage
    engine = Engine(model)
    assert engine.check_distance is not None and engine.check_distance < 0.05
    assert all((p.data_ptr(), p.dtype) == before[n] for n, p in model.named_parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with pytest.raises(RuntimeError):
        with float32_weights([model.model.layers[0]]):
            assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.float32
            raise RuntimeError("a forward that fails")
    assert all((p.data_ptr(), p.dtype) == before[n] for n, p in model.named_parameters())


@pytest.mark.parametrize("name", list(VISION_VARIANTS))
def test_vision_language_models_with_two_images_are_equal_or_refused(name):
    """Text with two images between its pieces: the engine, fed the model's own image embeddings as rows
    past the vocabulary, gives transformers' logits (one-shot and chunked) and greedy tokens, or refuses
    in one sentence what it cannot reproduce (Gemma 3's own image mask, Qwen2-VL's multimodal RoPE)."""
    r = check_images(name, VISION_VARIANTS[name])
    expected = {"gemma3": ("refused", "attention mask of its own"), "qwen2_vl": ("refused", "multimodal RoPE")}
    status, why = expected.get(VISION_VARIANTS[name].model_type, ("equal", ""))
    assert r.status == status, r
    assert why in r.detail
    if status == "equal":
        assert r.one_shot <= 1e-4 and r.chunked <= 1e-4 and r.tokens_equal


def test_image_ids_without_their_rows_are_refused():
    from reform.conformance import build_vision, vision_input, with_image_ids
    from reform.engine import Engine
    from reform.engine.cache import KVCache
    from reform.engine.vision import image_rows
    variant = VISION_VARIANTS["llava (CLIP)"]
    model = build_vision(variant)
    engine = Engine(model)
    ids, pixels = vision_input(variant)
    mask, rows = image_rows(model, ids, pixels)
    vids = with_image_ids(engine, ids, mask)
    with pytest.raises(ValueError, match="image embeddings are not in place"):
        engine.forward(vids, KVCache.empty(engine.shape.n_layers))
    with engine.input_rows(rows[:3]), pytest.raises(ValueError, match="not in place"):
        engine.forward(vids, KVCache.empty(engine.shape.n_layers))
