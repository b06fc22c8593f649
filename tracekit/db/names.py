"""Name keys: a host-side name (annotation, op, Python frame, call site) with its per-run parts masked.

NVTX ranges, `record_function` names and Python frames often carry values that change on every run
of the same code: `nccl:all_reduce, op_id = 150891, seq = 452673`, `<lambda> object at
0x7efbdb777b20`, `ProfilerStep#12`, `batch_1623143089861`. A name that becomes a grouping key or part
of a finding id is first turned into its key, so the same place has the same key in every run; the
raw name stays in the evidence. The masks, applied in order:

1. ` at 0x<hex>` (Python's repr of a live object) is dropped, and any other hex number of six or more
   digits becomes `0x#` (an address; short hex values are flags and stay);
2. the number after a per-run counter label becomes `#`: `op_id`, `seq` (`seq_num`, `seq_nr`,
   `seq_no`), `sequence_number`, `id`, `uid`, `call_id`, `request_id`, `req_id`, `correlation(_id)`,
   followed by `=`, `:` or a space (`op_id = 999469`, `seq: 12`, `id=7`);
3. a trailing `#N` (a step or iteration number) is dropped;
4. a trailing number of five or more digits after a separator becomes `#` (timestamps, pids, request
   counters: `worker0.1623143089861`, `batch_28692245`).

What stays: numbers inside module paths (`layers.3` and `layers.4` are different layers), sizes and
shapes (`[2048, 2048]`, four digits or fewer at the end, any length elsewhere), template arguments of
kernels. Kernel names are not keyed at all: they come from compiled code and are the same in every
run. The SQL macro `name_key(name)` (tracekit/db/views/08_names.sql) applies the same masks in the
views and in the diff's SQL; `tests/test_keys.py` checks the two agree on every name of the corpus.
"""

from __future__ import annotations

import re

# Each (pattern, replacement) in order; the SQL macro spells the same patterns in RE2 syntax, which has
# no look-around, so none is used here either.
_MASKS = (
    (re.compile(r" at 0x[0-9a-fA-F]+"), ""),
    (re.compile(r"0x[0-9a-fA-F]{6,}"), "0x#"),
    (
        re.compile(
            r"(^|[^0-9A-Za-z_])(op_id|seq|seq_num|seq_nr|seq_no|sequence_number|id|uid|call_id|request_id|req_id"
            r"|correlation|correlation_id)(\s*[=:]\s*|\s+)[0-9]+"
        ),
        r"\1\2\3#",
    ),
    (re.compile(r"#[0-9]+$"), ""),
    (re.compile(r"([^0-9A-Za-z])[0-9]{5,}$"), r"\1#"),
)


def name_key(name: str | None) -> str | None:
    """The name with its per-run parts masked (see the module doc); None stays None."""
    if name is None:
        return None
    for pattern, replacement in _MASKS:
        name = pattern.sub(replacement, name)
    return name
