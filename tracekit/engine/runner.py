"""Run rules over a database: missing-input checks, parameters, and the rules' findings and notes."""

from __future__ import annotations

import os
import time

from tracekit.db.connection import thread_budget, usable_cpus
from tracekit.engine import quality
from tracekit.engine.registry import DataQuality, Rule, all_rules, get_rule
from tracekit.engine.shared_views import computed_once
from tracekit.engine.toolkit import Context
from tracekit.errors import crash_line
from tracekit.findings.model import Finding


def missing_inputs(con, rule: Rule, known: dict[str, str | None] | None = None) -> list[str]:
    """Required relations that are absent or empty (e.g. `kernels` in a CPU-only trace). `known`, when
    given, keeps each relation's answer for the next rule of the same analysis: most rules require
    `kernels` or `gpu_activities`, and each probe plans the view again."""
    known = {} if known is None else known
    for rel in rule.requires:
        if rel not in known:
            try:
                found = con.execute(f"SELECT EXISTS (SELECT 1 FROM {rel})").fetchone()[0]
                known[rel] = None if found else f"{rel} (no rows)"
            except Exception:
                known[rel] = f"{rel} (absent)"
    return [known[rel] for rel in rule.requires if known[rel] is not None]


SHARED = "shared views"  # the keys of `timings` that are no rule code
QUALITY = "data-quality checks"

# Rules run on this many threads, each on its own connection to the database: on small traces most of
# a rule's time is DuckDB binding and optimising its SQL and Python building the finding, which one
# thread does while another's query runs. TRACEKIT_RULE_THREADS overrides (1: every rule in turn, on
# the caller's connection).
MAX_RULE_THREADS = 4
# On a large trace each rule's query already keeps every core busy and the threads only contend: on 2
# cores, with the shared views taking 0.1-0.5 s (the corpus traces up to a 216 MB copy of
# df_index_resolver) threads cut analyze by 6-8%; at 2.2 s (the 1 GB trace) they add 7%. The time the
# shared views took measures the trace's size in the unit that matters, on the machine at hand.
THREADED_UNTIL_S = 1.0


def rule_threads(shared_seconds: float = 0.0) -> int:
    """How many threads the rules of one analysis run on: TRACEKIT_RULE_THREADS if set, else 1 when
    computing the shared views took THREADED_UNTIL_S or more, else the CPUs this process may use
    (at most TRACEKIT_THREADS), at most MAX_RULE_THREADS."""
    wanted = os.environ.get("TRACEKIT_RULE_THREADS")
    if wanted:
        try:
            return max(1, int(wanted))
        except ValueError:
            pass
    if shared_seconds >= THREADED_UNTIL_S:
        return 1
    return min(usable_cpus(), thread_budget() or MAX_RULE_THREADS, MAX_RULE_THREADS)


def run_rules(
    con,
    select: list[str] | None = None,
    params: dict[str, dict] | None = None,
    scope: str | None = None,
    timings: dict[str, float] | None = None,
    then=None,
):
    """Returns (findings, data_quality notes) from the selected rules (all when select is None), of
    one scope only when `scope` is given ("run" in a cluster worker, "job" in its reducer).
    `timings`, when given, receives the wall seconds of each rule by code, of the shared views
    (SHARED) and of the data-quality checks (QUALITY); rules on several threads overlap, so the
    seconds may add up to more than the run took. `then`, when given, is called while the rules run
    (on the caller's thread and connection) or after them, while the shared views' tables exist:
    other queries of the same report read them too. Findings and notes come in rule order whatever
    the threads."""
    rules = [get_rule(k) for k in select] if select else all_rules()
    if scope is not None:
        rules = [r for r in rules if r.scope == scope]
    timings = {} if timings is None else timings
    started = time.perf_counter()
    with computed_once(con) as shared:
        timings[SHARED] = time.perf_counter() - started
        return _run(con, shared, rules, params or {}, timings, then)


def _run(con, shared, rules: list[Rule], params: dict[str, dict], timings: dict[str, float], then):
    ctx = Context(con)
    present: dict[str, str | None] = {}
    tasks = []  # (timing key, work on a connection and a Context -> findings and notes)
    if any(r.scope == "run" for r in rules):
        tasks.append((QUALITY, lambda c, x: ([], quality.notes(x))))
    for rule in rules:
        tasks.append((rule.code, lambda c, x, rule=rule: _run_one(c, rule, params, x, present)))
    threads = min(rule_threads(timings[SHARED]), len(tasks)) if shared.views and shared.shareable else 1
    if threads <= 1:
        results = [_timed(task, con, ctx, timings) for task in tasks]
        if then is not None:
            then()
    else:
        results = _on_threads(con, shared, ctx, tasks, threads, timings, then)
    findings: list[Finding] = []
    notes: list[DataQuality] = []
    for produced, said in results:
        findings.extend(produced)
        notes.extend(said)
    return findings, notes


def _timed(task, con, ctx, timings):
    key, work = task
    started = time.perf_counter()
    try:
        return work(con, ctx)
    finally:
        timings[key] = time.perf_counter() - started


def _on_threads(con, shared, ctx, tasks, threads: int, timings, then):
    """Each task's result, in task order, computed by `threads` threads that take the next task as
    they finish one; `then` runs meanwhile on this thread (whose connection the tasks do not use)."""
    import threading

    results: list = [None] * len(tasks)
    failures: list[BaseException] = []
    taken = iter(range(len(tasks)))
    lock = threading.Lock()
    cursors = [shared.cursor() for _ in range(threads)]

    def work(cursor):
        own = ctx.on(cursor)
        while not failures:
            with lock:
                i = next(taken, None)
            if i is None:
                return
            try:
                results[i] = _timed(tasks[i], cursor, own, timings)
            except BaseException as e:  # raised on the caller's thread once every thread stopped
                failures.append(e)
                return

    workers = [threading.Thread(target=work, args=(c,), name=f"tracekit-rules-{n}") for n, c in enumerate(cursors)]
    try:
        for w in workers:
            w.start()
        if then is not None:
            then()
    finally:
        for w in workers:
            w.join()
        for c in cursors:
            c.close()
    if failures:
        raise failures[0]
    return results


def _run_one(con, rule: Rule, params: dict[str, dict], ctx: Context, present) -> tuple[list, list]:
    import duckdb

    missing = missing_inputs(con, rule, present)
    if missing:
        return [], [DataQuality(rule.code, f"{rule.name} not run: needs {', '.join(missing)}")]
    values = rule.resolve_params(params.get(rule.code, {}))
    try:
        produced = list(rule.check(con, values, ctx))
    except duckdb.Error as e:  # e.g. out of memory on a huge trace: report it, run the other rules
        return [], [DataQuality(rule.code, f"{rule.name} failed: {' '.join(str(e).split())[:300]}")]
    except Exception as e:  # a rule's bug on some input: the report goes on with the other rules
        return [], [DataQuality(rule.code, f"{rule.name} failed (a tracekit bug; please report): {crash_line(e)}")]
    findings = [item for item in produced if not isinstance(item, DataQuality)]
    return findings, [item for item in produced if isinstance(item, DataQuality)]
