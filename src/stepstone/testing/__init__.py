"""The Store contract as tests, for the built-in backends and for yours.

A backend passes when its subclass of ``StoreContract`` passes::

    from stepstone.testing import StoreContract

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store_config(self, tmp_path):
            return f"mystore://{tmp_path}"  # a fresh, empty store per test

Every test runs in both forms, ``[sync]`` (``store.load``, ``stepstone.run``) and
``[async]`` (``await store.aload``, ``await stepstone.arun``), from one source; the
async-only tests add many runs in one loop, cancellation and a blocked-loop check. What
the suite expects of a backend comes from its class attributes (``durable``,
``kill_points``, ``counts_requests``, ``native_async``; see ``stepstone.Store``).

The suite covers the store methods, the runner on top of the store, concurrent threads,
tasks and processes, and real crashes: child processes that die by ``os._exit`` or
SIGKILL at chosen points, then a fresh process that reopens the store from the config
string. Tests that kill processes carry ``@pytest.mark.crash``: register the marker
(``markers = ["crash: kills real processes"]``) if you run pytest with
``--strict-markers``, and deselect them with ``-m "not crash"``. Requires pytest
(``pip install stepstone[testing]``).

``kill_point(name, action)`` calls ``action`` whenever the runner or a backend reaches a
named point (see ``stepstone._hooks`` and ``Store.kill_points``), for tests of your own
that crash or fail a run at a chosen moment.

``FakeClock`` is time your tests move: ``with FakeClock() as clock:`` installs it as the
clock the runner, the worker, leases, timers and backoff read (``use_clock`` installs any
``Clock``), and ``clock.advance(timedelta(days=2))`` ends a two-day wait in milliseconds.
``run``, ``arun``, ``start`` and ``Worker`` also take ``clock=``: a clock for that call
only, the installed one left as it is.

``StateMeter`` counts the saves planned inside a ``with`` block and the state bytes they
hand the store (document text and pieces), on every built-in backend.
"""

from .._clock import Clock, use_clock
from ._contract import StoreContract, backend_unavailable
from ._fake_clock import FakeClock
from ._ops import Ops
from ._points import KillPoint, kill_point
from ._state_meter import StateMeter

__all__ = [
    "Clock",
    "FakeClock",
    "KillPoint",
    "Ops",
    "StateMeter",
    "StoreContract",
    "backend_unavailable",
    "kill_point",
    "use_clock",
]
