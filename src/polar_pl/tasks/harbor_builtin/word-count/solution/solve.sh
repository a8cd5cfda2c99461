#!/bin/bash
cat > /app/count.py <<'PY'
import sys

print(len(open(sys.argv[1]).read().split()))
PY
