"""The load-time numeric check: ``Engine`` refuses a model unless its logits equal the model's own forward
(docs/architecture.md, "Where per-model behaviour lives"); in half precision both are judged against the
same weights' fp32 forward."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from .cache import KVCache
from .shape import UnsupportedModelError


# In half precision the engine may be HALF_MARGIN times as far from the fp32 forward as transformers' own
# half-precision forward is, plus HALF_SLACK (relative RMS). Measured in bf16 on the real SmolLM2-135M and
# Gemma 3 270M (12 tokens, 2-core Zen 3): transformers 0.019 / 0.036 from fp32, the engine 0.022 / 0.033;
# one layer's attention logits scaled by 2 (SmolLM2) or 1.2 (Gemma), or its values by 1.2 (SmolLM2):
# 0.040 / 0.064, 0.034, all refused. The largest difference instead of the RMS hides such breaks: it is
# set by the head's rounding of the largest logits, the same on both sides (0.040 and 0.040 on SmolLM2).
HALF_MARGIN = 1.5
HALF_SLACK = 2e-3


def relative_distance(truth: torch.Tensor, *others: torch.Tensor) -> float:
    """The largest absolute difference of any of ``others`` from ``truth``, relative to its largest logit."""
    scale = truth.abs().max().clamp(min=1e-6)
    return max(float((o - truth).abs().max() / scale) for o in others)


def relative_rms(truth: torch.Tensor, *others: torch.Tensor) -> float:
    """The largest root-mean-square difference of any of ``others`` from ``truth``, relative to its RMS."""
    scale = truth.pow(2).mean().sqrt().clamp(min=1e-6)
    return max(float((o - truth).pow(2).mean().sqrt() / scale) for o in others)


class float32_weights:
    """Context manager: the floating-point parameters and buffers of ``modules`` (their children too unless
    ``recurse`` is False) swapped in place for fp32 copies, and the very same tensors put back on exit
    (``restore``), so tied weights stay tied and nothing is rounded twice."""

    def __init__(self, modules, recurse: bool = True):
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        for m in modules:
            for t in (*m.parameters(recurse=recurse), *m.buffers(recurse=recurse)):
                if t.is_floating_point() and t.dtype != torch.float32:
                    self.saved.append((t, t.data))
                    t.data = t.data.float()

    def __enter__(self) -> "float32_weights":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def restore(self) -> None:
        for t, data in reversed(self.saved):
            t.data = data
        self.saved = []


def check_against_model(engine, n: int = 12) -> None:
    """Refuse the model unless the engine's logits equal the model's own forward on a short input:
    once in one block, and once in two blocks with the cache re-packed in between (pre-RoPE keys
    rotated afresh). Catches model-level code the engine does not run (embedding or logit scaling),
    attention features it does not honour, and layers that do not go through the attention interface.

    In fp32 "equal" means within 1e-4 of the largest logit. In half precision both sides carry
    rounding noise of their own, so both are judged against the truth, the same weights' forward in
    fp32: the engine's logits must land no further from it (relative RMS) than transformers' own
    half-precision forward does, up to ``HALF_MARGIN`` times that plus ``HALF_SLACK``; and the engine
    run on the same weights in fp32 must equal it within 1e-4, which catches a wrong layer that half
    precision's rounding noise would hide."""
    g = torch.Generator().manual_seed(0)
    vocab = engine.lm_head.weight.shape[0]
    ids = torch.randint(0, vocab, (n,), generator=g).to(engine.device)
    try:
        with torch.inference_mode():
            ref = engine.model(ids[None]).logits[0].float()
        ours, chunked = engine_logits(engine, ids)
    except UnsupportedModelError as e:
        raise UnsupportedModelError(f"model type '{engine.name}': {e}") from None
    except Exception as e:  # a layer the engine cannot drive: refuse, never half-run
        raise cannot_drive(engine, e) from None
    if engine.dtype == torch.float32:
        engine.check_distance = distance = relative_distance(ref, ours, chunked)
        tol, judged = 1e-4, f"relative difference {distance:.1e}"
    else:
        try:
            with float32_weights_per_layer(engine):
                truth = engine.model(ids[None]).logits[0].float()
        except Exception:    # weights that have no fp32 form (e.g. quantised layers): the model's own
            truth = None     # half-precision forward is the reference, within a fixed 3e-2
        if truth is None:
            engine.check_distance = distance = relative_distance(ref, ours, chunked)
            tol, judged = 3e-2, f"relative difference {distance:.1e} from its own forward"
        else:
            # the same weights in fp32 through the engine: equal within fp32's 1e-4, so a wrong layer
            # is caught even where half precision's own rounding noise would hide it
            try:
                with float32_weights_per_layer(engine):
                    exact = relative_distance(truth, *engine_logits(engine, ids))
            except Exception as e:
                raise cannot_drive(engine, e) from None
            if not exact <= 1e-4:
                raise UnsupportedModelError(
                    f"model type '{engine.name}': the engine's logits differ from the model's own forward "
                    f"with the same weights in fp32 (relative difference {exact:.1e}, on a {n}-token check), "
                    "so it computes something this engine does not")
            engine.check_distance = distance = relative_rms(truth, ours, chunked)
            engine.check_reference = reference = relative_rms(truth, ref)
            tol = HALF_MARGIN * reference + HALF_SLACK
            judged = (f"{distance:.1e} from the fp32 forward (relative RMS), where transformers' own "
                      f"{str(engine.dtype).removeprefix('torch.')} forward is {reference:.1e}")
    if not distance <= tol:
        raise UnsupportedModelError(f"model type '{engine.name}': the engine's logits differ from the model's "
                                    f"own forward ({judged}, on a {n}-token check), so it computes something "
                                    "this engine does not")


def cannot_drive(engine, e: Exception) -> UnsupportedModelError:
    first_line = (str(e).strip().splitlines() or [""])[0][:160]
    return UnsupportedModelError(f"model type '{engine.name}': the engine cannot drive its decoder layers "
                                 f"({type(e).__name__}: {first_line})")


@torch.inference_mode()
def engine_logits(engine, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's logits on ``ids`` in one block, and in two blocks with the cache re-packed in
    between (pre-RoPE keys rotated afresh); FLOPs of the check are not counted."""
    n = ids.shape[0]
    ours = engine.logits(engine.forward(ids, KVCache.empty(engine.shape.n_layers)))
    cache = KVCache.empty(engine.shape.n_layers)
    first = engine.logits(engine.forward(ids[:n // 2], cache))
    for lc in cache.layers:
        lc.keep(torch.arange(lc.length, device=engine.device).expand(lc.keys.shape[0], -1), engine.rotary)
    chunked = torch.cat([first, engine.logits(engine.forward(ids[n // 2:], cache))])
    engine.flops.reset()
    if any(lc.length == 0 for lc in cache.layers):
        raise UnsupportedModelError("its attention does not go through transformers' attention interface "
                                    "and cache, which the engine drives")
    return ours, chunked


@contextmanager
def float32_weights_per_layer(engine):
    """Inside, the model computes in fp32 (the truth half precision rounds), through its own forward
    or the engine's: each decoder layer is held in fp32 only while it runs (the embedding, final norm
    and head for the whole block), so this costs one layer's fp32 copy, not the model's; the
    half-precision weights are put back untouched."""
    in_layers = {id(m) for layer in engine.layers for m in layer.modules()}
    held: dict[int, float32_weights] = {}          # the layer in fp32 right now (one at a time)
    hooks = [h for layer in engine.layers for h in (
        layer.register_forward_pre_hook(lambda mod, args: held.__setitem__(id(mod), float32_weights([mod]))),
        layer.register_forward_hook(lambda mod, args, out: held.pop(id(mod)).restore()))]
    try:
        with float32_weights([m for m in engine.model.modules() if id(m) not in in_layers], recurse=False), \
                torch.inference_mode():
            yield
    finally:
        for h in hooks:
            h.remove()
        for weights in held.values():                 # a layer whose forward raised
            weights.restore()
