"""The persistent frame cache: cache entries saved under KILN_CACHE_DIR and reused by later processes.

After a capture the entry hands its result to `store`; on a cache miss in a later process,
`candidates` lists the entries stored for the same code object, and the first whose guards pass on
the actual frame is rebuilt by `materialize` without tracing. Corresponds to torch's FXGraphCache
and AOTAutogradCache, one level up (the whole frame, as torch's precompile does). What an entry is
keyed by, what it holds and what is admitted to it: docs/frame-cache.md.

The package, in the order its modules import each other:
  - digest: hashes of code, functions and classes, the environment, an entry's key (`frame_key`);
  - names: functions, classes, modules and singletons stored by name and found again by name;
  - portable: which guards another process can check, and in what form;
  - grammar: what stored guard sources and glue text may contain (an allowlist);
  - frames: the stored records, their checks, `store`, `candidates`, `materialize`.

Switch: `kiln.config.persistent_cache` (env KILN_PERSISTENT_CACHE=0 turns it off); under
KILN_DEBUG entries are stored but not loaded, so that the debug dump sees real captures. Log:
KILN_LOGS=cache prints frame-cache stores, hits and skipped entries; kiln.stats()["disk_hits"]
counts entries served from disk.
"""
from __future__ import annotations

from kiln.capture.guards import TensorSpec
from kiln.capture.persist.digest import (FORMAT, NotPortable, Stale, _config_text, _member_digest, class_digest,
                                         code_digest, environment_digest, frame_key, function_digest)
from kiln.capture.persist.frames import (DiskEntry, LoadedResult, StoredFrame, StoredResume, _built_class,
                                         _content_name, _glue_constant, _module_forward, _read, _split_name,
                                         _stored_attributes, candidates, check_texts, discriminator, dumps, loads,
                                         materialize, store, without_collections)
from kiln.capture.persist.names import _decode_local_code, _decode_named, _encode_local_code
from kiln.capture.persist.portable import _portable_guard, _portable_guards

# The private names are re-exported for the tests that check each step of a store and a load.
__all__ = ["FORMAT", "DiskEntry", "LoadedResult", "NotPortable", "Stale", "StoredFrame", "StoredResume", "TensorSpec",
           "_built_class", "_config_text", "_content_name", "_decode_local_code", "_decode_named",
           "_encode_local_code", "_glue_constant", "_member_digest", "_module_forward", "_portable_guard",
           "_portable_guards", "_read", "_split_name", "_stored_attributes", "candidates", "check_texts",
           "class_digest", "code_digest", "discriminator", "dumps", "environment_digest", "frame_key",
           "function_digest", "loads", "materialize", "store", "without_collections"]
