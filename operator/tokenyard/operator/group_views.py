"""Engine pods, as the `engine_pods` index summarises them, grouped into the gangs the reconcile counts.

Pure: the adapter's index entries in (one dict per pod), `GroupView`s out, one per (index, revision),
ordered by index then revision, members by rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tokenyard.operator.groups import GroupView, MemberView


def group_views(pods: Iterable[Mapping[str, Any]]) -> list[GroupView]:
    by_group: dict[tuple[int, str], list[Mapping[str, Any]]] = {}
    for pod in pods:
        by_group.setdefault((pod["group"], pod["revision"]), []).append(pod)
    views = []
    for (index, revision), members in sorted(by_group.items()):
        members.sort(key=lambda p: p["rank"])
        views.append(
            GroupView(
                index=index,
                revision=revision,
                size=max(p["size"] for p in members),
                members=tuple(
                    MemberView(
                        name=p["name"],
                        rank=p["rank"],
                        node=p["node"],
                        phase=p["phase"],
                        ready=p["ready"],
                        unschedulable_since=p["unschedulable_since"],
                        terminating=p["terminating"],
                    )
                    for p in members
                ),
                planned_nodes=tuple(p["planned"] or "" for p in members),
                # the whole gang's planned nodes, from the first member that recorded them
                recorded_nodes=next((p.get("group_nodes") for p in members if p.get("group_nodes")), ()),
            )
        )
    return views
