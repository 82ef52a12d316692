"""Where kbench finds tasks and bundled submissions and where it writes by default.

kbench is meant to run from a checkout (``pip install -e .``): tasks/ and reports/ sit beside
the package. Outside a checkout, the current directory takes their place.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
_CHECKOUT = PACKAGE_DIR.parent


def project_root() -> Path:
    """The checkout kbench runs from, or the current directory when installed elsewhere."""
    if (_CHECKOUT / "tasks").is_dir():
        return _CHECKOUT
    return Path.cwd()


def tasks_dir() -> Path:
    return Path(os.environ.get("KBENCH_TASKS_DIR") or project_root() / "tasks")


def submissions_dir() -> Path:
    return PACKAGE_DIR / "submissions"


def default_reports_dir() -> Path:
    return project_root() / "reports"


def default_cache_dir() -> Path:
    """Extension builds, content-addressed; safe to delete at any time."""
    if os.environ.get("KBENCH_CACHE_DIR"):
        return Path(os.environ["KBENCH_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kbench"
