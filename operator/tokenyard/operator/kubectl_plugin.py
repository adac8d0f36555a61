"""`kubectl tokenyard rollout status|promote|abort|pause|resume|undo NAME`: rollouts by hand, as
`kubectl argo rollouts` does them; `kubectl tokenyard render -f FILE`: the engine pods the operator would
create for a ModelDeployment (offline, no cluster needed), to compare with what you run by hand.

Installed as the `kubectl-tokenyard` console script, which kubectl finds on PATH as a plugin. Everything goes
through the ModelDeployment itself, so the same can be done with kubectl alone:
- promote, abort: the `tokenyard.dev/rollout-command` annotation (`{"command": ..., "id": ...}`; a new id per
  command, so the operator applies each once even across restarts);
- pause, resume: `spec.paused`;
- undo: the previous revision's template (model, engine, parallelism) from `status.revisionHistory` written back
  into the spec, which rolls that revision out again like any other change.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

from tokenyard.core import labels
from tokenyard.operator.canary_plan import COMMAND_ANNOTATION

PLURAL = "modeldeployments"


class PluginError(Exception):
    pass


def _api(kubeconfig: str | None):
    import urllib3
    from kubernetes import client, config

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    try:
        config.load_kube_config(config_file=kubeconfig)
    except config.ConfigException:
        config.load_incluster_config()
    return client.CustomObjectsApi()


def _get(api, namespace: str, name: str) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    try:
        return api.get_namespaced_custom_object(labels.GROUP, labels.VERSION, namespace, PLURAL, name)
    except ApiException as e:
        if e.status == 404:
            raise PluginError(f"modeldeployment {namespace}/{name} not found") from e
        raise


def _patch(api, namespace: str, name: str, body: dict[str, Any]) -> None:
    api.patch_namespaced_custom_object(labels.GROUP, labels.VERSION, namespace, PLURAL, name, body)


def describe(obj: dict[str, Any]) -> str:
    """The rollout as a person reads it (pure: used by `status` and its tests)."""
    status = obj.get("status") or {}
    rollout = status.get("rollout") or {}
    lines = [
        f"Name:       {obj['metadata']['namespace']}/{obj['metadata']['name']}",
        f"Strategy:   {obj['spec'].get('rollout', {}).get('strategy', 'RollingUpdate')}",
        f"Phase:      {rollout.get('phase') or ('Progressing' if status.get('updatedReplicas') != obj['spec'].get('replicas') else 'Healthy')}",
        f"Step:       {rollout.get('step', '-')} of {len(obj['spec'].get('rollout', {}).get('steps', []))}",
        f"Stable:     {rollout.get('stableRevision') or status.get('currentRevision', '-')}",
        f"Canary:     {rollout.get('canaryRevision') or '-'}",
        f"Groups:     {status.get('readyReplicas', 0)} ready of {obj['spec'].get('replicas')} desired",
    ]
    for weight in status.get("traffic") or []:
        lines.append(f"Traffic:    {weight['revision']} {weight['weight']}%")
    if status.get("shadow"):
        lines.append(
            f"Shadow:     {status['shadow']['revision']} {status['shadow']['fraction']:.0%} of requests"
        )
    if rollout.get("reason"):
        lines.append(f"Reason:     {rollout['reason']}")
    analysis = rollout.get("analysis") or {}
    if analysis:
        lines.append(f"Analysis:   {analysis.get('decision')}: {analysis.get('reason')}")
    return "\n".join(lines)


def undo_patch(obj: dict[str, Any], to_revision: str | None) -> dict[str, Any]:
    """The spec patch that restores a previous revision (the one before the current, by default)."""
    history = (obj.get("status") or {}).get("revisionHistory") or []
    current = (obj.get("status") or {}).get("updateRevision")
    if to_revision:
        matches = [h for h in history if h["revision"].startswith(to_revision)]
        if not matches:
            known = ", ".join(h["revision"] for h in history) or "none"
            raise PluginError(f"revision {to_revision} is not in the history (known: {known})")
        target = matches[-1]
    else:
        older = [h for h in history if h["revision"] != current]
        if not older:
            raise PluginError("no previous revision in the history to go back to")
        target = older[-1]
    if not target.get("template"):
        raise PluginError(f"revision {target['revision']} has no recorded template")
    return {"spec": target["template"]}


def render_pods(doc: dict[str, Any], namespace: str, group: int = 0) -> list[dict[str, Any]]:
    """The pods of group `group` as the operator renders them, each on a placeholder node (placement is the
    operator's decision at run time). ValueError naming the field when the spec is invalid."""
    from pydantic import ValidationError
    from tokenyard.core.types import ModelDeploymentSpec
    from tokenyard.operator.manifests import GroupNames, pod_manifest
    from tokenyard.operator.revision import revision_hash

    if doc.get("kind") != "ModelDeployment":
        raise PluginError(f"render takes a ModelDeployment, got kind {doc.get('kind')!r}")
    try:
        spec = ModelDeploymentSpec.parse(doc.get("spec"))
    except ValidationError as e:
        raise PluginError(f"invalid ModelDeployment: {e}") from e
    meta = doc.get("metadata") or {}
    names = GroupNames(
        meta.get("name", "unnamed"), meta.get("namespace", namespace), revision_hash(spec), group
    )
    pods = spec.parallelism.pods_per_group
    nodes = tuple(f"<node-of-rank-{rank}>" for rank in range(pods))
    return [pod_manifest(spec, names, rank, nodes[rank], nodes) for rank in range(pods)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["render"]:
        return _render_main(argv[1:])
    parser = argparse.ArgumentParser(prog="kubectl tokenyard", description="Manage tokenyard rollouts.")
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("-n", "--namespace", default="default")
    sub = parser.add_subparsers(dest="group", required=True)
    rollout = sub.add_parser("rollout", help="inspect and steer a ModelDeployment's rollout")
    sub.add_parser("render", help="print the engine pods a ModelDeployment file renders to (offline)")
    actions = rollout.add_subparsers(dest="action", required=True)
    for action, text in [
        ("status", "show the rollout"),
        ("promote", "skip the current step (--full: every remaining step)"),
        ("abort", "roll back to the stable revision now"),
        ("pause", "hold the rollout at its step"),
        ("resume", "continue a paused rollout"),
        ("undo", "roll the previous revision (or --to-revision) out again"),
    ]:
        p = actions.add_parser(action, help=text)
        p.add_argument("name")
        if action == "promote":
            p.add_argument("--full", action="store_true")
        if action == "undo":
            p.add_argument("--to-revision", default=None)
    args = parser.parse_args(argv)
    try:
        api = _api(args.kubeconfig)
        obj = _get(api, args.namespace, args.name)
        if args.action == "status":
            print(describe(obj))
        elif args.action in ("promote", "abort"):
            command = "promote-full" if args.action == "promote" and args.full else args.action
            annotation = json.dumps({"command": command, "id": uuid.uuid4().hex})
            _patch(
                api,
                args.namespace,
                args.name,
                {"metadata": {"annotations": {COMMAND_ANNOTATION: annotation}}},
            )
            print(f"modeldeployment {args.name}: {command} requested")
        elif args.action in ("pause", "resume"):
            _patch(api, args.namespace, args.name, {"spec": {"paused": args.action == "pause"}})
            print(f"modeldeployment {args.name}: {args.action}d")
        elif args.action == "undo":
            patch = undo_patch(obj, args.to_revision)
            _patch(api, args.namespace, args.name, patch)
            print(f"modeldeployment {args.name}: rolling back to the previous revision's template")
    except PluginError as e:
        print(f"kubectl tokenyard: {e}", file=sys.stderr)
        return 1
    return 0


def _render_main(argv: list[str]) -> int:
    import yaml

    parser = argparse.ArgumentParser(
        prog="kubectl tokenyard render", description="Print the engine pods the operator creates for a group."
    )
    parser.add_argument("-f", "--filename", required=True, help="a ModelDeployment YAML file, or - for stdin")
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument("--rank", type=int, default=None, help="only this rank (0 is the leader)")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read() if args.filename == "-" else open(args.filename).read()
        pods = render_pods(yaml.safe_load(text) or {}, args.namespace)
        if args.rank is not None:
            if not 0 <= args.rank < len(pods):
                raise PluginError(
                    f"--rank {args.rank}: a group of this ModelDeployment has {len(pods)} pod(s)"
                )
            pods = [pods[args.rank]]
    except (PluginError, OSError, yaml.YAMLError) as e:
        print(f"kubectl tokenyard render: {e}", file=sys.stderr)
        return 1
    print(yaml.safe_dump_all(pods, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
