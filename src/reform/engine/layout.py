"""Prompt layout: which tokens are template, context, question and answer prefix.

The chat template is rendered once around a placeholder and split, so the context can be tokenised
(and encoded) on its own and any question appended later: ``prefix + context`` is what gets encoded,
``separator + question + suffix`` is the question part asked on top of it. REFORM's query is the
``question`` span alone (no special tokens, no answer prefix; paper appendix C.6).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_PLACEHOLDER = "\u2063REFORM-CONTENT\u2063"
SEPARATOR = "\n\n"


@dataclass
class QuestionPart:
    separator: list[int]
    question: list[int]
    suffix: list[int]   # end of user turn, assistant header, answer prefix

    @property
    def ids(self) -> list[int]:
        return self.separator + self.question + self.suffix

    @property
    def query_span(self) -> slice:
        """Where the question's own tokens sit inside ``ids``."""
        return slice(len(self.separator), len(self.separator) + len(self.question))


class Templater:
    """Splits the tokenizer's chat template (if any) into the text before and after the user message."""

    def __init__(self, tokenizer, use_chat_template: bool = True):
        self.tok = tokenizer
        if use_chat_template and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": _PLACEHOLDER}],
                                                 tokenize=False, add_generation_prompt=True)
            self.head, self.tail = text.split(_PLACEHOLDER)
            self.prefix = self.encode(self.head)
        else:
            self.head, self.tail = "", "\n"
            self.prefix = tokenizer("", add_special_tokens=True)["input_ids"]  # BOS where the model uses one

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"] if text else []

    def context(self, text: str) -> list[int]:
        """Token ids to encode: template prefix + context."""
        return self.prefix + self.encode(text)

    def question(self, question: str, answer_prefix: str = "") -> QuestionPart:
        return QuestionPart(self.encode(SEPARATOR), self.encode(question),
                            self.encode(self.tail + answer_prefix))

    def eos_ids(self, model) -> list[int]:
        ids = model.generation_config.eos_token_id if getattr(model, "generation_config", None) else None
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        if self.tok.eos_token_id is not None:
            ids.append(self.tok.eos_token_id)
        return sorted(set(ids))


def as_tensor(ids: list[int], device) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.long, device=device)
