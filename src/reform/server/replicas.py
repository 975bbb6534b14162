"""A context's status, and how the processes sharing one store tell each other how their encodes go: each
writes a note per encode under way (``ContextStore.write_note``) and reads the others'. A note carries its
owner (host, pid, process start time, an instance id), so a restarted server knows its predecessor's
notes as dead, and a note nobody updates for ``STALE_NOTE_S`` reads as failed."""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field

from ..store import ContextStore

STALE_NOTE_S = 600      # an encode elsewhere whose note has not changed for this long is taken as dead


@dataclass
class ContextStatus:
    """What ``GET /v1/contexts/{id}`` shows."""

    id: str
    status: str                       # queued | encoding | ready | failed
    tokens: int
    tokens_encoded: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
    encode_seconds: float | None = None
    bytes: int | None = None
    error: str | None = None
    method: str | None = None

    def to_json(self) -> dict:
        # the id a client knows: the store key without its tenant's folder (``tenants.public_id``)
        return {"object": "context", **asdict(self), "id": self.id.rpartition("/")[2]}


def process_started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, Linux); None where unknown or not running."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def owner_gone(owner: dict, me: dict) -> bool:
    """Whether the process that wrote a status note is known to be gone: on this host, a pid that no longer
    runs, or that now belongs to a process started at another time (this very server restarted after a
    crash, say, with the same pid in its container). A note from another host is judged by its age alone
    (``STALE_NOTE_S``)."""
    if owner.get("host") != me["host"] or not isinstance(owner.get("pid"), int):
        return False
    started = process_started(owner["pid"])
    if started is None:
        try:
            os.kill(owner["pid"], 0)
        except ProcessLookupError:
            return True
        except OSError:           # alive, another user's
            return False
        return False
    return owner.get("started") is not None and owner["started"] != started


class Replicas:
    """This process's notes in ``store``, and the other processes' read back."""

    def __init__(self, store: ContextStore):
        self.store = store
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": process_started(os.getpid()),
                      "instance": uuid.uuid4().hex}

    def publish(self, status: ContextStatus) -> None:
        """Tell the other processes sharing the store how this encode goes."""
        self.store.write_note(status.id, {**status.to_json(), "updated": time.time(), "owner": self.owner})

    def elsewhere(self, key: str) -> ContextStatus | None:
        """The status another process sharing the store published for ``key``: None for none (or for this
        process's own note: its status table is the truth), failed for a writer known to be gone or silent
        for ``STALE_NOTE_S``."""
        note = self.store.read_note(key)
        if note is None:
            return None
        owner = note.get("owner") if isinstance(note.get("owner"), dict) else {}
        if owner.get("instance") == self.owner["instance"]:
            return None
        fields = {k: note[k] for k in ContextStatus.__dataclass_fields__ if k in note}
        try:
            status = ContextStatus(**{"id": key, "status": "failed", "tokens": 0, **fields})
        except TypeError:
            return None
        if status.status in ("queued", "encoding"):
            if owner_gone(owner, self.owner):
                status.status, status.error = "failed", (f"the process encoding it (pid {owner['pid']}) stopped "
                                                         "before it finished; upload the text again")
            elif time.time() - float(note.get("updated", 0)) > STALE_NOTE_S:
                status.status, status.error = "failed", "the process encoding it stopped reporting"
        return status
