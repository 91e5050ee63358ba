#!/usr/bin/env python3
"""What ctest skipped, and why, after its summary (scripts/test.sh).

Reads the JUnit file of a ctest run (--output-junit) and the test list with its labels
(ctest --show-only=json-v1), prints every skipped test with its label and the reason it gave
(GoogleTest's GTEST_SKIP message, or the last line a script printed before exiting 77), and
exits 1 when a test without the `gpu` label skipped: setup installs every tool and fetches
every model the other tests need, so such a skip is a broken set-up, never a pass. Ends with
the 15 slowest tests and the line "ctest: N passed, N failed, N skipped".

    ctest_report.py JUNIT_XML TESTS_JSON
"""
import json
import sys
import xml.etree.ElementTree as ET


def labels_by_test(tests_json):
    with open(tests_json) as f:
        tests = json.load(f).get("tests", [])
    labels = {}
    for t in tests:
        for p in t.get("properties", []):
            if p.get("name") == "LABELS":
                labels[t["name"]] = list(p.get("value") or [])
    return labels


def skip_reason(output):
    """The reason a test gave: GoogleTest's lines after "Skipped", else the last line."""
    lines = [ln.rstrip() for ln in (output or "").splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.endswith(": Skipped") and i + 1 < len(lines) and not lines[i + 1].startswith("[  SKIPPED ]"):
            return lines[i + 1].strip()
    reasons = [ln for ln in lines if not ln.startswith("[")]
    return reasons[-1].strip() if reasons else "(no reason printed)"


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    labels = labels_by_test(argv[2])
    passed = failed = 0
    skipped, times = [], []
    for case in ET.parse(argv[1]).getroot().iter("testcase"):
        name, status = case.get("name"), case.get("status")
        times.append((float(case.get("time") or 0), name))
        if case.find("skipped") is not None or status == "notrun":
            out = case.findtext("system-out") or ""
            skipped.append((name, labels.get(name, []), skip_reason(out)))
        elif case.find("failure") is not None or status == "fail":
            failed += 1
        else:
            passed += 1
    wrong = [s for s in skipped if "gpu" not in s[1]]
    print("ctest_report: the 15 slowest tests (seconds, run in parallel):")
    for t, name in sorted(times, reverse=True)[:15]:
        print(f"  {t:8.1f}  {name}")
    if skipped:
        print(f"ctest_report: {len(skipped)} tests skipped:")
        for name, lab, reason in sorted(skipped, key=lambda s: ("gpu" in s[1], s[0])):
            print(f"  {name} [{','.join(lab) or 'no label'}]: {reason}")
    if wrong:
        print(f"ctest_report: FAILED: {len(wrong)} tests without the gpu label skipped (a tool or test data "
              "that scripts/setup.sh or scripts/fetch_test_data.sh provides is missing):")
        for name, _lab, reason in wrong:
            print(f"  {name}: {reason}")
    print(f"ctest: {passed} passed, {failed + len(wrong)} failed, {len(skipped) - len(wrong)} skipped")
    return 1 if wrong or failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
