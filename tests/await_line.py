# SPDX-License-Identifier: MIT
"""Waits until FILE has a line containing TEXT and prints what follows TEXT
on it; exits 1 if process PID ends first. Usage: await_line.py FILE TEXT PID"""
import os
import sys
import time


def main():
    path, text, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
    while True:
        try:
            with open(path) as f:
                for line in f:
                    if text in line:
                        print(line.split(text, 1)[1].strip())
                        return 0
        except FileNotFoundError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print(f"process {pid} ended before {path} said {text!r}", file=sys.stderr)
            return 1
        time.sleep(0.01)


sys.exit(main())
