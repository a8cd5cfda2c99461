import unittest

from graphkit import CycleError, toposort


class ToposortTests(unittest.TestCase):
    def test_chain(self):
        self.assertEqual(toposort({"c": {"b"}, "b": {"a"}, "a": set()}), ["a", "b", "c"])

    def test_ties_sorted(self):
        self.assertEqual(toposort({"x": set(), "b": set(), "a": set()}), ["a", "b", "x"])

    def test_cycle(self):
        with self.assertRaises(CycleError) as cm:
            toposort({"a": {"b"}, "b": {"a"}})
        self.assertEqual(cm.exception.cycle, ["a", "b", "a"])
