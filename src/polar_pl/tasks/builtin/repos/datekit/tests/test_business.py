import datetime
import unittest

from datekit.business import business_days_between

D = datetime.date


class BusinessDaysTests(unittest.TestCase):
    def test_one_week(self):
        self.assertEqual(business_days_between(D(2024, 6, 3), D(2024, 6, 10)), 5)

    def test_within_week(self):
        self.assertEqual(business_days_between(D(2024, 6, 3), D(2024, 6, 6)), 3)

    def test_reversed(self):
        self.assertEqual(business_days_between(D(2024, 6, 10), D(2024, 6, 3)), -5)

    def test_weekday_holiday(self):
        self.assertEqual(business_days_between(D(2024, 6, 3), D(2024, 6, 10), [D(2024, 6, 5)]), 4)
