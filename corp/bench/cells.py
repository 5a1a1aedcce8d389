"""Running cells (`Bench`): the shared scored population of a seed and the prefix a budget buys,
growing an iterative run to its last checkpoint within a budget, and the cell record. Which process
runs a cell, and when, is the scheduler's (corp.bench.schedule)."""

from __future__ import annotations

import dataclasses
import math
import re
import time
from pathlib import Path

from corp.bench.budget import prefix_that_fits
from corp.bench.config import BENCH_PROTOCOL, BenchConfig, common_options, file_slug, results_path, units_in
from corp.bench.plan import (
    NOT_IDENTITY,
    POPULATION_OPTIONS,
    RECORD_FORMAT,
    Cell,
    clip_to_units,
    is_listed,
    list_values,
    merge_seeds,
    min_units,
    short_hash,
    trials_of,
)
from corp.bench.records import CellRecord, check_record
from corp.bench.search import choose, edge_flags, trial_score
from corp.config import in_scales, load_config
from corp.grids import chosen_outside
from corp.method import FIXED, ITERATIVE, POPULATION, get_path
from corp.methods import get_method
from corp.methods.score import NAME as SCORE
from corp.runtime.ledger import flops
from corp.runtime.runs import read_json, read_jsonl, write_json

GROWTH_AIM = 0.9  # share of the remaining budget an iterative cell's next growth aims at


def _call(method_name: str, opts: dict) -> tuple[dict, float]:
    method = get_method(method_name)
    cfg = load_config(method.config, None, opts)
    t0 = time.perf_counter()
    report = method(cfg)
    return report, time.perf_counter() - t0


def _report_done(run_dir: Path) -> dict | None:
    """The report of a run that finished (its status says complete), else None."""
    status, report = run_dir / "run_status.json", run_dir / "report.json"
    if status.exists() and report.exists() and read_json(status).get("status") == "complete":
        return read_json(report)
    return None


class Bench:
    def __init__(self, cfg: BenchConfig):
        self.cfg = cfg
        self.out = results_path(cfg)
        self.work = Path(cfg.work_dir) / cfg.name
        self.populations: dict[str, dict] = {}
        self.cells: list[Cell] = []  # the plan (run_bench sets it): own_estimate finds a cell's predecessor in it
        self.calls = 0  # method invocations this process made (tests: a resumed bench makes none)
        # options added to the shared populations' `corp score` runs: where they are scored (the Ray
        # executor under `corp bench --executor ray`), never what (these options are not in their key)
        self.score_on: dict = {}

    def record_path(self, cell: Cell) -> Path:
        return self.out / "cells" / cell.record_name()

    def load_record(self, cell: Cell) -> CellRecord | None:
        """The cell's finished record; None when there is none, when it was made under another bench
        protocol (kept as it is, never reused; its name differs too, through `run_key`), or when it is
        a population cell whose prefix the `population` cap bound under another cap (rerun)."""
        path = self.record_path(cell)
        rec = read_json(path) if path.exists() else None
        if rec is None or rec.get("bench_protocol") != BENCH_PROTOCOL:
            return None
        if cell.adapter.kind == POPULATION and cell.opts.get("race", "off") == "off" and rec.get("status") == "done":
            # `population` caps a cell's prefix but is not in its key: a record the cap bound (the
            # budget would have bought more) was made under another cap when its prefix differs from it
            units = int(rec.get("units") or 0)
            if units > self.cfg.population or (rec.get("budget_reached") is False and units != self.cfg.population):
                return None
        return rec

    def run_cell(self, cell: Cell) -> CellRecord:
        rec = self.load_record(cell)
        if rec is not None:
            return rec
        kind = cell.adapter.kind
        # a final cell's options its tuning chose on the edge of the searched grid: its runs' reports and
        # model cards say so (a run cannot see the bench's search)
        with chosen_outside(self.tuning_flags(cell)):
            rec = {FIXED: self._fixed, POPULATION: self._population_cell, ITERATIVE: self._iterative}[kind](cell)
        check_record(rec, where=f"cell {cell.record_name()}")  # the format later sessions read back
        write_json(self.record_path(cell), rec)
        return rec

    def tuning_flags(self, cell: Cell) -> list[dict]:
        """The edge flags of the options the bench's search chose for `cell` (none for a cell not tuned)."""
        space = (self.cfg.methods.get(cell.method) or {}).get("search") or {}
        chosen = (cell.tuning or {}).get("chosen") or {}
        return [{**f, "by": "corp bench's tuning"} for f in edge_flags(space, chosen)]

    def _run_dir(self, cell: Cell, key: str | None = None) -> Path:
        return (
            self.work / f"{file_slug(cell.task)}__{file_slug(cell.label)}__s{cell.seed}__{(key or cell.run_key())[:12]}"
        )

    def _invoke(self, method: str, opts: dict) -> tuple[dict, float]:
        self.calls += 1
        return _call(method, opts)

    def _fixed(self, cell: Cell) -> CellRecord:
        run_dir = self._run_dir(cell)
        report, wall = self._invoke(cell.method, {**cell.opts, "run_dir": str(run_dir)})
        return self._record(cell, report, run_dir, wall, units=None)

    # -- population cells: the largest prefix of the seed's shared population that fits the budget
    def population(self, cell: Cell) -> dict:
        """The seed's shared population (one `corp score` run per seed and data setting, mixing
        every scale of the bench's `sigmas`), scored as far as the cell needs. The cell's
        specialists are the population's, or, for a sigma trial (`from_sigmas`), those of its
        scales; a cell takes at most `population` of them. Scoring starts with 8 specialists and
        adds as many as the largest budget buys at their mean cost, plus one, until the cell's
        specialists cost more than the largest budget or `population` of them are scored (a
        one-scale trial of a three-scale grid may so score up to three times `population`).
        Specialist i is the same whatever the population size, so the prefix grows on resume.
        A final cell whose `from_sigmas` is set (chosen by its search, or given in its options)
        reads a population of exactly those scales instead (the trials compared scales on one shared
        population; the chosen scales' specialists are i.i.d. draws either way, and the final scores
        no specialist it cannot take).
        Returns the run directory, the population's scales and, per specialist the cell may take (in
        population order), its scoring FLOPs and seconds."""
        cfg = self.cfg
        pop_opts = {k: v for k, v in cell.opts.items() if k in POPULATION_OPTIONS}
        pop_opts["population"] = cfg.population
        chosen = cell.opts.get("from_sigmas")
        if chosen is not None and cell.setting != "tune":
            pop_opts["sigmas"] = [float(v) for v in list_values(chosen)]
            chosen = None
        key = short_hash({"population": {k: v for k, v in pop_opts.items() if k not in NOT_IDENTITY}})
        run_dir = self.work / f"{file_slug(cell.task)}__population__s{cell.seed}__{key[:12]}"

        def mine(sigma: float) -> bool:
            return chosen is None or in_scales(sigma, chosen)

        # the most specialists the shared run may need to score for this cell
        most = cfg.population if chosen is None else cfg.population * len(cfg.sigmas)
        top = max(cfg.budgets)
        pop = self.populations.get(key)
        while True:
            if pop is None:
                report, target, wall = _report_done(run_dir), min(cfg.population, 8), 0.0
            else:
                report, target, wall = pop["report"], pop["target"], pop["wall"]
            if report is None or report.get("population", {}).get("n", 0) < target:
                # score_base: the base's support row (one pass a seed, charged to no cell: no method reads
                # it), so that the density of good specialists can be read from the population
                opts = {**pop_opts, **self.score_on, "score_base": True, "population": target, "run_dir": str(run_dir)}
                with chosen_outside(()):  # shared by every cell of the seed: no cell's tuning is its
                    report, dt = self._invoke(SCORE, opts)
                wall += dt
            rows = sorted(
                (
                    r
                    for r in read_jsonl(run_dir / "population.jsonl", key="key", unique=True)
                    if r.get("kind") == "specialist"
                ),
                key=lambda r: r["index"],
            )
            n_params = int(report["population"]["selection_ledger"]["n_params"])
            pop = {
                "run_dir": str(run_dir),
                "costs": [flops(n_params, r["prompt_tokens"], r["generated_tokens"]) for r in rows],
                "sigmas": [float(r["sigma"]) for r in rows],
                "seconds": [float(r.get("seconds", 0.0)) + float(r.get("apply_seconds", 0.0)) for r in rows],
                "wall": wall,
                "report": report,
                "target": max(target, len(rows)),
            }
            self.populations[key] = pop
            take = [i for i, sg in enumerate(pop["sigmas"]) if mine(sg)][: cfg.population]  # the cell's specialists
            own = [pop["costs"][i] for i in take]
            if len(rows) >= most or len(own) >= cfg.population or sum(own) > top or not own:
                break
            # as many more of the cell's specialists as the largest budget buys, in population terms
            more = math.ceil((top - sum(own)) / (sum(own) / len(own)) * len(rows) / len(own))
            pop["target"] = min(most, len(rows) + more + 1)
        return {
            "run_dir": pop["run_dir"],
            "scales": [float(v) for v in list_values(pop_opts["sigmas"])],
            "costs": [pop["costs"][i] for i in take],
            "seconds": [pop["seconds"][i] for i in take],
            "wall": pop["wall"],
        }

    def own_estimate(self, cell: Cell) -> float | None:
        """The own-evaluation FLOPs (`own_flops`) in the record of this cell's predecessor in the
        plan: the nearest earlier cell of the same task, variant, setting and budget (the previous
        trial, or the previous seed); for the first final cell of a setting, the last trial of its
        variant and budget (trials finish before finals; a CoRP trial evaluates on the same probe
        and validation splits as its finals, so its own evaluations are the best guess there is,
        and a first try sized without one wastes a whole consolidate). None for the first trial,
        or when the predecessor has no such figure (it did not fit, or ran before the bench
        recorded it). Read from the record in every case, so a resumed bench sizes its first try
        as an uninterrupted one does."""
        before = self.predecessor(cell)
        if before is None:
            return None
        prev = self.resolve(before, self.cells)
        rec = self.load_record(prev) if prev is not None else None
        own = (rec or {}).get("own_flops") if (rec or {}).get("status") == "done" else None
        return None if own is None else float(own)

    def predecessor(self, cell: Cell) -> Cell | None:
        """The planned cell whose record `own_estimate` reads for `cell` (None: none)."""
        same = (cell.task, cell.label, cell.setting, cell.budget)
        chain = [c for c in self.cells if (c.task, c.label, c.setting, c.budget) == same]
        at = next((i for i, c in enumerate(chain) if (c.seed, c.trial) == (cell.seed, cell.trial)), 0)
        if at > 0:
            return chain[at - 1]
        trials = [c for c in self.cells if (c.task, c.label, c.setting, c.budget) == (*same[:2], "tune", same[3])]
        return None if cell.setting == "tune" or not trials else trials[-1]

    def _population_cell(self, cell: Cell) -> CellRecord:
        """The largest prefix n whose scoring FLOPs plus the method's own evaluations on it (CoRP's
        probe, step search and gates) fit the budget. Every try is a whole run of the method, so the
        first is sized with the own evaluations its predecessor measured (`own_estimate`; the prefix
        that scoring alone affords when there is none). Then, within 4 tries and never trying a
        prefix twice: a try over the budget steps down to the prefix that fits beside the own
        evaluations it measured; a try that fits steps up to that prefix when it is larger. The
        record is the largest prefix that fitted, with every try (`tried`). A method with no own
        evaluations fits at once. Nothing over the budget is recorded."""
        pop = self.population(cell)
        costs, budget = pop["costs"], cell.spend
        full = prefix_that_fits(costs, budget)
        guess = self.own_estimate(cell)
        n = full if not guess else min(full, max(min_units(cell), prefix_that_fits(costs, budget - guess)))
        if full < min_units(cell):
            return self._empty(cell, f"budget buys {full} specialist(s); {cell.label} needs at least {min_units(cell)}")
        if cell.opts.get("race", "off") != "off":
            return self._raced_cell(cell, full)
        best, tried, wall, empty = self._search_prefix(cell, pop, n, full)
        if empty is not None:  # no prefix fitted
            return empty
        n = best["units"]
        rec = self._record(cell, best["report"], best["run_dir"], wall, units=n, chosen=best["opts"])
        rec["population_run"] = pop["run_dir"]
        rec["population_sigmas"] = pop["scales"]
        rec["population_seconds"] = sum(pop["seconds"][:n])
        rec["tried"] = tried
        rec["own_flops"] = best["own"]
        rec["own_estimate"] = guess  # what the first try was sized with (None: scoring alone)
        # RandOpt on CoRP's population: charged the prefix CoRP read, not its own evaluations
        for row in rec.get("rows", []):
            if row.get("population_row"):
                row["flops"] = sum(costs[:n])
        rec["budget_reached"] = n < len(costs) or sum(costs) >= budget
        return rec

    def _search_prefix(self, cell: Cell, pop: dict, n: int, full: int):
        """The prefix search `_population_cell` describes, from a first try at n. Returns (the largest
        prefix that fitted with its report, every try, the seconds they took, None), or, when none
        fitted, (None, every try, None, the cell's empty record)."""
        adapter, costs, budget = cell.adapter, pop["costs"], cell.spend
        tried: list[dict] = []
        best: dict | None = None  # the largest prefix that fitted so far
        wall = 0.0
        # the population is part of what the run computes (a final reads its chosen scales' own)
        population = Path(pop["run_dir"]).name  # its name carries its key
        while True:
            opts = {**cell.opts, "from_run": pop["run_dir"], adapter.unit: n}
            clip_to_units(opts, adapter)
            run_dir = self._run_dir(cell, short_hash({"cell": cell.run_key(), "units": n, "population": population}))
            report, dt = self._invoke(cell.method, {**opts, "run_dir": str(run_dir)})
            wall += dt
            flops = sum(get_path(report, p) for p in adapter.flops)
            own = flops - sum(costs[:n])  # the method's own evaluations at this prefix
            # `own`: what this try's own evaluations cost, so a discarded try is counted (outputs: compute)
            tried.append({"units": n, "flops": flops, "run_dir": str(run_dir), "own": own})
            done = {t["units"] for t in tried}
            room = prefix_that_fits(costs, budget - own)  # the prefix these own evaluations leave room for
            if flops <= budget:
                if best is None or n > best["units"]:
                    best = {"units": n, "report": report, "run_dir": run_dir, "opts": opts, "own": own}
                nxt = min(full, room)
                stop = nxt <= n or nxt in done or len(tried) >= 4
            else:
                nxt = min(n - 1, room)
                if best is None and (nxt < min_units(cell) or len(tried) >= 4):
                    return None, tried, None, self._none_fitted(cell, n, flops, nxt, tried)
                stop = best is not None and (nxt <= best["units"] or nxt in done or len(tried) >= 4)
            if stop:
                return best, tried, wall, None
            n = nxt

    def _none_fitted(self, cell: Cell, n: int, flops: float, nxt: int, tried: list[dict]) -> CellRecord:
        """The empty record of a population cell no prefix of which fitted beside its own evaluations."""
        return self._empty(
            cell,
            f"{n} specialists plus {cell.label}'s own evaluations spent {flops:.3g} FLOPs, over the "
            f"budget; with {min_units(cell)} it would not fit either"
            if nxt < min_units(cell)
            else f"4 prefixes tried ({', '.join(str(t['units']) for t in tried)}), none within the budget",
            tried,
        )

    def _raced_cell(self, cell: Cell, n: int) -> dict:
        """A population cell with racing on (`race: halving`): a raced specialist costs less, so at
        budget B the method races its own population, as large as fits: starting from the n that
        full scoring affords, the population grows by the budget's ratio to the FLOPs spent while
        the raced run fits B (at most 4 tries, up to max_units). All tries share one run directory
        per seed and variant, so chunks scored once are reused and a rerun at the chosen size
        generates nothing; the record is the largest size that fit, with every size tried."""
        adapter = cell.adapter
        run_dir = self._run_dir(cell)
        tried: list[dict] = []
        best, wall = None, 0.0
        while len(tried) < 4:
            opts = {k: v for k, v in cell.opts.items() if k != "from_run"} | {adapter.unit: n}
            clip_to_units(opts, adapter)
            report, dt = self._invoke(cell.method, {**opts, "run_dir": str(run_dir)})
            wall += dt
            flops = sum(get_path(report, p) for p in adapter.flops)
            tried.append({"units": n, "flops": flops})
            if flops > cell.spend:
                break
            best = (n, opts)
            nxt = min(self.cfg.units_cap(cell.method), int(n * cell.spend / flops)) if flops > 0 else n + 1
            if nxt <= n:
                break
            n = nxt
        if best is None:
            return self._empty(
                cell, f"racing {tried[0]['units']} specialists spent {tried[0]['flops']:.3g} FLOPs, over the budget"
            )
        n, opts = best
        if tried[-1]["units"] != n:  # the run directory's report is the last try's: rebuild the chosen one (all cached)
            report, dt = self._invoke(cell.method, {**opts, "run_dir": str(run_dir)})
            wall += dt
        rec = self._record(cell, report, run_dir, wall, units=n, chosen=opts)
        rec["race"] = {"tried": tried, **((report.get("population") or {}).get("source") or {}).get("race", {})}
        rec["budget_reached"] = True
        return rec

    # -- iterative cells: one training run per seed, grown to its last checkpoint within the budget
    def _iterative(self, cell: Cell) -> CellRecord:
        """Train the seed's run (shared by every budget) while its ledger stays within the budget:
        each growth adds as many units as GROWTH_AIM (90%) of the remaining budget buys at the dearest
        unit cost seen so far, until what is left buys none; the cell is the last checkpoint at or
        below the budget. A growth that crosses it (a
        unit dearer than any before) leaves the run past the budget: the record is the previous
        checkpoint's, built when it was evaluated. The unit count recorded is the report's own: a run
        directory already trained past this budget (by a larger budget's cell, or a process stopped
        before writing its record) reports its real count and FLOPs, and the cell then trains a run
        of its own from the start instead of taking that model under a smaller label."""
        adapter = cell.adapter
        earlier = [self.load_record(dataclasses.replace(cell, budget=b)) for b in self.cfg.budgets if b < cell.budget]
        earlier = [r for r in earlier if r and r.get("units")]
        units = max([r["units"] for r in earlier], default=adapter.min_units)
        spent = sum(r.get("wall_seconds_increment", 0.0) for r in earlier)
        best, seen, wall, stopped = self._grow(cell, self._run_dir(cell), units)
        if best is None and seen[0]["units"] > adapter.min_units:  # the shared run was already past this budget
            own, seen2, wall2, stopped = self._grow(
                cell,
                self._run_dir(cell, short_hash({"cell": cell.run_key(), "budget": cell.budget})),
                adapter.min_units,
            )
            best, seen, wall = own, seen + seen2, wall + wall2
        if best is None:
            return self._empty(
                cell, f"{seen[-1]['units']} {adapter.unit} spent {seen[-1]['flops']:.3g} FLOPs, over the budget", seen
            )
        best["wall_seconds"] = spent + wall
        best["wall_seconds_increment"] = wall
        best["grown"] = seen
        # the budget stopped the run (a growth crossed it, or what is left buys no unit at the dearest
        # cost seen), not the unit cap or a run that stopped growing
        best["budget_reached"] = stopped is None
        return best

    def _grow(self, cell: Cell, run_dir: Path, units: int) -> tuple[dict | None, list[dict], float, str | None]:
        """Grow one run from `units` while it fits: (record of the last checkpoint within the budget
        or None, every (units, FLOPs) evaluated, seconds, why it stopped if not for the budget:
        max_units or a run that did not grow)."""
        adapter = cell.adapter
        wall, best, seen, dearest = 0.0, None, [], 0.0
        stopped = None  # why the growth stopped when the budget did not stop it (budget_reached)
        while True:
            report, dt = self._invoke(cell.method, {**cell.opts, adapter.unit: units, "run_dir": str(run_dir)})
            wall += dt
            flops = sum(get_path(report, p) for p in adapter.flops)
            done = units_in(report, adapter.units_done) if adapter.units_done else units
            seen.append({"units": done, "flops": flops})
            if flops > cell.spend:
                break
            best = self._record(cell, report, run_dir, wall, units=done, chosen={**cell.opts, adapter.unit: done})
            prev = seen[-2] if len(seen) > 1 else {"units": 0, "flops": 0.0}
            if done <= prev["units"] and len(seen) > 1:  # the run did not grow (a guard: never loop)
                stopped = "did not grow"
                break
            dearest = max(dearest, (flops - prev["flops"]) / (done - prev["units"]))
            # aim short of the budget (GROWTH_AIM of what is left): a unit can cost more than any seen
            # (longer generations), and a growth past the budget falls back to the last checkpoint,
            # which the old full-length step left far below it (bench-cpu-2's GRPO trial 1 on arith:
            # 22 steps at 1.2e13 of 2.8e13); the steps after fill the rest
            more = int(GROWTH_AIM * (cell.spend - flops) // dearest) if dearest > 0 else 1
            if done >= self.cfg.units_cap(cell.method):
                stopped = "max_units"
                break
            if more < 1:  # the remaining budget buys no unit at the dearest cost seen: the budget stops it
                break
            units = min(self.cfg.units_cap(cell.method), done + more)
        return best, seen, wall, stopped

    # -- records
    def _empty(self, cell: Cell, why: str, tried: list | None = None) -> CellRecord:
        """A cell whose method cannot fit the budget: 'does not fit', with what was tried (never an overshoot)."""
        rec = {
            **self._head(cell),
            "status": "does not fit",
            "reason": why,
            "rows": [],
            "flops": 0.0,
            "units": 0,
            "wall_seconds": 0.0,
        }
        if tried:
            rec["tried"] = tried
        return rec

    def _head(self, cell: Cell) -> dict:
        head = {
            "format": RECORD_FORMAT,
            "bench_protocol": BENCH_PROTOCOL,
            "task": cell.task,
            "setting": cell.setting,
            "seed": cell.seed,
            "method": cell.method,
            "label": cell.label,
            "budget": cell.budget,
            "kind": cell.adapter.kind,
        }
        if cell.share != 1.0:  # the cell spent at most budget x share (its method's tuning charged to it)
            head["budget_share"] = cell.share
        if cell.trial is not None:
            head["trial"] = cell.trial
        if cell.tuning is not None:
            head["tuning"] = cell.tuning
        return head

    # -- hyperparameter search: a final cell takes the options of its best trial
    def resolve(self, cell: Cell, cells: list[Cell]) -> Cell | None:
        """`cell` with its searched options set to the best trial's (corp.bench.search.choose, on
        the validation split); the cell itself when nothing is searched; None while a trial has no record."""
        if not cell.searched:
            return cell
        trials = trials_of(cell, cells)
        records = [self.load_record(c) for c in trials]
        if not trials or any(r is None for r in records):
            return None
        # a trial run on several seeds (tune_seeds) is one candidate: its score is the mean over them
        by_trial: dict[int, list[int]] = {}
        for i, c in enumerate(trials):
            by_trial.setdefault(c.trial, []).append(i)
        merged = [merge_seeds([records[i] for i in idx]) for idx in by_trial.values()]
        firsts = [trials[idx[0]] for idx in by_trial.values()]
        best = choose(merged)
        pick = firsts[0] if best is None else firsts[best]  # no trial fit the budget: the final cell says so too
        values = {k: pick.opts[k] for k in cell.searched}
        scores = [trial_score(rec) for rec in merged]
        cfg = self.cfg
        tuned_on = {"seed": pick.seed, "setting": "paper", "split": "validation", "examples": cfg.n_validation}
        if (cfg.tune_setting, cfg.tune_split, cfg.tune_seeds) != ("paper", "validation", 1):
            tuned_on = {
                "seeds": sorted({trials[i].seed for i in by_trial[pick.trial]}),
                "setting": cfg.tune_setting,
                "split": cfg.tune_split,
            }
        tuning = {
            "trials": len(by_trial),
            "chosen_trial": best,
            "chosen": values,
            "validation_accuracy": scores,
            "tuned_on": tuned_on,
        }
        return dataclasses.replace(cell, opts={**cell.opts, **values}, tuning=tuning)

    def _record(
        self, cell: Cell, report: dict, run_dir: Path, wall: float, units: int | None, chosen: dict | None = None
    ) -> CellRecord:
        adapter = cell.adapter
        pattern = re.compile(adapter.rows)
        mine = [r for r in report.get("rows", []) if pattern.fullmatch(r["method"].split(" ")[0])]
        outcomes = (
            read_json(run_dir / report["test_outcomes"])
            if report.get("test_outcomes")
            else {"example_ids": None, "outcomes": {}}
        )
        # a method with one row of its own (ES, a CoRP or GRPO variant) names it by the cell's label; one
        # whose rows come from a list option (RandOpt's top_k) keeps their names even when a small
        # budget clips that list to one value, so "randopt-top1" stays "randopt-top1"
        listed = is_listed(cell.opts, adapter)
        rows = []
        theirs = []  # RandOpt's rows on this CoRP cell's own population (config population_rows)
        if self.cfg.population_rows and adapter.population_rows is not None:
            other = re.compile(adapter.population_rows)
            theirs = [r for r in report.get("rows", []) if other.fullmatch(r["method"].split(" ")[0])]
        for r, on_population in [(r, False) for r in mine] + [(r, True) for r in theirs]:
            name = (
                f"{cell.label}/{r['method']}"
                if on_population
                else cell.label
                if len(mine) == 1 and not listed
                else (r["method"] if cell.label == cell.method else f"{cell.label}:{r['method']}")
            )
            rows.append(
                {
                    "name": name,
                    "report_row": r["method"],
                    "accuracy": r["accuracy"],
                    "passes_per_example": r["passes_per_example"],
                    "labelled_examples": r["labelled_examples"],
                    "test_tokens": r["ledger"]["prompt_tokens"] + r["ledger"]["generated_tokens"],
                    "test_flops": r["ledger"]["flops"],
                    "correct": outcomes["outcomes"].get(r["method"]),
                    **({"population_row": True} if on_population else {}),
                }
            )
        chosen = {
            k: v
            for k, v in (chosen or cell.opts).items()
            if k not in NOT_IDENTITY and k not in common_options(self.cfg, cell.task, cell.seed)
        }
        extra = {}
        own = report.get(get_method(cell.method).product)  # CoRP's section, named by what it makes
        if own is not None:  # what the report says about its own decision (kept as reported)
            extra["detail"] = {"accepted": own.get("accepted"), "reason": own.get("reason")}
            # the gate's margin and its candidate's and the base's test accuracy: what keeping the base cost (issue 55)
            extra["detail"].update({k: own[k] for k in ("gate", "candidate_test") if k in own})
        # values the run's own search chose on its grid's edge (issue 55); the bench's tuning flags, which
        # its report also carries, are the record's `tuning` already
        own_flags = [f for f in report.get("edge_flags") or [] if not f.get("by")]
        if own_flags:
            extra.setdefault("detail", {})["edge_flags"] = own_flags
        return {
            **self._head(cell),
            "status": "done",
            "rows": rows,
            "example_ids": outcomes.get("example_ids"),
            "flops": sum(get_path(report, p) for p in adapter.flops),
            "units": units,
            "wall_seconds": wall,
            "hyperparameters": chosen,
            "run_dir": str(run_dir),
            **extra,
        }
