"""Ingest into a trace lake (tracekit.db.lake): each run through a scratch in-memory database, as a
plain ingest does, then its rows copied out as Parquet and removed from the scratch database.

One call is all or nothing: the runs are staged under DIR/.staging and renamed into place once
every input is in; an input that fails leaves the lake as it was. The lake's lock is held from the
first run id taken to the last rename, so ingests into one lake take turns.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

from tracekit import db as dbmod
from tracekit.db import lake
from tracekit.errors import TracekitError
from tracekit.ingest import kill_points
from tracekit.ingest.pipeline import ingest

_KEPT = " (the inputs before it were ingested and kept:"


def ingest_lake(root, paths, same_content: str = "skip", duplicates: list | None = None, **options) -> list:
    """Ingest `paths` (as tracekit.ingest.ingest, whose keyword options it takes) into the lake at
    `root`, creating it when missing; one IngestResult per file. A trace whose content the lake
    holds already is skipped (into `duplicates`)."""
    if same_content != "skip":
        raise TracekitError("a lake skips a trace it holds already; replacing runs in a lake is not supported yet")
    root = Path(root).resolve()
    if root.exists() and not root.is_dir():
        raise TracekitError(f"{root}: --lake names a folder, and this is a file")
    if root.is_dir() and not lake.is_lake(root) and not lake.holds_only_lake_entries(root):
        raise TracekitError(f"{root}: not a tracekit lake, and not empty: name a new or empty folder")
    with lake.locked(root):
        for line in lake.tidy(root):
            print(line, file=sys.stderr)
        state = lake.read_state(root)
        stage = root / lake.STAGING / str(os.getpid())
        con = dbmod.connect(None)
        staged: list[int] = []
        catalog = _Catalog(root)
        try:
            _seed(con, root, state["next_run_id"])
            next_event = [state["next_event_id"]]

            def move_out(results) -> None:
                run_ids = sorted({r.run_id for r in results})
                lo, hi = con.execute(
                    "SELECT min(rowid), max(rowid) FROM event_rows WHERE list_contains(?, run_id)", [run_ids]
                ).fetchone()
                lake.stage_runs(con, stage, run_ids, next_event[0] - (lo or 0))
                if lo is not None:
                    next_event[0] += hi - lo + 1
                for table in lake.run_tables():
                    con.execute(f'DELETE FROM "{table}" WHERE list_contains(?, run_id)', [run_ids])
                staged.extend(run_ids)

            try:
                results = ingest(con, paths, same_content="skip", duplicates=duplicates, after_run=move_out, **options)
            except TracekitError as e:
                message = str(e).split(_KEPT)[0]
                raise TracekitError(f"{message} (nothing was added to the lake {root})") from None
            if staged:
                lake.write_state(root, {"next_run_id": max(staged) + 1, "next_event_id": next_event[0]})
                kill_points.reached("lake_staged")
                lake.publish(root, stage, staged, before_runs=lambda: kill_points.reached("lake_renamed"))
            catalog.install()
            return results
        finally:
            con.close()
            catalog.discard()
            shutil.rmtree(root / lake.STAGING, ignore_errors=True)


class _Catalog:
    """A new lake's catalog, made on a thread while the first runs load (its DDL and comments take
    about a second) and put in place once they are."""

    def __init__(self, root: Path):
        self.root, self.tmp, self.error, self.thread = root, None, None, None
        if not (root / lake.CATALOG).exists():
            self.thread = threading.Thread(target=self._build, daemon=True)
            self.thread.start()

    def _build(self) -> None:
        try:
            self.tmp = lake.build_catalog(self.root)
        except BaseException as e:  # raised on the ingest's thread by install
            self.error = e

    def install(self) -> None:
        """Once the lake holds runs: a catalog that an ingest killed before this point never made is
        made now."""
        if (self.root / lake.CATALOG).exists() or not lake.partitions(self.root, "runs"):
            return
        if self.thread is None:
            self.thread = threading.Thread(target=self._build)
            self.thread.start()
        self.thread.join()
        if self.error is not None:
            raise self.error
        lake.install_catalog(self.tmp, self.root)
        self.tmp = None

    def discard(self) -> None:
        if self.thread is not None:
            self.thread.join()
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def _seed(con, root: Path, next_run_id: int) -> None:
    """The scratch database hands out the lake's next run ids, and knows the lake's content digests
    (ingest_log rows holding only the run id and notes) so that a trace held already is skipped."""
    if lake.partitions(root, "ingest_log"):
        con.execute(
            "INSERT INTO ingest_log (run_id, notes) SELECT run_id, notes FROM read_parquet(?, hive_partitioning = true, "
            "union_by_name = true, hive_types = {'run_id': INTEGER}) "
            "WHERE json_extract_string(notes, '$.content_digest') IS NOT NULL",
            [lake.files_glob(root, "ingest_log")],
        )
    con.execute("DROP SEQUENCE IF EXISTS run_ids")
    con.execute(f"CREATE SEQUENCE run_ids START {int(next_run_id)}")
