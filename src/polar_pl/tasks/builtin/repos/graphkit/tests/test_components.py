import unittest

from graphkit import connected_components


class ComponentsTests(unittest.TestCase):
    def test_isolated(self):
        self.assertEqual(connected_components([1, 2], []), [[1], [2]])

    def test_pair(self):
        self.assertEqual(connected_components([1, 2, 3], [(1, 2)]), [[1, 2], [3]])
