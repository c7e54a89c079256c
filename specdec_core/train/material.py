"""Human-written material that ships offline, for prompts that paste text or code: summarise it,
explain it, translate it, continue it, rewrite it, answer from it.

Why: users paste text and code the target never wrote, and a head trained only on the target's
own prose drafts that badly (passages.py has the measurements). Three sources every machine
with this project has, or a Debian one has:

- prose: Python's reference documentation (pydoc_data.topics, PSF licence), see passages.py;
- code: functions of Python's own standard library (its .py sources, PSF licence), read with ast;
- prose and docs: Debian documentation packages under /usr/share/doc, only those in
  DEBIAN_DOCS, whose licence is permissive (checked again at load time: the package's copyright
  file must hold the licence's own words, else the package is skipped). Absent packages are
  skipped, so the material on another machine may be less: the data recipe then differs, which
  the work folder's record does not see (the shards say which material they read in `topic`).

Every pool is split by index into a training part and a held-out part (every tenth item), as
passages.py does, so held-out prompts never paste what a training prompt pastes.
"""

from __future__ import annotations

import ast
import gzip
import html
import re
import sysconfig
from functools import cache
from pathlib import Path

from .passages import documentation_passages

DOC_ROOT = Path("/usr/share/doc")
# package: (files under /usr/share/doc/PACKAGE, licence, words its copyright file must hold)
DEBIAN_DOCS = {
    "nodejs": ("api/*.md", "MIT (Expat)", "Permission is hereby granted, free of charge"),
    "python3-pip": ("html/**/*.rst*", "MIT (Expat)", "Permission is hereby granted, free of charge"),
    "libffi8": ("html/*.html", "MIT (Expat)", "Permission is hereby granted, free of charge"),
}
# Standard library modules whose functions are pasted as code (pure Python, plain style).
STDLIB_MODULES = (
    "textwrap", "shlex", "fnmatch", "glob", "calendar", "colorsys", "difflib", "heapq", "bisect", "statistics",
    "string", "csv", "json/encoder", "json/decoder", "html/__init__", "ipaddress", "fractions", "datetime",
    "argparse", "configparser", "random", "gettext", "netrc", "pprint", "quopri", "base64", "uu", "graphlib",
    "tokenize", "wave", "zipfile", "tarfile", "shutil", "posixpath", "ntpath", "urllib/parse", "email/utils",
    "http/cookies", "functools", "collections/__init__", "enum", "dataclasses", "operator", "textwrap",
)
MIN_WORDS, MAX_WORDS, LONG_WORDS = 40, 140, 380  # prose: short passages, and a few long ones
CODE_LINES = (6, 45)  # a function shorter is trivial, longer pads the batch


def _split(items: list, held_out: bool) -> list:
    return [item for i, item in enumerate(items) if (i % 10 == 8) == held_out]


@cache
def code_snippets() -> tuple[tuple[str, str], ...]:
    """(where, source) of standard-library functions of CODE_LINES lines, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    snippets, seen = [], set()
    for module in dict.fromkeys(STDLIB_MODULES):
        path = root / f"{module}.py"
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                body = lines[node.lineno - 1 : node.end_lineno]
                source = _dedent("\n".join(body))
                if CODE_LINES[0] <= len(body) <= CODE_LINES[1] and source not in seen:
                    seen.add(source)
                    snippets.append((f"{module.replace('/', '.')}.{node.name}", source))
    return tuple(snippets)


def _dedent(source: str) -> str:
    import textwrap

    return textwrap.dedent(source).strip("\n")


@cache
def debian_passages() -> tuple[tuple[str, str], ...]:
    """(topic, passage) pairs of prose from the DEBIAN_DOCS packages present here, each cut to
    MIN_WORDS..MAX_WORDS words (every fifth one to LONG_WORDS: users paste long text too)."""
    passages, seen = [], set()
    for package, (pattern, _licence, words) in sorted(DEBIAN_DOCS.items()):
        folder = DOC_ROOT / package
        copyright_file = folder / "copyright"
        if not copyright_file.exists() or words not in copyright_file.read_text(errors="replace"):
            continue  # absent here, or not under the licence we checked
        for path in sorted(folder.glob(pattern)):
            for paragraph in _prose_paragraphs(_read(path)):
                if paragraph in seen:  # the same words in two files (a page and its summary)
                    continue
                seen.add(paragraph)
                passages.append((f"{package}: {path.stem.split('.')[0].replace('_', ' ')}", paragraph))
    return tuple((topic, _cut(text, LONG_WORDS if i % 5 == 4 else MAX_WORDS)) for i, (topic, text) in enumerate(passages))


def _read(path: Path) -> str:
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    text = data.decode("utf-8", errors="replace")
    if ".html" in path.name:
        text = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", text, flags=re.S | re.I)
        text = html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"</?(p|div|h\d|li|pre|br)[^>]*>", "\n\n", text, flags=re.I)))
    return text


def _prose_paragraphs(text: str) -> list[str]:
    """Runs of prose paragraphs joined to at least MIN_WORDS words: markup lines, code blocks,
    tables and link lists left out."""
    out, joined = [], []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line for line in paragraph.splitlines() if line.strip()]
        if not lines or any(line.startswith(("    ", "\t", "```", "|", "..", "[", "<", "#", "*", "-", ":", "=")) for line in lines):
            continue
        words = " ".join(lines).split()
        if len(words) < 12 or sum(w[0].isalpha() for w in words) < 0.7 * len(words):
            continue
        joined += words
        if len(joined) >= MIN_WORDS:
            out.append(" ".join(joined[: LONG_WORDS]))
            joined = []
    return out


def _cut(text: str, limit: int) -> str:
    words = text.split()
    if len(words) <= limit:
        return text
    kept = " ".join(words[:limit])
    end = kept.rfind(". ")
    return kept[: end + 1] if end > len(kept) // 2 else kept


def prose_pool(held_out: bool) -> list[tuple[str, str]]:
    """Human prose: Python's documentation and the Debian documentation here, split as above."""
    return _split(list(documentation_passages()), held_out) + _split(list(debian_passages()), held_out)


def code_pool(held_out: bool) -> list[tuple[str, str]]:
    return _split(list(code_snippets()), held_out)


def material_licences() -> list[tuple[str, str]]:
    """(source, licence) of every source of material, for the data's README."""
    rows = [("Python documentation (pydoc_data)", "PSF License"), ("Python standard library sources", "PSF License")]
    rows += [(f"Debian /usr/share/doc/{package}/{pattern}", licence) for package, (pattern, licence, _) in sorted(DEBIAN_DOCS.items())]
    return rows
