"""The ``depthkit`` command line.

    depthkit book --model smollm2-135m [--smoke] [--chapters 00,01] [--force] [--no-execute]
    depthkit run 04 --model smollm2-135m -p n_per_tag=50 [-p ...] [--dtype bfloat16 --device cuda]
    depthkit list
    depthkit results
    depthkit publish [--remote origin] [--branch gh-pages]

Parameters are checked against the chapter's spec before anything runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from depthkit.book import reference
from depthkit.book import runner as book
from depthkit.chapters import CHAPTERS, Chapter, available_chapters, chapter
from depthkit.core.params import ParameterError
from depthkit.engine.models import DEFAULT_MODEL, ModelLoadError


def _select(spec: str | None) -> list[Chapter]:
    if not spec:
        found = available_chapters()
        if not found:
            print("depthkit: no chapter notebook exists under notebooks/; building the book without chapters.")
        return found
    selected = []
    for key in spec.split(","):
        try:
            ch = chapter(key)
        except KeyError as err:
            raise book.BookError(err.args[0]) from None
        if not ch.notebook.is_file():
            raise book.BookError(f"Chapter {ch.id} ({ch.title}) has no notebook yet ({ch.notebook}).")
        selected.append(ch)
    return selected


def _results_root(arg: str | None) -> Path:
    return Path(arg or os.environ.get("DEPTHKIT_RESULTS") or book.ROOT / "results").resolve()


def _book_root(arg: str | None) -> Path:
    root = Path(arg).resolve() if arg else book.ROOT
    if arg and not root.is_dir():
        raise book.BookError(f"--root {arg}: no such folder.")
    return root


def _placement(args: argparse.Namespace) -> dict[str, str]:
    """--dtype / --device / --device-map / --backend / --remote, as chapter
    parameters (only those given)."""
    given = {
        "dtype": args.dtype, "device": args.device, "device_map": args.device_map, "backend": args.backend,
        "remote": args.remote,
    }  # fmt: skip
    return {k: v for k, v in given.items() if v is not None}


def _cmd_book(args: argparse.Namespace) -> int:
    book.build_book(
        model=args.model,
        chapters=_select(args.chapters),
        smoke=args.smoke,
        force=args.force,
        root=_book_root(args.root),
        results_root=_results_root(args.results),
        progress=sys.stderr.isatty(),
        extra=_placement(args),
        execute=not args.no_execute,
    )
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        extra = book.parse_params(args.param or [])
    except ValueError as err:
        raise book.BookError(str(err)) from None
    clash = sorted(set(extra) & set(_placement(args)))
    if clash:
        raise book.BookError(f"{clash[0]} is given both as --{clash[0].replace('_', '-')} and as -p {clash[0]}=...; give it once.")
    extra.update(_placement(args))
    (ch,) = _select(args.chapter)
    if args.reference or args.variant:
        return _keep_reference(ch, args.model, extra, args.smoke, _results_root(args.results), _command(args), args.variant)
    root = _book_root(args.root)
    print(f"depthkit run: chapter {ch.id} ({ch.title})")
    result = book.run_chapter(
        ch.id, args.model, smoke=args.smoke, root=root, results_root=_results_root(args.results),
        progress=sys.stderr.isatty(), **extra,
    )
    print(f"done in {result.elapsed_s:.1f} s; executed notebook: {result.notebook}")
    print(f"To see it in the book: depthkit book --no-execute{' --root ' + str(root) if args.root else ''}")
    return 0


def _command(args: argparse.Namespace) -> str:
    return "depthkit " + " ".join(shlex.quote(a) for a in args.argv)


def _keep_reference(
    ch: Chapter, model: str, params: dict, smoke: bool, results_root: Path, command: str, variant: str | None = None
) -> int:
    """Run ``ch`` on ``model`` in a work folder (the book's own page of the chapter is
    not replaced) and keep it as a reference run, or as robustness run ``variant``."""
    if ch.reads_results:
        raise book.BookError(f"Chapter {ch.id} reads the other chapters' results; it is rebuilt by every book, not kept.")
    work = book.ROOT / "_build" / "reference-work"
    (work / "book" / "chapters").mkdir(parents=True, exist_ok=True)
    kind = f"robustness run '{variant}'" if variant else "reference run"
    print(f"depthkit run: chapter {ch.id} ({ch.title}) on {model}, kept as a {kind}")
    results_root = reference.variant_root(results_root, variant)
    result = book.run_chapter(
        ch.id, model, smoke=smoke, root=work, results_root=results_root, progress=sys.stderr.isatty(), **params
    )
    kept = reference.save(ch, model, result.notebook.parent, results_root, command, variant=variant)
    print(f"done in {result.elapsed_s:.1f} s; kept in {kept}")
    return 0


def _cmd_reference(args: argparse.Namespace) -> int:
    """Re-execute the kept runs (every model's and variant's, or those selected) with
    the parameters they were made with; a model given with none kept yet gets every
    chapter with its defaults."""
    chapters = [c for c in _select(args.chapters) if not c.reads_results]
    wanted = {c.id for c in chapters}
    kept = [
        r for r in reference.find()
        if r.chapter.id in wanted and (not args.model or r.model in args.model) and (args.variant in (None, r.variant))
    ]  # fmt: skip
    todo = [(r.model, r.chapter, r.variant, r) for r in kept]
    # A variant is defined by the parameters it was first made with, so only plain
    # reference runs are made from nothing here.
    for model in (args.model or []) if args.variant is None else []:
        have = {r.chapter.id for r in kept if r.model == model and r.variant is None}
        todo += [(model, c, None, None) for c in chapters if c.id not in have]
    if not todo:
        raise book.BookError("No kept run matches; make one with `depthkit run NN --model NAME --reference`.")
    for model, ch, variant, old in todo:
        if args.stale_only and old is not None and not old.is_stale():
            print(f"{model} {ch.id}{f' ({variant})' if variant else ''}: unchanged since it was kept, not executed")
            continue
        params = {k: v for k, v in (old.stamp.get("params", {}) if old else {}).items() if k not in ("model", "results_root")}
        args.argv = ["run", ch.id, "--model", model, "--reference", *(["--variant", variant] if variant else [])]
        args.argv += [x for k, v in params.items() for x in ("-p", f"{k}={v}")]
        _keep_reference(ch, model, params, False, _results_root(args.results), _command(args), variant)
    return 0


def _cmd_publish(args: argparse.Namespace) -> int:
    from depthkit.book.publish import publish_book

    root = _book_root(args.root)
    html = root / "_build" / "html"
    sha = publish_book(html, remote=args.remote, branch=args.branch, message=args.message, repo=root, push=not args.no_push)
    where = f"local branch {args.branch} (not pushed)" if args.no_push else f"{args.remote}/{args.branch}"
    print(f"depthkit publish: {html} -> {where} as {sha[:12]}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    out_dir = _book_root(args.root) / "book" / "chapters"
    for ch in CHAPTERS.values():
        if not ch.notebook.is_file():
            state = "no notebook yet"
        else:
            stamp = book.read_stamp(book.output_paths(out_dir, ch.slug)[1])
            if stamp is None:
                state = "not executed"
            else:
                model = stamp.get("params", {}).get("model", "?")
                state = f"executed {stamp.get('finished', '?')} on {model} ({stamp.get('elapsed_s', '?')} s)"
        print(f"{ch.id}  {ch.title:<52} {state}")
    return 0


def _cmd_results(args: argparse.Namespace) -> int:
    from depthkit.core.results import list_runs

    runs = list_runs(_results_root(args.results))
    if len(runs) == 0:
        print(f"No complete runs under {_results_root(args.results)}.")
    else:
        print(runs.to_string(index=False))
    return 0


_RESULTS_HELP = "results folder (default: $DEPTHKIT_RESULTS or ./results of the repository)"
_ROOT_HELP = "book folder holding _config.yml, _toc.yml and book/ (default: the repository)"


def _placement_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="precision of the weights (default float32)")
    p.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: a GPU if there is one)")
    p.add_argument("--device-map", help="transformers device_map for big hub models, e.g. auto")
    p.add_argument(
        "--backend", choices=("bridge", "nnsight"),
        help="engine of the forward passes: bridge (TransformerLens, default) or nnsight",
    )  # fmt: skip
    p.add_argument(
        "--remote", nargs="?", const="true", choices=("true", "local"),
        help="with --backend nnsight: run the forward passes on NDIF (needs NDIF_API_KEY); 'local' rehearses that here",
    )  # fmt: skip


def _add_book(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("book", help="execute every chapter with papermill and build the HTML book")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model name or hub id (default {DEFAULT_MODEL})")
    _placement_options(p)
    p.add_argument(
        "--no-execute", action="store_true",
        help="build the HTML from the executed chapters as they are (chapter 07 is still refreshed when saved results changed)",
    )
    p.add_argument("--smoke", action="store_true", help="use each chapter's tiny smoke parameters")
    p.add_argument("--chapters", help="comma-separated chapter ids, e.g. 00,01 (default: every chapter)")
    p.add_argument("--force", action="store_true", help="execute chapters even if unchanged since their last run")
    p.add_argument("--results", help=_RESULTS_HELP)
    p.add_argument("--root", help=_ROOT_HELP)
    p.set_defaults(func=_cmd_book)


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="execute one chapter into <root>/book/chapters/")
    p.add_argument("chapter", help="chapter id or slug, e.g. 04")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model name or hub id (default {DEFAULT_MODEL})")
    _placement_options(p)
    p.add_argument("-p", "--param", action="append", metavar="KEY=VALUE", help="parameter, value read as YAML")
    p.add_argument("--smoke", action="store_true", help="start from the chapter's smoke parameters")
    p.add_argument("--results", help=_RESULTS_HELP)
    p.add_argument("--root", help="folder whose book/chapters/ receives the executed notebook (default: the repository)")
    p.add_argument(
        "--reference", action="store_true",
        help="keep the run in reference/<model>/ with its provenance; the book then shows it beside the default model",
    )  # fmt: skip
    p.add_argument(
        "--variant", metavar="NAME",
        help="keep it as robustness run NAME (e.g. logit, with -p lens=logit): the findings page's robustness column",
    )  # fmt: skip
    p.set_defaults(func=_cmd_run)


def _add_reference(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reference", help="re-execute the reference runs kept in reference/ (every model's by default)")
    p.add_argument("--model", action="append", help="only this model (repeatable); a model with none yet gets every chapter")
    p.add_argument("--chapters", help="comma-separated chapter ids (default: every chapter)")
    p.add_argument("--variant", metavar="NAME", help="only robustness run NAME (made first with `depthkit run NN --variant NAME -p ...`)")
    p.add_argument("--stale-only", action="store_true", help="only the runs whose chapter code changed since")
    p.add_argument("--results", help=_RESULTS_HELP)
    p.set_defaults(func=_cmd_reference)


def _add_listings(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list the chapters and their last run")
    p.add_argument("--root", help=_ROOT_HELP)
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("results", help="list the complete result runs")
    p.add_argument("--results", help=_RESULTS_HELP)
    p.set_defaults(func=_cmd_results)


def _add_publish(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("publish", help="publish the built book (_build/html) to a gh-pages branch of a git remote")
    p.add_argument("--remote", default="origin", help="git remote to push to (default origin)")
    p.add_argument("--branch", default="gh-pages", help="branch that holds the site (default gh-pages)")
    p.add_argument("-m", "--message", help="commit message (default names the commit the book was built from)")
    p.add_argument("--no-push", action="store_true", help="commit to the local branch only")
    p.add_argument("--root", help=_ROOT_HELP)
    p.set_defaults(func=_cmd_publish)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="depthkit", description="Run the chapters of the book and build it.")
    sub = parser.add_subparsers(dest="command", required=True)
    # In the order `depthkit --help` lists them.
    for add in (_add_book, _add_run, _add_reference, _add_listings, _add_publish):
        add(sub)
    return parser


class Stopped(KeyboardInterrupt):
    """A stop signal (SIGTERM, SIGHUP) raised where the runner is, so it unwinds like
    Ctrl-C: papermill keeps the partial notebook and shuts its kernel down."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    # Python's default for these is to die on the spot, skipping every cleanup.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_stopped)
    try:
        return args.func(args)
    except (book.BookError, ParameterError, ModelLoadError) as err:
        kind = "" if isinstance(err, book.BookError) else f"{type(err).__name__}: "
        print(f"depthkit {args.command}: {kind}{err}", file=sys.stderr)
        return 1
    except ImportError as err:  # a missing optional package says how to install it
        print(f"depthkit {args.command}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:
        signum = err.signum if isinstance(err, Stopped) else signal.SIGINT
        with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) cannot be written to
            print(f"depthkit {args.command}: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
