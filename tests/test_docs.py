"""The documentation speaks of commands and flags that exist: every `sentinel ...` command line
in README.md and docs/*.md (in code blocks and inline code) names real subcommands, and every
flag on it is in that subcommand's `--help`. The README stays a front page."""

from __future__ import annotations

import argparse
import re
import runpy
from collections.abc import Iterator
from pathlib import Path

import pytest

from sentinel.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A command starts a code line or span, or follows `python -m`, a shell separator or a prompt;
# elsewhere "sentinel" is a word (a namespace, a user, program output).
COMMAND = re.compile(
    r"(?:^\s*(?:\$ )?|python3? -m |&& |; |\| |\$\()sentinel((?: +[a-z][a-z|-]*)+)(.*?)(?=\)|$)"
)


def code_segments(text: str) -> Iterator[str]:
    """Fenced code lines (a trailing backslash continues a line) and inline code spans (which
    may run over a line break within a paragraph)."""
    fenced, pending, prose = False, "", []
    for line in [*text.splitlines(), ""]:
        if line.strip().startswith("```") or (not fenced and not line.strip()):
            yield from re.findall(r"`([^`]+)`", " ".join(prose))
            prose = []
            fenced ^= line.strip().startswith("```")
            continue
        if not fenced:
            prose.append(line)
            continue
        pending += line
        if line.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        yield pending
        pending = ""


def commands(text: str) -> Iterator[tuple[list[str], list[str]]]:
    for segment in code_segments(text):
        for m in COMMAND.finditer(segment):
            words = m.group(1).split()
            rest = re.split(r" -- |&&|;|#| \| [a-z]", m.group(2) + " ")[0]
            yield words, re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest)


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def resolve(words: list[str]) -> tuple[list[argparse.ArgumentParser], list[str]]:
    """The parsers along the subcommand path, and any word that names no subcommand."""
    chain, unknown = [build_parser()], []
    for word in words:
        subs = subparsers(chain[-1])
        if not subs:
            break  # an argument (a file, a job id): the path ends here
        names = word.split("|")
        if not all(n in subs for n in names):
            unknown.append(word)
            break
        chain.append(subs[names[0]])
    return chain, unknown


def options(chain: list[argparse.ArgumentParser], words: list[str]) -> set[str]:
    """Every option the command accepts; for `a|b|c`, those of any of them."""
    out = {s for p in chain for a in p._actions for s in a.option_strings}
    if len(chain) > 1:
        parent_subs = subparsers(chain[-2])
        for word in words:
            for name in word.split("|"):
                if name in parent_subs:
                    out |= {s for a in parent_subs[name]._actions for s in a.option_strings}
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_command_and_flag_exists(doc: Path) -> None:
    problems = []
    found = 0
    for words, flags in commands(doc.read_text()):
        chain, unknown = resolve(words)
        if unknown:
            problems.append(f"sentinel {' '.join(words)}: no command {unknown[0]!r}")
            continue
        found += 1
        known = options(chain, words)
        problems += [f"sentinel {' '.join(words)}: no option {f}" for f in flags if f not in known]
    assert problems == [], "\n".join(problems)
    assert found or doc.name not in ("README.md", "reference.md")


def test_the_checker_catches_a_wrong_flag_and_command() -> None:
    text = "Run `sentinel burnin --sim-nodes 2 --no-such-flag` and `sentinel frobnicate --x`."
    found = list(commands(text))
    assert found == [(["burnin"], ["--sim-nodes", "--no-such-flag"]), (["frobnicate"], ["--x"])]
    chain, _ = resolve(["burnin"])
    assert "--no-such-flag" not in options(chain, ["burnin"])
    assert resolve(["frobnicate"])[1] == ["frobnicate"]


def test_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in (
        "agent",
        "coordinator",
        "hooks",
        "burnin",
        "deployment",
        "reference",
        "benchmarks",
    ):
        assert (ROOT / "docs" / f"{page}.md").exists(), page
        assert f"docs/{page}.md" in readme, page


def test_the_demo_scenario_table_is_generated_from_its_results_files() -> None:
    """docs/demo.md's scenario table is what scripts/demo_figures.py writes from the results
    files a run of every drill kept (docs/figures/demo/), one per shipped scenario."""
    figures = runpy.run_path(str(ROOT / "scripts" / "demo_figures.py"))
    from sentinel.scenario import shipped_scenarios

    kept = sorted(p.stem for p in (ROOT / "docs" / "figures" / "demo").glob("*.json"))
    assert kept == sorted(shipped_scenarios()), "run: python scripts/demo_figures.py run NAME"
    page = (ROOT / "docs" / "demo.md").read_text()
    assert figures["render"](page) == page, "regenerate: python scripts/demo_figures.py table"
