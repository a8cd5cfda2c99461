import unittest

from calc import CalcError, evaluate


class EvaluateTests(unittest.TestCase):
    def test_precedence(self):
        self.assertEqual(evaluate("1 + 2 * 3"), 7)

    def test_parentheses(self):
        self.assertEqual(evaluate("(1 + 2) * 3"), 9)

    def test_simple_subtraction(self):
        self.assertEqual(evaluate("7 - 2"), 5)

    def test_float(self):
        self.assertAlmostEqual(evaluate("1.5 * 4"), 6.0)

    def test_unary_minus(self):
        self.assertEqual(evaluate("-3 * 2"), -6)

    def test_power(self):
        self.assertEqual(evaluate("2 ^ 10"), 1024)

    def test_variables(self):
        self.assertEqual(evaluate("x * 2 + y", {"x": 3, "y": 1}), 7)

    def test_syntax_error(self):
        with self.assertRaises(CalcError):
            evaluate("1 +")
