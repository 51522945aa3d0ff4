"""Cost and daily budgets (docs/design.md §14): what a model call costs, the spend ledger
(``SpendDay``) and the check made before each provider call.

* ``call_cost`` prices one answer from its configuration's prices and the provider's usage
  (``None``: the configuration is not priced). A provider that reports no usage costs 0 and says
  so (``Priced.usage_known``).
* ``reserve`` is the check: one statement, made only when a budget applies (the configuration's
  ``daily_budget``, ``AGENTRUNS["USER_DAILY_BUDGET"]`` for a run with an initiator). It adds to
  each budget's row of today (UTC, the database's clock) the largest single call charged to it
  today, **only where the row's spend is still under its limit** — an ``INSERT … ON CONFLICT DO
  UPDATE … WHERE`` on the row's unique key, so of two runs racing for the last of a budget the
  second sees the first's reservation. It answers ``Exhausted`` (nothing held) or the
  ``Reservation``.
* ``charge`` records an answer: in each row, the call's cost minus what its reservation held,
  one more call and the largest call; written in the same transaction as the events that record
  the answer. ``release`` gives a reservation back when the call failed.

Every statement is raw SQL on the unique key ``(day, scope, key)`` (PostgreSQL, SQLite 3.35 or
later for ``RETURNING``); a database error propagates (the caller fails closed: no provider call
without a check that answered). Must never write a run's state (that is ``transitions``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import date
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from agentruns import conf
from agentruns.models import AgentConfiguration, SpendDay, SpendScope

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


def currency() -> str:
    """The currency every price, cost and budget is in (``AGENTRUNS["COST_CURRENCY"]``)."""
    return str(conf.get("COST_CURRENCY") or "USD")


def as_money(value: Any) -> Decimal:
    """``value`` as a stored cost: six places, within ``0 … MAX_COST``."""
    amount = Decimal(str(value)).quantize(QUANTUM, rounding=ROUND_HALF_UP)
    return min(max(amount, Decimal(0)), MAX_COST)


def user_daily_budget() -> Decimal | None:
    """``AGENTRUNS["USER_DAILY_BUDGET"]``: ``None`` when empty. A value that is not a
    non-negative decimal raises ``ImproperlyConfigured`` (the segment then fails the run before
    any provider call: fail closed)."""
    raw = conf.get("USER_DAILY_BUDGET")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    try:
        limit = Decimal(str(raw).strip())
    except InvalidOperation as exc:
        raise ImproperlyConfigured(f"AGENTRUNS_USER_DAILY_BUDGET={raw!r} is not a decimal") from exc
    if not limit.is_finite() or limit < 0:
        raise ImproperlyConfigured(f"AGENTRUNS_USER_DAILY_BUDGET={raw!r} must be 0 or more")
    return limit


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
class Reservation:
    """What ``reserve`` held back per budget row ``(scope, key)``, on the UTC ``day`` it was
    made: ``charge`` and ``release`` correct exactly those rows."""

    day: date
    held: dict[tuple[str, int], Decimal] = field(default_factory=dict)


@dataclass(frozen=True)
class Exhausted:
    """A budget is spent: its spend today is at or above its limit."""

    budget: Budget
    spend: Decimal
    day: date | None

    def payload(self) -> dict[str, Any]:
        """The ``budget`` event's payload (and the run's error)."""
        return {
            "budget": str(self.budget.scope),
            "key": self.budget.key,
            "spend": str(self.spend),
            "limit": str(self.budget.limit),
            "currency": currency(),
            "day": self.day.isoformat() if self.day is not None else None,
        }

    def message(self) -> str:
        whose = (
            "the configuration's" if self.budget.scope == SpendScope.CONFIGURATION else "the user's"
        )
        return (
            f"{whose} daily budget is spent: {self.spend} of {self.budget.limit} {currency()}"
            + (f" on {self.day.isoformat()} (UTC)" if self.day is not None else "")
        )


def _table(db: Any) -> str:
    return db.ops.quote_name(SpendDay._meta.db_table)


def _money(value: Any) -> Decimal:
    return Decimal(str(value)).quantize(QUANTUM, rounding=ROUND_HALF_UP)


def _day_param(db: Any, day: date) -> Any:
    return day if db.vendor == "postgresql" else day.isoformat()


def _day(value: Any) -> date:
    return value if isinstance(value, date) else date.fromisoformat(str(value))


def reserve(budgets: Sequence[Budget]) -> Reservation | Exhausted:
    """The check before a provider call (see the module docstring): one ``INSERT … ON CONFLICT
    DO UPDATE … WHERE spend < limit … RETURNING``. Every budget admitted: the ``Reservation``
    (committed at once, outside any caller's transaction). One refused: nothing is held (the
    statement is rolled back) and the first refusing budget is answered with its spend."""
    if not budgets:
        raise ValueError("nothing to reserve against")
    db = connections[DEFAULT_DB_ALIAS]
    for budget in budgets:
        if budget.limit <= 0:  # a zero budget admits nothing (a new row would be inserted)
            return _exhausted(db, budget)
    table, day = _table(db), _DAY_SQL[db.vendor]
    rows = ", ".join(f"({day}, %s, %s, 0, 0, 0, 0)" for _ in budgets)
    limits = " ".join(f"WHEN {table}.scope = %s AND {table}.key = %s THEN %s" for _ in budgets)
    params: list[Any] = []
    for budget in budgets:
        params += [str(budget.scope), budget.key]
    for budget in budgets:
        params += [str(budget.scope), budget.key, budget.limit]
    sql = (
        f"INSERT INTO {table} (day, scope, key, amount, calls, largest, unknown_usage_calls) "
        f"VALUES {rows} ON CONFLICT (day, scope, key) DO UPDATE "
        f"SET amount = {table}.amount + {table}.largest "
        f"WHERE {table}.amount < CAST(CASE {limits} END AS NUMERIC) "
        f"RETURNING day, scope, key, largest"
    )
    # One budget needs no transaction of its own: refused, its row was not changed. Two need
    # one, so that a refusal by either holds nothing on the other.
    with transaction.atomic(using=db.alias) if len(budgets) > 1 else nullcontext():
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            admitted = cursor.fetchall()
        if len(admitted) == len(budgets):
            held = {(str(scope), int(key)): _money(largest) for _, scope, key, largest in admitted}
            return Reservation(day=_day(admitted[0][0]), held=held)
        if len(budgets) > 1:
            transaction.set_rollback(True, using=db.alias)
    taken = {(str(row[1]), int(row[2])) for row in admitted}
    refused = next(b for b in budgets if (str(b.scope), b.key) not in taken)
    return _exhausted(db, refused)


def _exhausted(db: Any, budget: Budget) -> Exhausted:
    with db.cursor() as cursor:
        cursor.execute(
            f"SELECT day, amount FROM {_table(db)} WHERE day = {_DAY_SQL[db.vendor]} "
            "AND scope = %s AND key = %s",
            [str(budget.scope), budget.key],
        )
        row = cursor.fetchone()
    if row is None:
        return Exhausted(budget, Decimal(0).quantize(QUANTUM), None)
    return Exhausted(budget, _money(row[1]), _day(row[0]))


# --- Charging and releasing ---------------------------------------------------------------------


@dataclass(frozen=True)
class Charge:
    """An answer to record in the ledger: its cost (0 when unpriced or usage unknown), and the
    reservation made before its call (``None``: no budget applied)."""

    configuration_id: int
    initiator_id: int | None
    cost: Decimal
    usage_known: bool = True
    reservation: Reservation | None = None


def charge(entry: Charge) -> None:
    """Add ``entry`` to the configuration's and the initiator's rows (one statement): the cost
    less what the reservation held, one call, the largest call. Call it inside the transaction
    that writes the answer's event. On the reservation's day when there is one, else today."""
    db = connections[DEFAULT_DB_ALIAS]
    keys: list[tuple[str, int]] = [(SpendScope.CONFIGURATION, entry.configuration_id)]
    if entry.initiator_id is not None:
        keys.append((SpendScope.USER, entry.initiator_id))
    table, larger = _table(db), _LARGER_SQL[db.vendor]
    held = entry.reservation.held if entry.reservation is not None else {}
    rows, params = [], []
    for scope, key in keys:
        reserved = held.get((str(scope), key))
        if reserved is not None and entry.reservation is not None:
            rows.append("(%s, %s, %s, %s, 1, %s, %s)")
            params.append(_day_param(db, entry.reservation.day))
        else:
            rows.append(f"({_DAY_SQL[db.vendor]}, %s, %s, %s, 1, %s, %s)")
            reserved = Decimal(0)
        params += [
            str(scope),
            key,
            entry.cost - reserved,
            entry.cost,
            0 if entry.usage_known else 1,
        ]
    sql = (
        f"INSERT INTO {table} (day, scope, key, amount, calls, largest, unknown_usage_calls) "
        f"VALUES {', '.join(rows)} ON CONFLICT (day, scope, key) DO UPDATE "
        f"SET amount = {table}.amount + excluded.amount, calls = {table}.calls + 1, "
        f"largest = {larger}({table}.largest, excluded.largest), "
        f"unknown_usage_calls = {table}.unknown_usage_calls + excluded.unknown_usage_calls"
    )
    with db.cursor() as cursor:
        cursor.execute(sql, params)


def release(reservation: Reservation | None) -> None:
    """Give back what ``reservation`` held (its call failed or was never made: nothing to
    charge). A database error is logged and the reservation stays: spend is overstated, never
    understated."""
    if reservation is None:
        return
    try:
        _release(reservation)
    except DatabaseError:
        logger.exception("could not release a budget reservation (it stays charged)")


def _release(reservation: Reservation) -> None:
    held = [(scope, key, amount) for (scope, key), amount in reservation.held.items() if amount]
    if not held:
        return
    db = connections[DEFAULT_DB_ALIAS]
    table = _table(db)
    with db.cursor() as cursor:
        for scope, key, amount in held:
            cursor.execute(
                f"UPDATE {table} SET amount = amount - %s WHERE day = %s AND scope = %s "
                "AND key = %s",
                [amount, _day_param(db, reservation.day), scope, key],
            )
