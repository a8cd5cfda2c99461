import unittest

from confini import ConfigError, parse


class ParseTests(unittest.TestCase):
    def test_sections_and_keys(self):
        text = "[server]\nhost = example.org\nport = 8080\n"
        self.assertEqual(parse(text)["server"], {"host": "example.org", "port": "8080"})

    def test_comments(self):
        text = "# top\n; also a comment\n[a]\nx = 1  # inline\n"
        self.assertEqual(parse(text)["a"], {"x": "1"})

    def test_quotes_removed(self):
        self.assertEqual(parse('[a]\nname = "Ada Lovelace"\n')["a"]["name"], "Ada Lovelace")

    def test_keys_lowercased(self):
        self.assertEqual(parse("[a]\nUser = bob\n")["a"], {"user": "bob"})

    def test_bad_line(self):
        with self.assertRaises(ConfigError):
            parse("[a]\njust words\n")
