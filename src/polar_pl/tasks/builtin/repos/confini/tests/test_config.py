import unittest

from confini import ConfigError, loads


class ConfigTests(unittest.TestCase):
    def test_get_and_default_section(self):
        cfg = loads("timeout = 5\n[db]\nname = app\n")
        self.assertEqual(cfg.get("db", "name"), "app")
        self.assertEqual(cfg.get_int("db", "timeout"), 5)

    def test_missing_default(self):
        self.assertEqual(loads("[a]\n").get("a", "nope", "fallback"), "fallback")

    def test_bool(self):
        cfg = loads("[f]\non = true\noff = false\n")
        self.assertTrue(cfg.get_bool("f", "on"))
        self.assertFalse(cfg.get_bool("f", "off"))

    def test_bad_int(self):
        with self.assertRaises(ConfigError):
            loads("[a]\nn = many\n").get_int("a", "n")

    def test_reference(self):
        cfg = loads("[paths]\nroot = /srv\nlogs = ${root}/logs\n[app]\nout = ${paths:logs}\n")
        self.assertEqual(cfg.get("paths", "logs"), "/srv/logs")
