#!/usr/bin/env python3
"""Checks that the documentation claims only what it can back.

  check_docs.py tools ROOT    README.md and docs/ name no tool outside this repository (a
                              denylist of ones that have crept in) and no path of one machine.
  check_docs.py figures ROOT  every measured figure in README.md (tokens/s, MFU, ms/step, how
                              long something takes on N cores or GPUs) names the commit it was
                              measured at, as "measured at COMMIT"; with a git history, that
                              commit is in it.

Exit 0 when the pages pass, 1 naming each line that does not, 2 on a usage error.
"""
import pathlib
import re
import subprocess
import sys

# Tools that are neither part of this repository nor standard ones a reader has (compilers,
# cmake, mpirun, srun, promtool, python...), and paths that exist on one machine only.
OUTSIDE_TOOLS = [
    (re.compile(r"\bfarm-[a-z]+"), "a tool outside this repository"),
    (re.compile(r"(?<=`)duplicates\b|\bduplicates --"), "a tool outside this repository"),
    (re.compile(r"\bissues (show|note|resolved|blocked)\b"), "a tool outside this repository"),
    (re.compile(r"(?<![\w.-])/work/|\.library/|/tmp/bash_jobs"), "a path of one machine"),
]
FIGURE = re.compile(r"\d[\d.,]*k? tokens/s|\d[\d.]*% MFU|\d[\d.,]* ms/step"
                    r"|\b\d+ (minutes|seconds|hours) on \d+ (cores|GPUs?)\b")
MEASURED_AT = re.compile(r"measured at ([0-9a-f]{7,40})\b")


def pages(root):
    return [root / "README.md"] + sorted((root / "docs").rglob("*.md"))


def outside_tools(root):
    problems = []
    for page in pages(root):
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for pattern, what in OUTSIDE_TOOLS:
                found = pattern.search(line)
                if found:
                    problems.append(f"{page.relative_to(root)}:{number}: '{found.group(0)}' is {what}")
    return problems, f"{len(pages(root))} pages name no tool outside this repository"


def claims(lines):
    """(first line number, text) of each paragraph, list item and table row, outside code blocks."""
    blocks, current, start, in_code = [], [], 0, False
    for number, line in enumerate(lines, 1):
        fence = line.lstrip().startswith("```")
        if fence:
            in_code = not in_code
        starts_claim = line.startswith(("- ", "|", "#")) or not line.strip() or fence or in_code
        if starts_claim and current:
            blocks.append((start, " ".join(current)))
            current = []
        if line.strip() and not fence and not in_code:
            if not current:
                start = number
            current.append(line.strip())
    if current:
        blocks.append((start, " ".join(current)))
    return blocks


def history(root):
    """A function telling whether a commit is in root's git history, and what was not checked."""
    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if git("rev-parse", "--git-dir").returncode != 0:
        return None, "no git history here: the commits were not looked up"
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        return None, "a shallow clone: the commits were not looked up (git fetch --unshallow)"
    return (lambda commit: git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0), ""


def figures(root):
    readme = root / "README.md"
    known, unchecked = history(root)
    problems, commits = [], []
    for number, text in claims(readme.read_text(encoding="utf-8").splitlines()):
        figure = FIGURE.search(text)
        if not figure:
            continue
        measured = MEASURED_AT.findall(text)
        if not measured:
            problems.append(f"README.md:{number}: '{figure.group(0)}' does not say the commit it was measured at (\"measured at COMMIT\")")
        for commit in measured:
            if known and not known(commit):
                problems.append(f"README.md:{number}: measured at {commit}: no commit of this repository's history")
            commits.append(commit)
    if not commits and not problems:
        problems.append("README.md: no measured figure found: the pattern no longer sees the page's figures")
    if problems and unchecked:
        problems.append(f"README.md: {unchecked}")
    return problems, f"README.md: {len(commits)} figures, each measured at a commit ({', '.join(commits)}) {unchecked}".strip()


def main(argv):
    checks = {"tools": outside_tools, "figures": figures}
    if len(argv) != 3 or argv[1] not in checks:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    problems, summary = checks[argv[1]](pathlib.Path(argv[2]))
    if problems:
        print("\n".join(problems))
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
