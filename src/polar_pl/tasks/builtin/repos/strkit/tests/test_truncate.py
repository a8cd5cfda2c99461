import unittest

from strkit import truncate


class TruncateTests(unittest.TestCase):
    def test_fits(self):
        self.assertEqual(truncate("short", 10), "short")

    def test_exact_fit(self):
        self.assertEqual(truncate("abcde", 5), "abcde")
