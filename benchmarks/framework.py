"""The shape every benchmark scenario fills (``Scenario``), the run around it (``Run``: flags,
config, processes cleaned up however the run ends) and its report: the JSON, the plots, the
RESULTS.md section, its prose from ``templates/`` (``render``). benchmarks/README.md, "How a
scenario is built", walks through it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import string
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from benchmarks.harness import (
    BenchmarkFailed,
    Cleanup,
    command_line,
    describe_machine,
    fmt_number,
    fmt_range,
    machine_info,
    now_utc,
    positive_int,
    say,
    scaled,
    update_results_md,
    write_json,
)
from benchmarks.stack import BenchServer, start_server

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "out"
DEFAULT_RESULTS_MD = BENCH_DIR / "RESULTS.md"
TEMPLATES = BENCH_DIR / "templates"
#: A measurement during which other processes used more than this share of the machine is
#: flagged as disturbed: its wall-clock figures are not trustworthy.
DISTURBED_LOAD = 0.10

C = TypeVar("C")
T = TypeVar("T")


# ------------------------------------------------------------------------------ arguments


@dataclass(frozen=True)
class ByMode:
    """A flag's default that depends on ``--quick``, picked once the flags are parsed.
    ``%(default)s`` in a help text reads ``FULL; QUICK with --quick``."""

    full: Any
    quick: Any

    def __str__(self) -> str:
        return f"{self.full}; {self.quick} with --quick"


def _numbers(text: str, convert: Callable[[str], float]) -> tuple[Any, ...]:
    try:
        values = sorted({convert(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers, got {text!r}"
                                         ) from None
    if not values or values[0] <= 0:
        raise argparse.ArgumentTypeError(f"must be positive numbers, got {text!r}")
    return tuple(values)


def int_list(text: str) -> tuple[int, ...]:
    """``1,2,4`` -> (1, 2, 4): positive, sorted, without repeats."""
    return _numbers(text, int)


def float_list(text: str) -> tuple[float, ...]:
    """``0.5,1`` -> (0.5, 1.0): positive, sorted, without repeats."""
    return _numbers(text, float)


def flag(type: Callable[[str], Any] | None = None, default: Any = None, help: str = "", *,
         name: str | None = None, **argparse_options: Any) -> Any:
    """A config field that is its own command-line flag, declared once: ``--field-name`` (or
    ``name``) with argparse's ``type``, ``default`` (a ``ByMode`` for ``--quick``) and ``help``,
    which gets ``(default ...)`` appended when there is a default. The field itself has no
    default: ``configure`` fills it from the parsed flags."""
    return dataclasses.field(metadata={"flag": dict(
        name=name, type=type, default=default, help=help, **argparse_options)})


def switch(help: str, *, name: str | None = None) -> Any:
    """A boolean config field set by a flag: ``--field-name`` sets it, or ``name`` =
    ``--no-...`` clears it (the field then defaults to true)."""
    off = name is not None and name.startswith("--no-")
    return dataclasses.field(metadata={"flag": dict(
        name=name, action="store_false" if off else "store_true", help=help)})


def add_flags(parser: argparse.ArgumentParser, config: type[Any]) -> None:
    """The flags declared on ``config``'s fields (``flag``, ``switch``), in field order."""
    for f in dataclasses.fields(config):
        if "flag" not in f.metadata:
            continue
        options = {k: v for k, v in f.metadata["flag"].items() if v is not None}
        name = options.pop("name", None) or "--" + f.name.replace("_", "-")
        if options.get("default") is not None and options["help"]:
            options["help"] += " (default %(default)s)"
        parser.add_argument(name, dest=f.name, **options)


# ------------------------------------------------------------------------------ the shape


@dataclass
class Run(Generic[C]):
    """What ``measure`` gets: its config, the common flags, the machine (read at the start)
    and the ``Cleanup`` that owns every process it starts."""

    name: str
    cfg: C
    quick: bool
    trials: int
    out: Path
    cleanup: Cleanup
    machine: dict[str, Any]

    @property
    def log_dir(self) -> Path:
        return self.out / "logs"

    def server(self, *, appendonly: bool = True) -> tuple[BenchServer, str]:
        """The embedded server (AOF on by default) in a temporary folder, stopped and removed
        when the run ends."""
        return start_server(self.cleanup, self.name, appendonly=appendonly)

    def each_trial(self) -> Iterator[int]:
        """0 .. trials - 1, announcing each trial."""
        for trial in range(self.trials):
            say(f"trial {trial + 1}/{self.trials}")
            yield trial

    def rotations(self, variants: Sequence[T], label: Callable[[T], str] = str
                  ) -> Iterator[tuple[int, list[T]]]:
        """(trial, the variants rotated by one more each trial), announcing each trial."""
        for trial in range(self.trials):
            shift = trial % len(variants)
            order = [*variants[shift:], *variants[:shift]]
            say(f"trial {trial + 1}/{self.trials}: {' -> '.join(map(label, order))}")
            yield trial, order


class Scenario(Generic[C]):
    """One benchmark scenario: set the class attributes, ``measure`` and ``markdown``; the
    other methods are optional."""

    #: The command (``python -m benchmarks NAME``), the JSON's and the section's name.
    name: ClassVar[str]
    #: One line: the command's help and, after ``NAME:``, the section's heading.
    title: ClassVar[str]
    #: What ``--quick`` runs, for its help.
    quick_help: ClassVar[str]
    #: The ``Config`` dataclass ``configure`` fills from the flags of the same names.
    config: type[C]
    #: The default of ``--trials``: (full run, ``--quick``); None: the scenario has no trials.
    trials: ClassVar[tuple[int, int] | None] = (3, 1)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The scenario's flags beyond those its config's fields declare (``flag``)."""

    def configure(self, args: argparse.Namespace) -> C:
        names = {f.name for f in dataclasses.fields(self.config)}  # type: ignore[arg-type]
        return self.config(**{k: v for k, v in vars(args).items() if k in names})

    def records(self, args: argparse.Namespace) -> bool:
        """Whether this run writes its section of RESULTS.md (unless ``--no-results-md``)."""
        return True

    def measure(self, run: Run[C]) -> dict[str, Any]:
        """Run the workload through every variant; return the figures."""
        raise NotImplementedError

    def markdown(self, report: Mapping[str, Any]) -> str:
        """The section's body, below the command, date and machine lines."""
        raise NotImplementedError

    def plots(self, report: Mapping[str, Any], folder: Path) -> list[Path]:
        return []

    def exit_code(self, report: Mapping[str, Any]) -> int:
        return 0

    # ------------------------------------------------------------- driven by __main__

    def build_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--quick", action="store_true",
                            help=f"smoke test, not a measurement: {self.quick_help}")
        if self.trials is not None:
            parser.add_argument("--trials", type=positive_int, default=ByMode(*self.trials),
                                help="repeated trials; medians and min..max are reported "
                                     "(default %(default)s)")
        parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                            help=f"folder for {self.name}.json, plots and logs "
                                 "(default benchmarks/out)")
        parser.add_argument("--results-md", type=Path, default=DEFAULT_RESULTS_MD,
                            help="RESULTS.md to update (default benchmarks/RESULTS.md); its "
                                 "plots go to a plots/ folder next to it")
        parser.add_argument("--no-results-md", action="store_true",
                            help="do not touch RESULTS.md or its plots folder")
        add_flags(parser, self.config)
        self.add_arguments(parser)

    def main(self, args: argparse.Namespace) -> int:
        """Measure, then report; the exit status of ``python -m benchmarks NAME``."""
        for key, value in vars(args).items():
            if isinstance(value, ByMode):
                setattr(args, key, value.quick if args.quick else value.full)
        cfg = self.configure(args)
        results_md = None if args.no_results_md or not self.records(args) else args.results_md
        started, date = time.monotonic(), now_utc()
        cleanup = Cleanup()
        cleanup.install_signal_handlers()
        try:
            run = Run(self.name, cfg, args.quick, getattr(args, "trials", 1), args.out,
                      cleanup, machine_info(server_binary=_server_binary()))
            figures = self.measure(run)
        except KeyboardInterrupt as exc:
            print(f"\nbenchmarks {self.name}: interrupted ({exc or 'Ctrl-C'}); stopping its "
                  "processes", file=sys.stderr)
            return 130
        except Exception as exc:
            leaf = first_leaf(exc)
            if not isinstance(leaf, BenchmarkFailed):
                raise
            print(f"\nbenchmarks {self.name}: failed: {leaf}", file=sys.stderr)
            return 1
        finally:
            cleanup.close()
        report: dict[str, Any] = {
            "scenario": self.name, "command": command_line(), "date": date, "quick": run.quick,
            "elapsed_s": round(time.monotonic() - started, 1), "machine": run.machine,
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
            "config": {**config_dict(cfg), "trials": run.trials, "quick": run.quick,
                       "out": run.out, "results_md": results_md},
            **figures}
        report = json.loads(json.dumps(report, default=str))  # what the markdown reads = JSON
        print()
        print(self.save(report, run.out, results_md))
        return self.exit_code(report)

    def save(self, report: dict[str, Any], out: Path, results_md: Path | None) -> str:
        """Draw the plots, write ``<out>/<name>.json`` and the section (returned)."""
        plots = self.plots(report, out / "plots")
        report["plots"] = [str(p) for p in plots]
        json_path = out / f"{self.name}.json"
        write_json(json_path, report)
        say(f"wrote {json_path}")
        links = publish_plots(plots, results_md)
        section = "\n".join([
            header(report, f"{self.name}: {self.title}") + self.markdown(report).rstrip(), "",
            *(f"![{self.name} plot]({link})" for link in links), *([""] if links else []),
            f"Raw figures: `{display_path(json_path)}`."])
        if results_md is not None:
            update_results_md(self.name, section, results_md)
            say(f"updated {results_md}")
        return section


def config_dict(cfg: Any) -> dict[str, Any]:
    """A config dataclass's fields and properties (the figures derived from them)."""
    out = dataclasses.asdict(cfg)
    for klass in type(cfg).__mro__:
        for name, attr in vars(klass).items():
            if isinstance(attr, property):
                out.setdefault(name, getattr(cfg, name))
    return out


def _server_binary() -> str | None:
    from inferq.embedded import find_server_binary

    with contextlib.suppress(Exception):
        return find_server_binary()
    return None


def first_leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups, e.g. from a TaskGroup."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


# -------------------------------------------------------------------------------- reports


class _Text(string.Template):
    # ``${name}``, ``${a.b.c}`` (nested keys), ``${a.b:,.1f}`` (a format spec) and
    # ``${a.b|range:2}`` (a filter of FILTERS, its spec the digits).
    braceidpattern = r"(?a:[_a-z][_a-z0-9.]*(?:\|[a-z_]+)?(?::[^}]*)?)"


def _range(factor: float = 1.0, unit: str = "") -> Callable[[Any, str], str]:
    def fmt(s: Mapping[str, Any], spec: str) -> str:
        return fmt_range(scaled(s, factor) if factor != 1.0 else s, int(spec or 1), unit)
    return fmt


#: ``${a.b|name:digits}`` in a template: a summary (``harness.summary``) as median (min..max),
#: also as seconds (from ms) or percent (``percent`` with the sign); a number with thousands
#: separators.
FILTERS: dict[str, Callable[[Any, str], str]] = {
    "range": _range(), "range_s": _range(1e-3), "range_pct": _range(100),
    "percent": _range(100, "%"),
    "num": lambda v, spec: fmt_number(v, int(spec or 0)),
}


class _Values(Mapping[str, str]):
    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data

    def __getitem__(self, key: str) -> str:
        path, _, spec = key.partition(":")
        path, _, name = path.partition("|")
        value: Any = self.data
        for part in path.split("."):
            value = value[part]
        return FILTERS[name](value, spec) if name else format(value, spec)

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


def template_block(template: str) -> str:
    """The block ``template`` (``scenario`` or ``scenario.block``) of
    ``templates/<scenario>.md``: blocks after the first start with a line
    ``<!-- template: block -->``."""
    name, _, block = template.partition(".")
    parts = re.split(r"^<!-- template: ([\w-]+) -->\n", (TEMPLATES / f"{name}.md").read_text(),
                     flags=re.M)
    return {"": parts[0], **dict(zip(parts[1::2], parts[2::2], strict=True))}[block]


def render(template: str, values: Mapping[str, Any], **extra: Any) -> str:
    """A template block filled in: a ``string.Template`` whose ``${a.b:spec}`` reads
    ``values[a][b]`` (or ``extra``) formatted with ``spec``."""
    text = _Text(template_block(template)).substitute(_Values({**values, **extra}))
    return text.rstrip("\n") + "\n"


def render_rows(template: str, rows: Iterable[Mapping[str, Any]], **extra: Any) -> str:
    """A one-line template block (a table row) filled in once per element of ``rows``."""
    line = _Text(template_block(template).strip("\n"))
    return "\n".join(line.substitute(_Values({**row, **extra})) for row in rows)


def render_keyed(template: str, figures: Mapping[str, Any], **extra: Any) -> list[str]:
    """The lines ``key: text`` of a template block whose ``key`` has a value (not None) in
    ``figures``, each filled in with that value as ``v`` (and ``extra``)."""
    return [_Text(text).substitute(_Values({"v": figures[key], **extra}))
            for key, _, text in (line.partition(": ")
                                 for line in template_block(template).splitlines())
            if figures.get(key) is not None]


def noise_of(loads: Iterable[float | None]) -> dict[str, Any]:
    """The worst share of the machine other processes used during a measurement, and
    whether that makes the run disturbed; a scenario returns it as its ``noise``."""
    values = [x for x in loads if x is not None]
    worst = max(values, default=None)
    return {"max_other_load": worst, "disturbed": (worst or 0.0) > DISTURBED_LOAD}


def header(report: Mapping[str, Any], title: str) -> str:
    """The section's heading, quick/disturbed warnings, command, date and machine."""
    m = report["machine"]
    quick = ("\n> **Quick run** (`--quick`): a smoke test with few requests and one trial, not "
             "a measurement.\n" if report["quick"] else "")
    noise = report.get("noise", {})
    disturbed = ("" if not noise.get("disturbed") else
                 f"\n> **Disturbed run**: other processes used up to "
                 f"{noise['max_other_load']:.0%} of the machine during a measurement; "
                 "wall-clock figures are unreliable.\n")
    dirty = " (dirty tree)" if m["git"]["dirty"] else ""
    return (f"## {title}\n{quick}{disturbed}\n"
            f"- Command: `{report['command']}` ({report['elapsed_s']:.0f} s)\n"
            f"- Date: {report['date']}; git {str(m['git']['commit'])[:10]}{dirty}\n"
            f"- Machine: {describe_machine(m)}; load average {m['load_avg_1_5_15']} at start, "
            f"{report['load_avg_end']} at end\n")


def publish_plots(plots: Sequence[Path], results_md: Path | None) -> list[str]:
    """Copy plots next to RESULTS.md (``plots/``) and return their links relative to it; when
    RESULTS.md is not updated, links point at the files under ``out/``."""
    if results_md is None:
        return [str(p) for p in plots]
    folder = results_md.resolve().parent / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    links = []
    for p in plots:
        shutil.copyfile(p, folder / p.name)
        links.append(f"plots/{p.name}")
    return links


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(BENCH_DIR.parent))
    except ValueError:
        return str(path)
