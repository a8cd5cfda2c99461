import unittest

from graphkit import shortest_path


class ShortestPathTests(unittest.TestCase):
    def test_direct(self):
        self.assertEqual(shortest_path({"a": {"b": 3}}, "a", "b"), (3, ["a", "b"]))

    def test_unreachable(self):
        self.assertIsNone(shortest_path({"a": {"b": 1}, "c": {}}, "a", "c"))

    def test_same_node(self):
        self.assertEqual(shortest_path({}, "a", "a"), (0, ["a"]))
