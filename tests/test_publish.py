"""Publishing the built book onto gh-pages (depthkit.book.publish), against a local bare
repository, and the GitHub Pages workflow."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from depthkit.book.publish import publish_book
from depthkit.book.runner import BookError

REPO = Path(__file__).resolve().parent.parent

def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """(work repo with one commit and remote origin = a bare repo, bare repo, built book folder)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    # No user or system git config: the test works on a machine without one.
    empty = tmp_path / "gitconfig"
    empty.write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(empty))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    # Outside any repository: a publish that ignored `repo` would fail here rather
    # than write a gh-pages branch into the checkout the tests run from.
    monkeypatch.chdir(tmp_path)
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "Depthkit Test")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "test@example.invalid")
    work, bare = tmp_path / "work", tmp_path / "remote.git"
    git("init", "-q", "-b", "main", str(work))
    (work / "README.md").write_text("book\n")
    git("add", "README.md", cwd=work)
    git("commit", "-q", "-m", "first", cwd=work)
    git("init", "-q", "--bare", str(bare))
    git("remote", "add", "origin", str(bare), cwd=work)
    html = tmp_path / "html"
    (html / "_static").mkdir(parents=True)
    (html / "index.html").write_text("<html>book</html>")
    (html / "_static" / "x.css").write_text("body {}")
    return work, bare, html


def remote_files(bare: Path) -> set[str]:
    return set(git(f"--git-dir={bare}", "ls-tree", "-r", "gh-pages", "--name-only").splitlines())


def test_publish_pushes_the_book_with_nojekyll(setup):
    work, bare, html = setup
    sha = publish_book(html, repo=work)
    assert Path.cwd() == work.parent
    assert remote_files(bare) == {"index.html", "_static/x.css", ".nojekyll"}
    assert sha == git(f"--git-dir={bare}", "rev-parse", "refs/heads/gh-pages")
    assert git(f"--git-dir={bare}", "show", "gh-pages:index.html") == "<html>book</html>"
    head = git("rev-parse", "--short", "HEAD", cwd=work)
    assert git(f"--git-dir={bare}", "log", "-1", "--format=%s", "gh-pages") == f"Publish the book built from {head}"
    # The book's own branch is left alone.
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=work) == "main"
    assert git("status", "--porcelain", cwd=work) == ""


def test_publishing_twice_keeps_history_and_replaces_files(setup):
    work, bare, html = setup
    first = publish_book(html, repo=work, message="one")
    (html / "_static" / "x.css").unlink()
    (html / "new.html").write_text("new")
    second = publish_book(html, repo=work, message="two")
    assert second != first
    assert git(f"--git-dir={bare}", "rev-list", "gh-pages").splitlines() == [second, first]
    assert git(f"--git-dir={bare}", "log", "--format=%s", "gh-pages").splitlines() == ["two", "one"]
    assert remote_files(bare) == {"index.html", "new.html", ".nojekyll"}


def test_publish_builds_on_the_remote_branch_not_yet_fetched(setup, tmp_path):
    """A fresh clone (as in CI) has no origin/gh-pages yet: the new commit must
    still follow the remote's history, or the push would be rejected."""
    work, bare, html = setup
    first = publish_book(html, repo=work)
    git("push", "-q", "origin", "main", cwd=work)
    clone = tmp_path / "clone"
    git("clone", "-q", "--single-branch", "-b", "main", str(bare), str(clone))
    second = publish_book(html, repo=clone)
    assert git(f"--git-dir={bare}", "rev-list", "gh-pages").splitlines() == [second, first]


def test_publish_without_push_commits_locally_only(setup):
    work, bare, html = setup
    sha = publish_book(html, repo=work, branch="pages", push=False)
    assert sha == git("rev-parse", "refs/heads/pages", cwd=work)
    assert git(f"--git-dir={bare}", "branch", "--list") == ""


def test_missing_html_dir(setup, tmp_path):
    work, _, _ = setup
    with pytest.raises(BookError, match=r"does not exist.*depthkit book"):
        publish_book(tmp_path / "nowhere", repo=work)


def test_html_dir_without_index(setup):
    work, bare, html = setup
    (html / "index.html").unlink()
    with pytest.raises(BookError, match=r"has no index\.html.*depthkit book"):
        publish_book(html, repo=work)
    assert git(f"--git-dir={bare}", "branch", "--list") == ""


def test_unknown_remote_lists_the_remotes(setup):
    work, bare, html = setup
    git("remote", "add", "mirror", str(bare), cwd=work)
    with pytest.raises(BookError, match=r"'upstream' does not exist.*remotes: mirror, origin"):
        publish_book(html, remote="upstream", repo=work)


def test_not_a_git_repository(setup, tmp_path):
    _, _, html = setup
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(BookError, match="not inside a git repository"):
        publish_book(html, repo=plain)


def test_bad_branch_name(setup):
    work, _, html = setup
    with pytest.raises(BookError, match="not a valid git branch name"):
        publish_book(html, branch="a..b", repo=work)


def test_missing_identity(setup, monkeypatch):
    work, bare, html = setup
    monkeypatch.delenv("GIT_COMMITTER_NAME")
    with pytest.raises(BookError, match="user.name"):
        publish_book(html, repo=work)
    assert git(f"--git-dir={bare}", "branch", "--list") == ""


def test_failed_push_says_so(setup):
    work, bare, html = setup
    git("remote", "set-url", "origin", str(bare.parent / "gone.git"), cwd=work)
    with pytest.raises(BookError, match=r"git push origin gh-pages failed"):
        publish_book(html, repo=work)


def test_pages_workflow_builds_smoke_book_and_deploys():
    wf = yaml.safe_load((REPO / ".github" / "workflows" / "book.yml").read_text(encoding="utf-8"))
    # YAML 1.1 reads the key `on` as True.
    triggers = wf.get("on", wf.get(True))
    assert set(triggers) == {"push", "workflow_dispatch"}
    assert triggers["push"]["branches"] == ["main"]
    assert wf["permissions"]["pages"] == "write" and wf["permissions"]["id-token"] == "write"
    assert wf["concurrency"]["group"] == "pages"
    steps = [step for job in wf["jobs"].values() for step in job["steps"]]
    runs = "\n".join(step.get("run", "") for step in steps)
    uses = [step.get("uses", "") for step in steps]
    assert "bash scripts/install.sh" in runs
    assert "depthkit book --smoke" in runs
    assert any(u.startswith("actions/setup-python@") for u in uses)
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "_build/html"
    assert any(u.startswith("actions/deploy-pages@") for u in uses)
