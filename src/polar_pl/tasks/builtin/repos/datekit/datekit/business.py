"""Business days: Monday to Friday, minus holidays."""


def business_days_between(start, end, holidays=()):
    """Number of business days d with start <= d < end (negative when end < start)."""
    if end < start:
        return -business_days_between(end, start, holidays)
    days = (end - start).days
    weeks, extra = divmod(days, 7)
    count = weeks * 5
    first = start.weekday()
    for i in range(extra):
        if first + i < 5:
            count += 1
    count -= sum(1 for h in set(holidays) if start <= h < end)
    return count
