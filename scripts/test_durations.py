"""Write tests/durations.json (seconds per test module: setup, call and teardown of each of its
tests) from a run's JUnit XML, which `make test` balances its workers by:

    .venv/bin/python -m pytest tests -n 2 --junitxml=/tmp/suite.xml
    .venv/bin/python scripts/test_durations.py /tmp/suite.xml
"""
from __future__ import annotations

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "durations.json"


def main(junit: str) -> None:
    seconds: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).iter("testcase"):
        module = next(part for part in case.get("classname", "").split(".") if part.startswith("test_"))
        seconds[f"{module}.py"] += float(case.get("time", 0))
    OUT.write_text(json.dumps({m: round(s, 1) for m, s in sorted(seconds.items())}, indent=1) + "\n")
    print(f"{OUT}: {len(seconds)} modules, {sum(seconds.values()):.0f} s in all")


if __name__ == "__main__":
    main(sys.argv[1])
