"""Rendering ``deploy/k8s`` as ``kubectl apply -k`` would, for the manifest tests.

Only the part of kustomize these files use: ``resources`` (manifest files inside the
kustomization's directory, or other kustomization directories) and ``patches`` given as JSON 6902
operations (``add``, ``remove``, ``replace``, ``test``) with a ``target``. Anything else in a
kustomization is refused (:class:`Unsupported`) rather than ignored, so a file that uses a
feature this renderer does not know fails the tests instead of being checked half-rendered.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Final

import yaml  # type: ignore[import-untyped]

__all__ = ["Unsupported", "apply_json6902", "load_all", "render"]

Doc = dict[str, Any]

KUSTOMIZATION_KEYS: Final = frozenset({"apiVersion", "kind", "resources", "patches"})
PATCH_KEYS: Final = frozenset({"path", "target"})
TARGET_KEYS: Final = frozenset({"group", "version", "kind", "name", "namespace"})


class Unsupported(Exception):
    """A kustomization or patch uses something this renderer does not implement."""


def load_all(path: Path) -> list[Doc]:
    """Every YAML document of *path* (empty documents dropped); each must be a mapping."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for doc in docs:
        if not isinstance(doc, dict):
            raise Unsupported(f"{path}: a document is not a mapping")
    return docs


def render(directory: Path) -> list[Doc]:
    """The objects ``kubectl apply -k DIRECTORY`` would send, in resource order."""
    (kustomization,) = load_all(directory / "kustomization.yaml")
    unknown = set(kustomization) - KUSTOMIZATION_KEYS
    if unknown:
        raise Unsupported(f"{directory}: kustomization fields not rendered here: {sorted(unknown)}")
    docs: list[Doc] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            docs.extend(render(path))
        elif path.is_relative_to(directory.resolve()):
            docs.extend(load_all(path))
        else:  # kustomize refuses a file outside the kustomization's root
            raise Unsupported(f"{directory}: resource file {entry} is outside the directory")
    for patch in kustomization.get("patches", []):
        if set(patch) - PATCH_KEYS or "path" not in patch or "target" not in patch:
            raise Unsupported(f"{directory}: only JSON 6902 patches with a path and a target")
        target = patch["target"]
        if set(target) - TARGET_KEYS:
            raise Unsupported(f"{directory}: patch target fields {sorted(target)}")
        hits = [i for i, doc in enumerate(docs) if _matches(doc, target)]
        if len(hits) != 1:
            raise Unsupported(f"{directory}: patch target {target} matches {len(hits)} objects")
        operations = yaml.safe_load((directory / patch["path"]).read_text())
        if not isinstance(operations, list):
            raise Unsupported(f"{directory}: {patch['path']} is not a list of JSON 6902 operations")
        docs[hits[0]] = apply_json6902(docs[hits[0]], operations)
    return docs


def _matches(doc: Doc, target: dict[str, str]) -> bool:
    group, version = target.get("group", ""), target.get("version")
    api_version = f"{group}/{version}" if group else version
    return (
        (version is None or doc.get("apiVersion") == api_version)
        and doc.get("kind") == target.get("kind", doc.get("kind"))
        and doc["metadata"].get("name") == target.get("name", doc["metadata"].get("name"))
        and doc["metadata"].get("namespace")
        == target.get("namespace", doc["metadata"].get("namespace"))
    )


def _tokens(pointer: str) -> list[str]:
    if not pointer.startswith("/"):
        raise Unsupported(f"JSON pointer {pointer!r} must start with '/'")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _walk(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens:
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def apply_json6902(doc: Doc, operations: list[Doc]) -> Doc:
    """A copy of *doc* with the JSON 6902 *operations* applied.

    Raises KeyError or IndexError for a path that does not exist (``remove``, ``replace``,
    ``test``), AssertionError for a ``test`` that fails, Unsupported for another operation.
    """
    out = copy.deepcopy(doc)
    for operation in operations:
        op, tokens = operation["op"], _tokens(operation["path"])
        parent, last = _walk(out, tokens[:-1]), tokens[-1]
        if op == "test":
            found = _walk(out, tokens)
            if found != operation["value"]:
                raise AssertionError(f"test {operation['path']}: {found!r}")
        elif op == "add":
            value = copy.deepcopy(operation["value"])
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), value)
            else:
                parent[last] = value
        elif op == "replace":
            _walk(out, tokens)  # must exist
            parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(
                operation["value"]
            )
        elif op == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise Unsupported(f"JSON 6902 operation {op!r} is not rendered here")
    return out
