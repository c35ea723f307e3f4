"""``stepstone runs upgrade``: move one run onto a newer version of its workflow."""

from __future__ import annotations

import argparse
from typing import Any

from ._commands import Commands
from ._common import EXIT_OK, OperationalError, UsageError, existing, store_config
from ._output import PROG, emit_json, out, safe
from ._worker import add_workflow_version, add_workflows, load_workflows

__all__ = ["add_upgrade_parser"]


def add_upgrade_parser(actions: Commands) -> None:
    """Add ``upgrade`` to the ``runs`` actions (``stepstone.upgrade`` on one run)."""
    upgrade = actions.run("upgrade", _upgrade)
    add_workflows(upgrade, "where the new version is defined, as for `stepstone worker`")
    add_workflow_version(
        upgrade, "the version to move it to, when more than one in MODULE:ATTR upgrades it"
    )


def _target(workflows: list[Any], name: str | None, version: str | None, args: Any) -> Any:
    """Return the workflow that upgrades runs of ``name`` ``version``, as asked."""
    named = [w for w in workflows if w.name == name]
    if args.workflow_version is not None:
        named = [w for w in named if w.version == args.workflow_version]
    ups = [w for w in named if w.version != version and version in w.upgrades]
    if not ups:
        same = [w for w in named if w.version == version]
        if same:
            return same[0]  # the run is of that version already: nothing to do
        declared = sorted(
            f"{w.version!r} (from {', '.join(repr(v) for v in w.upgrades) or 'no version'})"
            for w in named
        )
        has = f"; it has {', '.join(declared)}" if declared else ""
        raise UsageError(
            f"--workflows {args.workflows!r} has no workflow {name!r} that upgrades version "
            f"{version!r}{has}: declare one with Workflow(..., upgrades={{{version!r}: fn}})"
        )
    if len(ups) > 1:
        shown = ", ".join(sorted(repr(w.version) for w in ups))
        raise UsageError(
            f"--workflows {args.workflows!r} upgrades version {version!r} to {shown}: say "
            "which with --workflow-version"
        )
    return ups[0]


def _upgrade(args: argparse.Namespace) -> int:
    """move a run onto a newer version of its workflow (as stepstone.upgrade)

    Move run RUN_ID onto the workflow among MODULE:ATTR that declares an upgrade from the
    run's version (Workflow(..., upgrades={OLD: fn})), at its step boundary, its state
    replaced by fn(state). Refused, with nothing written, when the run is held by a worker,
    when the steps it completed are not the first steps of the new version, or when fn
    raises. Workers serving the new version do this by themselves for the runs they claim.
    """
    from .. import _upgrade as runtime  # noqa: PLC0415 - the runtime, only when used

    workflows = load_workflows(args.workflows)
    with existing(store_config(args)) as store:
        cp = store.load(args.run_id)  # a bad run id fails here: InvalidRunId, exit 2
        if cp is None:
            raise OperationalError(f"no run {args.run_id!r} in the store; see `{PROG} runs list`")
        target = _target(workflows, cp.workflow, cp.workflow_version, args)
        saved = runtime.upgrade(store, args.run_id, target)
    moved = saved.version != cp.version
    if args.json:
        emit_json(
            {
                "run_id": args.run_id,
                "workflow": saved.workflow,
                "from_version": cp.workflow_version,
                "version": saved.workflow_version,
                "upgraded": moved,
                "status": saved.status,
                "step": saved.step,
            }
        )
    elif moved:
        out(
            f"upgraded run {safe(repr(args.run_id))} of {safe(repr(saved.workflow))} from "
            f"version {safe(repr(cp.workflow_version))} to {safe(repr(saved.workflow_version))}"
            f" after step {saved.step} (status {saved.status})"
        )
    else:
        out(
            f"run {safe(repr(args.run_id))} is of version {safe(repr(saved.workflow_version))}"
            " already; nothing to do"
        )
    return EXIT_OK
