"""The HTML side of the book: the files Jupyter Book 1 needs besides the executed
notebooks (MathJax and the chart bundle, served from the book itself so that it
works offline), the build's table of contents, the ``jupyter-book build`` call, and
the Sphinx extension (listed in _config.yml) that tidies every page."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from depthkit import plots
from depthkit.book import tether
from depthkit.core.files import atomic_write

ROOT = Path(__file__).resolve().parents[2]
MATHJAX_VERSION = "3.2.2"


class BookError(RuntimeError):
    """A build step failed; the message says which and what to look at."""


def mathjax_dir(root: Path = ROOT) -> Path:
    return Path(root) / ".cache" / "js" / f"mathjax-{MATHJAX_VERSION}"


def ensure_mathjax(repo: Path = ROOT) -> Path:
    """The local MathJax copy, fetched from npm by scripts/fetch_js.sh if missing."""
    target = mathjax_dir(repo)
    if not (target / "tex-mml-chtml.js").is_file():
        script = Path(repo) / "scripts" / "fetch_js.sh"
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True)
        if proc.returncode != 0 or not (target / "tex-mml-chtml.js").is_file():
            raise BookError(
                "MathJax for the offline book is missing and could not be fetched: "
                f"{(proc.stderr or proc.stdout).strip() or 'no output'}. Run `bash scripts/fetch_js.sh` "
                "(needs npm and access to the npm registry)."
            )
    return target


def prepare_static(static_dir: Path, repo: Path = ROOT) -> Path:
    """Fill the folder that _config.yml names as html_static_path with the chart
    bundle and MathJax."""
    static_dir = Path(static_dir)
    static_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(plots.bundle_path(), static_dir / "depthkit-vega.js")
    mathjax = ensure_mathjax(repo=repo)
    target = static_dir / "mathjax"
    stamp = target / ".version"
    if not (stamp.is_file() and stamp.read_text() == MATHJAX_VERSION):
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(mathjax, target)
        stamp.write_text(MATHJAX_VERSION)
    return static_dir


def write_build_toc(
    root: Path, slugs: Sequence[str], out: Path, reference_pages: Mapping[str, Sequence[str]] | None = None
) -> Path:
    """Copy ``root/_toc.yml`` to ``out`` with the chapter entries (files under
    book/chapters/) replaced by ``slugs`` in the given order, followed by one part per
    model of ``reference_pages`` ({model: [paths under book/chapters/]}); a part left
    with no entries is dropped."""
    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text(encoding="utf-8"))
    wanted = [{"file": f"book/chapters/{slug}"} for slug in slugs]
    placed = False
    parts = []
    for part in toc.get("parts", []):
        entries = []
        holds_chapters = False
        for entry in part.get("chapters", []):
            if str(entry.get("file", "")).startswith("book/chapters/"):
                holds_chapters = True
                if not placed:
                    entries.extend(wanted)
                    placed = True
            else:
                entries.append(entry)
        if entries:
            parts.append({**part, "chapters": entries})
        if holds_chapters:
            parts += [
                {"caption": f"Reference runs: {model}", "chapters": [{"file": f"book/chapters/{p}"} for p in pages]}
                for model, pages in (reference_pages or {}).items()
            ]
    if wanted and not placed:
        raise BookError(f"{Path(root) / '_toc.yml'} has no entry under book/chapters/ to place the chapters at.")
    toc["parts"] = parts
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(toc, sort_keys=False)
    # An unchanged toc keeps its timestamp, so Sphinx's incremental build holds.
    if not out.is_file() or out.read_text(encoding="utf-8") != text:
        atomic_write(out, text)
    return out


def build_html(root: Path, toc: Path, log: Path) -> tuple[Path, int]:
    """Run ``jupyter-book build`` quietly; returns (index.html, number of warnings).
    The full log goes to ``log``."""
    # jupyter_book.cli has no __main__; call its click group from this interpreter.
    launcher = "import sys; from jupyter_book.cli.main import main; sys.exit(main())"
    cmd = [sys.executable, "-c", launcher, "build", str(root), "--toc", str(toc), "-q"]
    # Tethered: stopping the runner, even by SIGKILL, stops the build too.
    proc = tether.run(cmd, cwd=root)
    text = proc.stdout + proc.stderr
    Path(log).write_text(text, encoding="utf-8")
    if proc.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-15:])
        raise BookError(f"jupyter-book build failed (full log: {log}):\n{tail}")
    index = Path(root) / "_build" / "html" / "index.html"
    if not index.is_file():
        raise BookError(f"jupyter-book finished but wrote no {index} (full log: {log}).")
    warnings = sum(1 for line in text.splitlines() if "WARNING" in line)
    return index, warnings


# --------------------------------------------------------------------------- Sphinx hooks


def setup(app: Any) -> dict[str, Any]:
    """Sphinx extension (listed in _config.yml) that fixes two things Jupyter Book 1
    gets wrong in every page: inline scripts added twice (sphinx-thebe and
    sphinx-togglebutton register theirs on each read pass, and a second
    ``const THEBE_JS_URL`` is a page error), and an unset theme mode (the theme
    logs "invalid theme mode" as a console error on a first visit)."""
    app.connect("config-inited", _default_theme_mode)
    # Late, after the extensions that add page scripts in this same event.
    app.connect("html-page-context", _dedupe_scripts, priority=990)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def _default_theme_mode(app: Any, config: Any) -> None:
    # pydata-sphinx-theme's layout reads the template variable, which
    # sphinx-book-theme never sets; light suits the charts' white background.
    config.html_context = {"default_mode": "light", **(config.html_context or {})}


def _dedupe_scripts(app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple[str, str]] = set()
    unique = []
    for script in scripts:
        # The same inline script comes once with filename None and once with "".
        key = (str(getattr(script, "filename", script) or ""), repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique
