#!/bin/bash
printf 'Hello, Harbor!' > /app/greeting.txt
