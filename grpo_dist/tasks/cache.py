"""Where the embedded tasks' models and data are built: ``$GRPO_DIST_CACHE``, else ``~/.cache/grpo_dist``."""

from __future__ import annotations

import os


def cache_root() -> str:
    return os.path.expanduser(os.environ.get("GRPO_DIST_CACHE", "~/.cache/grpo_dist"))
