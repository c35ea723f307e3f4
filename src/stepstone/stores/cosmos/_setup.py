"""Container set-up: the definition, creating it, checking it, and its indexes.

Each step that talks to the service is a generator of effects (``_effects``), so the
sync store and the async one open a container by the same rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from azure.cosmos import PartitionKey
from azure.cosmos.exceptions import CosmosHttpResponseError, CosmosResourceNotFoundError

from ..._errors import StoreError
from ..._store import Diagnosis
from ._config import Settings
from ._effects import Send, Steps

__all__ = [
    "CONTAINER_DEFINITION",
    "check_partition_key",
    "container_args",
    "create_resources",
    "index_diagnosis",
    "listing_indexed",
    "pieces_indexed",
    "read_container",
    "upgrade_indexing",
]

#: The container every CosmosStore expects; ``backends/cosmos/container.json`` and
#: ``main.bicep`` hold the same definition (tests keep both equal to this).
#:
#: - partition key ``/id``: one logical partition per run, so a load is a point read and
#:   a save touches one partition; runs spread evenly over physical partitions.
#: - a long state is kept in *piece* items (``^...`` ids, ``piece_of`` = the run's item
#:   id), each in its own partition too, under the 2 MB limit; the run's item names them.
#: - indexing: ``/*`` and ``/state/*`` excluded: states are large and never queried, and
#:   every indexed path costs RUs on every write. Only the fields ``stepstone runs`` /
#:   ``prune`` / ``claimable`` filter on are indexed.
#: - composite index (status, due_at): serves ``claimable``'s queries (an equality on
#:   ``status``, a range and the order on ``due_at``), so finding work reads only the
#:   active runs' index entries, however many finished runs the container holds.
#: - composite indexes (status, updated_at desc, run_id desc) and (updated_at desc, run_id
#:   desc): serve ``list_page``'s ORDER BY, so a dashboard page reads one page of entries.
#: - ``defaultTtl: -1``: TTL enabled but items never expire unless they carry a ``ttl``
#:   (``expire()`` or the ``ttl=`` option), which is how Cosmos does retention natively.
CONTAINER_DEFINITION: Final[dict[str, Any]] = {
    "partitionKey": {"paths": ["/id"], "kind": "Hash", "version": 2},
    "indexingPolicy": {
        "indexingMode": "consistent",
        "automatic": True,
        "includedPaths": [
            {"path": "/run_id/?"},
            {"path": "/stepstone/?"},
            {"path": "/step/?"},
            {"path": "/total_steps/?"},
            {"path": "/failure/?"},
            {"path": "/created_at/?"},
            {"path": "/updated_at/?"},
            {"path": "/status/?"},
            {"path": "/due_at/?"},
            {"path": "/owner/?"},
            # A long run's state is kept in piece items (``_statelog``) beside its item:
            # a load and a collection find them by run and generation.
            {"path": "/piece_of/?"},
            {"path": "/gen/?"},
        ],
        "excludedPaths": [{"path": "/state/*"}, {"path": "/*"}],
        "compositeIndexes": [
            [
                {"path": "/status", "order": "ascending"},
                {"path": "/due_at", "order": "ascending"},
            ],
            # The dashboard's listing (``list_page``): newest first, with and without a
            # status filter. Cosmos serves a multi-path ORDER BY only from a composite
            # index in exactly that order (or all reversed).
            [
                {"path": "/status", "order": "ascending"},
                {"path": "/updated_at", "order": "descending"},
                {"path": "/run_id", "order": "descending"},
            ],
            [
                {"path": "/updated_at", "order": "descending"},
                {"path": "/run_id", "order": "descending"},
            ],
        ],
    },
    "defaultTtl": -1,
}

#: ``list_page``'s composite indexes (the last two of ``CONTAINER_DEFINITION``).
_LISTING_INDEXES: Final = CONTAINER_DEFINITION["indexingPolicy"]["compositeIndexes"][1:]
_PROVISION: Final = (
    "create it with `stepstone init` or by adding create=true to the config string "
    "(dev/emulators), or provision backends/cosmos/main.bicep"
)


def container_args() -> dict[str, Any]:
    """``create_container``'s keyword arguments for ``CONTAINER_DEFINITION``."""
    definition = CONTAINER_DEFINITION
    return {
        "partition_key": PartitionKey(
            path=definition["partitionKey"]["paths"][0],
            kind=definition["partitionKey"]["kind"],
            version=definition["partitionKey"]["version"],
        ),
        "indexing_policy": definition["indexingPolicy"],
        "default_ttl": definition["defaultTtl"],
    }


def _created(settings: Settings, what: str, created: bool) -> str:
    name = settings.database if what == "database" else settings.container
    if not created:
        return f"{what} {name!r}: already exists"
    if what == "database":
        return f"database {name!r}: created"
    return (
        f"container {name!r}: created (partition key /id, state not indexed, "
        "claim index on (status, due_at), TTL enabled)"
    )


def create_resources(settings: Settings, client: Any) -> Steps[list[str]]:
    """Create the database and the container where missing; say what was done."""
    try:
        database = yield Send(client, "create_database", (settings.database,))
        lines = [_created(settings, "database", True)]
    except CosmosHttpResponseError as exc:
        if exc.status_code != 409:
            raise
        database = client.get_database_client(settings.database)
        lines = [_created(settings, "database", False)]
    try:
        yield Send(database, "create_container", (settings.container,), container_args())
        lines.append(_created(settings, "container", True))
    except CosmosHttpResponseError as exc:
        if exc.status_code != 409:
            raise
        lines.append(_created(settings, "container", False))
    return lines


def read_container(settings: Settings, container: Any, database: Any) -> Steps[Any]:
    """Read the container's properties; a missing database or container says which."""
    try:
        return (yield Send(container, "read"))
    except CosmosResourceNotFoundError as exc:
        try:
            yield Send(database, "read")
        except CosmosResourceNotFoundError:
            raise StoreError(
                f"Cosmos DB database {settings.database!r} does not exist in "
                f"{settings.endpoint}; create it (and the container) with `stepstone init` "
                "or by adding create=true to the config string (dev/emulators), or "
                "provision backends/cosmos/main.bicep"
            ) from exc
        raise StoreError(
            f"Cosmos DB container {settings.container!r} does not exist in database "
            f"{settings.database!r} at {settings.endpoint}; {_PROVISION}"
        ) from exc


def _paths(properties: Any) -> Any:
    """The partition key paths of a container's properties, None if they have none."""
    if not isinstance(properties, Mapping):
        return None
    key = properties.get("partitionKey")
    return key.get("paths") if isinstance(key, Mapping) else None


def check_partition_key(settings: Settings, properties: Any) -> None:
    """Refuse a container not partitioned by ``/id`` (one logical partition per run)."""
    paths = _paths(properties)
    if paths != ["/id"]:
        raise StoreError(
            f"Cosmos DB container {settings.container!r} is partitioned by {paths!r}, "
            "but stepstone needs ['/id'] (one logical partition per run); create a new "
            "container with backends/cosmos/container.json"
        )


def _norm(index: Any) -> list[tuple[Any, Any]]:
    return [(p.get("path"), (p.get("order") or "ascending").lower()) for p in index]


def index_diagnosis(policy: Mapping[str, Any]) -> Diagnosis:
    """Whether the container has the (status, due_at) index ``claimable`` relies on."""
    want = CONTAINER_DEFINITION["indexingPolicy"]["compositeIndexes"][0]
    have = [_norm(index) for index in policy.get("compositeIndexes") or []]
    ok = _norm(want) in have
    return Diagnosis(
        "claim index (status, due_at)",
        ok,
        "ok"
        if ok
        else "the container lacks the composite index on (status, due_at) and the "
        "/status/? and /due_at/? paths that finding work needs; update its indexing "
        "policy to backends/cosmos/container.json (az cosmosdb sql container update)",
    )


def listing_indexed(policy: Mapping[str, Any]) -> bool:
    """Whether the container has the composite indexes ``list_page`` orders by."""
    have = [_norm(index) for index in policy.get("compositeIndexes") or []]
    return all(_norm(want) in have for want in _LISTING_INDEXES)


_PIECE_PATHS: Final = ("/piece_of/?", "/gen/?")


def pieces_indexed(policy: Mapping[str, Any]) -> bool:
    """Whether the container indexes the paths a long state's pieces are found by."""
    have = {p.get("path") for p in policy.get("includedPaths") or [] if isinstance(p, Mapping)}
    return "/*" in have or all(path in have for path in _PIECE_PATHS)


def upgrade_indexing(settings: Settings, client: Any) -> Steps[list[str]]:
    """Give a container made by an older stepstone the claim and listing indexes.

    Its TTL is kept. Adding index paths is an online operation in Cosmos DB (the index
    is rebuilt in the background; queries keep working meanwhile), so ``init`` does it
    in place.
    """
    database = client.get_database_client(settings.database)
    properties = yield Send(database.get_container_client(settings.container), "read")
    policy = properties.get("indexingPolicy") or {}
    missing = [
        what
        for what, ok in (
            ("claim index on (status, due_at)", index_diagnosis(policy).ok),
            ("listing indexes on (status, updated_at, run_id)", listing_indexed(policy)),
            ("piece paths /piece_of and /gen", pieces_indexed(policy)),
        )
        if not ok
    ]
    if not missing:
        return []
    args = container_args()
    yield Send(
        database,
        "replace_container",
        (settings.container,),
        {
            "partition_key": args["partition_key"],
            "indexing_policy": args["indexing_policy"],
            "default_ttl": properties.get("defaultTtl"),
        },
    )
    return [
        f"container {settings.container!r}: indexing policy updated ({' and '.join(missing)} added)"
    ]
