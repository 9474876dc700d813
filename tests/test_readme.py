"""The README's and the docs' snippets work as written (the library example once imported modules that
did not exist), in README.md and every page under mkdocs/docs/:

- every ```python block runs against a tiny lake (catalog `lakehouse`, `dsr.yaml` in the working
  directory) unless an HTML comment right before it says `<!-- not run: reason -->`; `<!-- run: NAME -->`
  names the set-up in SETUPS that gives the block the DataFrames and tables it uses, and checks after
  it that it did what the page says;
- every ```yaml block is a dsr.yaml or a fragment of one, valid through `settings_from_dict` once merged
  over the demo's data map (examples/dsr.yaml), unless marked `<!-- not dsr.yaml: reason -->`;
- every `dsr COMMAND` in a shell block (bash, sh, console, or a `$ dsr` line of a plain block) or in an
  inline code span is a command of the Typer app, with options that command has; every `make TARGET`
  is a Makefile target and every `python SCRIPT.py` a file of the repository.
"""

from __future__ import annotations

import os
import re
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F

from helpers import SEED, make_settings, write_config
from lakehouse_dsr import synth
from lakehouse_dsr.config import Settings, expand_env, settings_from_dict
from lakehouse_dsr.lake.spark import attach

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
SOURCES = [README, *sorted((ROOT / "mkdocs" / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*(?P<text>.*?)\s*-->$")
SHELL = {"bash", "sh", "shell", "console"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None  # the HTML comment that is the last non-blank line before the fence

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def read_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, indent = opening.group("fence"), len(opening.group("indent"))
        end = i + 1
        while end < len(lines) and not re.fullmatch(rf" *{fence[0]}{{{len(fence)},}}\s*", lines[end]):
            end += 1
        before = i - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = MARKER.match(lines[before].strip()) if before >= 0 else None
        code = "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n"
        found.append(Block(path, i + 1, opening.group("lang"), code, marker.group("text") if marker else None))
        i = end + 1
    return found


def prose(path: Path) -> str:
    """The page without its fenced blocks (inline code spans stay)."""
    lines, inside, fence = [], False, ""
    for line in path.read_text(encoding="utf-8").splitlines():
        opening = FENCE.match(line)
        if not inside and opening:
            inside, fence = True, opening.group("fence")
        elif inside and re.fullmatch(rf" *{fence[0]}{{{len(fence)},}}\s*", line):
            inside = False
        elif not inside:
            lines.append(line)
    return "\n".join(lines)


BLOCKS = [block for source in SOURCES for block in read_blocks(source)]


def library_example() -> str:
    section = README.read_text().split("## From a notebook or a Spark job", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


# --- the python blocks ------------------------------------------------------------------------------


@dataclass
class Lake:
    """A tiny lake under the catalog name the docs use (`lakehouse`), after the README's library example
    erased `subject` (whose email is `email`) from it."""

    root: Path
    settings: Settings
    subject: str
    email: str
    example: dict  # the library example's variables after it ran


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory) -> Lake:
    root = tmp_path_factory.mktemp("docs-lake")
    settings = make_settings(root, catalog={"name": "lakehouse",
                                            "properties": {"type": "hadoop", "warehouse": str(root / "wh")}})
    attach(spark, settings)
    synth.generate(spark, settings, users=20, events=200, seed=SEED, batches=1)
    write_config(settings, root / "dsr.yaml")
    subject = synth.user_id(SEED, 3)
    email = spark.table(settings.table("demo.users")).where(F.col("user_id") == subject).first()["email"]
    scope = {"spark": spark, "subject_id": subject}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # the example reads "dsr.yaml" from where it runs
        exec(compile(library_example(), "README.md", "exec"), scope)
    return Lake(root, settings, subject, email, scope)


def test_the_readme_library_example_runs_as_written(spark, lake):
    report, proof = lake.example["report"], lake.example["dsr"].verify_completed(spark, lake.example["settings"])
    assert [r.status for r in report.requests] == ["completed"]
    assert proof == {report.requests[0].request_id: []}
    assert spark.table(lake.settings.table("demo.events")).where(F.col("user_id") == lake.subject).count() == 0


def _vault(spark, lake: Lake) -> dict:
    spark.sql("CREATE OR REPLACE TABLE lakehouse.crm.contacts_p (user_id string, email binary, name binary)")
    return {"df": spark.table(lake.settings.table("demo.users")).select("user_id", "email", "name")}


def _vault_check(spark, lake: Lake, scope: dict) -> None:
    back, df = scope["back"].select("user_id", "email", "name"), scope["df"]
    assert back.count() == df.count() > 0
    assert back.exceptAll(df).count() == 0  # every identifier and plaintext back
    stored = spark.table("lakehouse.crm.contacts_p")
    assert stored.where(F.col("user_id").startswith("psn:")).count() == df.count()


def _ingest(spark, lake: Lake) -> dict:
    spark.sql("CREATE OR REPLACE TABLE lakehouse.web.events (user_id string, event_type string)")
    other = synth.user_id(SEED, 4)
    return {"incoming": spark.createDataFrame([(lake.subject, "login"), (other, "login")],
                                              "user_id string, event_type string"),
            "signups": spark.createDataFrame([(lake.email,), ("someone.new@example.org",)], "mail string")}


def _ingest_check(spark, lake: Lake, scope: dict) -> None:
    written = spark.table("lakehouse.web.events")
    assert written.count() == 1 and written.where(F.col("user_id") == lake.subject).count() == 0
    assert [r.mail for r in scope["new_subscribers"].collect()] == ["someone.new@example.org"]


def _partner(spark, lake: Lake) -> dict:
    spark.sql("CREATE OR REPLACE TABLE lakehouse.partner.feed (customer_email string, item string)")
    spark.sql("CREATE OR REPLACE TABLE lakehouse.crm.contacts (email string, name string)")
    people = [(lake.email, "Erased Person"), ("someone.else@example.org", "Someone Else")]
    spark.createDataFrame(people, "email string, name string").writeTo("lakehouse.crm.contacts").append()
    return {"partner_feed": spark.createDataFrame(people, "customer_email string, item string")}


def _partner_check(spark, lake: Lake, scope: dict) -> None:
    for table, column in [("lakehouse.partner.feed", "customer_email"), ("lakehouse.crm.contacts", "email")]:
        assert [r[column] for r in spark.table(table).collect()] == ["someone.else@example.org"], table


# `<!-- run: NAME -->`: what the block needs besides `spark` and `settings`, and what it must have done
SETUPS = {"vault": (_vault, _vault_check), "ingest": (_ingest, _ingest_check), "partner": (_partner, _partner_check)}
PYTHON = [b for b in BLOCKS if b.lang == "python"]
# the library example runs in the `lake` fixture (README and the library page show the same code)
RUNNABLE = list({b.code: b for b in PYTHON if not (b.marker or "").startswith("not run")
                 and b.code != library_example()}.values())


def test_every_python_block_runs_or_says_why_not():
    assert any(b.code == library_example() for b in PYTHON if b.path == README)
    for block in PYTHON:
        marker = block.marker or ""
        if marker.startswith("not run"):
            assert re.fullmatch(r"not run: \S.*", marker), f"{block}: say why it does not run (not run: reason)"
            assert block.code != library_example(), f"{block}: the library example must run"
        elif marker.startswith("run"):
            name = re.fullmatch(r"run: (\S+)", marker)
            assert name and name.group(1) in SETUPS, f"{block}: unknown set-up in <!-- {marker} --> ({list(SETUPS)})"


@pytest.mark.parametrize("block", RUNNABLE, ids=str)
def test_python_block_runs(block, spark, lake, monkeypatch):
    name = (block.marker or "").removeprefix("run: ") if (block.marker or "").startswith("run: ") else None
    prepare, check = SETUPS.get(name, (lambda spark, lake: {}, lambda spark, lake, scope: None))
    scope = {"spark": spark, "settings": lake.settings, "subject_id": synth.user_id(SEED, 5),
             **prepare(spark, lake)}
    monkeypatch.chdir(lake.root)
    exec(compile(block.code, str(block), "exec"), scope)
    check(spark, lake, scope)


def test_the_public_api_resolves_and_is_documented():
    import lakehouse_dsr
    import lakehouse_dsr.runner  # noqa: F401  (a submodule imported first must not shadow an export)

    assert {"run", "Ledger", "RequestInput", "load_settings", "attach", "verify_completed", "suppress",
            "pseudonymize"} <= set(lakehouse_dsr.__all__)
    for name in lakehouse_dsr.__all__:
        value = getattr(lakehouse_dsr, name)
        assert not isinstance(value, types.ModuleType), f"lakehouse_dsr.{name} is a submodule's name"
        assert value.__doc__ and value.__doc__.strip(), f"lakehouse_dsr.{name} has no docstring"
        assert name in dir(lakehouse_dsr)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        lakehouse_dsr.nothing  # noqa: B018


# --- the yaml blocks --------------------------------------------------------------------------------


def merged(base: dict, fragment: dict) -> dict:
    out = dict(base)
    for key, value in fragment.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


YAML = [b for b in BLOCKS if b.lang in ("yaml", "yml")]


@pytest.mark.parametrize("block", YAML, ids=str)
def test_yaml_block_is_a_dsr_yaml(block, monkeypatch, tmp_path):
    if (block.marker or "").startswith("not dsr.yaml"):
        assert re.fullmatch(r"not dsr\.yaml: \S.*", block.marker), f"{block}: say what it is instead"
        return
    for name in re.findall(r"\$\{(\w+)\}", block.code):  # ${NAME} without a default must be set
        if name not in os.environ:
            monkeypatch.setenv(name, f"value-of-{name}")
    fragment = expand_env(yaml.safe_load(block.code), source=str(block))
    assert isinstance(fragment, dict) and fragment, f"{block}: not a mapping"
    demo = {"datamap": yaml.safe_load((ROOT / "examples" / "dsr.yaml").read_text())["datamap"]}
    settings_from_dict(merged(demo, fragment), base=tmp_path, source=str(block))


def test_the_readme_minimal_config_is_complete(tmp_path):
    section = README.read_text().split("## A minimal `dsr.yaml`", 1)[1]
    raw = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    settings = settings_from_dict(raw, base=tmp_path)
    assert "crm.users" in settings.datamap.tables


def test_the_readme_starts_with_make_demo_and_make_test():
    first = next(b for b in BLOCKS if b.path == README)
    commands = [line.split("#")[0].split() for line in first.code.splitlines() if line.strip()]
    assert commands[:2] == [["make", "demo"], ["make", "test"]]


# --- the commands -----------------------------------------------------------------------------------


def dsr_commands() -> dict[str, set[str]]:
    """Every command of the `dsr` app with the options it takes (a group such as `dsr hold`: those of
    its subcommands)."""
    import typer

    from lakehouse_dsr.cli import app

    def options(command) -> set[str]:
        own = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("-")}
        return own.union(*(options(sub) for sub in getattr(command, "commands", {}).values()))

    group = typer.main.get_command(app)
    return {name: options(command) | {"--help"} for name, command in group.commands.items()}


DSR = re.compile(r"(?:^|(?<=[\s\"'(/=;|&`]))dsr(?P<globals>(?:\s+(?:-c|--config)(?:\s+|=)\S+)*)\s+"
                 r"(?P<command>[a-z][a-z0-9-]*)(?P<rest>[^;|&)\"'`]*)")
MAKE = re.compile(r"(?:^|(?<=[\s(;&|]))make\s+(?P<target>[a-z][\w-]*)")
SCRIPT = re.compile(r"(?:^|(?<=[\s(;&|]))python3?\s+(?P<script>[\w./-]+\.py)\b")
CODE_SPAN = re.compile(r"(?<!`)(?P<ticks>`+)(?!`)(?P<code>.+?)(?<!`)(?P=ticks)(?!`)", re.S)


def shell_lines(block: Block) -> list[str]:
    """Logical command lines of a block (continuations joined, comments dropped); of a non-shell block,
    only its `$ ` prompt lines."""
    text = block.code.replace("\\\n", " ")
    lines = text.splitlines() if block.lang in SHELL else [ln for ln in text.splitlines() if ln.startswith("$ ")]
    return [re.split(r"(?:^|\s)#", line.removeprefix("$ "), maxsplit=1)[0] for line in lines]


def invocations() -> list[tuple[str, str]]:
    """(where, command text) of every command the README and the pages show."""
    found = []
    for block in BLOCKS:
        found += [(str(block), line) for line in shell_lines(block)]
    for source in SOURCES:
        for span in CODE_SPAN.finditer(prose(source)):
            text = span.group("code").replace("\\|", "|").replace("\n", " ")
            found.append((f"{source.relative_to(ROOT)} `{text.strip()[:60]}`", text))
    return found


def test_every_command_shown_exists():
    commands = dsr_commands()
    targets = set(re.findall(r"(?m)^([a-z][\w-]*)\s*:(?!=)", (ROOT / "Makefile").read_text()))
    seen, problems = set(), []
    for where, text in invocations():
        inline = "`" in where  # a code span: `|` lists choices there, it is no pipe
        for match in DSR.finditer(text if not inline else text.replace("|", " ")):
            command, options = match.group("command"), set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", match["rest"]))
            seen.add(command)
            if command not in commands:
                problems.append(f"{where}: `dsr {command}` is not a command ({', '.join(sorted(commands))})")
            elif options - commands[command]:
                unknown = ", ".join(sorted(options - commands[command]))
                problems.append(f"{where}: `dsr {command}` has no option {unknown}")
        for match in MAKE.finditer(text):
            if match["target"] not in targets:
                problems.append(f"{where}: `make {match['target']}` is not a Makefile target")
        for match in SCRIPT.finditer(text):
            if not (ROOT / match["script"]).is_file():
                problems.append(f"{where}: `python {match['script']}`: no such file")
    assert not problems, "\n".join(problems)
    assert {"demo", "generate", "submit", "run", "status", "verify", "serve"} <= seen  # the scan found them


def test_the_readme_links_resolve():
    """The README is not part of the site (whose strict build checks every page's links): its relative
    links, into mkdocs/docs/ and the repository, must name files that exist."""
    targets = re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", prose(README))
    relative = [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]
    assert relative and not [t for t in relative if not (ROOT / t).exists()]
