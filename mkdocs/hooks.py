"""Build-time hooks of the docs site (`hooks:` in mkdocs.yml): nothing here is written into mkdocs/docs.

- Repository files the pages link to outside mkdocs/docs (the charts in bench/results/, the screenshots
  in docs/screenshots/, examples/*.yaml) are linked relative to the page, so the links work when the
  Markdown is read on GitHub too. At build time each one is added to the site under `repo/` (copied
  into the build, never into git) and the page's link is rewritten to that copy, so the strict build
  checks them like any other link.
- reference/cli.md: the `<!-- generated: cli -->` marker becomes the reference of every command of the
  Typer app (`lakehouse_dsr.cli.app`), read from the app itself: usage, help text, arguments, options.
- reference/api.md: the `<!-- generated: api -->` marker becomes one mkdocstrings block per name the
  package exports (`lakehouse_dsr._EXPORTS`), rendered from the docstrings.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent  # the repository
REPO_PREFIX = "repo"  # where linked repository files go in the site
# a Markdown link or image target: ](target) or ](target "title")
LINK = re.compile(r"\]\((?P<target>[^)\s#]+)(?P<rest>(?:#[^)\s]*)?(?:\s+\"[^\"]*\")?\))")
FENCE = re.compile(r"^(```|~~~)")


def _outside_links(markdown: str, page_dir: Path, docs_dir: Path) -> dict[str, Path]:
    """Relative link targets of a page (outside code blocks) that are files of the repository outside
    docs_dir: {target as written: the file}."""
    found = {}
    in_code = False
    for line in markdown.splitlines():
        if FENCE.match(line.lstrip()):
            in_code = not in_code
            continue
        if in_code:
            continue
        for match in LINK.finditer(line):
            target = match.group("target")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                continue  # a URL, mailto:, an absolute path
            path = (page_dir / target).resolve()
            if path.is_file() and ROOT in path.parents and docs_dir not in path.parents:
                found[target] = path
    return found


def on_files(files: Files, config) -> Files:
    docs_dir = Path(config["docs_dir"]).resolve()
    wanted: dict[str, Path] = {}
    for file in files.documentation_pages():
        source = Path(file.abs_src_path)
        for path in _outside_links(source.read_text(encoding="utf-8"), source.parent, docs_dir).values():
            wanted[f"{REPO_PREFIX}/{path.relative_to(ROOT).as_posix()}"] = path
    for src_uri, path in sorted(wanted.items()):
        if files.get_file_from_path(src_uri) is None:
            files.append(File.generated(config, src_uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    source = Path(page.file.abs_src_path)
    outside = _outside_links(markdown, source.parent, docs_dir)
    if outside:
        page_dir = posixpath.dirname(page.file.src_uri)

        def rewrite(match: re.Match) -> str:
            path = outside.get(match.group("target"))
            if path is None:
                return match.group(0)
            copy = f"{REPO_PREFIX}/{path.relative_to(ROOT).as_posix()}"
            return f"]({posixpath.relpath(copy, page_dir or '.')}{match.group('rest')}"

        lines, in_code = [], False
        for line in markdown.split("\n"):
            if FENCE.match(line.lstrip()):
                in_code = not in_code
            lines.append(line if in_code else LINK.sub(rewrite, line))
        markdown = "\n".join(lines)
    if "<!-- generated: cli -->" in markdown:
        markdown = markdown.replace("<!-- generated: cli -->", cli_reference())
    if "<!-- generated: api -->" in markdown:
        markdown = markdown.replace("<!-- generated: api -->", api_reference())
    return markdown


def _cell(text: str, code: bool = False) -> str:
    # a pipe would end the cell; [a][b] in prose would read as a reference link
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if code else text.replace("[", "\\[")


def _usage(pieces: list[str]) -> str:
    # Typer writes required arguments as {name} and optional ones as [name]: the conventional NAME / [NAME]
    return " ".join(re.sub(r"[{\[]?(\w+)[}\]]?(\.\.\.)?",
                           lambda m: (m.group(1).upper() + (m.group(2) or "")) if not m.group(0).startswith("[")
                           else f"[{m.group(1).upper()}]{m.group(2) or ''}", p)
                    if p != "[OPTIONS]" else p for p in pieces)


def _params_table(command, context) -> list[str]:
    rows = []
    for param in command.params:
        record = param.get_help_record(context)
        if not record or getattr(param, "hidden", False):
            continue
        name, help_text = record
        kind = "argument" if param.param_type_name == "argument" else "option"
        if kind == "argument":
            name = name.split(" ")[0].upper() + (" " + name.split(" ", 1)[1] if " " in name else "")
        rows.append(f"| `{_cell(name, code=True)}` | {kind} | {_cell(help_text.strip()) or '–'} |")
    if not rows:
        return ["No arguments or options besides `--help`."]
    return ["| name | kind | help |", "|---|---|---|", *rows]


def cli_reference() -> str:
    """Markdown for every command of the `dsr` Typer app, read from the app (never written by hand)."""
    import typer
    from typer._click.core import Context  # the Click that this Typer vendors

    from lakehouse_dsr.cli import app

    group = typer.main.get_command(app)
    root = Context(group, info_name="dsr")
    names = group.list_commands(root)
    out = [
        f"`dsr`: {group.help}",
        "",
        "```text",
        "dsr [-c PATH | --config PATH] COMMAND [ARGS]...",
        "```",
        "",
        "Global options (before the command):",
        "",
        *_params_table(group, root),
        "",
        "Every command also takes `--help`. Commands:",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    commands = []
    for name in names:
        command = group.get_command(root, name)
        if command is None or command.hidden:
            continue
        commands.append((name, command))
        summary = (command.help or "").strip().split("\n\n")[0].replace("\n", " ")
        out.append(f"| [`dsr {name}`](#dsr-{name}) | {_cell(summary)} |")
    for name, command in commands:
        context = Context(command, info_name=name, parent=root)
        out += [
            "",
            f"## dsr {name} {{#dsr-{name}}}",
            "",
            "```text",
            f"dsr {name} {_usage(command.collect_usage_pieces(context))}".rstrip(),
            "```",
            "",
            (command.help or "").strip(),
            "",
            *_params_table(command, context),
        ]
    return "\n".join(out) + "\n"


def api_reference() -> str:
    """A mkdocstrings block for every name `lakehouse_dsr` exports (its `_EXPORTS`), grouped as the
    package's docstring lists them ("- settings: `load_settings`, ..."); a name no group lists still
    gets its block, under "Other"."""
    import lakehouse_dsr

    groups: list[tuple[str, list[str]]] = []
    for line in (lakehouse_dsr.__doc__ or "").splitlines():
        match = re.match(r"^- ([^:]+): (.*)$", line.strip())
        if match:
            names = [n for n in re.findall(r"`([A-Za-z_]\w*)`", match.group(2)) if n in lakehouse_dsr._EXPORTS]
            if names:
                groups.append((match.group(1), names))
    listed = {name for _, names in groups for name in names}
    unlisted = [name for name in lakehouse_dsr.__all__ if name not in listed]
    if unlisted:
        groups.append(("other", unlisted))
    out = []
    for title, names in groups:
        out += [f"## {title[0].upper()}{title[1:]}", ""]
        for name in names:
            out += [
                f"::: lakehouse_dsr{lakehouse_dsr._EXPORTS[name]}.{name}",
                "    options:",
                f'      heading: "lakehouse_dsr.{name}"',
                f'      toc_label: "{name}"',
                "",
            ]
    return "\n".join(out)
