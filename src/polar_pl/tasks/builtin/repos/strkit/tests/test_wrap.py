import unittest

from strkit import wrap


class WrapTests(unittest.TestCase):
    def test_short_text_is_one_line(self):
        self.assertEqual(wrap("hello world", 40), ["hello world"])

    def test_breaks_between_words(self):
        self.assertEqual(wrap("one two three four", 9), ["one two", "three", "four"])

    def test_long_word_alone(self):
        self.assertEqual(wrap("a supercalifragilistic b", 5), ["a", "supercalifragilistic", "b"])

    def test_bad_width(self):
        with self.assertRaises(ValueError):
            wrap("x", 0)
