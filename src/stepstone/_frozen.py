"""Building frozen slotted dataclasses without a setter call per field.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``: a
call per field, about a third of the instructions of a plain attribute store. The
objects the save path builds on every save (``Checkpoint``, its copies, a save's
``Prepared`` plan) are built here instead on a *twin*: a class with the same slots and
no frozen ``__setattr__``, whose plain attribute stores Python specialises to one slot
write each; the finished object then becomes the frozen class (``__class__``
assignment, allowed because the layouts are identical). The frozen class stays frozen:
only these generated functions write its slots, and they hand out finished objects only.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

__all__ = ["Twin"]


class _Factory:
    """The default of a field with a default factory (shown as in ``dataclasses``)."""

    def __repr__(self) -> str:
        return "<factory>"


class Twin:
    """The twin of one frozen slotted dataclass ``cls``, and the builders made from it."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.fields = tuple(f.name for f in fields(cls))
        slots: tuple[str, ...] = cls.__slots__  # type: ignore[attr-defined]
        self.twin: Any = type(f"_{cls.__name__}Twin", (), {"__slots__": slots})
        self.works = self._works(slots)

    def _works(self, slots: tuple[str, ...]) -> bool:
        try:
            probe = object.__new__(self.twin)
            probe.__class__ = self.cls
        except TypeError:  # pragma: no cover - an interpreter with stricter layout rules
            return False
        return set(slots) == set(self.fields)

    def compile(
        self, name: str, params: str, values: dict[str, str], namespace: dict[str, Any]
    ) -> Any:
        """Compile ``def name(params)`` building a ``cls`` from ``values`` (field -> expr)."""
        namespace.update(_new=object.__new__, _C=self.cls, _T=self.twin)
        if self.works:
            body = "".join(f"    new.{field} = {values[field]}\n" for field in self.fields)
            body += "    new.__class__ = _C\n"
            start = "    new = _new(_T)\n"
        else:  # pragma: no cover - as above
            for field in self.fields:
                namespace[f"_set_{field}"] = self.cls.__dict__[field].__set__
            body = "".join(f"    _set_{field}(new, {values[field]})\n" for field in self.fields)
            start = "    new = _new(_C)\n"
        exec(f"def {name}({params}):\n{start}{body}    return new\n", namespace)
        return namespace[name]

    def init(self) -> Any:
        """Build ``cls.__init__``: the dataclass one, minus ``object.__setattr__``.

        Same parameters, order, defaults and default factories as the generated one; the
        object is a twin while its fields are set. A subclass's instance is set through
        the slots' setters, as the dataclass would.
        """
        cls = self.cls
        namespace: dict[str, Any] = {"_F": _Factory(), "_C": cls, "_T": self.twin}
        namespace["_set_class"] = object.__setattr__
        params = []
        fast = ['    _set_class(self, "__class__", _T)\n']
        slow = []
        for f in fields(cls):
            namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
            value = f.name
            if f.default is not MISSING:
                namespace[f"_d_{f.name}"] = f.default
                params.append(f"{f.name}=_d_{f.name}")
            elif f.default_factory is not MISSING:
                namespace[f"_f_{f.name}"] = f.default_factory
                params.append(f"{f.name}=_F")
                value = f"_f_{f.name}() if {f.name} is _F else {f.name}"
            else:
                params.append(f.name)
            fast.append(f"        self.{f.name} = {value}\n")
            slow.append(f"        _set_{f.name}(self, {value})\n")
        fast.append("        self.__class__ = _C\n")
        source = (
            f"def __init__(self, {', '.join(params)}):\n"
            + ("    if type(self) is _C:\n" if self.works else "    if False:\n")
            + "".join("    " + line for line in fast[:1])
            + "".join(fast[1:])
            + "    else:\n"
            + "".join(slow)
        )
        exec(source, namespace)
        init = namespace["__init__"]
        init.__qualname__ = f"{cls.__qualname__}.__init__"
        init.__doc__ = cls.__dict__["__init__"].__doc__
        return init
