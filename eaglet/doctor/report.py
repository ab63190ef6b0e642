"""What a doctor run returns: one ``Check`` per link, each with a verdict and its evidence.

A check's ``summary`` is one line for the screen; ``lines`` are a few indented lines of
evidence (a table at most); ``evidence`` holds the same numbers, and more, for ``--json``.
Verdicts: ``pass``, ``warn`` (suspicious, not proven wrong), ``fail`` (wrong, with the
numbers that show it) and ``skip`` (not run: not asked for, or an earlier failure makes
it meaningless; the summary says which).
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from eaglet.outputs import write_atomic

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
WIDTH = 120  # problems are wrapped to this; tables stay narrower
_RANK = {SKIP: 0, PASS: 1, WARN: 2, FAIL: 3}


@dataclass
class Check:
    number: int
    title: str
    status: str = PASS
    summary: str = ""
    lines: list[str] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # one sentence per failed or suspicious item

    def flag(self, status: str, problem: str) -> None:
        """Record a problem and raise the verdict to ``status`` (a verdict never goes down)."""
        if problem not in self.problems:
            self.problems.append(problem)
        if _RANK[status] > _RANK[self.status]:
            self.status = status

    def to_json(self) -> dict:
        return {"number": self.number, "title": self.title, "status": self.status, "summary": self.summary,
                "problems": self.problems, "lines": self.lines, "evidence": self.evidence}


def skipped(number: int, title: str, why: str) -> Check:
    return Check(number, title, SKIP, why)


@dataclass
class Report:
    header: dict  # target, draft, prompts, device, dtype, settings
    checks: list[Check]
    seconds: float = 0.0

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failed

    def format(self) -> str:
        h = self.header
        out = ["eaglet doctor",
               f"  target {h['target']} ({h['target_layers']} layers, hidden {h['target_hidden']})",
               f"  draft  {h['draft']}",
               f"  {h['prompts']} prompts x {h['max_new_tokens']} new tokens ({h['serve_tokens']} decoded "
               f"speculatively, chain of {h['chain_steps']}), {h['device']} {h['dtype']}, {self.seconds:.1f} s", ""]
        for c in self.checks:
            out.append(f"{c.number} {c.title:<17} {c.status.upper():<4}  {c.summary}")
            out += [textwrap.fill(p, WIDTH, initial_indent="    ! ", subsequent_indent="      ") for p in c.problems]
            out.extend(f"    {line}" for line in c.lines)
        names = ", ".join(f"{c.number} {c.title}" for c in self.failed)
        warned = ", ".join(f"{c.number} {c.title}" for c in self.checks if c.status == WARN)
        verdict = f"FAIL ({names})" if names else "PASS" + (f" with warnings ({warned})" if warned else "")
        out += ["", f"verdict: {verdict}"]
        return "\n".join(out)

    def to_json(self) -> dict:
        return {"ok": self.ok, "seconds": round(self.seconds, 2), **self.header,
                "checks": [c.to_json() for c in self.checks]}

    def write_json(self, path: str | Path) -> None:
        write_atomic(path, json.dumps(self.to_json(), indent=1))
