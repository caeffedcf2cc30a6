"""Cron expressions as schedule slots: ``ScheduledTurn(slots=cron("0 9 * * MON-FRI"))``.

Extra ``turnkit[cron]`` (croniter computes which wall-clock times an expression
matches). The rule reads the expression in its zone's wall-clock time and maps each
matching local time to one instant, as daily ``at=`` times are mapped: a time that a
daylight-saving change skips fires at the instant it maps to (02:30 on the night
the clocks go forward fires at 03:30), and a time it repeats fires once, at its
first occurrence. See docs/scheduling.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ._errors import ConfigurationError

try:
    from croniter import CroniterError, croniter
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError("turnkit.cron needs croniter: pip install 'turnkit[cron]'") from exc

__all__ = ["CronSlots", "cron"]

#: More than any daylight-saving change moves a zone's clock: a local time this far
#: from another cannot map to an instant on the other side of it.
_SHIFT = timedelta(hours=3)
_ALIASES = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)


@dataclass(frozen=True)
class CronSlots:
    """The slots of a five-field cron expression in a time zone: a ``SlotRule``.

    Build it with ``cron(...)``; both methods are pure functions of their argument,
    so every process computes the same slots and so the same turn ids.
    """

    expression: str
    tz: tzinfo

    def next_slot(self, after: datetime) -> datetime:
        """The first slot strictly after ``after`` (timezone-aware), in UTC."""
        start = self._local(after) - _SHIFT
        return self._nearest(self._walk(start, forward=True), lambda slot: slot > after, min)

    def latest_slot(self, now: datetime) -> datetime | None:
        """The last slot at or before ``now`` (timezone-aware), in UTC."""
        start = self._local(now) + _SHIFT
        return self._nearest(self._walk(start, forward=False), lambda slot: slot <= now, max)

    def _local(self, moment: datetime) -> datetime:
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise ConfigurationError(f"expected a timezone-aware datetime, got {moment!r}")
        return moment.astimezone(self.tz).replace(tzinfo=None)

    def _walk(self, start: datetime, *, forward: bool) -> Iterator[tuple[datetime, datetime]]:
        """Matching wall-clock times from ``start`` on (or back), each with its instant."""
        times = croniter(self.expression, start)
        while True:
            local = times.get_next(datetime) if forward else times.get_prev(datetime)
            yield local, local.replace(tzinfo=self.tz).astimezone(UTC)

    @staticmethod
    def _nearest(
        walk: Iterator[tuple[datetime, datetime]],
        wanted: Callable[[datetime], bool],
        pick: Callable[[datetime, datetime], datetime],
    ) -> datetime:
        """The best instant ``wanted`` accepts among the times walked. A skipped local
        time maps past the times just after it, so the walk goes on for ``_SHIFT``
        beyond the first accepted one before it is sure."""
        best: datetime | None = None
        first: datetime | None = None
        for local, instant in walk:
            if best is not None and first is not None and abs(local - first) > _SHIFT:
                return best
            if wanted(instant):
                best = instant if best is None else pick(best, instant)
                if first is None:
                    first = local
        raise AssertionError("unreachable: the walk never ends")  # pragma: no cover


def cron(expression: str, *, tz: str | tzinfo = "UTC") -> CronSlots:
    """The slots of ``expression`` (minute hour day-of-month month day-of-week, or an
    alias such as ``@daily``) read in ``tz`` (an IANA name or a ``tzinfo``).

    A malformed expression or an unknown zone is a ``ConfigurationError``.
    """
    if not isinstance(expression, str) or not _is_cron(expression):
        raise ConfigurationError(
            f"cron: {expression!r} is not a cron expression (five fields: minute hour "
            "day-of-month month day-of-week, such as '0 9 * * MON-FRI', or @daily)"
        )
    return CronSlots(expression=" ".join(expression.split()), tz=_zone(tz))


def _is_cron(expression: str) -> bool:
    """A five-field expression or an alias that matches some date (not ``31 2``)."""
    fields = expression.split()
    if len(fields) == 1:
        return fields[0].lower() in _ALIASES
    if len(fields) != 5 or not croniter.is_valid(expression):
        return False
    try:
        croniter(expression, datetime(2000, 1, 1)).get_next(datetime)
    except CroniterError:
        return False
    return True


def _zone(tz: object) -> tzinfo:
    if isinstance(tz, tzinfo):
        return tz
    if not isinstance(tz, str) or not tz:
        raise ConfigurationError(f"cron: tz must be an IANA zone name or a tzinfo, got {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"cron: tz {tz!r} is not a known IANA time zone (such as 'Europe/Paris')"
        ) from None
