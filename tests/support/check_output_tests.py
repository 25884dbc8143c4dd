#!/usr/bin/env python3
"""Fails naming every test that matches its output (PASS_REGULAR_EXPRESSION) without checking
its exit status: CTest ignores the exit status of such a test, so a crash after the matched
line passes. A test checks it when its command is tests/support/expect_exit.sh and its
FAIL_REGULAR_EXPRESSION holds the line that script prints on a wrong status, as
llmtrain_output_test (cmake/output_test.cmake) declares it.

usage: check_output_tests.py --ctest CTEST BUILD_DIR   (its `ctest --show-only=json-v1`)
       check_output_tests.py --json FILE               (a file of that output)
"""
import json
import subprocess
import sys

WRAPPER_SUFFIX = "/tests/support/expect_exit.sh"
FAILURE_LINE = "expect_exit: FAILED"


def listed_tests(argv):
    if len(argv) == 3 and argv[1] == "--json":
        with open(argv[2], encoding="utf-8") as f:
            return json.load(f)["tests"]
    if len(argv) == 4 and argv[1] == "--ctest":
        run = subprocess.run([argv[2], "--show-only=json-v1"], cwd=argv[3], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"llmtrain: ctest --show-only=json-v1 in {argv[3]} exited {run.returncode}: {run.stderr.strip()}")
        return json.loads(run.stdout)["tests"]
    print(__doc__.split("\n\n")[-1].strip(), file=sys.stderr)
    sys.exit(2)


def problem(test):
    properties = {p["name"]: p["value"] for p in test.get("properties", [])}
    if "PASS_REGULAR_EXPRESSION" not in properties:
        return None
    command = test.get("command", [])
    if not command or not command[0].endswith(WRAPPER_SUFFIX):
        return f"its command is '{command[0] if command else ''}', not tests/support/expect_exit.sh"
    if FAILURE_LINE not in properties.get("FAIL_REGULAR_EXPRESSION", []):
        return "its FAIL_REGULAR_EXPRESSION does not match the line expect_exit.sh prints on a wrong exit status"
    return ""


def main(argv):
    tests = listed_tests(argv)
    if not tests:
        sys.exit("llmtrain: no tests listed: nothing was checked")
    found = [(t["name"], problem(t)) for t in tests]
    matched = [name for name, p in found if p is not None]
    bad = [f"  {name}: {p}" for name, p in found if p]
    if bad:
        print("llmtrain: tests matching their output (PASS_REGULAR_EXPRESSION) without checking their exit status, "
              "which CTest then ignores; declare them with llmtrain_output_test (cmake/output_test.cmake):")
        print("\n".join(bad))
        return 1
    print(f"llmtrain: {len(matched)} of {len(tests)} tests match their output; each checks its exit status too")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
