import unittest

from datekit import format_duration, parse_duration


class DurationTests(unittest.TestCase):
    def test_format(self):
        self.assertEqual(format_duration(3725), "1h 2m 5s")

    def test_format_days(self):
        self.assertEqual(format_duration(90000), "1d 1h")

    def test_parse(self):
        self.assertEqual(parse_duration("1h 2m 5s"), 3725)

    def test_parse_rejects_garbage(self):
        with self.assertRaises(ValueError):
            parse_duration("soon")
