"""The part of kustomize that deploy/kubernetes/ uses, so CI can validate the rendered overlay
without a kustomize binary: ``resources`` (files and directories), ``namespace``, ``images`` and
``patches`` given as JSON 6902 operations with a ``target`` kind and name. Anything else in a
kustomization is refused, so an overlay cannot quietly outgrow what is validated.
tests/test_kubernetes.py compares this with ``kubectl kustomize`` wherever kubectl is installed."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = frozenset({"apiVersion", "kind", "resources", "namespace", "images", "patches"})
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"})

Obj = dict[str, Any]


def load(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def render(directory: Path) -> list[Obj]:
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - SUPPORTED
    assert not unknown, f"{directory}: {sorted(unknown)} is not rendered by tests/kubernetes_render.py"
    objects: list[Obj] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        objects.extend(render(path) if path.is_dir() else load(path))
    objects = copy.deepcopy(objects)
    if "namespace" in spec:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = spec["namespace"]
    for image in spec.get("images", []):
        for container in containers(objects):
            if _image_name(container["image"]) == image["name"]:
                name = image.get("newName", image["name"])
                container["image"] = f"{name}:{image['newTag']}" if "newTag" in image else name
    for patch in spec.get("patches", []):
        target = patch["target"]
        matched = [o for o in objects if o["kind"] == target["kind"] and o["metadata"]["name"] == target["name"]]
        assert len(matched) == 1, f"patch target {target} matches {len(matched)} objects"
        for op in yaml.safe_load(patch["patch"]):
            _apply(matched[0], op)
    return objects


def containers(objects: list[Obj]) -> list[Obj]:
    """Every container (and init container) of every pod template."""
    out: list[Obj] = []
    for obj in objects:
        pod = obj.get("spec", {}).get("template", {}).get("spec")
        if pod:
            out.extend(pod.get("containers", []) + pod.get("initContainers", []))
    return out


def _image_name(image: str) -> str:
    name = image.split("@", 1)[0]
    head, _, tail = name.rpartition(":")
    return head if head and "/" not in tail else name


def _apply(obj: Obj, op: dict[str, Any]) -> None:
    """One RFC 6902 ``add``, ``replace`` or ``remove``."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
    node: Any = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) and last != "-" else last
    kind = op["op"]
    if kind == "remove":
        del node[key]
    elif kind == "replace":
        if isinstance(node, dict):
            assert key in node, f"replace of a missing {op['path']}"
        node[key] = op["value"]
    elif kind == "add":
        if isinstance(node, list):
            node.insert(len(node) if key == "-" else key, op["value"])
        else:
            node[key] = op["value"]
    else:
        raise AssertionError(f"JSON patch op {kind!r} is not rendered by tests/kubernetes_render.py")
