"""Month arithmetic."""

import datetime

from datekit.calendar import days_in_month


def add_months(day, months):
    """The same day-of-month `months` later (or earlier, when negative)."""
    total = day.month - 1 + months
    year = day.year + int(total / 12)
    month = total % 12 + 1
    return day.replace(year=year, month=month)


def month_range(year, month):
    """(first day, last day) of the month."""
    first = datetime.date(year, month, 1)
    return first, first.replace(day=days_in_month(year, month))
