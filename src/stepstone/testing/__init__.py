"""The Store contract as tests, for the built-in backends and for yours.

A backend passes when its subclass of ``StoreContract`` passes::

    from stepstone.testing import StoreContract

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store_config(self, tmp_path):
            return f"mystore://{tmp_path}"  # a fresh, empty store per test

The suite covers the store methods, the runner on top of the store, concurrent threads
and processes, and real crashes: child processes that die by ``os._exit`` or SIGKILL
at chosen points, then a fresh process that reopens the store from the config string.
Requires pytest.
"""

from ._contract import StoreContract, backend_unavailable

__all__ = ["StoreContract", "backend_unavailable"]
