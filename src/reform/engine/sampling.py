"""Choosing each generated token: greedy at temperature 0, else temperature + top-k, nucleus (top-p) and
min-p sampling with a seeded generator, as OpenAI-style and vLLM-style clients expect. Repetition, frequency
and presence penalties change the logits first, for greedy answers too. Stop strings end the answer where
they first appear (``StopScanner``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor, TopKLogitsWarper


@dataclass(frozen=True)
class Sampling:
    """``temperature`` 0 is greedy (the default, and what every equivalence test checks); ``top_p``
    keeps the smallest set of tokens whose probability reaches it; ``seed`` makes a sampled answer
    repeatable; ``stop``: up to 4 strings that end the answer (not included in it)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_k: int = 0                    # keep the k most likely tokens (0: all)
    min_p: float = 0.0                # drop tokens below min_p times the top token's probability (0: none)
    repetition_penalty: float = 1.0   # transformers' (and vLLM's): over the prompt and the answer so far (1: none)
    frequency_penalty: float = 0.0    # OpenAI's: minus this per time a token occurs in the answer so far
    presence_penalty: float = 0.0     # OpenAI's: minus this once a token occurs in the answer so far

    def __post_init__(self):
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if self.stop is not None and not isinstance(self.stop, (list, tuple)):
            raise ValueError(f"stop must be a string or a list of up to 4 strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop or ()))
        number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
        if not number(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be between 0 and 2, got {self.temperature!r}")
        if not number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2 ** 64):
            raise ValueError(f"seed must be a whole number from 0 to 2**64-1, got {self.seed!r}")
        if len(self.stop) > 4 or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be up to 4 non-empty strings")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be a whole number, 0 (all tokens) or more, got {self.top_k!r}")
        if not number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be between 0 and 1, got {self.min_p!r}")
        if not number(self.repetition_penalty) or not 0.0 < self.repetition_penalty <= 10.0:
            raise ValueError(f"repetition_penalty must be in (0, 10] (1: none), got {self.repetition_penalty!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not number(getattr(self, name)) or not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be between -2 and 2, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def chooser(self, device) -> "TokenChooser":
        return TokenChooser(self, device)


@dataclass
class TokenChooser:
    """Picks the next token from float32 logits ``[vocab]`` under one ``Sampling`` (its own generator,
    so concurrent answers never share random state)."""

    sampling: Sampling
    device: torch.device | str = "cpu"
    generator: torch.Generator | None = field(default=None, init=False)

    def __post_init__(self):
        if not self.sampling.greedy:
            self.generator = torch.Generator(device=self.device)
            if self.sampling.seed is not None:
                self.generator.manual_seed(self.sampling.seed)
            else:
                self.generator.seed()

    def __call__(self, logits: torch.Tensor, prompt: torch.Tensor | None = None, answer: list[int] = ()) -> int:
        """The next token from ``logits`` ``[vocab]``; ``prompt`` (ids) and ``answer`` (the tokens chosen so
        far) are what the penalties count."""
        s = self.sampling
        if s.penalised:
            logits = self.penalise(logits, prompt, answer)
        if s.greedy:
            return int(logits.argmax(-1))
        # shift before scaling, in float64: at a tiny temperature logits / T overflows (or T itself rounds
        # to 0 in float32) and softmax gives NaN; shifted, the top token is 0 and the rest fall to -inf
        logits = logits.double()
        if s.top_k and s.top_k < logits.shape[-1]:
            logits = TopKLogitsWarper(s.top_k)(None, logits[None])[0]
        probs = torch.softmax((logits - logits.max()) / s.temperature, dim=-1).float()
        if s.min_p > 0.0:           # relative to the top token: the top token always stays
            probs = torch.where(probs < s.min_p * probs.max(), 0.0, probs)
        if s.top_p < 1.0:
            sorted_p, order = probs.sort(descending=True)
            # drop tokens once the mass before them already reaches top_p (the top token always stays)
            drop = sorted_p.cumsum(-1) - sorted_p >= s.top_p
            drop[0] = False          # even where a tiny top_p rounds to 0 in float32
            sorted_p[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def penalise(self, logits: torch.Tensor, prompt: torch.Tensor | None, answer) -> torch.Tensor:
        s, logits = self.sampling, logits.float().clone()
        chosen = torch.tensor(list(answer), dtype=torch.long, device=logits.device)
        if s.repetition_penalty != 1.0:
            seen = chosen if prompt is None else torch.cat([prompt.to(logits.device).long(), chosen])
            seen = seen[seen < logits.shape[-1]]          # ids past the vocabulary stand for image rows
            if seen.numel():
                logits = RepetitionPenaltyLogitsProcessor(s.repetition_penalty)(seen[None], logits[None])[0]
        if chosen.numel() and (s.frequency_penalty or s.presence_penalty):
            counts = torch.bincount(chosen, minlength=logits.shape[-1])[:logits.shape[-1]].float()
            logits -= s.frequency_penalty * counts + s.presence_penalty * (counts > 0).float()
        return logits


class StopScanner:
    """Follows the decoded answer and says how much of it is final: text before the first stop string,
    holding back any tail that could still become the start of one (so streamed text never shows part
    of a stop string). ``one_line``: the answer also ends at the first line break after its first
    visible character (a base model's answer line)."""

    def __init__(self, stop: tuple[str, ...], one_line: bool = False):
        self.stop, self.one_line = stop, one_line
        self.stopped = False

    def final(self, text: str) -> str:
        """The part of ``text`` that can be shown; sets ``stopped`` once a stop string appeared."""
        if not self.stop and not self.one_line:
            return text
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if self.one_line and text.strip():
            if (end := text.find("\n", len(text) - len(text.lstrip()))) >= 0:
                hits.append(end)
        if hits:
            self.stopped = True
            return text[:min(hits)]
        hold = max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        return text[:len(text) - hold]
