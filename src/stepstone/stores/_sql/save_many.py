"""``save_many`` on a SQL store that saves together: the saves in one transaction.

Each checkpoint's save is the store's own plan (``SQLStore._save``: pieces, the
compare-and-swap, what a lost swap or a retried answer means), driven in lockstep: every
plan runs until it reaches its save statement, those statements are run together (SQLite:
``GroupCommit.submit_many``, one batch, one ``BEGIN IMMEDIATE`` ... ``COMMIT``, one fsync;
PostgreSQL: ``save_pg.save_many``, one pipelined round trip), and each plan then goes on
with its own statement's outcome. So a save in ``save_many`` means exactly what ``save``
means, error for error; only the commit is shared, and an error of the transaction as a
whole fails each of its saves, as it would have failed each one alone.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from .._group import Pending
from .effects import Exec, Result

if TYPE_CHECKING:
    from ..._checkpoint import Checkpoint

__all__ = ["save_together"]

#: One save's plan (``SQLStore._save``).
SavePlan = Generator[Exec, Any, "Checkpoint"]


def save_together(
    plans: list[SavePlan],
    perform: Callable[[Exec], Result],
    submit: Callable[[list[Pending]], None],
) -> list[Checkpoint | Exception]:
    """Drive the save ``plans`` with one commit; each one's outcome (``Store.save_many``).

    ``perform`` runs any other statement (``SQLStore._perform``); ``submit`` runs the
    save statements in one transaction, setting each one's ``stored`` or ``error``.
    """
    outcomes: list[Any] = [None] * len(plans)
    parked: list[tuple[int, Exec]] = []
    try:
        for n in range(len(plans)):
            _advance(perform, plans, outcomes, parked, n, None, None)
        if parked:
            items = [Pending(e.sql, e.params, e.first) for _, e in parked]
            try:
                submit(items)
            except Exception as exc:  # noqa: BLE001 - the whole transaction's: each save's
                for item in items:
                    item.error = exc
            for (n, _), item in zip(parked, items, strict=True):
                if item.error is not None:
                    _advance(perform, plans, outcomes, None, n, None, item.error)
                else:
                    _advance(perform, plans, outcomes, None, n, (item.stored or 0, []), None)
    except BaseException:
        for plan in plans:
            plan.close()
        raise
    return outcomes


def _advance(
    perform: Callable[[Exec], Result],
    plans: list[SavePlan],
    outcomes: list[Any],
    parked: list[tuple[int, Exec]] | None,
    n: int,
    send: Any,
    error: BaseException | None,
) -> None:
    """Run plan ``n`` until it parks its save statement (``parked`` given) or ends.

    As ``step_through``: each statement's result is sent in, its error thrown in. A
    plan that ends sets its outcome: what it returned, or the exception it raised.
    """
    plan = plans[n]
    while True:
        try:
            effect = plan.send(send) if error is None else plan.throw(error)
        except StopIteration as stop:
            outcomes[n] = stop.value
            return
        except Exception as exc:  # noqa: BLE001 - that save's outcome alone
            outcomes[n] = exc
            return
        send = error = None
        if effect.save and parked is not None:
            parked.append((n, effect))
            return
        try:
            send = perform(effect)
        except Exception as exc:  # noqa: BLE001 - thrown back in: the plan decides
            error = exc
