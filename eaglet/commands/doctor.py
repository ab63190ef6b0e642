"""``eaglet doctor``: the checks (doctor/), their report on stdout, exit status 1 when one fails."""

from __future__ import annotations

from eaglet.doctor.config import DoctorConfig
from eaglet.errors import EXIT_CHECK_FAILED


def run(opts: DoctorConfig) -> int:
    from eaglet.doctor.run import run_doctor

    report = run_doctor(opts)
    print(report.format())
    if opts.json:
        report.write_json(opts.json)
    return 0 if report.ok else EXIT_CHECK_FAILED
