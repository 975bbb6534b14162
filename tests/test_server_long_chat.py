"""A long chat costs what one text does before its encode is queued (issue 100): the stored prefix of a
conversation is found from one tokenisation of the whole, and the prefix it uses is checked exactly."""

import random

import httpx

from reform.engine.layout import Templater
from reform.pipeline import Pipeline
from reform.server.openai_schema import context_text
from reform.server.service import Keys
from reform.server.tenants import Tenant

from conftest import real_tokenizer, tiny
from live_server import DOC, OPTIONS


def brute_force(keys: Keys, texts: list[str], limit: int, tenant: Tenant) -> dict[int, str]:
    """Every prefix's key by tokenising it alone, as long as the messages after it fit in ``limit``."""
    found = {}
    for j in range(len(texts), 0, -1):
        if j < len(texts) and keys.tokens(context_text([("user", t) for t in texts[j:]])) > limit:
            break
        found[j] = tenant.context_key(keys.of(context_text([("user", t) for t in texts[:j]]))[0])
    return found


def test_every_prefix_key_from_one_tokenisation_is_the_prefix_alone_key():
    tok = real_tokenizer()
    pipe = Pipeline(tiny("llama", vocab_size=len(tok)), tok, **OPTIONS)
    keys, rng = Keys(pipe), random.Random(0)
    pieces = ["The", " quick", "fox", " ", "  ", "\n", "42", ".", "dog?", "é", "中"]
    for tenant in (Tenant("default"), Tenant("acme")):
        for _ in range(20):
            texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 30))]
            exact = brute_force(keys, texts, 40, tenant)
            fast = keys.prefix_keys(texts, 40, tenant)
            prefix_key = lambda j: tenant.context_key(keys.of(context_text([("user", t) for t in texts[:j]]))[0])
            assert all(key == prefix_key(j) for j, key in fast)      # never a wrong key
            assert {j for j, _ in fast} >= set(exact) - {j for j in exact if j < len(texts) and texts[j - 1][-1:].isspace()}
            assert fast and fast[0] == (len(texts), exact[len(texts)])


def test_a_3000_message_chat_tokenises_its_text_a_few_times_not_once_per_message(live, monkeypatch):
    calls = []
    for name in ("encode", "context_offsets"):
        original = getattr(Templater, name)
        monkeypatch.setattr(Templater, name, lambda self, text, _f=original, _n=name: calls.append(len(text)) or _f(self, text))
    messages = [{"role": "system", "content": DOC}] + [{"role": "user" if i % 2 else "assistant", "content": "x"}
                                                      for i in range(3000)] + [{"role": "user", "content": "Why?"}]
    with httpx.Client(base_url=live.url, timeout=120) as http:
        r = http.post("/v1/chat/completions", json={"model": "reform", "messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text
    whole = len(context_text([("user", m["content"]) for m in messages[:-1]]))
    # the whole conversation is tokenised a few times (its key, its prefixes, its encode), never per message
    assert sum(n for n in calls if n >= len(DOC)) <= 6 * whole
