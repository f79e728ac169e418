"""``blazar doctor``: gather facts (I/O), judge them (pure), repair the safe ones.

    report = diagnose(paths, fix=True)

With ``fix``, the facts are gathered and judged again after the repairs, so the
report's findings are what remains.
"""

from __future__ import annotations

from blazar.config import Paths
from blazar.diagnose.facts import Facts, Finding, Fixed, Report
from blazar.diagnose.fix import apply_fixes
from blazar.diagnose.gather import gather
from blazar.diagnose.judge import judge, report

__all__ = ["Facts", "Finding", "Fixed", "Report", "diagnose", "gather", "judge"]


def diagnose(paths: Paths, *, fix: bool = False, deep: bool = False) -> Report:
    findings = judge(gather(paths, deep=deep))
    if not fix or not any(f.fixable for f in findings):
        return report(findings)
    fixed = apply_fixes(findings)
    return report(judge(gather(paths, deep=deep)), fixed)
