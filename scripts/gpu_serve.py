"""gpu_check's `serve` mode: users asking at once on one encoded context, as `reform serve`'s worker
batches them, against the same questions one at a time."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from gpu_measure import SHAPES, Results, build_model, byte_tokenizer, machine, markdown, need_bm25s, need_cuda


def serve(out: Path, device: str, shape_name: str, length: int, users: list[int], max_tokens: list[int],
          budget_s: float) -> Results:
    """Users asking at once on one context encoded by REFORM (the paper's settings for the shape): for each
    ``max_tokens``, the questions one at a time (``Context.ask``), then each count of ``users`` at once
    (``Context.ask_many``, the decoding loop of ``reform serve``'s worker without its HTTP layer). Per row:
    tokens per second, the speed-up over one at a time, p50 / p95 latency (to each answer's last text) and
    how many answers equal their one-at-a-time answer. A row whose estimate no longer fits ``budget_s`` is
    skipped with a note."""
    from reform.model import pick_dtype
    from reform.pipeline import Pipeline
    started = time.perf_counter()
    need_cuda(device, 40 if shape_name == "mistral-nemo-12b" else 0)
    need_bm25s()
    shape, dtype = SHAPES[shape_name], pick_dtype(torch.device(device))
    res = Results(out, "serve", {"shape": shape_name, "context_tokens": length, "dtype": str(dtype),
                                 "machine": machine(device)})
    model = build_model(shape, device, dtype)
    options = dict(chunk_size=shape.chunk, cache_budget=shape.chunk, recompute_budget=shape.recompute)
    if shape.reform_heads:
        options["heads"] = ",".join(shape.reform_heads)
    pipe = Pipeline(model, byte_tokenizer(), model_name=f"random {shape_name}", use_chat_template=False, **options)
    ctx = pipe.encode_tokens(torch.randint(3, 259, (length,), generator=torch.Generator().manual_seed(0)).to(device))
    res.note(f"context encoded in {ctx.encode_seconds:.1f} s")
    res.note(profile_decode(ctx, out / "serve-profile.txt"))
    questions = [f"Question {i}: what does the text say about item {i}?" for i in range(max(users))]
    for n in max_tokens:
        t = time.perf_counter()
        alone = [ctx.ask(q, max_new_tokens=n) for q in questions[:1]]
        each = time.perf_counter() - t
        if each * (len(questions) - 1) > budget_s - (time.perf_counter() - started):
            res.note(f"skipped max_tokens {n}: one at a time would take about {each * len(questions):.0f} s")
            continue
        t = time.perf_counter()
        alone += [ctx.ask(q, max_new_tokens=n) for q in questions[1:]]
        alone_s = each + time.perf_counter() - t
        for u in users:
            if (left := budget_s - (time.perf_counter() - started)) < alone_s * u / len(questions):
                res.note(f"skipped {u} users at {n} tokens: {left:.0f} s left of the budget")
                continue
            finished: dict[int, float] = {}
            asked = [{"question": q, "max_new_tokens": n,
                      "on_text": lambda _, i=i: finished.__setitem__(i, time.perf_counter())}
                     for i, q in enumerate(questions[:u])]
            t = time.perf_counter()
            answers = ctx.ask_many(asked, max_batch=u)
            wall = time.perf_counter() - t
            latency = sorted(finished.get(i, t + wall) - t for i in range(u))
            tokens, one = sum(len(a.tokens) for a in answers), alone[:u]
            one_s = alone_s * u / len(questions)
            res.add({"max_tokens": n, "users": u, "wall_s": round(wall, 2), "tokens": tokens,
                     "tokens_per_s": round(tokens / wall, 1),
                     "one_at_a_time_tokens_per_s": round(sum(len(a.tokens) for a in one) / one_s, 1),
                     "speedup": round((tokens / wall) / (sum(len(a.tokens) for a in one) / one_s), 2),
                     "p50_s": round(latency[len(latency) // 2], 2), "p95_s": round(latency[int(0.95 * (u - 1))], 2),
                     "equal_answers": f"{sum(a.tokens == b.tokens for a, b in zip(answers, one))}/{u}"})
    res.write(markdown(res.rows, [("max_tokens", "max_tokens"), ("users", "users"), ("tokens/s", "tokens_per_s"),
                                  ("one at a time", "one_at_a_time_tokens_per_s"), ("speed-up", "speedup"),
                                  ("p50 s", "p50_s"), ("p95 s", "p95_s"), ("equal answers", "equal_answers")]))
    return res


def profile_decode(ctx, path: Path, steps: int = 8) -> str:
    """Where one answer's decoding steps go: the same question profiled with one token (the recompute and
    the first token) and with ``1 + steps``, the difference per step: operator calls, GPU kernels and GPU
    busy time against the step's wall time; the longer answer's top operators go to ``path``. A GPU busy
    for a small part of a step is waiting on the host."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    from reform.outputs import write_atomic
    cuda = ctx.ids.device.type == "cuda"
    ctx.ask("Warm-up question?", max_new_tokens=steps)

    def profiled(tokens: int):
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            answer = ctx.ask("Profiled question?", max_new_tokens=tokens)
            if cuda:
                torch.cuda.synchronize()
        events = prof.events()
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        ops = sum(e.device_type == DeviceType.CPU for e in events)
        return prof, answer, ops, len(kernels), sum(e.device_time for e in kernels) / 1e3
    _, _, ops1, kernels1, busy1 = profiled(1)
    prof, answer, ops2, kernels2, busy2 = profiled(1 + steps)
    n = max(len(answer.tokens) - 1, 1)
    wall_ms = answer.stats.get("generate", 0.0) / n * 1e3
    line = (f"decoding one answer: {wall_ms:.1f} ms a step (wall, under the profiler), "
            f"{(ops2 - ops1) / n:.0f} operator calls, {(kernels2 - kernels1) / n:.0f} GPU kernels and "
            f"{(busy2 - busy1) / n:.1f} ms of GPU time a step, over {n} steps")
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    write_atomic(path, line + "\n\n" + prof.key_averages().table(sort_by=sort, row_limit=25))
    return line
