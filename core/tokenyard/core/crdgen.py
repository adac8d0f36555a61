"""Generates the CRDs in `charts/tokenyard/crds/` from the pydantic types in `tokenyard.core.types`.

    python -m tokenyard.core.crdgen --write charts/tokenyard/crds    # regenerate
    python -m tokenyard.core.crdgen --check charts/tokenyard/crds    # exit 1 when the YAML drifted

pydantic's JSON schema is close to, but not, a Kubernetes structural schema: it uses `$ref`, `anyOf` with
`null` for optional fields, and `title`s. This module inlines references, drops nulls and titles, keeps
descriptions, defaults, bounds, patterns and CEL rules, and marks free-form objects with
`x-kubernetes-preserve-unknown-fields`.
"""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path
from typing import Any

import yaml
from tokenyard.core import labels, types

# JSON-schema keys a structural schema keeps as they are.
_KEPT_KEYS = {
    "type",
    "description",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "format",
    "x-kubernetes-validations",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
}


def structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Turn one pydantic JSON-schema node into a structural OpenAPI v3 node."""
    if "$ref" in schema:
        target = defs[schema["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return structural(merged, defs)
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {schema}")
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        return structural({**options[0], **rest}, defs)

    out: dict[str, Any] = {k: v for k, v in schema.items() if k in _KEPT_KEYS}
    # JSON Schema 2020-12 gives exclusive bounds as numbers; OpenAPI v3.0 (the API server's) as booleans.
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(out.get(exclusive), int | float) and not isinstance(out[exclusive], bool):
            out[bound] = out.pop(exclusive)
            out[exclusive] = True
    if "default" in schema and schema["default"] is not None:
        out["default"] = {} if isinstance(schema["default"], dict) else schema["default"]
    if "const" in schema:
        out["enum"] = [schema["const"]]
    kind = schema.get("type")
    if "enum" in out and kind is None:
        out["type"] = "string"
    if kind == "object" or "properties" in schema:
        out["type"] = "object"
        props = schema.get("properties", {})
        if props:
            out["properties"] = {name: structural(p, defs) for name, p in props.items()}
            required = schema.get("required")
            if required:
                out["required"] = list(required)
        elif isinstance(schema.get("additionalProperties"), dict):
            out["additionalProperties"] = structural(schema["additionalProperties"], defs)
        elif not out.get("x-kubernetes-preserve-unknown-fields"):
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        out["items"] = structural(schema.get("items", {}), defs)
    if "type" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        raise ValueError(f"schema node without a type: {schema}")
    return out


def schema_of(model: type[types.ApiModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="serialization")
    return structural(raw, raw.get("$defs", {}))


def _model_in(annotation: Any) -> type[types.ApiModel] | None:
    """The API model a field holds: directly, optionally, or as list items."""
    if isinstance(annotation, type) and issubclass(annotation, types.ApiModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found:
            return found
    return None


def add_factory_defaults(model: type[types.ApiModel], node: dict[str, Any]) -> None:
    """pydantic leaves fields with a `default_factory` out of the JSON schema's defaults; put them in.

    An object default is written in full (not as `{}`): the API server validates a default against the
    object's CEL rules before filling in nested defaults, so `{}` would fail rules that read those fields.
    Empty lists are left out.
    """
    props = node.get("properties", {})
    for name, field in model.model_fields.items():
        prop = props.get(field.alias or name)
        if prop is None:
            continue
        if field.default_factory is not None:
            value = field.default_factory()
            if isinstance(value, types.ApiModel):
                prop["default"] = value.dump()
            elif isinstance(value, list) and value:
                prop["default"] = [v.dump() if isinstance(v, types.ApiModel) else v for v in value]
        inner = _model_in(field.annotation)
        if inner is not None:
            add_factory_defaults(inner, prop.get("items", prop))


def _crd(
    kind: str,
    plural: str,
    short_names: list[str],
    spec_model: type[types.ApiModel],
    status_model: type[types.ApiModel],
    columns: list[dict[str, Any]],
    scale: dict[str, str] | None,
    description: str,
) -> dict[str, Any]:
    spec = schema_of(spec_model)
    status = schema_of(status_model)
    add_factory_defaults(spec_model, spec)
    subresources: dict[str, Any] = {"status": {}}
    if scale:
        subresources["scale"] = scale
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{labels.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "tokenyard"},
        },
        "spec": {
            "group": labels.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["tokenyard"],
            },
            "versions": [
                {
                    "name": labels.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {
                                    "type": "string",
                                    "description": "API version: tokenyard.dev/v1alpha1.",
                                },
                                "kind": {"type": "string", "description": f"Kind: {kind}."},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD object, for every CRD tokenyard defines."""
    model_deployment = _crd(
        kind="ModelDeployment",
        plural="modeldeployments",
        short_names=["mdep"],
        spec_model=types.ModelDeploymentSpec,
        status_model=types.ModelDeploymentStatus,
        columns=[
            {"name": "Model", "type": "string", "jsonPath": ".spec.model.servedModelName", "priority": 1},
            {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
            {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
            {"name": "TP", "type": "integer", "jsonPath": ".spec.parallelism.tensor"},
            {"name": "Revision", "type": "string", "jsonPath": ".status.updateRevision"},
            {"name": "Rollout", "type": "string", "jsonPath": ".status.rollout.phase"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        scale={
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
        description=(
            "ModelDeployment serves one model with tensor-parallel replica groups of GPU pods, placed on the GPU "
            "topology, rolled out revision by revision, and routed to by the tokenyard router."
        ),
    )
    autoscaler = _crd(
        kind="InferenceAutoscaler",
        plural="inferenceautoscalers",
        short_names=["iasc"],
        spec_model=types.InferenceAutoscalerSpec,
        status_model=types.InferenceAutoscalerStatus,
        columns=[
            {"name": "Target", "type": "string", "jsonPath": ".spec.scaleTargetRef.name"},
            {"name": "Min", "type": "integer", "jsonPath": ".spec.minReplicas"},
            {"name": "Max", "type": "integer", "jsonPath": ".spec.maxReplicas"},
            {"name": "Current", "type": "integer", "jsonPath": ".status.currentReplicas"},
            {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
            {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        scale=None,
        description=(
            "InferenceAutoscaler scales the replica groups of a ModelDeployment (or any resource with a scale "
            "subresource) from queue depth, KV-cache occupancy and latency read from Prometheus."
        ),
    )
    return {
        "tokenyard.dev_modeldeployments.yaml": model_deployment,
        "tokenyard.dev_inferenceautoscalers.yaml": autoscaler,
    }


HEADER = "# Generated by `make crds` from core/tokenyard/core/types.py. Do not edit by hand.\n"


def render(crd: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(crd, sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tokenyard.core.crdgen", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="DIR", help="write the CRD YAML files into DIR")
    mode.add_argument("--check", metavar="DIR", help="exit 1 when a file in DIR differs from the types")
    args = parser.parse_args(argv)
    folder = Path(args.write or args.check)
    drifted = []
    for name, crd in crds().items():
        path = folder / name
        text = render(crd)
        if args.write:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        elif not path.exists() or path.read_text() != text:
            drifted.append(str(path))
    if drifted:
        print(
            f"CRD YAML out of date with core/tokenyard/core/types.py: {', '.join(drifted)}; run `make crds`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
