import unittest

from datekit import days_in_month, is_leap


class CalendarTests(unittest.TestCase):
    def test_leap_years(self):
        self.assertTrue(is_leap(2024))
        self.assertFalse(is_leap(2023))

    def test_february(self):
        self.assertEqual(days_in_month(2024, 2), 29)
        self.assertEqual(days_in_month(2023, 2), 28)

    def test_bad_month(self):
        with self.assertRaises(ValueError):
            days_in_month(2024, 13)
