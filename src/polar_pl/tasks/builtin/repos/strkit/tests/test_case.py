import unittest

from strkit import to_snake


class ToSnakeTests(unittest.TestCase):
    def test_camel(self):
        self.assertEqual(to_snake("camelCase"), "camel_case")

    def test_pascal(self):
        self.assertEqual(to_snake("ParseResult"), "parse_result")

    def test_already_snake(self):
        self.assertEqual(to_snake("already_snake"), "already_snake")
