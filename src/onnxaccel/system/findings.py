"""A finding: one thing the doctor noticed, how bad it is, and what to do about it."""

from __future__ import annotations

from dataclasses import dataclass

OK = "ok"
INFO = "info"
WARN = "warn"
ERROR = "error"
SEVERITIES = (OK, INFO, WARN, ERROR)


@dataclass(frozen=True)
class Finding:
    """``code`` is stable (scripts and docs/TROUBLESHOOTING.md key on it); the rest is for people."""

    severity: str
    code: str
    title: str
    detail: str = ""
    fix: str = ""

    def to_dict(self) -> dict:
        """The finding as JSON-ready values."""
        return {"severity": self.severity, "code": self.code, "title": self.title, "detail": self.detail,
                "fix": self.fix}
