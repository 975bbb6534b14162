"""An answer under way, and many answered at once (docs/architecture.md, "Answering many at once").

``Answering`` is the generate half of REFORM's recompute (§3.3): the method's prompt (gathered tokens +
question, or a question on a compressed cache) is prefilled when it is made; then each call to ``take``
chooses one token from the current logits, applies the stop rules and streams the new text. The next
logits come from a decoding step of a ``DecodeBatch`` (``Together``; ``answer_together`` for many answers
at once): the model's weights are read once per step for every answer in it, and an answer joins at the
next step and leaves the moment it ends. An answer asked alone decodes in a batch of one, so it is the
same answer in any batch (``Engine.step``). Only answers whose cache a generation policy re-selects at
every token (ReAttention) or that run past the model's window decode on their own (``advance``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..documents.evidence import Passage
from ..engine.batch import DecodeBatch
from ..engine.cache import KVCache
from ..engine.layout import QuestionPart
from ..engine.sampling import Sampling, StopScanner
from ..stats import Timer, peak_cuda_mb, peak_memory_mb


@dataclass
class Answer:
    text: str
    tokens: list[int]
    method: str
    input_tokens: int
    stats: dict
    finish_reason: str = "stop"   # "stop": end-of-sequence token or a stop string; "length": max_new_tokens
    # indices of the context tokens the answer was recomputed from (None: it was read from a compressed
    # cache, whose per-head contents have no single token set); the eval's gold recall checks them
    kept: torch.Tensor | None = None
    kept_scores: torch.Tensor | None = None     # the gather scores of ``kept`` (methods that score tokens)
    # the passages the answer was recomputed from, best first (``documents.evidence``), and, when there
    # are none, why
    evidence: list[Passage] = field(default_factory=list)
    evidence_note: str | None = None

    def to_json(self) -> dict:
        return {"answer": self.text, "method": self.method, "input_tokens": self.input_tokens,
                "finish_reason": self.finish_reason, "stats": self.stats,
                "evidence": [p.to_json() for p in self.evidence],
                **({"evidence_note": self.evidence_note} if self.evidence_note else {})}


class Answering:
    """One answer being generated. Made by ``Method.start`` (gather + prompt prefill done: ``logits`` are
    the first token's); ``take()`` chooses the next token and says whether the answer is complete;
    ``advance()`` runs that token through the model alone; ``answer()`` is the finished ``Answer``.

    ``alone``: the answer cannot decode in a batch (a generation policy re-selects its cache at every token,
    as ReAttention's does, or it runs past the model's window), so its tokens come from ``advance``."""

    def __init__(self, method, ctx, part: QuestionPart, *, max_new_tokens: int,
                 on_text: Callable[[str], None] | None, sampling: Sampling, fit_window: bool):
        # ``method`` is a ``base.Method`` and ``ctx`` a ``base.Context``, which import this module
        engine = ctx.pipeline.engine
        self.method, self.ctx, self.part, self.on_text = method, ctx, part, on_text
        self.timer = timer = Timer()
        timer.add("encode", ctx.encode_seconds)
        if ctx.load_seconds is not None:
            timer.add("load", ctx.load_seconds)
        prompt, cache, self.kept, self.kept_scores = method.prompt(ctx, part, timer)
        used = prompt.shape[0] + (cache.length if cache is not None else 0)
        if fit_window:
            room = engine.max_positions - used
            if room < 1:
                raise ValueError(f"the prompt ({used} tokens with the cache) fills the model's window "
                                 f"({engine.max_positions}): no room is left for an answer")
            max_new_tokens = min(max_new_tokens, room)
        if used + max_new_tokens > engine.max_positions:
            raise ValueError(f"prompt ({used} tokens with the cache) + max_new_tokens ({max_new_tokens}) exceeds "
                             f"the model's window ({engine.max_positions})")
        self.max_new_tokens, self.recomputed = max_new_tokens, int(prompt.shape[0])
        self.window = engine.max_positions          # what ``advance`` may use (``Full`` past the window)
        self.policy = method.generation_policy(ctx)
        self.alone = self.policy is not None or self.window > engine.shape.window
        self.choose = sampling.chooser(prompt.device)
        self.prompt_ids = prompt if sampling.penalised else None     # what a repetition penalty counts
        self.stop = StopScanner(sampling.stop, part.one_line)
        self.tokens: list[int] = []
        self.shown, self.finish, self.done = "", "stop", False
        self.error: Exception | None = None        # what ended it in a batch instead (its stream failed)
        self.t0 = time.perf_counter()
        self.cache = cache if cache is not None else KVCache.empty(engine.shape.n_layers)
        hidden = engine.prefill(prompt, self.cache, chunk_size=engine.shape.window, policy=self.policy)
        self.logits = engine.logits(hidden[-1:])[0]

    def take(self, logits: torch.Tensor | None = None) -> bool:
        """Choose the next token from ``logits`` (default: this answer's own), stream the text it adds,
        and return True once the answer is complete (end-of-sequence, a stop string or ``max_new_tokens``)."""
        pipe = self.ctx.pipeline
        token = self.choose(self.logits if logits is None else logits, self.prompt_ids, self.tokens)
        if token in pipe.eos_ids:
            return self._end("stop")
        if not self.tokens:
            self._lap("recompute")                           # prefill + first token
        self.tokens.append(token)
        visible = self.stop.final(pipe.tokenizer.decode(self.tokens, skip_special_tokens=True))
        if not self.stop.stopped:
            visible = visible.rstrip("\ufffd")               # a character still being decoded
        self._show(visible)
        if self.stop.stopped:
            return self._end("stop", held_back=False)
        if len(self.tokens) >= self.max_new_tokens:
            return self._end("length")
        return False

    def advance(self) -> None:
        """Run the last chosen token through the model alone: ``logits`` become the next token's."""
        engine = self.ctx.pipeline.engine
        with engine.past_window(self.window):
            hidden = engine.prefill(torch.tensor([self.tokens[-1]], device=engine.device), self.cache,
                                    chunk_size=1, policy=self.policy)
        self.logits = engine.logits(hidden[-1:])[0]

    def run(self) -> "Answer":
        """Generate the rest alone and return the ``Answer``: through a decoding batch of one, unless it
        must run ``alone``, so that its tokens are those it gets in any batch."""
        if self.alone:
            while not self.take():
                self.advance()
        else:
            together = Together(self.ctx.pipeline.engine, 1)
            if not together.add(self):
                while together:
                    together.step()
            if self.error is not None:
                raise self.error
        return self.answer()

    def _show(self, visible: str) -> None:
        if self.on_text is not None and len(visible) > len(self.shown):
            self.on_text(visible[len(self.shown):])
        self.shown = max(self.shown, visible, key=len)

    def _lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timer.add(stage, now - self.t0)
        self.t0 = now

    def _end(self, finish: str, held_back: bool = True) -> bool:
        """Complete the answer; ``held_back``: show any tail held back for a stop string that never came."""
        if held_back:
            self._show(self.ctx.pipeline.tokenizer.decode(self.tokens, skip_special_tokens=True))
        self.finish, self.done, self.cache = finish, True, None
        self._lap("recompute" if not self.tokens else "generate")
        return True

    def answer(self) -> "Answer":
        stats = {**{k: round(v, 3) for k, v in self.timer.seconds.items()},
                 "recomputed_tokens": self.recomputed, "new_tokens": len(self.tokens),
                 "peak_memory_mb": peak_memory_mb()}
        if (cuda := peak_cuda_mb()) is not None:
            stats["peak_cuda_mb"] = cuda
        ctx = self.ctx
        answer = Answer(self.shown.strip(), self.tokens, self.method.name,
                        int(ctx.ids.shape[0] + len(self.part.ids)), stats, self.finish, self.kept, self.kept_scores)
        ctx.attach_evidence(answer)
        return answer


class Together:
    """Answers decoding as one batch: ``add`` one after its prefill (it joins at the next ``step``), ``step``
    gives every answer in the batch its next token and returns those that ended (their slots freed at
    once; ``error`` set on one whose streamed text failed), ``drop`` removes one whose client left.
    Answers that must run ``alone`` are not added here."""

    def __init__(self, engine, max_size: int):
        self.engine = engine
        self.batch = DecodeBatch(engine.shape.n_layers, max_size)
        self.members: list[Answering] = []          # members[s] decodes in slot s

    def __len__(self) -> int:
        return len(self.members)

    def room(self) -> int:
        return self.batch.free()

    def add(self, answering: Answering) -> bool:
        """Take the first token of a prefilled answer; True if that already ended it (it does not join)."""
        if answering.alone:
            raise ValueError("this answer decodes alone (a generation policy, or past the model's window)")
        if answering.take():
            return True
        self.batch.join(answering.cache)
        answering.cache = None                      # its entries live in the batch's slot now
        self.members.append(answering)
        return False

    def admit(self, answering: Answering) -> Answer | None:
        """A prefilled answer into the batch: its ``Answer`` at once when it must run alone (decoded now) or
        ended at its first token, else None (it joined; ``step`` returns it when it ends). How
        ``answer_together`` and the server's loop (``server/scheduler.py``) both start answers."""
        if answering.alone:
            return answering.run()
        return answering.answer() if self.add(answering) else None

    def step(self) -> list[Answering]:
        """One decoding step for every member; returns the members that ended at it."""
        if not self.members:
            return []
        logits = self.engine.step(self.batch, [a.tokens[-1] for a in self.members])
        ended = []
        for a, row in zip(list(self.members), logits):
            try:
                done = a.take(row)
            except Exception as e:      # its text could not be delivered (its client left): it ends here
                a.error, done = e, True
            if done:
                ended.append(a)
                self.drop(a)
        return ended

    def drop(self, answering: Answering) -> None:
        """Remove ``answering`` from the batch (ended, or its client left): its slot is free at once."""
        slot = self.members.index(answering)
        moved = self.batch.leave(slot)
        last = self.members.pop()
        if moved is not None:
            self.members[slot] = last


def answer_together(starts: Sequence[Callable[[], Answering]], max_batch: int = 8,
                    refusals: bool = False) -> list[Answer]:
    """Answer many questions at once: each of ``starts`` makes one ``Answering`` (its gather and prefill);
    the answers decode together, up to ``max_batch`` in a step, a new one joining as soon as one ends.
    Answers that must run alone run alone. Returns the answers in the order of ``starts``; with
    ``refusals``, a question refused at its start (``ValueError``: it does not fit, say) gets the refusal
    in its place and the others go on."""
    results: list[Answer | ValueError | None] = [None] * len(starts)
    pending = list(enumerate(starts))
    together: Together | None = None
    index: dict[int, int] = {}                     # id(answering) -> its place in ``starts``
    while pending or together:
        while pending and (together is None or together.room() > 0):
            i, start = pending.pop(0)
            try:
                answering = start()
            except ValueError as e:
                if not refusals:
                    raise
                results[i] = e
                continue
            engine = answering.ctx.pipeline.engine
            together = together or Together(engine, max_batch)
            if engine is not together.engine:
                raise ValueError("answers decode together only on one model: these contexts belong to two")
            if (answer := together.admit(answering)) is not None:
                results[i] = answer
            else:
                index[id(answering)] = i
        if together is not None:
            for answering in together.step():
                if answering.error is not None:
                    raise answering.error
                results[index.pop(id(answering))] = answering.answer()
    return results
