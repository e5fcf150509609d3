"""The what-if sweep's cache on disk: one JSON file per point, named by a hash of everything that decides its
plan (the model's and cluster's content, the request, hyperplan's own source), written atomically; points a
time limit or a failure decided are never kept."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Mapping

from planner.model_source import content_file, kind_of


def cache_dir() -> Path:
    """`$HYPERPLAN_CACHE/whatif`, else `$XDG_CACHE_HOME` (or ~/.cache) `/hyperplan/whatif`."""
    root = os.environ.get("HYPERPLAN_CACHE")
    if root:
        return Path(root) / "whatif"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hyperplan" / "whatif"


def _file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_CODE_DIGEST: list[str] = []


def code_digest() -> str:
    """The hyperplan version and a hash of its source and presets.

    Why both: the version alone would serve stale plans while the planner
    changes between releases; hashing ~100 files takes milliseconds.
    """
    if not _CODE_DIGEST:
        import cost_models
        import models_zoo

        h = hashlib.sha256()
        for pkg in (cost_models, models_zoo, __import__("planner")):
            base = Path(pkg.__file__).parent
            for p in sorted(q for q in base.rglob("*") if q.suffix in (".py", ".toml", ".json") and q.is_file()):
                h.update(f"{pkg.__name__}/{p.relative_to(base).as_posix()}\0".encode())
                h.update(p.read_bytes())
        try:
            ver = version("hyperplan")
        except PackageNotFoundError:
            ver = "unknown"
        _CODE_DIGEST.append(f"{ver}+{h.hexdigest()[:16]}")
    return _CODE_DIGEST[0]


def identity(model: str | os.PathLike, cluster: str) -> tuple[dict[str, str], dict[str, str]]:
    """What names the model and the cluster for the cache: a file by its content (an ONNX file, a config.json), a
    name by itself."""
    from cost_models.loader import PRESET_DIR, preset_names

    text = os.fspath(model)
    held = content_file(text)
    if held is None:
        model_id = {"zoo": text}
    else:
        model_id = {"hf_config_sha256" if kind_of(text) == "hf_config" else "file_sha256": _file_sha256(held)}
    path = PRESET_DIR / f"{cluster}.toml" if cluster in preset_names() else Path(cluster)
    return model_id, {"name": cluster, "sha256": _file_sha256(path)}


def point_key(task: Mapping[str, Any]) -> str:
    """The cache key of one point: a SHA-256 over every input that decides its plan."""
    blob = json.dumps({**task, "code": code_digest()}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def read_point(folder: Path, key: str) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # absent or damaged: compute it again
    return data.get("point") if isinstance(data, dict) and data.get("key") == key else None


def cacheable(rec: Mapping[str, Any]) -> bool:
    """Whether a point's record may be served again: timeouts, failures and plans cut short by --time-limit
    depend on the machine, so they are never cached."""
    return rec["status"] in ("ok", "infeasible") and rec.get("search_complete") is not False


def write_point(folder: Path, key: str, point: Mapping[str, Any]) -> None:
    """Atomic write; a cache that cannot be written only costs time, so errors are ignored."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"key": key, "point": point}, f, sort_keys=True)
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        pass


__all__ = ["cache_dir", "cacheable", "code_digest", "identity", "point_key", "read_point", "write_point"]
