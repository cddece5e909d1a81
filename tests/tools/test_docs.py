"""The docs say what is true now, not when or on which commit it became so: README.md and every
docs/*.md hold no commit hash, no date and no line over 400 characters (history lives in commit
bodies and docs/results/results.json)."""

import pathlib
import re

import paths
import pytest

ROOT = pathlib.Path(paths.ROOT)
PAGES = ["README.md"] + sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
MAX_LINE = 400

# 7 to 40 lowercase hex characters, a whole word, with a letter and a digit: a commit's (short) hash.
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
CHECKSUM = re.compile(r"sha256 $")  # "sha256 f6d9e39f...": a data set's checksum, not a commit
DATE = re.compile(r"20\d\d-\d\d-\d\d")


def findings(text):
    """(line number, what, offending text) of every hash, date and overlong line of `text`."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in HASH.finditer(line):
            if not CHECKSUM.search(line[: match.start()]):
                found.append((number, "commit hash", match.group()))
        found += [(number, "date", match.group()) for match in DATE.finditer(line)]
        if len(line) > MAX_LINE:
            found.append((number, f"line of {len(line)} characters", line[:80] + "..."))
    return found


@pytest.mark.parametrize("page", PAGES)
def test_page_is_a_reference_not_a_run_log(page):
    found = findings((ROOT / page).read_text(encoding="utf-8"))
    assert not found, "\n".join(f"{page}:{number}: {what}: {text!r}" for number, what, text in found)


def test_the_check_sees_hashes_dates_and_long_lines():
    text = "\n".join(
        [
            "measured on 219ef1c, and f090108's code (b89ef7d)",
            "on 2026-11-26",
            "x" * (MAX_LINE + 1),
            "digits data: sha256 f6d9e39f37dc45d3; 25557032 floats; deadbeef; 0x7FC0; cafe; ab12cd",
        ]
    )
    assert [(number, what) for number, what, _ in findings(text)] == [
        (1, "commit hash"),
        (1, "commit hash"),
        (1, "commit hash"),
        (2, "date"),
        (3, f"line of {MAX_LINE + 1} characters"),
    ]
    assert [text for _, _, text in findings(text)][:3] == ["219ef1c", "f090108", "b89ef7d"]
