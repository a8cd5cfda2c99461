import datetime
import unittest

from datekit import add_months, month_range


class AddMonthsTests(unittest.TestCase):
    def test_forward(self):
        self.assertEqual(add_months(datetime.date(2024, 3, 15), 2), datetime.date(2024, 5, 15))

    def test_over_year_end(self):
        self.assertEqual(add_months(datetime.date(2024, 11, 10), 3), datetime.date(2025, 2, 10))

    def test_month_range(self):
        self.assertEqual(month_range(2024, 4), (datetime.date(2024, 4, 1), datetime.date(2024, 4, 30)))
