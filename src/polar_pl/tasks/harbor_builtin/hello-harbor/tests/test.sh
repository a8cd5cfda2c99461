#!/bin/bash
# Reward through reward.txt: 1 when the greeting is exactly right, else 0.
if [ "$(cat /app/greeting.txt 2>/dev/null)" = "Hello, Harbor!" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
