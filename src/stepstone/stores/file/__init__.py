"""FileStore: one JSON document per run in a local directory.

On disk
-------
``DIR/<name>.json`` holds the run's checkpoint: the shared stepstone document (see
``_codec.encode_document``) plus a top-level ``"version"`` key holding the version token.
``<name>`` encodes the run_id (``_names``). ``DIR/.tmp-*`` are files being written.
``DIR/.active/<name>`` marks a run that may be queued, running or waiting (the index
``claimable`` reads, ``_index``). ``DIR/.pieces/<name>/<key>`` hold the pieces of a long
state (``_pieces``; schema-3 documents name them). Nothing else is written, and files
this store did not write are never modified or deleted (except by ``delete`` of the
run whose name they carry). ``backends/file/README.md`` has the details.

The package, one concern a module, each importing only those above it:

- ``_config``: the config-string forms, options and their checks;
- ``_names``: run names on disk, and the temp and index names;
- ``_errors``: the table turning ``OSError`` into stepstone's errors, and our messages;
- ``_disk``: atomic writes, fsync, reading a whole document, listing a directory;
- ``_trust``: creating the directory, and refusing one another user could change;
- ``_documents``: opening and parsing a run's document, refusing what is not ours;
- ``_locking``: the descriptors a store holds open, and ``flock`` on a run's document;
- ``_index``: the ``.active/`` index of runs a worker may claim;
- ``_pieces``: the pieces of long states, beside the documents;
- ``_publish``: putting a run's document in place and taking it away, with its marker;
- ``_piece_hooks``: load, save and delete as the pieces protocol's hooks, with the locks;
- ``_listing``: the listings, and the runs a worker may claim;
- ``_store``: ``FileStore``, putting these together.

Guarantees
----------
``durability=full`` (the default) fsyncs the temp file before the rename and the
directory after it (and after ``delete``). A save that returned survives a process crash
and a power cut. ``durability=none`` fsyncs the temp file but never the directory: a
save that returned survives a process crash; a power cut may undo recent renames, so a
run may come back at an earlier checkpoint, or vanish if its first save was recent, but
every document that survives is whole: a power cut never leaves an empty or torn one.
A crash between writing and renaming leaves a ``.tmp-*`` file, removed when a store is
next opened on the directory if it is over an hour old.

If the save raises after the rename (only the directory fsync can), the new checkpoint
may be visible and may or may not survive a power cut; reload to find out.

Meant for local file systems; POSIX only (``fcntl``). On network file systems ``flock``
may not exclude other hosts.
"""

from __future__ import annotations

from ._config import FORMS, Durability, Trust
from ._names import decode_name, encode_name
from ._store import MAX_DOCUMENT_BYTES, FileStore

__all__ = [
    "FORMS",
    "MAX_DOCUMENT_BYTES",
    "Durability",
    "FileStore",
    "Trust",
    "decode_name",
    "encode_name",
]
