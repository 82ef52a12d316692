"""Two runs side by side (`kbench compare A B`): per submission and benchmark size, the speedup
before and after, the change, and whether it is beyond noise. Speedups, not times, are
compared: each divides the reference timed in the same run, so a machine that got slower
between the runs does not read as a regression. Verdicts that are new, gone or changed are
listed; a correct submission that stopped being correct counts as a regression.

Beyond noise means both: the two 95 % intervals do not overlap, and the change is larger than
a noise floor. The intervals describe the sampling noise within one run only; between runs
(another process placement, another GPU or host of the same kind) a speedup moves more, most of
all where launch overhead dominates. Measured on unchanged l2norm files: in 417 size rows of
four runs on one host of 2x H200 (docs/evidence/h200x2-2026-11-26-scaling/), 11 had disjoint
intervals, all at launch-bound sizes, moved by up to 7.8 %; between two such hosts
(docs/evidence/h200x2-2026-11-26-compare/), 4 of 42, up to 1.1 % at ordinary sizes and 5.5 % at
launch-bound ones. Hence the default floors, 3 % and 10 % (launch-bound: marked † in the
report)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from kbench.results.run_record import RunResult, params_text
from kbench.results.verdict import Status

NOISE_FLOOR_PCT = 3.0  # smallest change called beyond noise, where intervals are disjoint
LAUNCH_BOUND_FLOOR_PCT = 10.0  # the same for launch-bound sizes (RunResult.launch_bound)


@dataclass(frozen=True)
class SizeChange:
    problem: str
    submission: str
    size: str
    dtype: str
    before: float
    before_ci: list[float] | None
    after: float
    after_ci: list[float] | None
    floor_pct: float  # the noise floor this size is judged with (see the module's docstring)

    @property
    def change_pct(self) -> float:
        return 100 * (self.after / self.before - 1)

    @property
    def disjoint(self) -> bool:
        """The two intervals do not overlap."""
        if not self.before_ci or not self.after_ci:
            return False
        return self.after_ci[1] < self.before_ci[0] or self.after_ci[0] > self.before_ci[1]

    @property
    def beyond_noise(self) -> bool:
        return self.disjoint and abs(self.change_pct) > self.floor_pct

    def regressed(self, pct: float) -> bool:
        return self.beyond_noise and self.change_pct < -pct


@dataclass(frozen=True)
class VerdictChange:
    problem: str
    submission: str
    before: str | None  # None: not in the first run
    after: str | None  # None: not in the second

    @property
    def regressed(self) -> bool:
        return self.before == Status.OK.value and self.after not in (None, Status.OK.value)


@dataclass(frozen=True)
class Diff:
    before: str  # how each run was named
    after: str
    sizes: list[SizeChange]
    verdicts: list[VerdictChange]

    def regressions(self, pct: float) -> list[str]:
        """One line per size slower beyond noise by more than ``pct`` percent, and per
        submission no longer correct."""
        return ([f"{c.problem}/{c.submission} {c.size}: {c.before:.3f}x -> {c.after:.3f}x "
                 f"({c.change_pct:+.1f}%)" for c in self.sizes if c.regressed(pct)]
                + [f"{v.problem}/{v.submission}: {v.before} -> {v.after}"
                   for v in self.verdicts if v.regressed])


class DiffError(Exception):
    pass


def load(source: str, store_dir: Path) -> tuple[str, RunResult]:
    """A run by its id in the store in ``store_dir``, or a results.json (or a folder with
    one); its name as the table shows it."""
    if source.isdigit():
        from kbench.results.store import FILENAME, Store, StoreError

        if not (store_dir / FILENAME).exists():
            raise DiffError(f"run {source}: no results store in {store_dir} (--out names it)")
        try:
            with Store(store_dir) as store:
                return f"run {source}", store.load_run(int(source))
        except StoreError as exc:
            raise DiffError(str(exc)) from None
    path = Path(source)
    path = path / "results.json" if path.is_dir() else path
    try:
        return str(path), RunResult.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DiffError(f"{path}: not a kbench results.json ({type(exc).__name__}: "
                        f"{exc})") from None


@dataclass(frozen=True)
class Floors:
    """Noise floors in percent (`--noise-floor`, `--launch-bound-floor`)."""

    ordinary: float = NOISE_FLOOR_PCT
    launch_bound: float = LAUNCH_BOUND_FLOOR_PCT

    @classmethod
    def given(cls, ordinary: float | None, launch_bound: float | None) -> Floors:
        """The defaults where the command line gave none."""
        return cls(cls.ordinary if ordinary is None else ordinary,
                   cls.launch_bound if launch_bound is None else launch_bound)

    def of(self, bound: bool) -> float:
        return self.launch_bound if bound else self.ordinary


def diff(before: tuple[str, RunResult], after: tuple[str, RunResult],
         floors: Floors = Floors()) -> Diff:
    old = {(s.problem, s.name): s for s in before[1].submissions}
    new = {(s.problem, s.name): s for s in after[1].submissions}
    # Launch-bound in either run's reference table (as the report marks it, †): the wider floor.
    bound = {(p.name, size) for run in (before[1], after[1]) for p in run.problems
             for size in run.launch_bound(p)}
    sizes, verdicts = [], []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if a is None or b is None or a.status is not b.status:
            verdicts.append(VerdictChange(*key, a and a.status.value, b and b.status.value))
        if a is None or b is None:
            continue
        earlier = {(params_text(x.params), x.dtype): x for x in a.benchmarks if x.speedup}
        for x in b.benchmarks:
            y = earlier.get((params_text(x.params), x.dtype))
            if x.speedup and y is not None:
                size = params_text(x.params)
                sizes.append(SizeChange(*key, size, x.dtype, y.speedup, y.speedup_ci,
                                        x.speedup, x.speedup_ci,
                                        floors.of((key[0], size) in bound)))
    return Diff(before[0], after[0], sizes, verdicts)


def compare(before: str, after: str, store_dir: Path, fail_pct: float | None,
            floors: Floors = Floors()) -> int:
    """`kbench compare`: print the diff; 1 if ``fail_pct`` is given and a regression beyond
    it was found, else 0. Raises DiffError for a run that cannot be read."""
    for flag, value in (("--noise-floor", floors.ordinary),
                        ("--launch-bound-floor", floors.launch_bound),
                        ("--fail-on-regression", fail_pct)):
        if value is not None and not 0 <= value < 100:  # NaN fails too: it hides every change
            raise DiffError(f"{flag} {value:g}: expected a percentage from 0 to under 100")
    result = diff(load(before, store_dir), load(after, store_dir), floors)
    print(render(result, fail_pct or 0.0))
    regressions = result.regressions(fail_pct) if fail_pct is not None else []
    if regressions:
        print(f"\n{len(regressions)} regression(s) beyond noise and {fail_pct:g}%:")
        print("\n".join(f"- {line}" for line in regressions))
    return 1 if regressions else 0


def render(d: Diff, pct: float) -> str:
    lines = [f"before: {d.before}", f"after:  {d.after}", ""]
    if d.sizes:
        lines.append(tabulate(
            [[f"{c.problem}/{c.submission}", c.size, _x(c.before, c.before_ci),
              _x(c.after, c.after_ci), f"{c.change_pct:+.1f}%",
              _judgement(c, pct)] for c in d.sizes],
            headers=["submission", "size", "before", "after", "change", "beyond noise?"],
            tablefmt="github"))
    else:
        lines.append("No size was timed in both runs.")
    if d.verdicts:
        lines += ["", tabulate([[f"{v.problem}/{v.submission}", v.before or "(new)",
                                 v.after or "(gone)"] for v in d.verdicts],
                               headers=["submission", "verdict before", "after"],
                               tablefmt="github")]
    return "\n".join(lines)


def _judgement(c: SizeChange, pct: float) -> str:
    if c.beyond_noise:
        return "REGRESSION" if c.regressed(pct) else "faster" if c.change_pct > 0 else "slower"
    return f"within floor ({c.floor_pct:g}%)" if c.disjoint else "within noise"


def _x(value: float, ci: list[float] | None) -> str:
    return f"{value:.3f}x" + (f" ({ci[0]:.3g}-{ci[1]:.3g})" if ci else "")
