-- Blocking host calls in the steady state: `host_blocking` without the calls that return in a
-- warm-up, capture or profiler window (`run_phases`), what H001 host-sync reports by default.

-- The rows of `host_blocking_exempting(small_htod_bytes)` in the steady state: a call that returns
-- inside a left-out window of `run_phases` is dropped, and a call charged GPU idle is charged only the
-- steady part of it (left-out time between the waiting call's return and the gap's end is not
-- charged; the waiting call is the charged one itself or, for a pageable copy, the stream sync after
-- it, `idle_charged_to`). With `all_phases` true every row comes back unchanged; `phases` as in
-- `steady_between`. Same columns as `host_blocking`.
--
-- Cost: `host_blocking_exempting`, and two `steady_between` lookups per call.
CREATE OR REPLACE MACRO steady_host_blocking(small_htod_bytes, all_phases := false, phases := 'run_phases') AS TABLE
WITH _calls AS MATERIALIZED (
    SELECT * FROM host_blocking_exempting(small_htod_bytes)
), _charged AS (
    -- the idle each waiting call hands on: from its return to the end of its gap
    SELECT run_id, event_id, end_ns AS start_ns, CASE WHEN idle_charged_to IS NOT NULL THEN gap_end_ns ELSE end_ns END AS end_ns
    FROM _calls
), _returned AS (
    -- the nanosecond after the return: is it steady time?
    SELECT run_id, event_id, end_ns AS start_ns, end_ns + 1 AS end_ns FROM _calls
), _steady_charges AS (
    SELECT c.run_id, c.idle_charged_to AS event_id, sum(s.steady_ns) AS steady_ns
    FROM _calls c JOIN steady_between('_charged', all_phases := all_phases, phases := phases) s USING (run_id, event_id)
    WHERE c.idle_charged_to IS NOT NULL
    GROUP BY c.run_id, c.idle_charged_to
)
SELECT c.* REPLACE (CASE WHEN c.charged_idle_ns > 0 THEN coalesce(s.steady_ns, 0) ELSE 0 END AS charged_idle_ns)
FROM _calls c
LEFT JOIN _steady_charges s USING (run_id, event_id)
JOIN steady_between('_returned', all_phases := all_phases, phases := phases) r USING (run_id, event_id)
WHERE r.steady_ns > 0;
