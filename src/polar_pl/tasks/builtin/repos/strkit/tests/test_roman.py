import unittest

from strkit import from_roman, to_roman


class RomanTests(unittest.TestCase):
    def test_small(self):
        self.assertEqual(to_roman(4), "IV")
        self.assertEqual(to_roman(14), "XIV")

    def test_year(self):
        self.assertEqual(to_roman(2024), "MMXXIV")

    def test_parse(self):
        self.assertEqual(from_roman("XLII"), 42)

    def test_range(self):
        with self.assertRaises(ValueError):
            to_roman(0)
