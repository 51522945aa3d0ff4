"""What a reaper pass reports: ``RunVerdict`` (one line per run judged) and ``ReaperReport``
(the pass), and how a carried-out rule or a settled approval deadline becomes a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from uuid import UUID

from agentruns.models import AgentRun
from agentruns.services import deadline_sweep
from agentruns.services.reaper.rules import RESULT, VERDICT_OF_RULE, Rule, Verdict


@dataclass(frozen=True)
class RunVerdict:
    """The reaper's verdict on one stale run."""

    run_uuid: UUID
    segment: str  # the claimed_by that abandoned it
    lease_epoch: int
    rule: str
    verdict: str
    result: str  # the status (and reason) it was left in; "" when skipped
    detail: str = ""

    def line(self) -> str:
        text = (
            f"{self.run_uuid} segment={self.segment or '-'} rule={self.rule} verdict={self.verdict}"
        )
        if self.result:
            text += f" -> {self.result}"
        if self.detail:
            text += f" ({self.detail})"
        return text


@dataclass
class ReaperReport:
    """One pass: a verdict per stale run found, and how many queued runs were redispatched."""

    dry_run: bool = False
    verdicts: list[RunVerdict] = field(default_factory=list)
    redispatched: int = 0
    checks_redispatched: int = 0  # check tasks of in-doubt runs sent again (docs/design.md §9.2)
    # Runs that waited for approval or input past their deadline (docs/design.md §5.11).
    expired: list[RunVerdict] = field(default_factory=list)
    # Budget holds past their expiry, charged at what they held (docs/design.md §14).
    holds_lapsed: int = 0

    def count(self, verdict: str) -> int:
        return sum(1 for v in self.verdicts if v.verdict == verdict)

    @property
    def found(self) -> int:
        return len(self.verdicts)

    def summary(self) -> str:
        text = (
            f"found {self.found}, requeued {self.count(Verdict.REQUEUED)}, "
            f"in doubt {self.count(Verdict.IN_DOUBT)}, "
            f"dead-lettered {self.count(Verdict.DEAD_LETTERED)}, "
            f"skipped {self.count(Verdict.SKIPPED)}"
        )
        if self.expired:
            denied = sum(1 for v in self.expired if v.verdict == Verdict.DENIED)
            failed = sum(1 for v in self.expired if v.verdict == Verdict.DEAD_LETTERED)
            escalated = sum(1 for v in self.expired if v.verdict == Verdict.ESCALATED)
            skipped = len(self.expired) - denied - failed - escalated
            text += (
                f"; past their approval deadline {len(self.expired)}: denied {denied}, "
                f"failed {failed}, "
                + (f"escalated {escalated}, " if escalated else "")
                + f"skipped {skipped}"
            )
        if self.dry_run:
            return text + " (dry run: nothing changed)"
        if self.holds_lapsed:
            text += f"; {self.holds_lapsed} budget hold(s) lapsed"
        text += f"; redispatched {self.redispatched} unclaimed queued run(s)"
        if self.checks_redispatched:
            text += f", {self.checks_redispatched} lost check(s) of in-doubt runs"
        return text


def _verdict(run: AgentRun, rule: str, detail: str, *, taken: bool, failure: str) -> RunVerdict:
    """The verdict on ``run`` once its ``rule`` was carried out (``taken``) or not."""
    verdict = VERDICT_OF_RULE[rule]
    if failure:
        detail = failure
    if not taken:
        verdict, detail = Verdict.SKIPPED, detail or "lease renewed or run changed meanwhile"
    return RunVerdict(
        run_uuid=run.uuid,
        segment=run.claimed_by,
        lease_epoch=run.lease_epoch,
        rule=rule,
        verdict=verdict,
        result=RESULT[rule] if verdict != Verdict.SKIPPED else "",
        detail=detail,
    )


#: The verdict of each deadline action (anything else failed the run).
_DEADLINE_VERDICTS = {"deny": Verdict.DENIED, "escalate": Verdict.ESCALATED}


def _deadline_verdict(outcome: deadline_sweep.DeadlineOutcome) -> RunVerdict:
    """The line and the counted verdict of one run past its approval deadline."""
    deadline = outcome.deadline.isoformat() if outcome.deadline else "?"
    if outcome.taken:
        verdict = _DEADLINE_VERDICTS.get(outcome.action, Verdict.DEAD_LETTERED)
        detail = f"waited in {outcome.waited} past its deadline {deadline}"
    else:
        verdict = Verdict.SKIPPED
        detail = outcome.failure or "decided, cancelled or being decided meanwhile"
    return RunVerdict(
        run_uuid=outcome.run_uuid,
        segment="",
        lease_epoch=0,
        rule=Rule.DEADLINE,
        verdict=verdict,
        result=outcome.result,
        detail=detail,
    )
