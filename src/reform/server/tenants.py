"""Tenants of a shared ``reform serve``: who a request's key belongs to, what that tenant may use, and
where its contexts and files live (docs/server.md, "Tenants").

- ``Tenant``: a name, a key and optional ``Quotas``. Its contexts and files live under its own folder of
  the store (``scope``), and its context ids are its own: the content key mixed with the tenant's name
  (``context_key``), so the same text uploaded by two tenants is two contexts, encoded twice, and no
  answer, id or timing tells one tenant what another has read.
- ``Tenants``: every tenant of a server, from a keys file (``--keys``: TOML, JSON, or ``name:key`` lines),
  from one ``--api-key``, or the one open tenant of a server without keys. ``find`` looks a bearer key up
  in constant time (every key compared, whatever matched).
- ``DailyTokens``: tokens accepted for encoding per tenant per UTC day, kept in the store so that a
  restart or another replica over the same store counts the same day.

The tenant named ``default`` (the only one of an ``--api-key`` or open server) owns the store's top
folder: a store written before tenants existed stays readable, under it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path

DEFAULT = "default"                        # the tenant of the store's top folder
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_KEY_CHARS = 4096


class KeysFileError(ValueError):
    """A keys file that cannot be used, said in one line (never quoting a key)."""


@dataclass(frozen=True)
class Quotas:
    """What one tenant may use; None: unlimited. ``store_bytes`` and ``contexts`` refuse new uploads with
    413 while the tenant's store is at them; ``in_flight`` and ``daily_tokens`` answer 429 with
    ``Retry-After``."""

    store_bytes: int | None = None      # bytes of the tenant's saved contexts
    contexts: int | None = None         # contexts stored, queued or encoding
    in_flight: int | None = None        # requests being answered at once
    daily_tokens: int | None = None     # context tokens accepted for encoding per UTC day


@dataclass(frozen=True)
class Tenant:
    name: str
    key: str | None = field(default=None, repr=False)     # never printed: not in repr, logs or errors
    quotas: Quotas = Quotas()
    admin: bool = False     # may read what concerns every tenant: /metrics, /health's counts, /openapi.json

    @property
    def scope(self) -> str:
        """The tenant's folder in the store, relative to its top ("" for ``default``)."""
        return "" if self.name == DEFAULT else f"tenants/{self.name}"

    def context_key(self, content_key: str) -> str:
        """The store key of a context whose content key is ``content_key``: the tenant's folder and an id
        of its own (``default`` keeps the content key, as before tenants)."""
        if not self.scope:
            return content_key
        mixed = hashlib.sha256(f"{self.name}/{content_key}".encode()).hexdigest()[:32]
        return f"{self.scope}/{mixed}"

    def stored_key(self, public_id: str) -> str:
        """The store key of the id a client sends (``public_id`` unchecked: the store refuses bad ones)."""
        return f"{self.scope}/{public_id}" if self.scope else public_id

    def owns(self, key: str) -> bool:
        return scope_of(key) == self.scope


def scope_of(key: str) -> str:
    return key.rpartition("/")[0]


def public_id(key: str) -> str:
    """What clients see of a store key: the id without the tenant's folder."""
    return key.rpartition("/")[2]


class Tenants:
    """Every tenant of one server, looked up by bearer key. ``open``: no key is asked (one ``default``
    tenant)."""

    def __init__(self, tenants: list[Tenant], open: bool = False):
        self.all, self.open = list(tenants), open
        self.by_name = {t.name: t for t in self.all}
        self._digests = [(hashlib.sha256(t.key.encode()).digest(), t) for t in self.all if t.key is not None]

    @classmethod
    def of(cls, api_key: str | None = None, keys_file: str | None = None) -> "Tenants":
        if api_key is not None and keys_file is not None:
            raise KeysFileError("give --api-key or --keys, not both (a single key is a keys file of one tenant)")
        if keys_file is not None:
            return cls(read_keys_file(keys_file))
        if api_key is not None:         # one tenant: nobody else's activity to see
            return cls([Tenant(DEFAULT, check_key(api_key, "--api-key"), admin=True)])
        return cls([Tenant(DEFAULT)], open=True)

    def find(self, authorization: str) -> Tenant | None:
        """The tenant whose key a request's ``Authorization: Bearer KEY`` header carries, else None. Every
        key is compared (digests, in constant time), so the time taken says nothing of which one matched
        or how much of one did."""
        if self.open:
            return self.all[0]
        scheme, _, given = authorization.partition(" ")
        digest = hashlib.sha256(given.strip().encode("utf-8", "surrogateescape")).digest()
        found = None
        for known, tenant in self._digests:      # no early exit: every key costs the same
            if hmac.compare_digest(digest, known):
                found = tenant
        return found if scheme.lower() == "bearer" else None

    def operator(self, authorization: str, metrics_key: str | None = None) -> bool:
        """Whether a request may read what concerns every tenant (``/metrics``, ``/health``'s counts,
        ``/openapi.json``): on an open server without ``metrics_key``, anyone; else the bearer of
        ``metrics_key`` or of an admin tenant's key (compared in constant time, as ``find`` does)."""
        if self.open and metrics_key is None:
            return True
        scheme, _, given = authorization.partition(" ")
        by_metrics_key = metrics_key is not None and hmac.compare_digest(
            hashlib.sha256(given.strip().encode("utf-8", "surrogateescape")).digest(),
            hashlib.sha256(metrics_key.encode()).digest())
        tenant = None if self.open else self.find(authorization)
        return scheme.lower() == "bearer" and (by_metrics_key or (tenant is not None and tenant.admin))

    def names(self) -> list[str]:
        return [t.name for t in self.all]


def check_key(key: str, where: str) -> str:
    if not key:
        raise KeysFileError(f"{where}: the key is empty")
    if len(key) > MAX_KEY_CHARS:
        raise KeysFileError(f"{where}: the key is longer than {MAX_KEY_CHARS} characters")
    if not all("!" <= c <= "~" for c in key):       # what an HTTP header carries as it is, without spaces
        raise KeysFileError(f"{where}: the key holds a space, a control character or a non-ASCII character "
                            "(keys are printable ASCII: they travel in an HTTP header)")
    return key


def read_keys_file(path: str | Path) -> list[Tenant]:
    """The tenants of a keys file: ``.toml`` or ``.json`` (a ``tenants`` table of name -> {key, quotas}), or
    any other file as one ``name:key`` per line (``#`` comments and blank lines ignored). Refused in one
    line: unreadable, empty, a bad name or key, a name or key given twice, an unknown field."""
    path = Path(path).expanduser()
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise KeysFileError(f"cannot read the keys file {path}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise KeysFileError(f"keys file {path}: not UTF-8 text (byte {e.start})") from None
    where = f"keys file {path}"
    if path.suffix.lower() in (".toml", ".json"):
        entries = _table_entries(text, path.suffix.lower(), where)
    else:
        entries = _line_entries(text, where)
    if not entries:
        raise KeysFileError(f"{where} names no tenants")
    tenants, seen_keys = [], {}
    for name, key, quotas, admin, at in entries:
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise KeysFileError(f"{where}, {at}: tenant name {str(name)[:80]!r} is not 1-64 letters, digits, '_', "
                                "'.' or '-' (starting with a letter or digit)")
        if name in {t.name for t in tenants}:
            raise KeysFileError(f"{where}, {at}: tenant {name!r} is named twice")
        if not isinstance(key, str):
            raise KeysFileError(f"{where}, {at}: tenant {name!r} has no key (a string)")
        check_key(key, f"{where}, {at}")
        if key in seen_keys:
            raise KeysFileError(f"{where}, {at}: tenants {seen_keys[key]!r} and {name!r} have the same key")
        seen_keys[key] = name
        tenants.append(Tenant(name, key, quotas, admin))
    return tenants


def _line_entries(text: str, where: str) -> list:
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, colon, key = line.partition(":")
        if not colon:
            raise KeysFileError(f"{where}, line {number}: not 'name:key'")
        entries.append((name.strip(), key.strip(), Quotas(), False, f"line {number}"))
    return entries


def _table_entries(text: str, suffix: str, where: str) -> list:
    try:
        if suffix == ".toml":
            data = _toml().loads(text)
        else:
            data = json.loads(text, object_pairs_hook=_no_twice)
    except (ValueError, RecursionError) as e:      # tomllib.TOMLDecodeError and JSONDecodeError are ValueErrors
        raise KeysFileError(f"{where}: {str(e).splitlines()[0] if str(e) else 'not valid'}") from None
    if not isinstance(data, dict) or set(data) - {"tenants"} or not isinstance(data.get("tenants", {}), dict):
        raise KeysFileError(f"{where}: expected one 'tenants' table of name = {{key = ..., quotas ...}}")
    entries, known = [], {f.name for f in fields(Quotas)}
    for name, entry in data.get("tenants", {}).items():
        at = f"tenant {str(name)[:80]!r}"
        if not isinstance(entry, dict):
            raise KeysFileError(f"{where}, {at}: expected a table with 'key' and optional quotas")
        if unknown := sorted(set(entry) - known - {"key", "admin"}):
            raise KeysFileError(f"{where}, {at}: unknown field {unknown[0]!r} (known: key, admin, "
                                f"{', '.join(sorted(known))})")
        if not isinstance(entry.get("admin", False), bool):
            raise KeysFileError(f"{where}, {at}: admin must be true or false")
        for q in known & set(entry):
            if type(entry[q]) is not int or entry[q] <= 0:
                raise KeysFileError(f"{where}, {at}: {q} must be a positive whole number")
        entries.append((name, entry.get("key"), Quotas(**{q: entry[q] for q in known & set(entry)}),
                        entry.get("admin", False), at))
    return entries


def _toml():
    try:
        import tomllib
    except ImportError:             # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise KeysFileError("a TOML keys file needs Python 3.11 or the tomli package; write it as JSON "
                                "or as name:key lines") from None
    return tomllib


def _no_twice(pairs):
    names = [name for name, _ in pairs]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"{twice[0]!r} is given twice")
    return dict(pairs)


# ---------------------------------------------------------------------- daily tokens
def utc_day(now: float | None = None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() if now is None else now))


def seconds_to_next_day(now: float | None = None) -> int:
    now = time.time() if now is None else now
    return int(86400 - now % 86400) + 1


class DailyTokens:
    """Context tokens each tenant had accepted for encoding today (UTC), over every process sharing the
    store: each process writes its own counts to ``usage/DAY/INSTANCE.json`` in the tenant's folder
    (whole-file writes, one writer per file) and reads the others' when it checks a quota."""

    def __init__(self, store, instance: str | None = None):
        self.store, self.instance = store, instance or uuid.uuid4().hex
        self.lock = threading.Lock()
        self.mine: dict[tuple[str, str], int] = {}       # (scope, day) -> tokens accepted here

    def _folder(self, scope: str, day: str) -> str:
        return "/".join(p for p in (self.store.root, scope, "usage", day) if p)

    def _others(self, scope: str, day: str) -> int:
        total = 0
        with contextlib.suppress(OSError):
            for path in self.store.fs.glob(f"{self._folder(scope, day)}/*.json"):
                if path.rsplit("/", 1)[-1] == f"{self.instance}.json":
                    continue
                with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                    total += int(json.loads(self.store.read_whole(path))["tokens"])
        return total

    def used(self, scope: str) -> int:
        day = utc_day()
        with self.lock:
            return self._others(scope, day) + self.mine.get((scope, day), 0)

    def take(self, scope: str, tokens: int, limit: int | None) -> int | None:
        """Count ``tokens`` for today; with ``limit``, only if they fit under it: else None and nothing
        counted. Returns the day's total. (Blocking: call it off the event loop.)"""
        day = utc_day()
        with self.lock:
            used = self._others(scope, day) + self.mine.get((scope, day), 0)
            if limit is not None and used + tokens > limit:
                return None
            mine = self.mine[(scope, day)] = self.mine.get((scope, day), 0) + tokens
            with contextlib.suppress(OSError):
                self.store.write_whole(f"{self._folder(scope, day)}/{self.instance}.json",
                                       json.dumps({"tokens": mine}).encode())
        return used + tokens
