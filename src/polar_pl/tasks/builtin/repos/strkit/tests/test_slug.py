import unittest

from strkit import slugify


class SlugifyTests(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_accents(self):
        self.assertEqual(slugify("Crème brûlée"), "creme-brulee")

    def test_custom_separator(self):
        self.assertEqual(slugify("a b c", sep="_"), "a_b_c")
