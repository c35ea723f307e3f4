"""Ownership of a run: who may write it, and how a lease is taken, kept and given back.

A run being executed has an owner, a lease length and a fencing epoch, all stored in the
same compare-and-swap record as its checkpoint. There is no second record and no other
coordinator: the store's compare-and-swap on the version is the only primitive.

- **Claim.** A run is claimed by a compare-and-swap save that sets ``owner``, bumps
  ``epoch`` and records ``lease`` (seconds). Two claimants racing on one version: one
  wins, the other gets ``ConflictError``.
- **Renewal.** While a step runs longer than a third of the lease, the owner re-saves
  the record (a new version, ``renewed_at`` set). Any write changes the version.
- **Expiry** is judged by the claimant's own monotonic clock: a run whose owner wrote
  nothing for a whole lease (the lease its owner recorded) while the claimant was
  watching is expired. Only the owner's own writes count (``owner_mark``): a signal or
  cancel request also makes a new version, but keeps a dead owner's run alive no
  longer. No two hosts' wall clocks are ever compared, so clock skew can delay nothing
  and expire nothing early. ``renewed_at`` is compared for equality only.
- **Fencing.** Every write by an owner is a compare-and-swap on the version it last
  wrote; after a takeover that version is gone, so a frozen owner that wakes up cannot
  write. When its save conflicts it reloads: a new epoch or owner means ``LeaseLost``.
- **Writes by others.** ``signal`` and ``cancel`` may change a run someone owns; they
  touch only ``signals`` and ``cancel_requested``. An owner whose save conflicted on
  such a write rebases its save on the stored record (``rebase``) and tries again; any
  other change (state, step, failure) is a real conflict.
- **Release.** The owner's last write (done, failed, waiting, cancelled, or stopping)
  clears ``owner``, so another worker can take the run at once.
"""

from __future__ import annotations

import functools
import json
import os
from datetime import timedelta

from ._bounds import DEFAULT_LEASE, MAX_LEASE, MIN_LEASE
from ._checkpoint import Checkpoint, evolve, utcnow
from ._errors import ConflictError, InvalidWorkflow, LeaseLost

__all__ = [
    "DEFAULT_LEASE",
    "MAX_LEASE",
    "MIN_LEASE",
    "check_lease",
    "as_stored",
    "claimed",
    "dead_here",
    "new_owner",
    "owner_mark",
    "rebase",
    "released",
    "renewal",
]


def check_lease(lease: object) -> float:
    """Return ``lease`` (a number of seconds or a ``timedelta``) as seconds, or raise."""
    if isinstance(lease, timedelta):
        seconds = lease.total_seconds()
    elif isinstance(lease, (int, float)) and not isinstance(lease, bool):
        seconds = float(lease)
    else:
        raise InvalidWorkflow(
            f"lease must be a number of seconds or a timedelta, got {type(lease).__name__}"
        )
    if not MIN_LEASE <= seconds <= MAX_LEASE:
        raise InvalidWorkflow(
            f"lease must be between {MIN_LEASE} and {MAX_LEASE:.0f} seconds, got {seconds!r}"
        )
    return seconds


@functools.cache
def _machine() -> str:
    """Return an id of this kernel boot and PID namespace: where a PID means one process.

    Two owners with the same id see the same process table, so a PID that does not
    exist there is a process that is gone. Empty when the kernel does not tell.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    import hashlib  # noqa: PLC0415 - once per process; keeps `import stepstone` light

    return hashlib.sha256(f"{boot}:{namespace}".encode()).hexdigest()[:12]


def _started(pid: int) -> int | None:
    """Return when process ``pid`` started (clock ticks since boot), or None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # Field 22; the name (field 2) may hold spaces and parentheses, so count from
        # after its closing parenthesis, where field 3 begins.
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@functools.cache
def _own_start() -> str:
    """``.START`` of this process for ``new_owner``, or empty when the kernel does not tell."""
    started = _started(os.getpid())
    return "" if started is None else f".{started}"


def new_owner(kind: str = "run") -> str:
    """Return a fresh owner name: readable for operators, unique across hosts and restarts.

    ``KIND:HOST:PID:MACHINE[.START]:RANDOM``; MACHINE lets ``dead_here`` recognise an
    owner that ran on this very boot and PID namespace, and START (when the process
    started) one whose PID another process took since. Owners written before START
    existed have none.
    """
    host = (os.uname().nodename[:64] or "host").replace(":", "_")
    machine = _machine()
    mark = f"{machine}{_own_start()}" if machine else "-"
    return f"{kind}:{host}:{os.getpid()}:{mark}:{os.urandom(4).hex()}"


def dead_here(owner: str | None) -> bool:
    """Return whether ``owner`` was a process on this machine that no longer exists.

    Only a certainty counts: the owner's MACHINE id must be ours (same boot, same PID
    namespace) and its PID must be absent, or held by a process that started at
    another time than the owner's START (the PID was reused). Another machine, or a
    reused PID of an owner that recorded no START, reads as alive, and the caller then
    waits for the lease as usual. Used by ``run``/``arun`` called directly, so a script
    killed and started again resumes at once, and by workers (``worker._watch.Watch``), so a
    worker killed on this host is taken over at once.
    """
    if owner is None:
        return False
    parts = owner.split(":")
    if len(parts) < 5 or not parts[-3].isdigit():
        return False
    machine = _machine()
    theirs, _, start = parts[-2].partition(".")
    if not machine or theirs != machine:
        return False
    pid = int(parts[-3])
    if pid <= 1:
        return False
    if pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
    # The PID is taken: by the owner, or by a process that got it after the owner died.
    # (A killed owner not yet reaped keeps its start time: alive until reaped.)
    if not start.isdigit():
        return False
    now = _started(pid)
    return now is not None and now != int(start)


def owner_mark(cp: Checkpoint) -> tuple[object, ...]:
    """Return what only ``cp``'s owner writes: it changes with every claim, renewal or save.

    ``signal``, ``cancel`` and a child's nudge change the version too, but touch only
    ``signals``, ``cancel_requested`` and ``wake_at``, which are left out: a claimant
    watching this mark sees a dead owner's run expire however many signals it receives.
    The state is left out too: every save of the owner's moves ``renewed_at`` (``write``).
    """
    return (
        cp.owner,
        cp.epoch,
        cp.lease,
        cp.renewed_at,
        cp.step,
        cp.attempt,
        cp.failure,
        cp.waiting_for,
        cp.children,
        cp.cancelled,
        cp.queued,
        cp.total_steps,
    )


def claimed(cp: Checkpoint, owner: str, lease: float) -> Checkpoint:
    """Return ``cp`` as a claim by ``owner``: saved by compare-and-swap on ``cp.version``."""
    return evolve(
        cp,
        owner=owner,
        epoch=cp.epoch + 1,
        lease=lease,
        renewed_at=utcnow(),
        queued=False,
    )


def as_stored(cp: Checkpoint) -> Checkpoint:
    """Return ``cp`` with the state exactly as it was stored, not as a step has it now.

    The runner hands a saved record's state to the next step as its working copy, so a
    step running now may be changing it in place. A record written *during* a step (a
    renewal) or in place of one (a release after an interruption) must carry the state
    of the last checkpoint, never the step's half-done changes.
    """
    if cp.state_json is None:
        return cp
    return evolve(cp, state=json.loads(cp.state_json))


def renewal(cp: Checkpoint) -> Checkpoint:
    """Return the record that renews ``cp``'s lease (the stored content, a new save)."""
    return evolve(as_stored(cp), renewed_at=utcnow())


def released(cp: Checkpoint) -> Checkpoint:
    """Return ``cp`` with its lease given back (the epoch stays, for fencing)."""
    return evolve(cp, owner=None, lease=None, renewed_at=None)


def _same_progress(a: Checkpoint, b: Checkpoint) -> bool:
    return (
        a.step == b.step
        and a.step_names == b.step_names
        and a.attempt == b.attempt
        and a.failure == b.failure
        and a.consumed == b.consumed
        and a.waiting_for == b.waiting_for
        and a.cancelled == b.cancelled
        # The text, when both sides have it: a loaded state may already be a step's
        # working copy, mutated in place.
        and (a.state_json is None or b.state_json is None or a.state_json == b.state_json)
    )


def rebase(base: Checkpoint, intended: Checkpoint, stored: Checkpoint | None) -> Checkpoint:
    """Return ``intended`` re-based on ``stored``, after a save built on ``base`` conflicted.

    Raises:
        LeaseLost: the run has another owner or epoch now (a takeover), or was deleted.
        ConflictError: someone advanced the run (state, step, failure) without taking it
            over; nothing may be merged.
    """
    run_id = base.run_id
    if stored is None:
        raise LeaseLost(f"run {run_id!r} was deleted while owned by {base.owner!r}", run_id)
    if stored.owner != base.owner or stored.epoch != base.epoch:
        raise LeaseLost(
            f"run {run_id!r}: lease lost: the run is now held by {stored.owner!r} at epoch "
            f"{stored.epoch} (this owner was {base.owner!r} at epoch {base.epoch}); "
            "nothing was written",
            run_id,
        )
    if not _same_progress(base, stored):
        raise ConflictError(
            f"run {run_id!r}: expected version {base.version!r}, stored {stored.version!r}: "
            "another writer advanced the run",
            run_id,
        )
    wake_at = intended.wake_at
    if (
        intended.waiting_for is not None
        and stored.wake_at is not None
        and stored.wake_at != base.wake_at
        and (wake_at is None or stored.wake_at < wake_at)
    ):
        # Someone made the run due sooner while we were saving it as waiting (a child
        # finished, a signal came): keep the earlier time, or the wake-up is lost.
        wake_at = stored.wake_at
    return evolve(
        intended,
        version=stored.version,
        signals=stored.signals,
        cancel_requested=stored.cancel_requested or intended.cancel_requested,
        created_at=stored.created_at,
        wake_at=wake_at,
    )
