"""Point records of a sweep (DIR/points/<id>.json): sealed with a checksum when written,
checked against a schema and the checksum on resume. A record that fails (edited by hand,
truncated by a crash of another tool, written by an older placer, the wrong shape) is not
reused: the point is solved again."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from placer.schema import Plan

RECORD_STATUS = Literal["optimal", "feasible", "time_limit", "infeasible", "error"]
Scalar = str | int | float | bool | None


class PointRecord(BaseModel):
    """The shape resume relies on (results_table reads these fields)."""

    model_config = ConfigDict(extra="forbid")
    version: int
    id: str
    overrides: dict[str, Any]
    fingerprint: str
    status: RECORD_STATUS
    message: str
    metrics: dict[str, Scalar | list[Scalar]]
    plan: dict[str, Any] | None
    checksum: str

    @model_validator(mode="after")
    def _plan_when_solved(self) -> PointRecord:
        if self.status in ("optimal", "feasible") and self.plan is None:
            raise ValueError(f"status {self.status} without a plan")
        if self.plan is not None:
            Plan.model_validate(self.plan)
        return self


def _canonical(rec: dict[str, Any]) -> bytes:
    body = {k: v for k, v in rec.items() if k != "checksum"}
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), allow_nan=False, default=str
    ).encode("utf-8")


def seal(rec: dict[str, Any]) -> dict[str, Any]:
    """The record as it is stored (JSON values only) with its SHA-256 checksum."""
    plain = json.loads(_canonical(rec))
    plain["checksum"] = hashlib.sha256(_canonical(plain)).hexdigest()
    return plain


def check(rec: Any, *, point_id: str, version: int) -> dict[str, Any] | None:
    """The record if it is intact and has the shape of a point record of this version."""
    if not isinstance(rec, dict) or rec.get("version") != version or rec.get("id") != point_id:
        return None
    try:
        if rec.get("checksum") != hashlib.sha256(_canonical(rec)).hexdigest():
            return None
        PointRecord.model_validate(rec)
    except (ValidationError, ValueError, TypeError):
        return None
    return rec
