"""The user docs (README.md and docs/*.md) say what the code does.

- Settings: every field of ``jobs.core.settings.Settings`` is documented in
  docs/CONFIGURATION.md as ``INFERQ_<NAME>``, and every ``INFERQ_*`` variable the docs
  name is a field or is read by the code (a click ``envvar``, ``os.environ``, a script).
- The command line: every command, argument and option of ``cli.main.main`` (walked
  through click's own API) has its section in docs/CLI.md; every command a section or
  a command line anywhere in the docs names exists, with the options it is given there.
- HTTP routes: docs/API.md's route table is the Flask app's URL map, and every
  ``METHOD /path`` the docs name is a route.
- Paths: every file of this repository and every module the docs name exists.

docs/ARCHITECTURE.md is left out (tests/unit/test_module_map.py keeps its module map).
Each extractor is checked against entries it must find, so a parser that finds
nothing cannot pass by finding nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest
from flask import Flask

from jobs.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS_DIR = ROOT / "docs"
CLI_DOC = DOCS_DIR / "CLI.md"
CONFIG_DOC = DOCS_DIR / "CONFIGURATION.md"
API_DOC = DOCS_DIR / "API.md"
NOT_CHECKED = {"ARCHITECTURE.md"}


def user_docs() -> dict[str, str]:
    docs = {"README.md": (ROOT / "README.md").read_text()}
    for p in sorted(DOCS_DIR.glob("*.md")):
        if p.name not in NOT_CHECKED:
            docs[f"docs/{p.name}"] = p.read_text()
    return docs


def outside_fences(text: str) -> Iterator[str]:
    """The lines of ``text`` that are not inside a fenced code block."""
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield line


# Settings -----------------------------------------------------------------------------------

VARIABLE = re.compile(r"\bINFERQ_[A-Z0-9_]+\*?")
CODE_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".ini"}
CODE_NAMES = {"Makefile"}
CODE_DIRS = ("api", "jobs", "workers", "storage", "cli", "inferq", "bench", "tests",
             "migrations", "docker")


def setting_variables() -> set[str]:
    return {f"INFERQ_{name.upper()}" for name in Settings.model_fields}


def documented_variables(text: str) -> set[str]:
    """Every ``INFERQ_*`` name in ``text``; a family (``INFERQ_USAGE_*``) ends in ``*``."""
    return {m.group() for m in VARIABLE.finditer(text)}


def configuration_table(text: str) -> set[str]:
    """The variables of docs/CONFIGURATION.md's table rows (their first column)."""
    found = set()
    for line in outside_fences(text):
        if line.startswith("| `INFERQ_"):
            found |= documented_variables(line.split(" | ")[0])
    return found


def code_text() -> str:
    """The repository's code and scripts (not its Markdown, nor this file)."""
    parts = []
    for d in CODE_DIRS:
        for p in (ROOT / d).rglob("*"):
            if p.is_file() and p != Path(__file__).resolve() and (
                    p.suffix in CODE_SUFFIXES or p.name in CODE_NAMES
                    or p.name.startswith("Dockerfile")):
                parts.append(p.read_text(errors="replace"))
    parts.append((ROOT / "Makefile").read_text())
    return "\n".join(parts)


def read_by_code(name: str, code: str) -> bool:
    """``name`` is read: a string literal of Python (``os.environ.get("X")``, a click
    ``envvar="X"``) or a shell expansion (``$X``, ``${X``)."""
    return bool(re.search(rf"""["']{name}["']|\$\{{?{name}\b""", code))


def test_settings_extractors_find_known_entries() -> None:
    assert {"INFERQ_DATABASE_URL", "INFERQ_SHARD_ROWS"} <= setting_variables()
    sample = "| `INFERQ_A_B` / `INFERQ_C` | 1 | `INFERQ_D` |\n```\n| `INFERQ_E` |\n```\n"
    assert configuration_table(sample) == {"INFERQ_A_B", "INFERQ_C"}
    assert documented_variables("`INFERQ_USAGE_*` and INFERQ_API_URL.") == {
        "INFERQ_USAGE_*", "INFERQ_API_URL"}
    code = code_text()
    assert read_by_code("INFERQ_API_URL", code)  # click envvar and inferq.client
    assert read_by_code("INFERQ_BENCH_TWINS", code)  # bench/gpu.sh, bench/twins.py
    assert not read_by_code("INFERQ_NO_SUCH_VARIABLE", code)


def test_every_setting_is_documented() -> None:
    table = configuration_table(CONFIG_DOC.read_text())
    missing = setting_variables() - table
    assert not missing, f"docs/CONFIGURATION.md has no row for {sorted(missing)}"


def test_every_documented_variable_is_read() -> None:
    known = setting_variables()
    code = code_text()
    unread = set()
    for path, text in user_docs().items():
        for name in documented_variables(text):
            if name.endswith("*"):
                ok = any(k.startswith(name[:-1]) for k in known)
            else:
                ok = name in known or read_by_code(name, code)
            if not ok:
                unread.add(f"{path}: {name}")
    assert not unread, f"variables no code reads: {sorted(unread)}"


# The command line ---------------------------------------------------------------------------

HEADING = re.compile(r"^#{1,6}\s+`inferq((?:\s+[a-z][\w-]*)*)`\s*$")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])(?![\w-])")
SPAN = re.compile(r"`([^`\n]+)`")
PROMPT = re.compile(r"^\s*(?:\$\s+)?(?:\.venv/bin/)?inferq\s")


@dataclass
class Command:
    path: str  # "inferq projects locations add"
    command: click.Command
    options: set[str] = field(default_factory=set)  # every spelling, --help included
    arguments: set[str] = field(default_factory=set)  # as usage lines name them: NAME


def cli_commands() -> dict[str, Command]:
    """Every command of ``cli.main.main``, by its full name, walked through click."""
    from cli.main import main

    found: dict[str, Command] = {}

    def walk(cmd: click.Command, path: str, parent: click.Context | None) -> None:
        ctx = click.Context(cmd, info_name=path.split()[-1], parent=parent)
        c = Command(path, cmd)
        for p in cmd.get_params(ctx):
            if isinstance(p, click.Option):
                c.options |= set(p.opts) | set(p.secondary_opts)
            elif isinstance(p, click.Argument):
                c.arguments.add(p.human_readable_name)
        found[path] = c
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(sub, f"{path} {name}", ctx)

    walk(main, "inferq", None)
    return found


def resolve(words: list[str], commands: dict[str, Command]) -> tuple[str, str | None]:
    """The command ``inferq WORDS…`` names (the longest existing one), and the word that
    names no subcommand of a group, if any (``None``: nothing wrong)."""
    path = "inferq"
    for w in words:
        if not re.fullmatch(r"[a-z][\w-]*", w):
            break
        if not isinstance(commands[path].command, click.Group):
            break
        if f"{path} {w}" not in commands:
            return path, w
        path = f"{path} {w}"
    return path, None


def command_lines(text: str) -> Iterator[str]:
    """Every command line of the ``inferq`` command in ``text``: an inline code span that
    starts with it, and a line of a fenced shell (or usage) block that does, with its
    continuation lines (after a ``\\``, or indented in a usage block); comments dropped.
    Python, JSON and YAML blocks are not command lines."""
    fence: str | None = None
    current: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            if current:
                yield current
            current = None
            fence = None if fence is not None else stripped[3:].strip() or "usage"
            continue
        if fence is None:
            for span in SPAN.findall(line):
                if PROMPT.match(span):
                    yield span
            continue
        if fence not in ("sh", "bash", "shell", "console", "usage"):
            continue
        code = line.split(" #", 1)[0].rstrip()
        if current is not None and (current.endswith("\\") or (
                fence == "usage" and line.startswith((" ", "\t")) and code.strip())):
            current = current.rstrip("\\") + " " + code.strip()
            continue
        if current:
            yield current
        current = code if PROMPT.match(code) else None
    if current:
        yield current


def words_after_inferq(line: str) -> list[str]:
    return line.split("inferq", 1)[1].split()


def flags_of(text: str) -> set[str]:
    return set(FLAG.findall(text))


@dataclass
class Section:
    path: str
    text: str


def cli_sections(text: str) -> list[Section]:
    """docs/CLI.md's sections: a heading that is a command (`` `inferq models add` ``),
    up to the next heading."""
    sections: list[Section] = []
    current: Section | None = None
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            m = HEADING.match(line)
            current = Section("inferq" + " ".join(("",) + tuple(m.group(1).split())),
                              "") if m else None
            if current:
                sections.append(current)
            continue
        if current:
            current.text += line + "\n"
    return sections


def prose(text: str) -> str:
    """``text`` less its fenced blocks and its inline command lines: the flags left in a
    section are its own command's (command lines are checked against theirs)."""
    return "\n".join(SPAN.sub(lambda m: " " if PROMPT.match(m.group(1)) else m.group(),
                              line) for line in outside_fences(text))


def test_cli_extractors_find_known_entries() -> None:
    commands = cli_commands()
    add = commands["inferq projects locations add"]
    assert {"--access", "--api-url", "--admin-key"} <= add.options
    assert {"PROJECT_ID", "URI"} <= add.arguments
    assert {"-o", "--output"} <= commands["inferq results"].options
    assert "--no-wait" in commands["inferq submit"].options
    assert resolve(["models", "add", "NAME"], commands) == ("inferq models add", None)
    assert resolve(["models", "adopt"], commands) == ("inferq models", "adopt")
    doc = ("# x\n\n### `inferq up`\n\nuse `--port` (or `inferq api --port`)\n"
           "```\ninferq up [--port P]\n          [--workers N]\n```\n"
           "```python\nfrom inferq import client\n```\n"
           "```console\n$ inferq capacity --lane flex \\\n    --rows 1   # a comment --x\n"
           "  WORKERS\n```\n## Other\ntext\n")
    sections = cli_sections(doc)
    assert [s.path for s in sections] == ["inferq up"]
    assert flags_of(prose(sections[0].text)) == {"--port"}
    assert list(command_lines(doc)) == [
        "inferq up", "inferq api --port", "inferq up [--port P] [--workers N]",
        "$ inferq capacity --lane flex  --rows 1"]


def test_every_command_and_option_is_in_the_cli_reference() -> None:
    commands = cli_commands()
    sections = {s.path: s for s in cli_sections(CLI_DOC.read_text())}
    missing = sorted(set(commands) - {"inferq"} - set(sections))
    assert not missing, f"docs/CLI.md has no section for {missing}"
    undocumented = []
    for path, c in commands.items():
        if path == "inferq":
            continue
        text = sections[path].text
        for opt in sorted(c.options - {"--help"}):
            if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text):
                undocumented.append(f"{path} {opt}")
        for arg in sorted(c.arguments):
            if not re.search(rf"\b{arg}\b", text):
                undocumented.append(f"{path} {arg}")
    assert not undocumented, f"docs/CLI.md does not document {undocumented}"


def test_every_documented_command_and_option_exists() -> None:
    commands = cli_commands()
    wrong = []
    for s in cli_sections(CLI_DOC.read_text()):
        if s.path not in commands:
            wrong.append(f"docs/CLI.md: section {s.path!r}: no such command")
            continue
        for flag in flags_of(prose(s.text)):
            if flag not in commands[s.path].options:
                wrong.append(f"docs/CLI.md, {s.path}: {flag}")
    for path, text in user_docs().items():
        for line in command_lines(text):
            cmd, unknown = resolve(words_after_inferq(line), commands)
            if unknown:
                wrong.append(f"{path}: {line!r}: {cmd} has no command {unknown!r}")
                continue
            for flag in flags_of(line.split("inferq", 1)[1]):
                if flag not in commands[cmd].options:
                    wrong.append(f"{path}: {line!r}: {cmd} has no option {flag}")
    assert not wrong, "\n".join(wrong)


# HTTP routes --------------------------------------------------------------------------------

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
ROUTE_ROW = re.compile(r"^\|\s*`([A-Z]+)`\s*\|\s*`(/[^`]*)`\s*\|")
MENTION = re.compile(r"\b((?:GET|POST|PUT|PATCH|DELETE|HEAD)(?:\|(?:GET|POST|PUT|PATCH|DELETE))*)"
                     r"\s+(/[^\s`'\"),;]*)")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Flask:
    """The app as served; building its URL map reaches no backend."""
    from api.app import create_app

    return create_app(Settings(database_url="postgresql+psycopg://nobody@127.0.0.1:1/none",
                               redis_url="redis://127.0.0.1:1/0",
                               data_dir=tmp_path_factory.mktemp("docs-truth")))


def app_routes(app: Flask) -> set[tuple[str, str]]:
    """(method, path) of every rule, ``<converter:name>`` written ``{name}``."""
    out = set()
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", rule.rule)
        out |= {(m, path) for m in rule.methods or () if m in METHODS}
    return out


def route_table(text: str) -> set[tuple[str, str]]:
    """The rows of docs/API.md's "Routes" table."""
    section = text.split("\n## Routes\n", 1)[1].split("\n## ", 1)[0]
    return {(m.group(1), m.group(2)) for line in section.splitlines()
            if (m := ROUTE_ROW.match(line))}


def shape(path: str) -> str:
    """A path with its parameters blanked (``{id}``, ``{batch_id}``, ``<id>``: ``{}``) and
    no query string: what tells two routes apart."""
    path = path.split("?", 1)[0].rstrip(".:")
    return re.sub(r"\{[^}]*\}|<[^>]*>", "{}", path)


def mentioned_routes(text: str) -> set[tuple[str, str]]:
    """Every ``METHOD /path`` (``GET|POST /path``) of ``text``: (method, shape)."""
    out = set()
    for m in MENTION.finditer(text):
        for method in m.group(1).split("|"):
            out.add(("GET" if method == "HEAD" else method, shape(m.group(2))))
    return out


def test_route_extractors_find_known_entries(app: Flask) -> None:
    routes = app_routes(app)
    assert ("POST", "/v1/organization/models") in routes
    assert ("GET", "/dashboard/static/{asset}") in routes
    assert ("GET", "/v1/models") in route_table(API_DOC.read_text())
    assert mentioned_routes("`GET|POST /v1/x/{name}/y?z=1`, then POST /v1/files.") == {
        ("GET", "/v1/x/{}/y"), ("POST", "/v1/x/{}/y"), ("POST", "/v1/files")}


def test_the_route_table_is_the_url_map(app: Flask) -> None:
    served, table = app_routes(app), route_table(API_DOC.read_text())
    assert not served - table, f"docs/API.md's Routes table lacks {sorted(served - table)}"
    assert not table - served, f"docs/API.md's Routes table has no such route: " \
                               f"{sorted(table - served)}"


def test_every_documented_route_exists(app: Flask) -> None:
    served = {(m, shape(p)) for m, p in app_routes(app)}
    wrong = [f"{path}: {m} {p}" for path, text in user_docs().items()
             for m, p in sorted(mentioned_routes(text)) if (m, p) not in served]
    assert not wrong, f"no such route: {wrong}"


# Paths and modules --------------------------------------------------------------------------

PATH = re.compile(r"(?<![\w./:<-])((?:api|jobs|workers|storage|cli|inferq|bench|tests|docker"
                  r"|migrations|docs)/[\w./-]*[\w/])")
MODULE = re.compile(r"(?<![\w./:-])((?:api|jobs|workers|storage|cli|bench)"
                    r"(?:\.[A-Za-z_]\w*)+)")
# What runs write: benchmarks their results, the dashboard test its screenshots.
GENERATED = ("bench/results/", "tests/artifacts/")
# docs/STYLE.md names files of other projects (Flask's, Redash's) by their own paths.
OTHER_PROJECTS = {"docs/STYLE.md"}


def missing_paths(text: str) -> set[str]:
    return {p for p in PATH.findall(text)
            if not p.startswith(GENERATED) and not (ROOT / p).exists()}


def missing_modules(text: str) -> set[str]:
    """Dotted names (``jobs.slo.admission``, ``workers.celery.app.ShardQueuesAfterModels``)
    whose module does not exist, or whose module does not define the rest."""
    out = set()
    for name in MODULE.findall(text):
        parts = name.split(".")
        if parts[-1] in ("py", "md", "json", "yaml"):
            continue  # a file name (jobs.py), not a module
        for i in range(len(parts), 0, -1):
            base = ROOT.joinpath(*parts[:i])
            source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else (
                base / "__init__.py")
            if source.is_file():
                break
        else:
            out.add(name)
            continue
        if i == 1 or any(not re.search(rf"\b{re.escape(a)}\b", source.read_text())
                         for a in parts[i:i + 1]):
            out.add(name)
    return out


def test_path_extractors_find_known_entries() -> None:
    text = "`jobs/core/settings.py`, jobs/nowhere.py and bench/results/x.json; " \
           "`jobs.core.settings.Settings`, jobs.core.nowhere, jobs.core.settings.nothing_such"
    assert missing_paths(text) == {"jobs/nowhere.py"}
    assert missing_modules(text) == {"jobs.core.nowhere", "jobs.core.settings.nothing_such"}


def test_every_named_file_and_module_exists() -> None:
    wrong = []
    for path, text in user_docs().items():
        if path in OTHER_PROJECTS:
            continue
        wrong += [f"{path}: {p}" for p in sorted(missing_paths(text))]
        wrong += [f"{path}: {m}" for m in sorted(missing_modules(text))]
    assert not wrong, f"no such file or module: {wrong}"


# The README ---------------------------------------------------------------------------------


def test_the_readme_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```", 2)[1]
    commands = [ln.split("#", 1)[0].strip() for ln in block.splitlines()[1:] if ln.strip()]
    assert commands[:2] == ["make demo", "make test"]
