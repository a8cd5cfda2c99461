#!/bin/bash
# Partial reward through reward.json: the share of the $CASES cases counted right.
passed=0
check() {  # text, expected
  printf '%b' "$1" > /tmp/case.txt
  [ "$(python3 /app/count.py /tmp/case.txt 2>/dev/null)" = "$2" ] && passed=$((passed + 1))
}
check 'one two three' 3
check '' 0
check '  spaced\tout\n\nwords  ' 3
check 'a\nb\nc\nd\ne' 5
python3 -c "import json, sys; print(json.dumps({'reward': $passed / int(sys.argv[1]), 'passed': $passed}))" "$CASES" \
  > /logs/verifier/reward.json
