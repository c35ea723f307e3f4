"""Values in a MAF checkpoint as JSON: tagged types that come back as themselves.

A value that is not plain JSON is written ``{TYPE_KEY: "module:qualname", ...}`` and
rebuilt on load as the same type, for three kinds of type only, so stored data can never
pick the code that runs:

* the standard value types MAF's restricted unpickler allows by default (tuple, set,
  frozenset, bytes, bytearray, complex, range, slice, non-finite floats, dicts with
  non-str keys, datetime, date, time, timedelta, timezone, ``ZoneInfo`` zones, UUID,
  Decimal, OrderedDict, Counter, deque, defaultdict of a builtin type), from a fixed
  table;
* Agent Framework's own types (``WorkflowMessage``, ``WorkflowEvent``, chat
  ``Message``s by their ``to_dict``, its dataclasses and enums);
* types the application declares (``allowed_checkpoint_types``, or MAF's
  ``register_checkpoint_type``): dataclasses, enums, NamedTuples and pydantic models,
  field by field.

Anything else is refused at save with its path (``Refused``).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime as dt
import decimal
import enum
import importlib
import json
import math
import uuid
import zoneinfo
from collections.abc import Callable, Iterable
from typing import Any, Final

from agent_framework import WorkflowEvent, WorkflowMessage

from ..._errors import ConfigError

TYPE_KEY: Final = "__stepstone_maf_type__"
_FRAMEWORK_MODULES: Final = ("agent_framework.", "agent_framework_")


class Refused(Exception):
    """A value this encoding cannot store; ``path`` names it, ``reason`` says why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def type_key(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def framework_type(cls: type) -> str | None:
    """Return ``module:qualname`` of a type from Agent Framework's packages, else None."""
    module = cls.__module__
    if module == "agent_framework" or module.startswith(_FRAMEWORK_MODULES):
        return type_key(cls)
    return None


def _registered() -> frozenset[str]:
    # MAF's process-wide register_checkpoint_type() declares a type for its own storages;
    # it declares it for this one too.
    try:
        from agent_framework._workflows import _checkpoint_encoding  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a MAF release that moved it
        return frozenset()
    return frozenset(getattr(_checkpoint_encoding, "_REGISTERED_CHECKPOINT_TYPE_KEYS", ()))


class Types:
    """The application's declared checkpoint types, named ``"module:qualname"`` or given."""

    def __init__(self, declared: Iterable[str | type] = ()) -> None:
        self.keys: set[str] = set()
        self._classes: dict[str, type] = {}
        for entry in declared:
            if isinstance(entry, type):
                self._classes[type_key(entry)] = entry
                self.keys.add(type_key(entry))
            elif isinstance(entry, str) and ":" in entry:
                self.keys.add(entry)
            else:
                raise ConfigError(
                    "allowed_checkpoint_types takes classes or 'module:qualname' strings "
                    f"(e.g. 'my_app.models:Request'), got {entry!r}"
                )

    def declares(self, cls: type) -> bool:
        key = type_key(cls)
        return key in self.keys or key in _registered()

    def resolve(self, key: str) -> type:
        """Return the declared type named ``key``, imported if need be; refuse any other."""
        found = self._classes.get(key)
        if found is not None:
            return found
        if key not in self.keys and key not in _registered():
            raise ValueError(
                f"{key!r} is not an Agent Framework type, nor one declared in "
                "allowed_checkpoint_types; refusing to build it (declare it to load this)"
            )
        module_name, _, qualname = key.partition(":")
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        if not isinstance(obj, type) or type_key(obj) != key:
            raise ValueError(f"{key!r} does not name a class")
        self._classes[key] = obj
        return obj

    def request_types(self, fields: dict[str, Any]) -> dict[str, type]:
        """The declared types among a request_info event's request and response types."""
        dotted = {key.replace(":", ".", 1): key for key in self.keys | _registered()}
        found: dict[str, type] = {}
        for name in (fields.get("request_type"), fields.get("response_type")):
            if isinstance(name, str) and name in dotted:
                found[name] = self.resolve(dotted[name])
        return found


def _canonical(item: Any) -> str:
    # Set members in a fixed order: a retried save must write the same document.
    return json.dumps(item, sort_keys=True, ensure_ascii=False)


def _tz_json(tz: dt.tzinfo | None, path: str) -> Any:
    if tz is None:
        return None
    if isinstance(tz, zoneinfo.ZoneInfo) and tz.key is not None:
        return {"zone": tz.key}
    if isinstance(tz, dt.timezone):
        offset = tz.utcoffset(None)
        return {"offset": offset.total_seconds(), "name": tz.tzname(None)}
    raise Refused(
        path,
        f"its tzinfo is a {type(tz).__name__}; only datetime.timezone and zoneinfo.ZoneInfo "
        "can be stored as JSON",
    )


def _tz(value: Any) -> dt.tzinfo | None:
    if value is None:
        return None
    if "zone" in value:
        return zoneinfo.ZoneInfo(value["zone"])
    return dt.timezone(dt.timedelta(seconds=value["offset"]), value["name"])


#: The default factories a stored defaultdict may name: builtin types, never code.
_FACTORIES: Final[dict[str, type]] = {
    t.__name__: t for t in (list, dict, set, frozenset, tuple, int, float, str, bytes, bool)
}


def _mapping_json(value: Any, path: str, types: Types) -> dict[str, Any]:
    """A dict (with keys JSON cannot hold) or a dict subclass, as key-value pairs."""
    pairs = [
        [to_json(k, f"{path}[key {k!r}]", types), to_json(v, f"{path}[{k!r}]", types)]
        for k, v in value.items()
    ]
    encoded: dict[str, Any] = {TYPE_KEY: type_key(type(value)), "items": pairs}
    if type(value) is collections.defaultdict:
        factory = value.default_factory
        if factory is not None and factory not in _FACTORIES.values():
            raise Refused(
                path,
                f"a defaultdict whose default_factory is {factory!r}; only None or one of "
                f"{sorted(_FACTORIES)} can be stored as JSON",
            )
        encoded["factory"] = None if factory is None else factory.__name__
    return encoded


def _std_json(value: Any, path: str, types: Types) -> Any:
    """Encode a standard value type, or return ``NotImplemented``."""
    kind = type(value)
    key = type_key(kind)
    if kind is float:  # only non-finite ones get here
        return {TYPE_KEY: key, "value": repr(value)}
    if kind is tuple or kind is collections.deque:
        items = [to_json(v, f"{path}[{i}]", types) for i, v in enumerate(value)]
        if kind is collections.deque:
            return {TYPE_KEY: key, "value": items, "maxlen": value.maxlen}
        return {TYPE_KEY: key, "value": items}
    if kind in (set, frozenset):
        items = [to_json(v, f"{path}[{i}]", types) for i, v in enumerate(value)]
        return {TYPE_KEY: key, "value": sorted(items, key=_canonical)}
    if kind in (dict, collections.OrderedDict, collections.Counter, collections.defaultdict):
        return _mapping_json(value, path, types)
    if kind in (range, slice):
        return {TYPE_KEY: key, "value": [value.start, value.stop, value.step]}
    if kind in (bytes, bytearray):
        return {TYPE_KEY: key, "value": base64.b64encode(value).decode("ascii")}
    if kind is complex:
        return {TYPE_KEY: key, "value": [repr(value.real), repr(value.imag)]}
    if kind in (dt.datetime, dt.time):
        naive = value.replace(tzinfo=None)
        return {
            TYPE_KEY: key,
            "value": naive.isoformat(),
            "tz": _tz_json(value.tzinfo, path),
            "fold": value.fold,
        }
    if kind is dt.date:
        return {TYPE_KEY: key, "value": value.isoformat()}
    if kind is dt.timedelta:
        return {TYPE_KEY: key, "value": [value.days, value.seconds, value.microseconds]}
    if kind is dt.timezone:
        return {TYPE_KEY: key, "value": _tz_json(value, path)}
    if kind is uuid.UUID or kind is decimal.Decimal:
        return {TYPE_KEY: key, "value": str(value)}
    return NotImplemented


def _dict_from_items(cls: type, value: dict[str, Any], types: Types) -> Any:
    # Through a dict: Counter(pairs) would count the pairs instead of taking them.
    return cls({from_json(k, types): from_json(v, types) for k, v in value["items"]})


def _defaultdict(value: dict[str, Any], types: Types) -> Any:
    name = value["factory"]
    built: collections.defaultdict[Any, Any] = collections.defaultdict(
        None if name is None else _FACTORIES[name]
    )
    built.update(_dict_from_items(dict, value, types))
    return built


_STD: Final[dict[str, Callable[[dict[str, Any], Types], Any]]] = {
    "collections:defaultdict": _defaultdict,
    "builtins:range": lambda v, t: range(*v["value"]),
    "builtins:slice": lambda v, t: slice(*v["value"]),
    "builtins:float": lambda v, t: float(v["value"]),
    "builtins:tuple": lambda v, t: tuple(from_json(i, t) for i in v["value"]),
    "collections:deque": lambda v, t: collections.deque(
        (from_json(i, t) for i in v["value"]), v["maxlen"]
    ),
    "builtins:set": lambda v, t: {from_json(i, t) for i in v["value"]},
    "builtins:frozenset": lambda v, t: frozenset(from_json(i, t) for i in v["value"]),
    "builtins:dict": lambda v, t: _dict_from_items(dict, v, t),
    "collections:OrderedDict": lambda v, t: _dict_from_items(collections.OrderedDict, v, t),
    "collections:Counter": lambda v, t: _dict_from_items(collections.Counter, v, t),
    "builtins:bytes": lambda v, t: base64.b64decode(v["value"], validate=True),
    "builtins:bytearray": lambda v, t: bytearray(base64.b64decode(v["value"], validate=True)),
    "builtins:complex": lambda v, t: complex(float(v["value"][0]), float(v["value"][1])),
    "datetime:datetime": lambda v, t: dt.datetime.fromisoformat(v["value"]).replace(
        tzinfo=_tz(v["tz"]), fold=v["fold"]
    ),
    "datetime:time": lambda v, t: dt.time.fromisoformat(v["value"]).replace(
        tzinfo=_tz(v["tz"]), fold=v["fold"]
    ),
    "datetime:date": lambda v, t: dt.date.fromisoformat(v["value"]),
    "datetime:timedelta": lambda v, t: dt.timedelta(*v["value"]),
    "datetime:timezone": lambda v, t: _tz(v["value"]),
    "uuid:UUID": lambda v, t: uuid.UUID(v["value"]),
    "decimal:Decimal": lambda v, t: decimal.Decimal(v["value"]),
}


def message_json(message: WorkflowMessage, path: str, types: Types) -> dict[str, Any]:
    """A ``WorkflowMessage`` field by field (the layout stored since the first release)."""
    fields = message.to_dict()
    encoded = {
        name: to_json(value, f"{path}[{name!r}]", types)
        for name, value in fields.items()
        if name != "original_request_info_event"
    }
    encoded["original_request_info_event"] = item_json(
        fields["original_request_info_event"], f"{path}['original_request_info_event']", types
    )
    return encoded


def event_json(event: WorkflowEvent[Any], path: str, types: Types) -> dict[str, Any]:
    """A request_info event as MAF's own ``to_dict`` writes it (its types by name)."""
    fields = event.to_dict()
    fields["data"] = to_json(fields["data"], f"{path}['data']", types)
    return fields


def is_request(value: object) -> bool:
    return isinstance(value, WorkflowEvent) and value.type == "request_info"


def item_json(value: Any, path: str, types: Types) -> Any:
    """A pending request (or a message's original request) in the layout MAF's ``to_dict``
    gives, anything else (None stays None) under ``{TYPE_KEY: "stepstone:value"}``."""
    if value is None:
        return None
    if is_request(value):
        return event_json(value, path, types)
    return {TYPE_KEY: VALUE_TAG, "value": to_json(value, path, types)}


#: Tags a value that sits where MAF usually puts one of its own types (a message, a
#: pending request) but is not one: stored as any value, and loaded back as itself.
VALUE_TAG: Final = "stepstone:value"


def _event_attrs(event: WorkflowEvent[Any], path: str, types: Types) -> dict[str, Any]:
    # Any other event (MAF's to_dict takes only request_info ones): its attributes, all
    # of them, as MAF's pickle would keep them.
    return {k: to_json(v, f"{path}.{k}", types) for k, v in vars(event).items()}


def to_json(value: Any, path: str, types: Types) -> Any:
    """Return ``value`` as JSON values, tagged where it is not plain JSON.

    Raises:
        Refused: a value of a type that is neither JSON, a standard value type, one of
            Agent Framework's, nor declared.
    """
    kind = type(value)
    if value is None or kind in (str, int, bool):
        return value
    if kind is float:
        return value if math.isfinite(value) else _std_json(value, path, types)
    if kind is dict and all(type(k) is str for k in value) and TYPE_KEY not in value:
        return {k: to_json(v, f"{path}[{k!r}]", types) for k, v in value.items()}
    if kind is list:
        return [to_json(v, f"{path}[{i}]", types) for i, v in enumerate(value)]
    # Before the str/int test: a str enum must come back as itself.
    if isinstance(value, enum.Enum) and (framework_type(kind) is not None or types.declares(kind)):
        return {TYPE_KEY: type_key(kind), "value": to_json(value.value, f"{path}.value", types)}
    std = _std_json(value, path, types)
    if std is not NotImplemented:
        return std
    if isinstance(value, WorkflowMessage):
        return {TYPE_KEY: type_key(kind), "message": message_json(value, path, types)}
    if isinstance(value, WorkflowEvent):
        if is_request(value):
            return {TYPE_KEY: type_key(kind), "event": event_json(value, path, types)}
        return {TYPE_KEY: type_key(kind), "attrs": _event_attrs(value, path, types)}
    framework = framework_type(kind) is not None
    if framework and callable(getattr(value, "to_dict", None)) and hasattr(kind, "from_dict"):
        # MAF's SerializationMixin: the type's own JSON form (it leaves out raw provider
        # payloads, ``raw_representation``, which pickling would have kept).
        return {TYPE_KEY: type_key(kind), "value": to_json(value.to_dict(), path, types)}
    if framework or types.declares(kind):
        return _declared_json(value, path, types)
    if isinstance(value, (str, int, float)):
        return value  # a subclass of a JSON type (an undeclared str enum): its plain value
    raise Refused(
        path,
        f"a {kind.__name__} is not JSON; declare its type to store it as JSON: "
        f"StepstoneCheckpointStorage(..., allowed_checkpoint_types=[{type_key(kind)!r}]) "
        "(a dataclass, enum, NamedTuple or pydantic model), or register it with MAF's "
        "register_checkpoint_type",
    )


def _declared_json(value: Any, path: str, types: Types) -> dict[str, Any]:
    kind = type(value)
    key = type_key(kind)
    if dataclasses.is_dataclass(value):
        fields = {
            f.name: to_json(getattr(value, f.name), f"{path}.{f.name}", types)
            for f in dataclasses.fields(value)
            if f.init
        }
        return {TYPE_KEY: key, "fields": fields}
    if isinstance(value, tuple) and hasattr(kind, "_fields"):
        items = [to_json(v, f"{path}.{n}", types) for n, v in zip(kind._fields, value, strict=True)]
        return {TYPE_KEY: key, "tuple": items}
    model_fields = getattr(kind, "model_fields", None)
    if isinstance(model_fields, dict) and hasattr(kind, "model_construct"):
        fields = {n: to_json(getattr(value, n), f"{path}.{n}", types) for n in model_fields}
        return {TYPE_KEY: key, "model": fields}
    raise Refused(
        path,
        f"{key} is not a dataclass, enum, NamedTuple or pydantic model, which is what "
        "stepstone can store as JSON; use StepstoneCheckpointStorage(..., encoding='maf')",
    )


def framework_class(key: str) -> type | None:
    """Return the Agent Framework type named ``key``; None if ``key`` is not one of its."""
    module_name, _, qualname = key.partition(":")
    if not (module_name == "agent_framework" or module_name.startswith(_FRAMEWORK_MODULES)):
        return None
    found: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not isinstance(found, type) or framework_type(found) != key:
        raise ValueError(f"{key!r} does not name an Agent Framework type")
    return found


def from_json(value: Any, types: Types) -> Any:
    """Rebuild what ``to_json`` wrote."""
    if isinstance(value, list):
        return [from_json(v, types) for v in value]
    if not isinstance(value, dict):
        return value
    if TYPE_KEY not in value:
        return {k: from_json(v, types) for k, v in value.items()}
    key = value[TYPE_KEY]
    if not isinstance(key, str) or ":" not in key:
        raise ValueError(f"{TYPE_KEY} is {key!r}, not 'module:qualname'")
    std = _STD.get(key)
    if std is not None:
        return std(value, types)
    if key == VALUE_TAG:
        return from_json(value["value"], types)
    cls = framework_class(key) or types.resolve(key)
    if "message" in value:
        return message(value["message"], types)
    if "event" in value:
        return event(value["event"], types)
    if "attrs" in value:
        built = object.__new__(WorkflowEvent)
        vars(built).update({k: from_json(v, types) for k, v in value["attrs"].items()})
        return built
    if "fields" in value:
        return cls(**{k: from_json(v, types) for k, v in value["fields"].items()})
    if "tuple" in value:
        return cls(*(from_json(v, types) for v in value["tuple"]))
    if "model" in value:
        fields = {k: from_json(v, types) for k, v in value["model"].items()}
        return cls.model_construct(**fields)  # type: ignore[attr-defined]
    if issubclass(cls, enum.Enum):
        return cls(from_json(value["value"], types))
    return cls.from_dict(from_json(value["value"], types))  # type: ignore[attr-defined]


def message(fields: dict[str, Any], types: Types) -> WorkflowMessage:
    decoded = {
        k: from_json(v, types) for k, v in fields.items() if k != "original_request_info_event"
    }
    built = WorkflowMessage.from_dict(decoded)
    built.original_request_info_event = item(fields.get("original_request_info_event"), types)
    return built


def event(fields: dict[str, Any], types: Types) -> WorkflowEvent[Any]:
    # from_dict resolves the request and response types among the declared ones, then
    # among the modules already imported; it never imports one named by stored data.
    return WorkflowEvent.from_dict(
        {**fields, "data": from_json(fields.get("data"), types)},
        allowed_types=types.request_types(fields),
    )


def item(value: Any, types: Types) -> Any:
    """Rebuild what ``item_json`` wrote."""
    if not isinstance(value, dict):
        return value
    if value.get(TYPE_KEY) == VALUE_TAG:
        return from_json(value["value"], types)
    return event(value, types)
