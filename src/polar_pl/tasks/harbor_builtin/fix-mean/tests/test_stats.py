import sys
import unittest

sys.path.insert(0, "/app")
from stats import mean


class MeanTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 6]), 3)
        self.assertEqual(mean([5]), 5)


if __name__ == "__main__":
    unittest.main()
