"""Prompt layout: which tokens are template, context, question and answer prefix.

The chat template is rendered once around a placeholder and split, so the context can be tokenised
(and encoded) on its own and any question appended later: ``prefix + context`` is what gets encoded,
``separator + question + suffix`` is the question part asked on top of it. REFORM's query is the
``question`` span alone (no special tokens, no answer prefix; paper appendix C.6).

A model without a chat template (a base model, or ``use_chat_template=False``) gets the plain-text layout
base models are evaluated with (as RULER does): the context, then ``Question: ...``, then ``Answer:`` and
the answer prefix; its answers end at the end of their first line (``QuestionPart.one_line``), where a base
model would go on with a new question of its own.

User text (context, question, answer prefix) is always tokenised as text: a ``<|im_start|>`` inside a
document becomes the characters it spells, never a control token, so a document cannot open a turn of
its own. Only the template's own parts carry special tokens.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

_PLACEHOLDER = "\u2063REFORM-CONTENT\u2063"
SEPARATOR = "\n\n"
PLAIN_QUESTION, PLAIN_ANSWER = "\n\nQuestion:", "\nAnswer:"     # the plain-text layout's labels
LAYOUTS = ("question", "verbatim", "continuation")      # how a question follows its context (Templater.question)
# a "Question:" label at the start, after a line break or after a sentence's end: what follows it is searched
_QUESTION_LABEL = re.compile(r"(?:^|\n|(?<=[.!?:;)])[ \t])[ \t]*question:[ \t]*", re.IGNORECASE)


def split_instruction(text: str) -> tuple[str, str]:
    """``(instruction, question)``: the text up to and including its last ``Question:`` label (at the start,
    after a line break or after a sentence) that has words after it, and those words; ``("", text)`` where
    there is none. The instruction is read by the model, the question is what a gather searches with, so
    "Answer in one word. Question: Who ...?" searches as "Who ...?" does."""
    for m in reversed(list(_QUESTION_LABEL.finditer(text))):
        if text[m.end():].strip():
            return text[:m.end()], text[m.end():]
    return "", text


@dataclass
class QuestionPart:
    separator: list[int]
    question: list[int]
    suffix: list[int]   # end of user turn, assistant header, answer prefix
    # the answer ends with its first line (the plain-text layout's labelled questions; a benchmark's own
    # prompt runs to its own length)
    one_line: bool = False
    # how many of ``separator``'s last tokens are an instruction (read, not searched with), and the question's
    # tokens as searched (None: ``question``'s; they differ where an instruction's label ends with a space)
    told: int = 0
    searched: list[int] | None = field(default=None, repr=False)

    @property
    def ids(self) -> list[int]:
        return self.separator + self.question + self.suffix

    @property
    def query_span(self) -> slice:
        """Where the question's own tokens sit inside ``ids``."""
        return slice(len(self.separator), len(self.separator) + len(self.question))

    @property
    def search_ids(self) -> list[int]:
        """What a gather runs on top of the context to embed the question: ``ids`` without the instruction."""
        return self.separator[:len(self.separator) - self.told] + self.search_question + self.suffix

    @property
    def search_question(self) -> list[int]:
        return self.question if self.searched is None else self.searched

    @property
    def search_span(self) -> slice:
        """Where the question's tokens sit inside ``search_ids``."""
        start = len(self.separator) - self.told
        return slice(start, start + len(self.search_question))


class Templater:
    """Splits the tokenizer's chat template (if any) into the text before and after the user message;
    without one, lays the prompt out as plain text (``plain``)."""

    def __init__(self, tokenizer, use_chat_template: bool = True):
        self.tok = tokenizer
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))
        self.plain = not (use_chat_template and self.has_chat_template)
        if not self.plain:
            text = tokenizer.apply_chat_template([{"role": "user", "content": _PLACEHOLDER}],
                                                 tokenize=False, add_generation_prompt=True)
            self.head, self.tail = text.split(_PLACEHOLDER)
            self.prefix = self.template_ids(self.head)
        else:
            self.head, self.tail = "", PLAIN_ANSWER
            self.prefix = tokenizer("", add_special_tokens=True)["input_ids"]  # BOS where the model uses one

    def template_ids(self, text: str) -> list[int]:
        """The template's own text, special tokens included."""
        return self.tok(text, add_special_tokens=False)["input_ids"] if text else []

    def encode(self, text: str) -> list[int]:
        """User text, special-token strings included as plain text."""
        if not text:
            return []
        if isinstance(self.tok, PreTrainedTokenizerBase):
            return self.tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return self.tok(text, add_special_tokens=False)["input_ids"]

    @functools.cached_property
    def special_strings(self) -> list[str]:
        """The tokenizer's special-token strings (``<|endoftext|>``, ``<|im_start|>`` ...)."""
        specials = set(getattr(self.tok, "all_special_tokens", None) or ())
        for token in (getattr(self.tok, "added_tokens_decoder", None) or {}).values():
            if getattr(token, "special", False):
                specials.add(str(token))
        return sorted((s for s in specials if s), key=len, reverse=True)

    def context(self, text: str) -> list[int]:
        """Token ids to encode: template prefix + context."""
        return self.prefix + self.encode(text)

    def context_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """``context(text)`` and, per id, the character of ``text`` where its token starts (-1 for the
        template's). A fast tokenizer says so itself; others are decoded token by token."""
        if isinstance(self.tok, PreTrainedTokenizerBase) and getattr(self.tok, "is_fast", False):
            enc = self.tok(text, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
            ids, starts = enc["input_ids"], [a for a, _ in enc["offset_mapping"]]
        else:
            ids, starts, at = self.encode(text), [], 0
            for i in ids:
                starts.append(min(at, len(text)))
                at += len(self.tok.decode([i]))
        return self.prefix + ids, [-1] * len(self.prefix) + starts

    def question(self, question: str, answer_prefix: str = "", after_context: bool = True,
                 layout: str = "question", instruction: str = "") -> QuestionPart:
        """The question's ids after the context (``after_context`` False: the question is the whole
        prompt, so nothing separates it from a context). ``layout`` (``LAYOUTS``): ``question`` adds the
        separator (plain text: the ``Question:``/``Answer:`` labels); ``verbatim`` lays the question and
        answer prefix out exactly as given, so that context + question + answer prefix is a benchmark's own
        prompt (a chat template still closes the turn); ``continuation`` also leaves the turn open, so the
        answer continues the text itself (code completion). ``instruction``: text read right before the
        question (a benchmark's "Answer the question based on the given documents ..."), outside the
        question's own tokens (``QuestionPart.query_span``), so a gather does not search with it."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        words = question
        for special in self.special_strings:
            words = words.replace(special, "")
        if not words.strip():
            raise ValueError(f"the question {question.strip()!r} holds only special tokens; ask it in words")
        extra, question = split_instruction(question)
        instruction += extra
        if layout != "question":
            tail = [] if self.plain or layout == "continuation" else self.template_ids(self.tail)
            return self._part([], instruction, question, tail + self.encode(answer_prefix))    # runs its length
        if self.plain:      # "...context\n\nQuestion: [INSTRUCTION ]QUESTION\nAnswer: PREFIX"
            label = PLAIN_QUESTION if after_context else PLAIN_QUESTION.lstrip()
            suffix = self.template_ids(self.tail) + self.encode(" " + answer_prefix if answer_prefix else "")
            told = self.encode(" " + instruction.strip()) if instruction.strip() else []
            q = self.encode(" " + question.strip())
            return QuestionPart(self.template_ids(label) + told, q, suffix, one_line=True, told=len(told))
        return self._part(self.template_ids(SEPARATOR if after_context else ""), instruction, question,
                          self.template_ids(self.tail) + self.encode(answer_prefix))

    def _part(self, separator: list[int], instruction: str, question: str, suffix: list[int]) -> QuestionPart:
        """``separator + instruction + question + suffix``, the instruction marked as read, not searched; an
        instruction's trailing space is read as the question's leading one (as the text is tokenised whole)."""
        if not instruction:
            return QuestionPart(separator, self.encode(question), suffix)
        spaced = instruction[-1:].isspace() and not question[:1].isspace()
        told = self.encode(instruction.rstrip(" ") if spaced else instruction)
        read = self.encode(" " + question) if spaced else self.encode(question)
        return QuestionPart(separator + told, read, suffix, told=len(told), searched=self.encode(question))

    def question_preview(self, part: QuestionPart) -> list[int]:
        """``Question: QUESTION`` and a blank line: the question read before a context as well, so that a
        reader knows what it reads for (REFORM's ``question_first``)."""
        return self.encode(f"Question: {self.tok.decode(part.question).strip()}{SEPARATOR}")

    def eos_ids(self, model) -> list[int]:
        ids = model.generation_config.eos_token_id if getattr(model, "generation_config", None) else None
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        if self.tok.eos_token_id is not None:
            ids.append(self.tok.eos_token_id)
        return sorted(set(ids))


def as_tensor(ids: list[int], device) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.long, device=device)
