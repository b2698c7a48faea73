"""The fuzz campaign: valid cases and invalid-input cases per backend, aggregated into one report.

Case (backend, seed) for seeds 0, 1, ... of each backend; `split` shares a total among the backends (the Triton
backend, slow under TRITON_INTERPRET=1, gets a smaller share of smaller cases, see grpo_fast.testing.fuzz.cases).
The report is JSON-able: per backend the case counts, the failures, and the worst ratio error / bound per
category (loss, metric, grad) with the case that produced it and the command that reproduces it.
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable

from .check import CaseResult, run_case
from .invalid import run_invalid_case

SHARES = {"torch": 0.425, "cpu": 0.425, "triton": 0.15}
CATEGORIES = ("loss", "metric", "grad")
LISTED_FAILURES = 20  # failing cases listed in full per backend (all are counted)


def split(total: int, backends: tuple[str, ...]) -> dict[str, int]:
    """`total` cases shared among `backends` by SHARES (renormalised), the remainder to the first."""
    weights = {b: SHARES[b] for b in backends}
    counts = {b: int(total * w / sum(weights.values())) for b, w in weights.items()}
    counts[backends[0]] += total - sum(counts.values())
    return counts


def reproduce_command(backend: str, seed: int, invalid: bool = False) -> str:
    return f"python -m grpo_fast.testing.fuzz --backend {backend} --seed {seed}" + (" --invalid" if invalid else "")


def shard(count: int, index: int, shards: int) -> range:
    """Seeds of shard `index` of `shards` (contiguous, sizes differing by at most one) out of seeds 0..count-1."""
    if not 0 <= index < shards:
        raise ValueError(f"shard: expected an index in [0, {shards}), got {index}")
    return range(count * index // shards, count * (index + 1) // shards)


def run_campaign(
    cases: dict[str, int | range],
    invalid: dict[str, int | range],
    progress: Callable[[str], None] | None = None,
):
    """{backend: report} for the valid cases `cases[backend]` and invalid-input cases `invalid[backend]` (a count:
    seeds from 0; or a range of seeds, one shard of a campaign, see `shard` and `merge_reports`)."""
    report = {}
    for backend in cases:
        start = time.perf_counter()
        section = _BackendReport(backend)
        seeds = _seeds(cases[backend])
        for done, seed in enumerate(seeds, 1):
            section.add(run_case(backend, seed))
            if progress and done % 100 == 0:
                progress(f"{backend}: {done}/{len(seeds)} cases (seeds {seeds.start}-), {section.failed} failed")
        for seed in _seeds(invalid.get(backend, 0)):
            section.add_invalid(run_invalid_case(backend, seed))
        report[backend] = section.as_dict(time.perf_counter() - start)
    return report


def _seeds(cases: int | range) -> range:
    return cases if isinstance(cases, range) else range(cases)


def merge_reports(reports: list[dict]) -> dict:
    """One {backend: report} from the reports of disjoint shards (run_campaign's, or read back from JSON): counts
    add up, the worst case of each category is the worst of the shards', the listed failures are the first
    LISTED_FAILURES by seed, and a backend's wall_s is the sum of its shards' (the time its cases took one after
    another, not the elapsed time of shards run side by side)."""
    merged: dict[str, dict] = {}
    for report in reports:
        for backend, section in report.items():
            merged[backend] = section if backend not in merged else _merge_sections(merged[backend], section)
    return merged


def _merge_sections(a: dict, b: dict) -> dict:
    def add(x: dict, y: dict, order) -> dict:
        total = collections.Counter(x) + collections.Counter(y)
        total.update({k: 0 for k in (*x, *y) if k not in total})  # Counter + drops zero counts
        return dict(sorted(total.items(), key=order))

    def first(x: list, y: list) -> list:
        return sorted(x + y, key=lambda entry: entry["seed"])[:LISTED_FAILURES]

    worst = {}
    for category in CATEGORIES:
        candidates = [w for w in (a["worst"].get(category), b["worst"].get(category)) if w is not None]
        if candidates:
            worst[category] = max(candidates, key=lambda w: (w["ratio"], -w["seed"]))
    keys = [*a["counts"], *(k for k in b["counts"] if k not in a["counts"])]
    inv_a, inv_b = a["invalid"], b["invalid"]
    return {
        "cases": a["cases"] + b["cases"],
        "failed": a["failed"] + b["failed"],
        "failures": first(a["failures"], b["failures"]),
        "worst": worst,
        "checks": a["checks"] + b["checks"],
        "checks_with_conditioning_slack_above_rule": a["checks_with_conditioning_slack_above_rule"]
        + b["checks_with_conditioning_slack_above_rule"],
        "counts": {k: add(a["counts"].get(k, {}), b["counts"].get(k, {}), lambda item: str(item[0])) for k in keys},
        "invalid": {
            "cases": inv_a["cases"] + inv_b["cases"],
            "failed": inv_a["failed"] + inv_b["failed"],
            "failures": first(inv_a["failures"], inv_b["failures"]),
            "mutations": add(inv_a["mutations"], inv_b["mutations"], lambda item: (-item[1], str(item[0]))),
        },
        "wall_s": round(a["wall_s"] + b["wall_s"], 1),
    }


class _BackendReport:
    def __init__(self, backend: str):
        self.backend = backend
        self.cases = self.failed = 0
        self.failures: list[dict] = []
        self.worst: dict[str, dict] = {}
        self.counts = collections.defaultdict(collections.Counter)
        self.conditioned = self.checks = 0
        self.invalid_cases = self.invalid_failed = 0
        self.invalid_failures: list[dict] = []
        self.invalid_kinds = collections.Counter()

    def add(self, result: CaseResult) -> None:
        self.cases += 1
        params = result.params
        for key in ("api", "dtype", "layout", "regime"):
            self.counts[key][params.get(key)] += 1
        self.counts["loss_type"][params["config"]["loss_type"]] += 1
        self.counts["peer"].update(c.peer for c in result.checks[:1])
        self.counts["quantile_switched_off"][bool(params.get("quantile_switched_off"))] += 1
        for check in result.checks:
            self.checks += 1
            self.conditioned += check.slack > check.rule
            best = self.worst.get(check.category)
            if best is None or check.ratio > best["ratio"]:
                self.worst[check.category] = _worst(self.backend, check, params)
        if result.failed:
            self.failed += 1
            if len(self.failures) < LISTED_FAILURES:
                entry = {"seed": params["seed"], "command": reproduce_command(self.backend, params["seed"])}
                self.failures.append(entry | {"failures": result.failures(), "case": _summary(params)})

    def add_invalid(self, result) -> None:
        self.invalid_cases += 1
        self.invalid_kinds[result.mutation.split("[")[0].split("=")[0].split(" ")[0]] += 1
        if result.failure is not None:
            self.invalid_failed += 1
            if len(self.invalid_failures) < LISTED_FAILURES:
                seed = result.params["seed"]
                command = reproduce_command(self.backend, seed, invalid=True)
                self.invalid_failures.append(
                    {"seed": seed, "command": command, "mutation": result.mutation, "failure": result.failure}
                )

    def as_dict(self, seconds: float) -> dict:
        return {
            "cases": self.cases,
            "failed": self.failed,
            "failures": self.failures,
            "worst": {c: self.worst[c] for c in CATEGORIES if c in self.worst},
            "checks": self.checks,
            "checks_with_conditioning_slack_above_rule": self.conditioned,
            "counts": {key: dict(sorted(counter.items(), key=str)) for key, counter in self.counts.items()},
            "invalid": {
                "cases": self.invalid_cases,
                "failed": self.invalid_failed,
                "failures": self.invalid_failures,
                "mutations": dict(self.invalid_kinds.most_common()),
            },
            "wall_s": round(seconds, 1),
        }


def _worst(backend: str, check, params: dict) -> dict:
    return {
        "ratio": check.ratio,
        "quantity": check.name,
        "error": check.error,
        "bound": check.bound,
        "rule_bound": check.rule,
        "peer": check.peer,
        "seed": params["seed"],
        "command": reproduce_command(backend, params["seed"]),
        "case": _summary(params),
    }


def _summary(params: dict) -> dict:
    """The parameters that say what a case is (the seed reproduces all of them)."""
    keys = ("api", "dtype", "layout", "B", "T", "H", "V", "regime", "max_abs_logit", "old", "ref", "adv_values")
    return {k: params.get(k) for k in keys} | {"config": params.get("config")}


def markdown_summary(report: dict) -> str:
    """A table of the campaign: cases, failures, worst loss / metric / gradient error relative to its bound."""
    lines = [
        "| backend | cases | failed | worst loss err/bound (seed) | worst metric err/bound (seed) "
        "| worst grad err/bound (seed) | invalid cases | invalid failed | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for backend, section in report.items():
        worst = [section["worst"].get(c) for c in CATEGORIES]
        cells = [f"{w['ratio']:.3f} ({w['quantity']}, {w['seed']})" if w else "-" for w in worst]
        invalid = section["invalid"]
        lines.append(
            f"| {backend} | {section['cases']} | {section['failed']} | {' | '.join(cells)} "
            f"| {invalid['cases']} | {invalid['failed']} | {section['wall_s']} |"
        )
    return "\n".join(lines)


def stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
