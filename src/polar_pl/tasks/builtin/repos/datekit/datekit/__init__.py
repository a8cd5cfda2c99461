"""datekit: calendar helpers on top of datetime."""

from datekit.business import business_days_between
from datekit.calendar import days_in_month, is_leap
from datekit.duration import format_duration, parse_duration
from datekit.months import add_months, month_range

__all__ = [
    "add_months",
    "business_days_between",
    "days_in_month",
    "format_duration",
    "is_leap",
    "month_range",
    "parse_duration",
]
