#!/usr/bin/env python3
"""The extension's version is written once, as outbox.control's
default_version; everything else that names it must agree, and this test
says where it does not: META.json (the distribution and the extension it
provides, and the script it names), debian/changelog's newest entry,
CHANGELOG.md's newest entry, the full script outbox--<version>.sql, an
upgrade path to it from every earlier script, and the package file name the
README shows.  Tests and scripts that need the version read outbox.control
(test/package-test.sh, test/major-upgrade-test.sh).

Run by ctest (CMakeLists.txt) and by hand: test/version-test.py [source dir]."""

import json
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)


def main():
    errors = []
    control = (ROOT / "outbox.control").read_text()
    version = re.search(r"^default_version\s*=\s*'([^']+)'", control, re.M).group(1)
    release = version + ".0"  # the package's and PGXN's three-part form

    meta = json.loads((ROOT / "META.json").read_text())
    if meta["version"] != release:
        errors.append(f"META.json version {meta['version']}, not {release}")
    provided = meta["provides"]["outbox"]
    if provided["version"] != release:
        errors.append(f"META.json provides.outbox.version {provided['version']}, not {release}")
    if provided["file"] != f"outbox--{version}.sql":
        errors.append(f"META.json provides.outbox.file {provided['file']}, not outbox--{version}.sql")

    newest = (ROOT / "debian" / "changelog").read_text().splitlines()[0]
    m = re.match(r"pg-outbox \(([^)-]+)(-[^)]*)?\)", newest)
    if not m or m.group(1) != release:
        errors.append(f"debian/changelog's newest entry is '{newest}', not {release}")

    changelog = (ROOT / "CHANGELOG.md").read_text()
    m = re.search(r"^## \[?([0-9.]+)\]?", changelog, re.M)
    if not m or m.group(1) != version:
        errors.append(f"CHANGELOG.md's newest entry is {m.group(1) if m else 'missing'}, not {version}")

    if not (ROOT / f"outbox--{version}.sql").exists():
        errors.append(f"outbox--{version}.sql (the full script of default_version) is missing")

    # Every version with a script reaches default_version through the
    # upgrade scripts (what ALTER EXTENSION outbox UPDATE follows).
    edges, versions = {}, set()
    for path in ROOT.glob("outbox--*.sql"):
        parts = path.stem.split("--")[1:]
        versions.update(parts)
        if len(parts) == 2:
            edges.setdefault(parts[0], set()).add(parts[1])
    for start in sorted(versions):
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        if version not in seen:
            errors.append(f"no upgrade path from {start} to {version}")
    newer = [v for v in versions if tuple(map(int, v.split("."))) > tuple(map(int, version.split(".")))]
    if newer:
        errors.append(f"scripts for {', '.join(sorted(newer))}, newer than default_version {version}")

    readme = (ROOT / "README.md").read_text()
    for shown in set(re.findall(r"postgresql-\d+-outbox_([0-9.]+)_amd64\.deb", readme)):
        if shown != release:
            errors.append(f"README.md shows a package of version {shown}, not {release}")

    for e in errors:
        print("FAIL:", e)
    print(f"outbox.control default_version {version}: " + ("agreed everywhere" if not errors
                                                           else "disagreement"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
