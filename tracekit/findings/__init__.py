"""The finding record and what is made of findings: the ranked report, statuses against a baseline,
feedback records for agents."""

from tracekit.findings.model import FINDING_SCHEMA_VERSION, SEVERITY_RANK, Finding, Quantity, json_schema

__all__ = ["FINDING_SCHEMA_VERSION", "SEVERITY_RANK", "Finding", "Quantity", "json_schema"]
