"""Cost and daily budgets (docs/design.md §14): what a model call costs, the spend ledger
(``SpendDay``), the reservations of the calls in flight (``SpendHold``) and the check made before
each provider call.

* ``call_cost`` prices one answer from its configuration's prices and the provider's usage
  (``None``: the configuration is not priced). A provider that reports no usage costs 0 and says
  so (``Priced.usage_known``). ``call_bound`` is the most one call can cost before it is made:
  ``max_tokens_per_call`` tokens at the higher of the two prices (``None``: no bound set).
* ``reserve`` is the check, made only when a budget applies (the configuration's
  ``daily_budget``, ``AGENTRUNS["USER_DAILY_BUDGET"]`` for a run with an initiator). One
  transaction: an ``INSERT … ON CONFLICT DO UPDATE SET reserved = reserved + hold WHERE amount +
  reserved < limit`` on each budget's row of today (UTC, the database's clock), then one
  ``SpendHold`` row per admitted budget row. The row lock of the upsert orders racing checks, so
  each sees every hold admitted before it. The hold is the call's bound, or, without one, the
  largest single call charged to the row today (an estimate). A check refused by a budget whose
  spend is under its limit (holds fill the rest) asks again after a pause, for as long as a hold
  lives, before it answers ``Exhausted``.
* ``charge`` records an answer in the transaction that writes its events: it deletes the call's
  holds (``DELETE … RETURNING``) and adds the cost (and takes the holds off ``reserved``) on the
  configuration's and the initiator's rows. ``release`` gives a failed call's holds back.
  ``lapse_holds`` (the reaper) charges the holds past their expiry at what they held: their call
  may have been made by a segment that died before recording it. A hold is deleted by exactly
  one of the three; a charge or release that finds its hold lapsed corrects the row by the
  difference.

The invariant, per budget row (one budget, one day): a call is admitted only while ``amount +
reserved < limit`` and then adds its hold, atomically; a charge, release or lapse never raises
``amount + reserved`` as long as no call costs more than its hold. So when every hold is a bound
(``max_tokens_per_call`` set, usage reported within it), the calls admitted on the row cost less
than ``limit`` + the cost of the last one admitted, and the row's ``amount`` (which counts lapsed
holds at what they held) stays under ``limit`` + the last admitted call's hold. A call that cost
more than its hold adds its excess to both bounds and is counted in ``overruns``.

Every statement is raw SQL on the unique key ``(day, scope, key)`` or on a hold's ``token``
(PostgreSQL, SQLite 3.35 or later for ``RETURNING``); every transaction locks holds before ledger
rows, and ledger rows configuration before user, so none waits on another in a cycle. A database
error propagates (the caller fails closed: no provider call without a check that answered). Must
never write a run's state (that is ``transitions``).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import ROUND_HALF_UP, ROUND_UP, Decimal
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.models import DurationField

from agentruns.conf import app_settings
from agentruns.leases import Lease
from agentruns.models import AgentConfiguration, SpendDay, SpendHold, SpendScope

logger = logging.getLogger(__name__)

#: Six decimal places: what every cost column stores.
QUANTUM = Decimal("0.000001")
#: The most one call or one run may cost (``AgentRun.cost``: 14 digits, 6 after the point); a
#: larger figure (absurd prices times absurd token counts) is stored as this.
MAX_COST = Decimal("99999999.999999")
MILLION = Decimal(1_000_000)

_DAY_SQL = {
    "postgresql": "(STATEMENT_TIMESTAMP() AT TIME ZONE 'UTC')::date",
    "sqlite": "DATE('now')",
}
_LARGER_SQL = {"postgresql": "GREATEST", "sqlite": "MAX"}
# The database clock, and the clock + a ``DurationField`` parameter, as Django compiles ``Now()``
# and ``Now() + duration`` (so a hold's expiry compares with ``Now()`` like any other timestamp).
_NOW_SQL = {
    "postgresql": "STATEMENT_TIMESTAMP()",
    "sqlite": "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')",
}
_LATER_SQL = {
    "postgresql": "(STATEMENT_TIMESTAMP() + %s)",
    "sqlite": "(django_format_dtdelta('+', STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'), %s))",
}
_DURATION: DurationField[timedelta, timedelta] = DurationField()
_LEDGER_COLUMNS = (
    "day, scope, key, amount, calls, largest, unknown_usage_calls, reserved, lapsed_holds, overruns"
)


def currency() -> str:
    """The currency every price, cost and budget is in (``AGENTRUNS["COST_CURRENCY"]``)."""
    return app_settings().cost_currency


def as_money(value: Any) -> Decimal:
    """``value`` as a stored cost: six places, within ``0 … MAX_COST``."""
    amount = Decimal(str(value)).quantize(QUANTUM, rounding=ROUND_HALF_UP)
    return min(max(amount, Decimal(0)), MAX_COST)


def user_daily_budget() -> Decimal | None:
    """``AGENTRUNS["USER_DAILY_BUDGET"]``: ``None`` when empty. A value that is not a
    non-negative decimal raises ``ImproperlyConfigured`` (``agentruns.conf``: every read of the
    settings refuses it, so nothing starts and no provider is called: fail closed)."""
    return app_settings().user_daily_budget


# --- What a call costs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Priced:
    """One answer's cost; ``usage_known`` is ``False`` when the provider reported no usage (the
    call is then charged 0)."""

    cost: Decimal
    usage_known: bool


def _tokens(usage: Mapping[str, Any], key: str) -> int | None:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def call_cost(configuration: AgentConfiguration, usage: Mapping[str, Any]) -> Priced | None:
    """The cost of one answer whose provider reported ``usage``; ``None`` when the configuration
    sets neither price (an unset one of the two prices counts as 0)."""
    prompt_price = configuration.price_per_million_prompt_tokens
    completion_price = configuration.price_per_million_completion_tokens
    if prompt_price is None and completion_price is None:
        return None
    prompt, completion = _tokens(usage, "prompt_tokens"), _tokens(usage, "completion_tokens")
    if prompt is None and completion is None:
        return Priced(Decimal(0).quantize(QUANTUM), usage_known=False)
    cost = (
        Decimal(prompt or 0) * (prompt_price or Decimal(0))
        + Decimal(completion or 0) * (completion_price or Decimal(0))
    ) / MILLION
    return Priced(as_money(cost), usage_known=True)


def call_bound(configuration: AgentConfiguration) -> Decimal | None:
    """The most one call of ``configuration`` can cost, before it is made: its
    ``max_tokens_per_call`` tokens (prompt and completion together) at the higher of its two
    prices, rounded up, so never below what ``call_cost`` charges for usage within the bound.
    0 for an unpriced configuration (its calls cost nothing); ``None`` when it sets no bound."""
    prompt_price = configuration.price_per_million_prompt_tokens
    completion_price = configuration.price_per_million_completion_tokens
    if prompt_price is None and completion_price is None:
        return Decimal(0).quantize(QUANTUM)
    tokens = configuration.max_tokens_per_call
    if tokens is None:
        return None
    price = max(prompt_price or Decimal(0), completion_price or Decimal(0))
    bound = (Decimal(tokens) * price / MILLION).quantize(QUANTUM, rounding=ROUND_UP)
    return min(bound, MAX_COST)


# --- Budgets and the check ---------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    scope: str  # SpendScope
    key: int
    limit: Decimal


def budgets_for(*, configuration: AgentConfiguration, initiator_id: int | None) -> list[Budget]:
    """The budgets a run's next provider call is checked against (possibly none)."""
    found = []
    if configuration.daily_budget is not None:
        found.append(Budget(SpendScope.CONFIGURATION, configuration.pk, configuration.daily_budget))
    user_limit = user_daily_budget()
    if user_limit is not None and initiator_id is not None:
        found.append(Budget(SpendScope.USER, initiator_id, user_limit))
    return found


@dataclass(frozen=True)
class Holder:
    """The call a reservation is for: its run and segment (recorded on the holds), what it
    holds (``bound``; ``None``: each row's largest call today) and how many seconds its holds
    live before they lapse (the configuration's call timeout and one lease: by then a live
    segment has answered or failed, and a dead one's lease has run out)."""

    run_id: int
    segment: str
    bound: Decimal | None
    seconds: int

    @classmethod
    def of(cls, configuration: AgentConfiguration, lease: Lease) -> Holder:
        # Whole seconds, rounded up: a hold never lapses before the lease it is under.
        seconds = int(configuration.timeout_seconds or 30) + math.ceil(app_settings().lease_seconds)
        return cls(lease.run_id, lease.owner, call_bound(configuration), seconds)


@dataclass(frozen=True)
class Reservation:
    """What ``reserve`` held back per budget row ``(scope, key)``, on the UTC ``day`` it was
    made, under the holds' ``token``: ``charge`` and ``release`` settle exactly those holds."""

    day: date
    token: str
    held: dict[tuple[str, int], Decimal] = field(default_factory=dict)


@dataclass(frozen=True)
class Exhausted:
    """A budget admits no more calls: its spend today is at or above its limit, or the holds of
    the calls in flight (``reserved``) fill what is left of it."""

    budget: Budget
    spend: Decimal
    day: date | None
    reserved: Decimal = Decimal(0)

    @property
    def spent(self) -> bool:
        """The spend alone reaches the limit (no call in flight can give anything back)."""
        return self.spend >= self.budget.limit

    def payload(self) -> dict[str, Any]:
        """The ``budget`` event's payload (and the run's error)."""
        return {
            "budget": str(self.budget.scope),
            "key": self.budget.key,
            "spend": str(self.spend),
            "reserved": str(self.reserved),
            "limit": str(self.budget.limit),
            "currency": currency(),
            "day": self.day.isoformat() if self.day is not None else None,
        }

    def message(self) -> str:
        whose = (
            "the configuration's" if self.budget.scope == SpendScope.CONFIGURATION else "the user's"
        )
        held = f", {self.reserved} more held by calls in flight" if self.reserved else ""
        return (
            f"{whose} daily budget is spent: {self.spend} of {self.budget.limit} {currency()}"
            + held
            + (f" on {self.day.isoformat()} (UTC)" if self.day is not None else "")
        )


def _table(db: Any) -> str:
    return db.ops.quote_name(SpendDay._meta.db_table)


def _holds(db: Any) -> str:
    return db.ops.quote_name(SpendHold._meta.db_table)


def _money(value: Any) -> Decimal:
    return Decimal(str(value)).quantize(QUANTUM, rounding=ROUND_HALF_UP)


def _day_param(db: Any, day: date) -> Any:
    return day if db.vendor == "postgresql" else day.isoformat()


def _day(value: Any) -> date:
    return value if isinstance(value, date) else date.fromisoformat(str(value))


#: Seconds between two checks of a call refused while holds fill its budget (the last repeats).
WAIT_STEPS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0)


def reserve(
    budgets: Sequence[Budget], *, holder: Holder, waiting: Callable[[], bool] = lambda: True
) -> Reservation | Exhausted:
    """The check before a provider call (see the module docstring). Every budget admitted: the
    ``Reservation`` (committed at once, outside any caller's transaction). Refused: nothing is
    held, and a refusing budget is answered with its spend and what is held on it (a spent one
    first) — at once when its spend reaches its limit; otherwise (calls in flight may end
    costing less than they hold) after asking again every ``WAIT_STEPS`` while ``waiting()``
    (the caller's lease is alive), for at most ``holder.seconds``."""
    if not budgets:
        raise ValueError("nothing to reserve against")
    deadline, attempt = time.monotonic() + holder.seconds, 0
    while True:
        verdict = _reserve_once(budgets, holder)
        if isinstance(verdict, Reservation) or verdict.spent:
            return verdict
        pause = WAIT_STEPS[min(attempt, len(WAIT_STEPS) - 1)]
        if time.monotonic() + pause > deadline or not waiting():
            return verdict
        time.sleep(pause)
        attempt += 1


def _reserve_once(budgets: Sequence[Budget], holder: Holder) -> Reservation | Exhausted:
    db = connections[DEFAULT_DB_ALIAS]
    for budget in budgets:
        if budget.limit <= 0:  # a zero budget admits nothing (a new row would be inserted)
            return _exhausted(db, budget)
    table, day = _table(db), _DAY_SQL[db.vendor]
    hold = f"COALESCE(CAST(%s AS NUMERIC), {table}.largest)"
    rows = ", ".join(f"({day}, %s, %s, 0, 0, 0, 0, %s, 0, 0)" for _ in budgets)
    limits = " ".join(f"WHEN {table}.scope = %s AND {table}.key = %s THEN %s" for _ in budgets)
    params: list[Any] = []
    for budget in budgets:  # a new row's largest is 0
        params += [str(budget.scope), budget.key, holder.bound or Decimal(0)]
    params.append(holder.bound)
    for budget in budgets:
        params += [str(budget.scope), budget.key, budget.limit]
    params.append(holder.bound)
    sql = (
        f"INSERT INTO {table} ({_LEDGER_COLUMNS}) VALUES {rows} "
        f"ON CONFLICT (day, scope, key) DO UPDATE SET reserved = {table}.reserved + {hold} "
        f"WHERE {table}.amount + {table}.reserved < CAST(CASE {limits} END AS NUMERIC) "
        f"RETURNING day, scope, key, COALESCE(CAST(%s AS NUMERIC), largest)"
    )
    with transaction.atomic(using=db.alias), db.cursor() as cursor:
        cursor.execute(sql, params)
        admitted = cursor.fetchall()
        if len(admitted) == len(budgets):
            return _hold(db, cursor, admitted, holder)
        transaction.set_rollback(True, using=db.alias)  # a refusal by one holds nothing
    taken = {(str(row[1]), int(row[2])) for row in admitted}
    refusals = [_exhausted(db, b) for b in budgets if (str(b.scope), b.key) not in taken]
    return next((r for r in refusals if r.spent), refusals[0])  # a spent one: no use waiting


def _hold(db: Any, cursor: Any, admitted: list[Any], holder: Holder) -> Reservation:
    """Insert the holds of the rows ``admitted`` (in the check's transaction)."""
    token = uuid.uuid4().hex
    day = _day(admitted[0][0])
    held = {(str(scope), int(key)): _money(amount) for _, scope, key, amount in admitted}
    lives = _DURATION.get_db_prep_value(timedelta(seconds=holder.seconds), db)
    rows, params = [], []
    for (scope, key), amount in held.items():
        rows.append(f"(%s, %s, %s, %s, %s, %s, %s, {_LATER_SQL[db.vendor]})")
        params += [token, _day_param(db, day), scope, key, amount, holder.run_id, holder.segment]
        params.append(lives)
    cursor.execute(
        f"INSERT INTO {_holds(db)} (token, day, scope, key, amount, run_id, segment, expires_at) "
        f"VALUES {', '.join(rows)}",
        params,
    )
    return Reservation(day=day, token=token, held=held)


def _exhausted(db: Any, budget: Budget) -> Exhausted:
    with db.cursor() as cursor:
        cursor.execute(
            f"SELECT day, amount, reserved FROM {_table(db)} WHERE day = {_DAY_SQL[db.vendor]} "
            "AND scope = %s AND key = %s",
            [str(budget.scope), budget.key],
        )
        row = cursor.fetchone()
    if row is None:
        return Exhausted(budget, Decimal(0).quantize(QUANTUM), None, Decimal(0).quantize(QUANTUM))
    return Exhausted(budget, _money(row[1]), _day(row[0]), _money(row[2]))


# --- Charging, releasing, lapsing ---------------------------------------------------------------


@dataclass(frozen=True)
class Charge:
    """An answer to record in the ledger: its cost (0 when unpriced or usage unknown), and the
    reservation made before its call (``None``: no budget applied)."""

    configuration_id: int
    initiator_id: int | None
    cost: Decimal
    usage_known: bool = True
    reservation: Reservation | None = None


def _take_holds(cursor: Any, db: Any, token: str) -> set[tuple[str, int]]:
    """Delete the holds of ``token`` still there; the rows they were on. A hold of the
    reservation missing from the answer lapsed (it was charged at what it held)."""
    cursor.execute(f"DELETE FROM {_holds(db)} WHERE token = %s RETURNING scope, key", [token])
    return {(str(scope), int(key)) for scope, key in cursor.fetchall()}


def charge(entry: Charge) -> None:
    """Add ``entry`` to the configuration's and the initiator's rows: its holds deleted, then one
    upsert adding the cost, one call and the largest call, and taking each live hold off
    ``reserved`` (a lapsed one was charged already: the cost less the hold is added). Call it
    inside the transaction that writes the answer's event (it opens none of its own there). On
    the reservation's day for a held row, else today."""
    db = connections[DEFAULT_DB_ALIAS]
    reservation = entry.reservation
    keys: list[tuple[str, int]] = [(str(SpendScope.CONFIGURATION), entry.configuration_id)]
    if entry.initiator_id is not None:
        keys.append((str(SpendScope.USER), entry.initiator_id))
    table, larger = _table(db), _LARGER_SQL[db.vendor]
    unknown = 0 if entry.usage_known else 1
    with transaction.atomic(using=db.alias, savepoint=False), db.cursor() as cursor:
        live = _take_holds(cursor, db, reservation.token) if reservation is not None else set()
        rows: list[str] = []
        params: list[Any] = []
        for scope, key in keys:
            held = reservation.held.get((scope, key)) if reservation is not None else None
            if held is None or reservation is None:
                rows.append(f"({_DAY_SQL[db.vendor]}, %s, %s, %s, 1, %s, %s, 0, 0, 0)")
                params += [scope, key, entry.cost, entry.cost, unknown]
                continue
            rows.append("(%s, %s, %s, %s, 1, %s, %s, %s, 0, %s)")
            lapsed = (scope, key) not in live
            params += [
                _day_param(db, reservation.day),
                scope,
                key,
                entry.cost - held if lapsed else entry.cost,
                entry.cost,
                unknown,
                Decimal(0) if lapsed else -held,
                1 if entry.cost > held else 0,
            ]
        cursor.execute(
            f"INSERT INTO {table} ({_LEDGER_COLUMNS}) VALUES {', '.join(rows)} "
            f"ON CONFLICT (day, scope, key) DO UPDATE "
            f"SET amount = {table}.amount + excluded.amount, calls = {table}.calls + 1, "
            f"largest = {larger}({table}.largest, excluded.largest), "
            f"unknown_usage_calls = {table}.unknown_usage_calls + excluded.unknown_usage_calls, "
            f"reserved = {table}.reserved + excluded.reserved, "
            f"overruns = {table}.overruns + excluded.overruns",
            params,
        )


def release(reservation: Reservation | None) -> None:
    """Give back what ``reservation`` held (its call failed or was never made: nothing to
    charge). A hold that lapsed meanwhile was charged: that charge is taken back. A database
    error is logged and the holds stay (they lapse: spend is overstated, never understated)."""
    if reservation is None:
        return
    db = connections[DEFAULT_DB_ALIAS]
    table = _table(db)
    try:
        with transaction.atomic(using=db.alias), db.cursor() as cursor:
            live = _take_holds(cursor, db, reservation.token)
            for (scope, key), amount in reservation.held.items():
                column = "reserved" if (scope, key) in live else "amount"
                cursor.execute(
                    f"UPDATE {table} SET {column} = {column} - %s "
                    "WHERE day = %s AND scope = %s AND key = %s",
                    [amount, _day_param(db, reservation.day), scope, key],
                )
    except DatabaseError:
        logger.exception("could not release a budget reservation (it stays held, then lapses)")


#: Holds lapsed per transaction (``lapse_holds``).
LAPSE_BATCH = 500


def lapse_holds(*, batch: int = LAPSE_BATCH) -> int:
    """Charge every hold past its expiry at what it held, and take it off ``reserved``: its
    segment died (or outlived it) without settling it, and its call may have been made. Safe
    beside live segments and other passes: each hold is deleted by one statement only (on
    PostgreSQL ``SKIP LOCKED`` passes over a hold being settled). How many lapsed."""
    db = connections[DEFAULT_DB_ALIAS]
    table, holds, now = _table(db), _holds(db), _NOW_SQL[db.vendor]
    skip = " FOR UPDATE SKIP LOCKED" if db.vendor == "postgresql" else ""
    lapsed = 0
    while True:
        with transaction.atomic(using=db.alias), db.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {holds} WHERE id IN (SELECT id FROM {holds} "
                f"WHERE expires_at < {now} ORDER BY id LIMIT %s{skip}) "
                "RETURNING day, scope, key, amount",
                [batch],
            )
            gone = cursor.fetchall()
            per_row: dict[tuple[str, int, date], tuple[Decimal, int]] = {}
            for day, scope, key, amount in gone:
                row = (str(scope), int(key), _day(day))
                total, count = per_row.get(row, (Decimal(0), 0))
                per_row[row] = (total + _money(amount), count + 1)
            for (scope, key, day), (amount, count) in sorted(per_row.items()):
                cursor.execute(
                    f"UPDATE {table} SET reserved = reserved - %s, amount = amount + %s, "
                    "lapsed_holds = lapsed_holds + %s WHERE day = %s AND scope = %s AND key = %s",
                    [amount, amount, count, _day_param(db, day), scope, key],
                )
        lapsed += len(gone)
        if len(gone) < batch:
            return lapsed
