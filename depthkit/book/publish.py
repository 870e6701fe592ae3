"""Publish the built HTML book onto a ``gh-pages`` branch with ghp-import.

``depthkit publish`` (see :mod:`depthkit.cli`) calls :func:`publish_book` after
``depthkit book``. ghp-import writes the folder as one new commit on top of the
branch (history is kept) and pushes it; GitHub Pages then serves that branch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from depthkit.book.runner import ROOT, BookError


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    # ghp-import runs git in the current directory and takes no repository argument.
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _identity(repo: Path, key: str, env: str) -> str:
    # ghp-import reads exactly these and would otherwise commit as "<>".
    return os.environ.get(env) or _git(repo, "config", key).stdout.strip()


def _publishing_repo(repo: Path, remote: str, branch: str, push: bool) -> Path:
    """The top folder of the git repository holding ``repo``, once git, the branch
    name, the remote (when pushing) and the committer's identity are checked."""
    if shutil.which("git") is None:
        raise BookError("git is not installed; install it (e.g. apt-get install git) to publish.")
    top = _git(Path(repo), "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise BookError(f"{repo} is not inside a git repository: publish from a clone of the book's repository.")
    repo = Path(top.stdout.strip())
    if _git(repo, "check-ref-format", "--branch", branch).returncode != 0:
        raise BookError(f"{branch!r} is not a valid git branch name; use e.g. gh-pages.")
    # Without a push the remote is only consulted for its branch head, so it may be absent.
    if push:
        remotes = _git(repo, "remote").stdout.split()
        if remote not in remotes:
            known = ", ".join(remotes) if remotes else "none"
            raise BookError(
                f"git remote {remote!r} does not exist in {repo} (remotes: {known}); "
                f"add it with `git remote add {remote} URL` or choose another remote."
            )
        # ghp-import builds on <remote>/<branch> as last fetched; a clone that never
        # fetched the branch would start a new history and have its push rejected.
        _git(repo, "fetch", "-q", remote, f"+refs/heads/{branch}:refs/remotes/{remote}/{branch}")
    for key, env in (("user.name", "GIT_COMMITTER_NAME"), ("user.email", "GIT_COMMITTER_EMAIL")):
        if not _identity(repo, key, env):
            raise BookError(f"git has no {key}: set it with `git config {key} ...` (or ${env}).")
    return repo


def publish_book(
    html_dir: Path,
    remote: str = "origin",
    branch: str = "gh-pages",
    message: str | None = None,
    repo: Path = ROOT,
    push: bool = True,
) -> str:
    """Commit the contents of ``html_dir`` (plus ``.nojekyll``) as the new tree of
    ``branch`` in ``repo`` and, if ``push``, push it to ``remote``. Returns the
    commit sha of the published branch. Raises :class:`BookError` on bad input."""
    try:
        import ghp_import
    except ImportError:
        raise BookError("ghp-import is not installed: run `bash scripts/install.sh` (or pip install ghp-import).") from None

    html_dir = Path(html_dir).resolve()
    if not (html_dir / "index.html").is_file():
        state = "has no index.html" if html_dir.is_dir() else "does not exist"
        raise BookError(f"{html_dir} {state}: build the book first (run `depthkit book`).")
    repo = _publishing_repo(repo, remote, branch, push)
    if message is None:
        head = _git(repo, "rev-parse", "--short", "-q", "--verify", "HEAD").stdout.strip()
        message = f"Publish the book built from {head}" if head else "Publish the book"

    try:
        with _cwd(repo):
            ghp_import.ghp_import(
                str(html_dir), mesg=message, remote=remote, branch=branch, push=push, nojekyll=True
            )
    except ghp_import.GhpError as err:
        raise BookError(f"ghp-import failed: {str(err.message).strip()}") from None
    except TypeError:
        # ghp-import 2.1.0 reports a failed `git fast-import` by writing bytes to sys.stdout.
        raise BookError(f"git fast-import could not commit to {branch!r} in {repo}; see git's message above.") from None
    except subprocess.CalledProcessError:
        raise BookError(
            f"git push {remote} {branch} failed (git's message is above); the commit is on the local "
            f"branch {branch!r}: fix access to the remote and publish again."
        ) from None
    return _git(repo, "rev-parse", f"refs/heads/{branch}").stdout.strip()
