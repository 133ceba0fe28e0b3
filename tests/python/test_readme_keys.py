"""README.md's configuration table against `fp8wire-config --defaults`, the one source of the keys
and their defaults (common/config.cpp's key table). Fails when the README misses a key, names one the
library does not know, or gives a default the library does not use.

    test_readme_keys.py README.md FP8WIRE-CONFIG

How the table is read (README.md, "Configuration"): the key column holds backticked names; a name
starting with "." replaces the last part of the name before it (`direct.window_bytes`, `.ctas`);
`<collective>` and `<fabric>` stand for every collective and fabric. The default column holds
backticked values: one for every key of the row, or one per name, in order. Text outside backticks
is commentary.
"""
from __future__ import annotations

import itertools
import re
import subprocess
import sys
import unittest
from pathlib import Path
from typing import Dict, List, Tuple

PLACEHOLDERS = {"<collective>": ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"],
                "<fabric>": ["nvlink", "pcie", "net"]}
SIZE_UNITS = {"": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20, "G": 1 << 30, "GiB": 1 << 30,
              "T": 1 << 40, "TiB": 1 << 40}


def defaults_from_tool(tool: str) -> Dict[str, str]:
    """key -> TOML literal, from `fp8wire-config --defaults` (its comments dropped)."""
    out = subprocess.run([tool, "--defaults"], capture_output=True, text=True, check=True).stdout
    keys, section = {}, ""
    for line in out.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]") + "."
            continue
        name, _, value = (part.strip() for part in line.partition("="))
        if value.startswith('"'):  # a string may hold '#'
            value = re.match(r'"(?:[^"\\]|\\.)*"', value).group(0)
        elif value.startswith("["):
            value = value[: value.index("]") + 1]
        else:
            value = value.split("#", 1)[0].strip()
        keys[section + name] = value
    return keys


def table_rows(readme: str) -> List[Tuple[str, str]]:
    """(key cell, default cell) of every row of the table headed `| key | default | meaning |`."""
    lines = readme.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| key | default | meaning |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        rows.append((cells[0], cells[1]))
    return rows


def expand(name: str) -> List[str]:
    parts = re.split(r"(<collective>|<fabric>)", name)
    choices = [PLACEHOLDERS.get(p, [p]) for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


def readme_defaults(readme: str) -> Tuple[Dict[str, str], List[str]]:
    """key -> default as the README gives it, and the problems found reading the table."""
    keys, problems = {}, []
    for key_cell, default_cell in table_rows(readme):
        names, full = [], ""
        for n in re.findall(r"`([^`]+)`", key_cell):
            full = full.rsplit(".", 1)[0] + n if n.startswith(".") else n
            names.append(full)
        values = re.findall(r"`([^`]*)`", default_cell)
        if len(values) not in (1, len(names)):
            problems.append(f"row {key_cell}: {len(values)} default(s) for {len(names)} name(s)")
            continue
        for i, name in enumerate(names):
            for key in expand(name):
                if key in keys:
                    problems.append(f"{key} appears twice in the table")
                keys[key] = values[0 if len(values) == 1 else i]
    return keys, problems


def normalise(literal: str):
    """A default for comparison: strings unquoted, sizes and integers as numbers, spaces dropped."""
    text = re.sub(r"\s+", "", literal)
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        text = text[1:-1]
    m = re.fullmatch(r"(\d+)(K|KiB|M|MiB|G|GiB|T|TiB)?", text)
    return int(m.group(1)) * SIZE_UNITS[m.group(2) or ""] if m else text


def disagreements(readme: str, tool_keys: Dict[str, str]) -> List[str]:
    given, problems = readme_defaults(readme)
    for key in sorted(set(tool_keys) - set(given)):
        problems.append(f"{key} (default {tool_keys[key]}) is missing from README.md's table")
    for key in sorted(set(given) - set(tool_keys)):
        problems.append(f"{key} is in README.md's table but fp8wire-config does not know it")
    for key in sorted(set(given) & set(tool_keys)):
        if normalise(given[key]) != normalise(tool_keys[key]):
            problems.append(f"{key}: README.md says {given[key]}, fp8wire-config --defaults says {tool_keys[key]}")
    return problems


class ReadmeKeys(unittest.TestCase):
    readme: str = ""
    tool: str = ""

    def test_table_matches_the_defaults(self):
        tool_keys = defaults_from_tool(self.tool)
        self.assertGreater(len(tool_keys), 50)  # the tool's output was read
        problems = disagreements(self.readme, tool_keys)
        self.assertEqual(problems, [], "\n" + "\n".join(problems))

    def test_a_missing_key_and_a_wrong_default_are_caught(self):
        tool_keys = defaults_from_tool(self.tool)
        without_seed = "\n".join(l for l in self.readme.splitlines() if not l.startswith("| `seed`"))
        self.assertIn("seed (default 24301) is missing from README.md's table", disagreements(without_seed, tool_keys))
        wrong = self.readme.replace("| `scratch.max_bytes` | `512MiB` |", "| `scratch.max_bytes` | `256MiB` |")
        self.assertIn('scratch.max_bytes: README.md says 256MiB, fp8wire-config --defaults says "512MiB"',
                      disagreements(wrong, tool_keys))
        unknown = self.readme.replace("| `seed` |", "| `seeds` |")
        self.assertIn("seeds is in README.md's table but fp8wire-config does not know it",
                      disagreements(unknown, tool_keys))


if __name__ == "__main__":
    ReadmeKeys.readme = Path(sys.argv[1]).read_text()
    ReadmeKeys.tool = sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
