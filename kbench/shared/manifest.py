"""The manifest of a build's ``load_inline`` calls: which library each call produced, with its
sha256. A build's worker writes it (kbench.worker.prebuilt), the trusted side ships the
libraries it names to another node (kbench.host.artifacts), and the worker there loads them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

MANIFEST = ".kbench-prebuilt.json"  # in the build folder (TORCH_EXTENSIONS_DIR)


def call_key(arguments: dict[str, Any]) -> str:
    """A call's arguments (as bound to torch's signature) as one hash."""
    return hashlib.sha256(json.dumps(arguments, sort_keys=True, default=repr).encode()
                          ).hexdigest()


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read(manifest: Path) -> dict[str, dict[str, str]]:
    """The calls a manifest records, key: {"file": relative path, "sha256": ...} ({} where
    there is none or it does not parse)."""
    try:
        calls = json.loads(manifest.read_text()).get("calls", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return calls if isinstance(calls, dict) else {}
