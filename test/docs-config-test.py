#!/usr/bin/env python3
"""docs/configuration.md's table of settings agrees with the GUCs the
extension defines (every DefineCustom*Variable call under src/).

Fails when a GUC is missing from the table, the table names one the code
does not define, or a type, default, unit or context differs.  Run by ctest
(CMakeLists.txt) and by hand: test/docs-config-test.py [source dir]."""

import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)

TYPES = {"String": "string", "Int": "integer", "Bool": "bool", "Enum": "enum", "Real": "real"}
CONTEXTS = {"PGC_POSTMASTER": "restart", "PGC_SIGHUP": "reload", "PGC_SUSET": "superuser",
            "PGC_USERSET": "any role"}
UNITS = {"GUC_UNIT_MS": "ms", "GUC_UNIT_S": "s", "GUC_UNIT_BYTE": "bytes", "GUC_UNIT_KB": "kB"}
# The table's default column in Postgres' own units, to the GUC's base unit.
SCALE = {"ms": {"ms": 1, "s": 1000, "min": 60000, "h": 3600000, "d": 86400000},
         "s": {"s": 1, "min": 60, "h": 3600, "d": 86400},
         "bytes": {"B": 1, "kB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3},
         "kB": {"kB": 1, "MB": 1024, "GB": 1024 ** 2}}


def split_args(text):
    """The top-level arguments of a C call, string literals joined."""
    args, cur, depth, i = [], "", 0, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            cur += text[i:j + 1]
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += c
        i += 1
    args.append(cur.strip())
    return [re.sub(r'"\s+"', "", a) for a in args]


def defined_gucs():
    gucs = {}
    for path in sorted((ROOT / "src").rglob("*.cpp")):
        text = re.sub(r"//[^\n]*", "", path.read_text())
        macros = {}  # the first definition: the build with lz4, as the table says
        for k, v in re.findall(r"#define\s+(\w+)\s+(\w+)", text):
            macros.setdefault(k, v)
        # Enum options: {"name", CONSTANT, hidden} entries of config_enum_entry tables.
        options = {}
        for n, k in re.findall(r'\{\s*"([^"]+)"\s*,\s*(\w+)\s*,\s*(?:false|true)\s*\}', text):
            options.setdefault(k, n)
        for m in re.finditer(r"DefineCustom(\w+)Variable\s*\(", text):
            depth, j = 1, m.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            args = split_args(text[m.end():j - 1])
            kind = TYPES[m.group(1)]
            name = args[0].strip('"')
            default = args[4]
            if kind in ("integer", "real"):
                context, flags = args[7], args[8]
                default = eval(default, {"INT_MAX": 2 ** 31 - 1})  # noqa: S307 (our own source)
            elif kind == "enum":
                context, flags = args[6], args[7]
                default = macros.get(default, default)
                default = macros.get(default, default)
                default = options.get(default) or default.rsplit("_", 1)[-1].lower()
            else:
                context, flags = args[5], args[6]
                if kind == "bool":
                    default = {"true": "on", "false": "off"}[default]
                else:
                    default = default.strip('"')
            unit = next((u for f, u in UNITS.items() if f in flags), "")
            gucs[name] = dict(type=kind, default=default, context=CONTEXTS[context], unit=unit,
                              superuser_only="GUC_SUPERUSER_ONLY" in flags, where=path.name)
    return gucs


def documented_gucs():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    gucs = {}
    for line in doc.splitlines():
        if not line.startswith("| `outbox."):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name, kind, default, unit, applies = cells[:5]
        gucs[name.strip("`")] = dict(type=kind, default=default.strip("`"), unit=unit,
                                     applies=applies)
    return gucs


def doc_default(kind, unit, text):
    if kind == "string":
        return "" if text == "''" else text
    if kind != "integer":
        return text
    m = re.fullmatch(r"(-?\d+)\s*([A-Za-z]*)", text)
    if not m:
        return text
    n, u = int(m.group(1)), m.group(2)
    return n * SCALE[unit][u] if u else n


def main():
    code, doc = defined_gucs(), documented_gucs()
    errors = []
    for name in sorted(set(code) - set(doc)):
        errors.append(f"{name} ({code[name]['where']}) is missing from docs/configuration.md")
    for name in sorted(set(doc) - set(code)):
        errors.append(f"docs/configuration.md names {name}, which no DefineCustom*Variable defines")
    for name in sorted(set(code) & set(doc)):
        c, d = code[name], doc[name]
        if c["type"] != d["type"]:
            errors.append(f"{name}: type {c['type']} in the code, {d['type']} in the table")
        unit = c["unit"]
        if unit and d["unit"] != unit:
            errors.append(f"{name}: unit {unit} in the code, '{d['unit']}' in the table")
        if c["default"] != doc_default(c["type"], unit, d["default"]):
            errors.append(f"{name}: default {c['default']!r} in the code, {d['default']} in the table")
        if not d["applies"].startswith(c["context"]):
            errors.append(f"{name}: applies on {c['context']} in the code, {d['applies']} in the table")
        if c["superuser_only"] != ("superuser-only" in d["applies"]):
            errors.append(f"{name}: GUC_SUPERUSER_ONLY is {c['superuser_only']} in the code, "
                          f"the table says '{d['applies']}'")
    for e in errors:
        print("FAIL:", e)
    if not code:
        print("FAIL: no DefineCustom*Variable found under src/")
        return 1
    print(f"{len(code)} settings, {len(doc)} rows: " + ("agree" if not errors else "disagree"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
