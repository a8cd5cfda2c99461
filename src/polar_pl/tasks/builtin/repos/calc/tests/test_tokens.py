import unittest

from calc.errors import CalcError
from calc.tokens import tokenize


class TokenizeTests(unittest.TestCase):
    def test_numbers_and_ops(self):
        self.assertEqual(tokenize("12+3.5"), [("num", 12), ("op", "+"), ("num", 3.5)])

    def test_names(self):
        self.assertEqual(tokenize("rate_2 * x"), [("name", "rate_2"), ("op", "*"), ("name", "x")])

    def test_bad_character(self):
        with self.assertRaises(CalcError):
            tokenize("2 $ 3")
