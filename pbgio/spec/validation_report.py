"""The published JSON Schema of a validation report (``pbgio validate --json``).

It describes exactly what :meth:`pbgio.errors.Report.to_dict` returns; the rule
ids come from :data:`pbgio.spec.rules.RULES`, so a new rule is in the schema as
soon as ``tools/gen_schemas.py`` regenerates ``schemas/validate-report.schema.json``.

>>> schema = report_json_schema()
>>> schema["required"]
['target', 'kind', 'valid', 'error_count', 'warning_count', 'checked', 'issues']
>>> issue = schema["$defs"]["Issue"]["properties"]
>>> issue["severity"]["enum"], "edge-rel-range" in issue["rule"]["enum"]
(['error', 'warning'], True)
"""

from __future__ import annotations

from typing import Any, get_args

from pbgio.errors import Severity
from pbgio.spec.rules import RULES

SCHEMA_ID = "https://pbg.dev/schemas/validate-report.schema.json"
_COUNT: dict[str, Any] = {"type": "integer", "minimum": 0}


def _nullable_string(description: str) -> dict[str, Any]:
    return {"type": ["string", "null"], "description": description}


def report_json_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of ``Report.to_dict()``."""
    issue: dict[str, Any] = {
        "type": "object",
        "description": "One broken rule (pbgio.errors.Issue).",
        "additionalProperties": False,
        "required": ["rule", "severity", "file", "dataset", "message", "rows", "count"],
        "properties": {
            "rule": {
                "type": "string",
                "enum": list(RULES),
                "description": "Stable rule id; see docs/format/rules.md.",
            },
            "severity": {"type": "string", "enum": list(get_args(Severity))},
            "file": _nullable_string("The file the problem is in, relative to the validated root "
                                     "where possible; null for the run as a whole."),
            "dataset": _nullable_string("HDF5 dataset, attribute or config key path; null when "
                                        "the problem concerns the whole file."),
            "message": {"type": "string", "description": "'expected …, found …'."},
            "rows": {
                "type": "array",
                "items": _COUNT,
                "description": "The first offending rows (or lines), in order.",
            },
            "count": {
                "type": ["integer", "null"],
                "minimum": 0,
                "description": "How many rows break the rule in all; null when not counted.",
            },
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "pbgio validation report",
        "description": "The output of `pbgio validate --json` (pbgio.errors.Report.to_dict()).",
        "type": "object",
        "additionalProperties": False,
        "required": ["target", "kind", "valid", "error_count", "warning_count", "checked", "issues"],
        "properties": {
            "target": {"type": "string", "description": "The path that was validated."},
            "kind": {
                "type": "string",
                "description": "What the target was taken to be: config, entities, edges, "
                               "checkpoint (joined with + for a mixed directory), bucket, model, "
                               "embeddings, legacy or unknown.",
            },
            "valid": {"type": "boolean", "description": "True when there are no errors."},
            "error_count": _COUNT,
            "warning_count": _COUNT,
            "checked": {
                "type": "object",
                "additionalProperties": _COUNT,
                "description": "How many things of each kind were checked (files, edges, bytes, …).",
            },
            "issues": {"type": "array", "items": {"$ref": "#/$defs/Issue"}},
        },
        "if": {"properties": {"error_count": {"const": 0}}},
        "then": {"properties": {"valid": {"const": True}}},
        "else": {"properties": {"valid": {"const": False}}},
        "$defs": {"Issue": issue},
    }
