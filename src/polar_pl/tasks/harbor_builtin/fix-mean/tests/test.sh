#!/bin/bash
# No reward file: the exit status of the tests is the verdict.
cd /app && python3 /tests/test_stats.py
