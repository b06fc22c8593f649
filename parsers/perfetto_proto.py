"""Perfetto protobuf trace (a stream of TracePacket, optionally gzipped) -> event_rows of one run.

The file is a protobuf `Trace`: field 1 (TracePacket) repeated, each `0x0a <varint length> <bytes>`.
It is walked packet by packet (tag, length, payload), so memory stays bounded by one packet plus the
rows, and a truncated or corrupt file is reported at the byte offset of the packet that breaks.
Each packet is decoded with the `perfetto` package's bundled classes (TracePacket.FromString).

Unit of reconciliation: one packet. `read` counts packets by payload type (the `data` oneof, or
`state only` for packets that carry nothing but interned data / defaults / sequence flags; the
packets inside a deflated `compressed_packets` count each, and so does their container);
`skipped` counts the packets that gave nothing, by reason. A slice is two packets (BEGIN and END)
that become one row; flow and metadata rows are derived from packets and are not counted.

Mapping (docs/schema.md, "Perfetto protobuf traces"):

- TrackEvent SLICE_BEGIN/END, paired per track in timestamp order (END closes the latest open
  BEGIN; an async track's BEGIN and END may come from two sequences) -> `user_annotation`, ph X, cat = the categories joined with ",", args = debug
  annotations (plus `posted_from` / `source_location`). Legacy events: phase X -> ph X, B/E like
  BEGIN/END, I/i/R/n -> instant; other phases are skipped.
- TYPE_INSTANT -> `instant`, ph i. TYPE_COUNTER -> `counter`, ph C, name = the counter track's name,
  args `{"value": v}` (unit_multiplier applied, incremental counters summed).
- flow_ids / terminating_flow_ids -> `flow` rows, one `s` (on the earlier event) and one `f` (on the
  later) per arrow, cat `flow`: arrows of one id follow the events that carry it in time order;
  the first arrow's flow_id is the id, later arrows `<id>.<n>`; an id seen once gives a lone row.
- Tracks -> pid/tid/track: a track with a thread descriptor -> its pid/tid (track NULL); any other
  track (process, counter, async/custom, nested child tracks) -> pid of its nearest ancestor with a
  process or thread descriptor (0 when none), tid = -(1 + uuid mod (2**31 - 1)) (stable, negative
  so it never meets a real tid), track = the `/`-joined names from its outermost ancestor below
  that process or thread down to it (`track <uuid>` for an unnamed one, `global` for uuid 0), and a
  `thread_name` metadata row names that synthetic thread after the track's own name. A child track
  is a timeline of its own, as in Perfetto (siblings overlap), so slices nest (parent_id) within
  one track; the path shows the track tree. Legacy sequences without track uuids use
  the sequence's ThreadDescriptor packet.
- Process/thread descriptors -> `process_name` / `thread_name` metadata rows (last name wins).

Incremental state is per `trusted_packet_sequence_id`: interning tables (event names, categories,
debug annotation names and string values, source locations), TracePacketDefaults and sequence
clocks are reset by SEQ_INCREMENTAL_STATE_CLEARED / incremental_state_cleared; a packet with
SEQ_NEEDS_INCREMENTAL_STATE on a sequence whose state was lost (previous_packet_dropped) or never
set is skipped, as trace_processor does.

Clock: packet timestamps in ns. Sequence-scoped clocks (ids 64-127, e.g. Chrome's incremental
microsecond clock) are resolved through the sequence's ClockSnapshot; builtin clocks are moved onto
the trace's primary clock (ClockSnapshot.primary_trace_clock, BOOTTIME by default) with the first
snapshot holding both. `notes.clock` says what was done, `notes.clock_snapshots` what was seen.
"""

from __future__ import annotations

import zlib
from collections import Counter
from pathlib import Path

import orjson

from tracekit.errors import InputError

from .rows import Export

FORMAT = "perfetto_proto"
GZIP_MAGIC = b"\x1f\x8b"
PACKET_TAG = 0x0A  # field 1, wire type 2
SNIFF_BYTES = 1 << 20
SNIFF_PACKETS = 4
CHUNK = 1 << 20
SEQ_CLEARED, SEQ_NEEDS = 1, 2
BOOTTIME = 6
SEQUENCE_CLOCKS = range(64, 128)
SLICE_BEGIN, SLICE_END, INSTANT, COUNTER = 1, 2, 3, 4
TID_MOD = 2**31 - 1
CLOCK_NAMES = {1: "REALTIME", 2: "REALTIME_COARSE", 3: "MONOTONIC", 4: "MONOTONIC_COARSE", 5: "MONOTONIC_RAW",
               6: "BOOTTIME", 8: "TSC", 9: "PERF"}  # fmt: skip


def _pb():
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2

    return perfetto_trace_pb2


def _varint(buf, pos: int, end: int) -> tuple[int | None, int]:
    """(value, next position), or (None, pos) when the varint runs past `end`."""
    value = shift = 0
    while pos < end:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")
    return None, pos


def synthetic_tid(uuid: int) -> int:
    return -(1 + uuid % TID_MOD)


# ---------------------------------------------------------------------------------------------- detect


def _head(path: Path, size: int) -> bytes:
    with open(path, "rb") as f:
        raw = f.read(max(size, 64))
        if raw[:2] != GZIP_MAGIC:
            return raw[:size]
        d = zlib.decompressobj(wbits=31)
        out = d.decompress(raw, size)
        while len(out) < size and not d.eof:
            more = f.read(CHUNK)
            if not more:
                break
            out += d.decompress(d.unconsumed_tail + more, size - len(out))
        return out


def detect(path) -> bool:
    """True when the content is a TracePacket stream: the first packets chain, parse and each sets a known field."""
    try:
        first = _head(Path(path), 1)
        if not first or first[0] != PACKET_TAG:
            return False  # cheap: most files are told apart by their first byte
        head = _head(Path(path), SNIFF_BYTES)
        pb = _pb()
        pos, checked = 0, 0
        while checked < SNIFF_PACKETS and pos < len(head):
            if head[pos] != PACKET_TAG:
                return False
            length, start = _varint(head, pos + 1, len(head))
            if length is None or start + length > len(head):
                # a packet the sniffed head cuts: only the first one must be whole
                return checked > 0
            # fields newer than the bundled protos are tolerated (kept as unknown), but each packet must
            # set a known one, and packets must follow each other exactly
            if not pb.TracePacket.FromString(head[start : start + length]).ListFields():
                return False
            checked += 1
            pos = start + length
        return checked > 0
    except Exception:  # detect never raises: anything unreadable is simply not ours
        return False


# ---------------------------------------------------------------------------------------------- stream


def _chunks(path: Path):
    """The file's bytes (decompressed) in pieces; a gzip stream that is cut or corrupt ends with a str saying so."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputError(path, "file", f"expected a readable file ({e.strerror})") from None
    with f:
        first = f.read(CHUNK)
        if first[:2] != GZIP_MAGIC:
            while first:
                yield first
                first = f.read(CHUNK)
            return
        d, raw, total = zlib.decompressobj(wbits=31), first, 0
        while True:
            try:
                out = d.decompress(raw)
            except zlib.error as e:
                yield f"corrupt gzip stream after decompressed byte {total}: {e}"
                return
            total += len(out)
            if out:
                yield out
            if d.eof and d.unused_data:  # concatenated gzip members
                raw, d = d.unused_data, zlib.decompressobj(wbits=31)
                continue
            raw = f.read(CHUNK)
            if not raw:
                if not d.eof:
                    yield f"the gzip stream is truncated after decompressed byte {total}"
                return


def _is_gzip(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == GZIP_MAGIC
    except OSError:
        return False  # _chunks reports the unreadable file


def _packets(path: Path):
    """(byte offset, payload) of each packet; InputError at the offset of the packet that is cut or wrong.

    Offsets are in the decompressed stream for a gzipped file.
    """
    where = "decompressed byte" if _is_gzip(path) else "byte"
    chunks = _chunks(path)
    buf, base = b"", 0  # buf holds stream bytes [base, base + len(buf))
    pos = 0
    done = False
    broken = None  # why a gzip stream ended early

    def more() -> bool:
        nonlocal buf, base, pos, done, broken
        if done:
            return False
        nxt = next(chunks, None)
        if nxt is None or isinstance(nxt, str):
            done, broken = True, nxt
            return False
        buf, base, pos = buf[pos:] + nxt, base + pos, 0
        return True

    while True:
        if pos >= len(buf) and not more():
            if broken:
                raise InputError(path, f"{where} {base + pos}", f"expected the next TracePacket ({broken})")
            return
        offset = base + pos
        if buf[pos] != PACKET_TAG:
            raise InputError(path, f"{where} {offset}", f"expected a TracePacket (tag 0x0a), found 0x{buf[pos]:02x}")
        while True:
            try:
                length, start = _varint(buf, pos + 1, len(buf))
            except ValueError:
                raise InputError(
                    path, f"{where} {offset}", "expected a packet length (varint of at most 10 bytes)"
                ) from None
            if length is not None and start + length <= len(buf):
                break
            if not more():
                have = 0 if length is None else len(buf) - start
                what = "a packet length" if length is None else f"a TracePacket of {length} bytes, found {have}"
                raise InputError(path, f"{where} {offset}", f"expected {what} ({broken or 'the file ends: truncated'})")
            offset = base + pos
        yield offset, buf[start : start + length]
        pos = start + length


# ---------------------------------------------------------------------------------------------- decode

# record fields (a list per event, filled in while the packets are walked, made into a row at the end)
KIND, PH, CAT, NAME, START, END, KEY, ARGS, EXTRA, FLOWS = range(10)


class _Sequence:
    """Incremental state of one trusted_packet_sequence_id."""

    def __init__(self) -> None:
        self.valid = False
        self.thread: tuple[int, int] | None = None  # from a ThreadDescriptor packet (legacy SDK)
        self.legacy_us: int | None = None  # ThreadDescriptor.reference_timestamp_us, moved by deltas
        # sequence clock id -> [multiplier, incremental, value, ref value, ref clock, ref ns]
        self.clocks: dict[int, list] = {}
        self.reset()

    def reset(self) -> None:
        self.names: dict[int, str] = {}
        self.cats: dict[int, str] = {}
        self.ann_names: dict[int, str] = {}
        self.ann_strings: dict[int, str] = {}
        self.locations: dict[int, str] = {}
        self.track_uuid: int | None = None
        self.clock_id: int | None = None
        self.counter_totals: dict[int, float] = {}

    def intern(self, d) -> None:
        for e in d.event_names:
            self.names[e.iid] = e.name
        for e in d.event_categories:
            self.cats[e.iid] = e.name
        for e in d.debug_annotation_names:
            self.ann_names[e.iid] = e.name
        for e in d.debug_annotation_string_values:
            self.ann_strings[e.iid] = e.str.decode("utf-8", "replace")
        for e in d.source_locations:
            self.locations[e.iid] = _location(e)

    def defaults(self, d) -> None:
        if d.HasField("timestamp_clock_id"):
            self.clock_id = d.timestamp_clock_id
        if d.HasField("track_event_defaults") and d.track_event_defaults.HasField("track_uuid"):
            self.track_uuid = d.track_event_defaults.track_uuid


def _location(loc) -> str:
    where = f"{loc.file_name}:{loc.line_number}" if loc.line_number else loc.file_name
    return f"{loc.function_name} ({where})" if loc.function_name else where


def _nested(v):
    if v.nested_type == 1:
        return {k: _nested(x) for k, x in zip(v.dict_keys, v.dict_values)}
    if v.nested_type == 2:
        return [_nested(x) for x in v.array_values]
    for field in ("string_value", "int_value", "double_value", "bool_value"):
        if v.HasField(field):
            return getattr(v, field)
    return None


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.pb = _pb()
        self.out = Export(path)
        self.seqs: dict[int, _Sequence] = {}
        self.tracks: dict[int, dict] = {}
        self.records: list[list] = []
        self.marks: dict[tuple, list] = {}  # track key -> slice BEGIN records and END marks, in file order
        self.snapshots: list[dict[int, int]] = []
        self.primary: int | None = None
        self.clocks_used: Counter = Counter()
        self.process_names: dict[int, str] = {}
        self.thread_names: dict[tuple[int, int], str] = {}
        self.unresolved: Counter = Counter()
        self.not_decoded_fields: Counter = Counter()
        self.handlers = {
            "track_event": self.track_event,
            "track_descriptor": self.track_descriptor,
            "clock_snapshot": lambda seq, p, ts: None,  # read before the timestamp, see packet()
            "process_descriptor": self.process_descriptor,
            "thread_descriptor": self.thread_descriptor,
            "process_tree": self.process_tree,
            "system_info": self.keep_metadata,
            "trace_uuid": self.keep_metadata,
            "state only": self.state_only,
        }

    # -- packets

    def packet(self, offset: int, payload: bytes) -> None:
        from google.protobuf.message import DecodeError

        try:
            p = self.pb.TracePacket.FromString(payload)
        except DecodeError as e:
            where = "decompressed byte" if _is_gzip(self.path) else "byte"
            raise InputError(self.path, f"{where} {offset}", f"expected a TracePacket ({e})") from None
        kind = p.WhichOneof("data") or "state only"
        self.out.read[kind] += 1
        seq_id = p.trusted_packet_sequence_id
        seq = self.seqs.get(seq_id)
        if seq is None:
            seq = self.seqs[seq_id] = _Sequence()
        if p.previous_packet_dropped:
            seq.valid = False  # interned data and deltas before the loss cannot be trusted
        if p.incremental_state_cleared or p.sequence_flags & SEQ_CLEARED:
            seq.reset()
            seq.valid = True
        if p.HasField("trace_packet_defaults"):
            seq.defaults(p.trace_packet_defaults)
        if p.HasField("interned_data"):
            seq.intern(p.interned_data)
        if kind == "compressed_packets":
            self.compressed(offset, p.compressed_packets)
            return
        if kind == "clock_snapshot":
            self.clock_snapshot(seq, p.clock_snapshot)
        if p.sequence_flags & SEQ_NEEDS and not seq.valid:
            self.out.skipped["packet needing incremental state the sequence lost or never set"] += 1
            return
        ts = self.timestamp(seq, p)
        handler = self.handlers.get(kind)
        if handler is None:
            self.out.skipped[f"packet type {kind} (not decoded)"] += 1
            return
        reason = handler(seq, p, ts)
        if reason:
            self.out.skipped[reason] += 1

    def compressed(self, offset: int, blob: bytes) -> None:
        """A deflated run of packets (the service's packet compression): each inner packet counts as one."""
        where = "decompressed byte" if _is_gzip(self.path) else "byte"
        try:
            data = zlib.decompress(blob)
        except zlib.error as e:
            raise InputError(self.path, f"{where} {offset}", f"expected deflated compressed_packets ({e})") from None
        pos = 0
        while pos < len(data):
            try:
                length, start = _varint(data, pos + 1, len(data)) if data[pos] == PACKET_TAG else (None, pos)
            except ValueError:
                length = start = None
            if length is None or start + length > len(data):
                raise InputError(self.path, f"{where} {offset}", f"expected whole TracePackets in compressed_packets "
                                 f"(inner byte {pos})")  # fmt: skip
            self.packet(offset, data[start : start + length])
            pos = start + length

    def state_only(self, seq, p, ts):
        if not (p.HasField("interned_data") or p.HasField("trace_packet_defaults") or p.sequence_flags
                or p.incremental_state_cleared):  # fmt: skip
            return "packet without payload or sequence state"
        return None

    def keep_metadata(self, seq, p, ts):
        from google.protobuf.json_format import MessageToDict

        kind = p.WhichOneof("data")
        self.out.metadata[kind] = MessageToDict(getattr(p, kind))
        return None

    # -- clocks

    def clock_snapshot(self, seq: _Sequence, snap) -> None:
        if snap.HasField("primary_trace_clock") and self.primary is None:
            self.primary = snap.primary_trace_clock
        builtin = {c.clock_id: c.timestamp for c in snap.clocks if c.clock_id not in SEQUENCE_CLOCKS}
        if builtin:
            self.snapshots.append(builtin)
        ref = next((c for c in builtin if c == self.primary), next(iter(builtin), None))
        for c in snap.clocks:
            if c.clock_id in SEQUENCE_CLOCKS and ref is not None:
                seq.clocks[c.clock_id] = [c.unit_multiplier_ns or 1, c.is_incremental, c.timestamp, c.timestamp,
                                          ref, builtin[ref]]  # fmt: skip

    def timestamp(self, seq: _Sequence, p):
        """(builtin clock, ns), None without a timestamp, or a skip reason."""
        if not p.HasField("timestamp"):
            return None
        clock = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else seq.clock_id or BOOTTIME
        if clock in SEQUENCE_CLOCKS:
            c = seq.clocks.get(clock)
            if c is None:
                return f"timestamp on sequence clock {clock} without its ClockSnapshot"
            mult, incremental, value, ref_value, ref_clock, ref_ns = c
            value = value + p.timestamp if incremental else p.timestamp
            c[2] = value
            self.clocks_used[f"{clock} -> {ref_clock}"] += 1
            return ref_clock, ref_ns + (value - ref_value) * mult
        self.clocks_used[str(clock)] += 1
        return clock, p.timestamp

    # -- tracks

    def track_descriptor(self, seq, p, ts):
        d = p.track_descriptor
        t = self.tracks.setdefault(d.uuid, {})
        if d.HasField("parent_uuid"):
            t["parent"] = d.parent_uuid
        which = d.WhichOneof("static_or_dynamic_name")
        if which and getattr(d, which):
            t["name"] = getattr(d, which)
        if d.HasField("thread"):
            th = d.thread
            t["thread"] = (th.pid, th.tid)
            if th.thread_name:
                self.thread_names[(th.pid, th.tid)] = th.thread_name
        if d.HasField("process"):
            t["pid"] = d.process.pid
            self._name_process(d.process.pid, d.process.process_name, d.process.cmdline)
        if d.HasField("counter"):
            c = d.counter
            unit = c.unit_name or (self.pb.CounterDescriptor.Unit.Name(c.unit) if c.unit else None)
            t["counter"] = (c.unit_multiplier or 1, c.is_incremental, unit)
            if "name" not in t and c.type:
                t["name"] = self.pb.CounterDescriptor.BuiltinCounterType.Name(c.type).removeprefix("COUNTER_").lower()
        return None

    def _name_process(self, pid: int, name: str, cmdline) -> None:
        if not name and cmdline:  # Chrome writes the whole command line as cmdline[0]
            name = cmdline[0].split()[0].rsplit("/", 1)[-1] if cmdline[0].strip() else ""
        if name:
            self.process_names[pid] = name

    def process_descriptor(self, seq, p, ts):
        d = p.process_descriptor
        self._name_process(d.pid, d.process_name, d.cmdline)
        return None

    def thread_descriptor(self, seq, p, ts):
        d = p.thread_descriptor
        seq.thread = (d.pid, d.tid)
        if d.thread_name:
            self.thread_names[(d.pid, d.tid)] = d.thread_name
        if d.HasField("reference_timestamp_us"):
            seq.legacy_us = d.reference_timestamp_us
        return None

    def process_tree(self, seq, p, ts):
        tree = p.process_tree
        for proc in tree.processes:
            self._name_process(proc.pid, "", proc.cmdline)
        for th in tree.threads:
            if th.name:
                self.thread_names[(th.tgid or th.tid, th.tid)] = th.name
        return None

    # -- track events

    def track_event(self, seq: _Sequence, p, ts):
        e = p.track_event
        if isinstance(ts, str):
            return ts
        if ts is None:
            # the legacy SDK's per-thread microsecond timestamps
            if e.HasField("timestamp_absolute_us"):
                seq.legacy_us = e.timestamp_absolute_us
            elif e.HasField("timestamp_delta_us") and seq.legacy_us is not None:
                seq.legacy_us += e.timestamp_delta_us
            else:
                return "track event without timestamp"
            ts = (
                seq.clock_id if seq.clock_id and seq.clock_id not in SEQUENCE_CLOCKS else BOOTTIME,
                seq.legacy_us * 1000,
            )
        if e.HasField("track_uuid"):
            key = ("u", e.track_uuid)
        elif seq.track_uuid is not None:
            key = ("u", seq.track_uuid)
        elif seq.thread is not None:
            key = ("t", *seq.thread)
        else:
            return "track event without a track (no track_uuid, default track or thread descriptor)"
        typ = e.type
        dur = None
        if typ == 0:
            if not e.HasField("legacy_event"):
                return "track event of unspecified type"
            phase = chr(e.legacy_event.phase)
            if phase == "X":
                typ, dur = SLICE_BEGIN, e.legacy_event.duration_us * 1000
            elif phase in "BEIiRn" and phase:
                typ = {"B": SLICE_BEGIN, "E": SLICE_END}.get(phase, INSTANT)
            else:
                return f"legacy track event phase {phase!r} (not decoded)"
        if typ == SLICE_END:
            # paired at the end, in timestamp order: an async track's BEGIN and END may come from
            # two sequences, each written to the file in its own chunks
            end_args = self.args(seq, e) if e.debug_annotations else None
            end = ["end", None, None, None, ts, None, key, end_args, None, None]
            self._flows(end, e)
            self.marks.setdefault(key, []).append(end)
            return None
        if e.HasField("name"):
            name = e.name
        elif e.name_iid:
            name = seq.names.get(e.name_iid)
            if name is None:
                self.unresolved["event name iid"] += 1
        elif e.HasField("legacy_event") and e.legacy_event.name_iid:
            name = seq.names.get(e.legacy_event.name_iid)
        else:
            name = None
        if e.categories:
            cat = ",".join(e.categories)
        elif e.category_iids:
            cats = [seq.cats.get(i) for i in e.category_iids]
            if None in cats:
                self.unresolved["category iid"] += 1
            cat = ",".join(c if c is not None else f"<category iid {i}>" for c, i in zip(cats, e.category_iids))
        else:
            cat = None
        if typ == COUNTER:
            if key[0] != "u":
                return "counter event without a counter track"
            if e.HasField("double_counter_value"):
                value = e.double_counter_value
            elif e.HasField("counter_value"):
                value = e.counter_value
            else:
                return "counter event without a value"
            mult, incremental, unit = self.tracks.get(key[1], {}).get("counter", (1, False, None))
            if incremental:
                value = seq.counter_totals[key[1]] = seq.counter_totals.get(key[1], 0) + value
            extra = {"track_uuid": key[1], "unit": unit} if unit else {"track_uuid": key[1]}
            self.records.append(["counter", "C", cat, name, ts, None, key, {"value": value * mult}, extra, None])
            return None
        if typ not in (SLICE_BEGIN, INSTANT):
            return f"track event type {typ} (not decoded)"
        args = self.args(seq, e) if (e.debug_annotations or e.HasField("task_execution")
                                     or e.source_location_iid or e.HasField("source_location")) else None  # fmt: skip
        if e.extra_counter_values or e.extra_double_counter_values:
            self.not_decoded_fields["extra_counter_values (thread time/instruction counts)"] += 1
        extra = {"track_uuid": key[1]} if key[0] == "u" else None
        if typ == INSTANT:
            rec = ["instant", "i", cat, name, ts, None, key, args, extra, None]
        else:
            rec = ["user_annotation", "X", cat, name, ts, None, key, args, extra, None]
            if dur is not None:
                rec[END] = (ts[0], ts[1] + dur)
            else:
                self.marks.setdefault(key, []).append(rec)
        self._flows(rec, e)
        self.records.append(rec)
        return None

    def _flows(self, rec: list, e) -> None:
        ids, ends = e.flow_ids, e.terminating_flow_ids
        if not (ids or ends or e.flow_ids_old or e.terminating_flow_ids_old):
            return
        flows = [(f, False) for f in (*ids, *e.flow_ids_old)]
        flows += [(f, True) for f in (*ends, *e.terminating_flow_ids_old)]
        rec[FLOWS] = (rec[FLOWS] or []) + flows

    def args(self, seq: _Sequence, e) -> dict:
        args = {}
        for a in e.debug_annotations:
            args[self._ann_name(seq, a)] = self._ann_value(seq, a)
        if e.HasField("task_execution"):
            args["posted_from"] = seq.locations.get(e.task_execution.posted_from_iid)
        if e.source_location_iid:
            args["source_location"] = seq.locations.get(e.source_location_iid)
        elif e.HasField("source_location"):
            args["source_location"] = _location(e.source_location)
        return args

    def _ann_name(self, seq: _Sequence, a) -> str:
        if a.HasField("name"):
            return a.name
        name = seq.ann_names.get(a.name_iid)
        if name is None:
            self.unresolved["debug annotation name iid"] += 1
            return f"<name iid {a.name_iid}>"
        return name

    def _ann_value(self, seq: _Sequence, a):
        which = a.WhichOneof("value")
        if which is None:
            if a.dict_entries:
                return {self._ann_name(seq, d): self._ann_value(seq, d) for d in a.dict_entries}
            if a.array_values:
                return [self._ann_value(seq, v) for v in a.array_values]
            if a.HasField("proto_value"):
                return f"<proto {a.proto_type_name or a.proto_type_name_iid}: {len(a.proto_value)} bytes>"
            return None
        if which == "string_value_iid":
            return seq.ann_strings.get(a.string_value_iid)
        if which == "pointer_value":
            return hex(a.pointer_value)
        if which == "nested_value":
            return _nested(a.nested_value)
        if which == "legacy_json_value":
            try:
                return orjson.loads(a.legacy_json_value)
            except orjson.JSONDecodeError:
                return a.legacy_json_value
        return getattr(a, which)

    # -- rows

    def finish(self) -> Export:
        out = self.out
        to_ns = self._clock_map()
        self._pair_slices(to_ns)
        self.slice_names: dict[int, set] = {}
        for rec in self.records:
            if rec[KIND] is not None and rec[KEY][0] == "u":
                self.slice_names.setdefault(rec[KEY][1], set()).add(rec[NAME])
        places: dict[tuple, tuple] = {}
        synthetic: dict[tuple[int, int], str] = {}
        arrows: list[tuple] = []  # (ts, order, record row index, flow id, terminating)
        for rec in self.records:
            if rec[KIND] is None:
                continue
            ts = to_ns(rec[START])
            dur = None
            if rec[KIND] == "user_annotation":
                dur = to_ns(rec[END]) - ts  # >= 0: paired in time order
            key = rec[KEY]
            place = places.get(key)
            if place is None:
                place = places[key] = self._place(key)
                if place[3] is not None:
                    synthetic[(place[0], place[1])] = place[3]
            pid, tid, track, _ = place
            name = rec[NAME]
            if rec[KIND] == "counter":
                name = self.tracks.get(key[1], {}).get("name") or name or track
            args = orjson.dumps(rec[ARGS]).decode() if rec[ARGS] else None
            extra = orjson.dumps(rec[EXTRA]).decode() if rec[EXTRA] else None
            if rec[FLOWS]:
                for fid, terminating in rec[FLOWS]:
                    arrows.append((ts, len(out.rows), fid, terminating))
            out.rows.append((rec[KIND], rec[PH], rec[CAT], name, ts, dur, pid, tid, track, None, None, None, None,
                             None, args, extra))  # fmt: skip
        self._flow_rows(arrows)
        for pid, name in sorted(self.process_names.items()):
            out.rows.append(_meta("process_name", pid, None, name))
        for (pid, tid), name in sorted(self.thread_names.items()):
            out.rows.append(_meta("thread_name", pid, tid, name))
        for (pid, tid), name in sorted(synthetic.items()):
            out.rows.append(_meta("thread_name", pid, tid, name))
        self._notes()
        return out

    def _pair_slices(self, to_ns) -> None:
        """BEGIN/END per track in timestamp order (file order among equal times): END closes the latest open BEGIN."""
        skipped = self.out.skipped
        for marks in self.marks.values():
            order = sorted(range(len(marks)), key=lambda i: (to_ns(marks[i][START]), i))
            stack = []
            for i in order:
                m = marks[i]
                if m[KIND] != "end":
                    stack.append(m)
                    continue
                if not stack:
                    skipped["slice end without begin on its track"] += 1
                    continue
                rec = stack.pop()
                rec[END] = m[START]
                if m[ARGS]:
                    rec[ARGS] = {**(rec[ARGS] or {}), **m[ARGS]}
                if m[FLOWS]:
                    rec[FLOWS] = (rec[FLOWS] or []) + m[FLOWS]
            for rec in stack:
                rec[KIND] = None  # dropped
                skipped["slice begin never ended"] += 1
        self.marks = {}

    def _place(self, key: tuple) -> tuple[int, int, str | None, str | None]:
        """(pid, tid, track, thread name) of a track key: thread tracks keep their ids; any other track gets
        a synthetic tid and, as track, the path of names from its outermost ancestor below a process or thread."""
        if key[0] == "t":
            return key[1], key[2], None, None
        uuid = key[1]
        t = self.tracks.get(uuid, {})
        if "thread" in t:
            return t["thread"][0], t["thread"][1], None, None
        pid, names, u, seen = None, [], uuid, set()
        while u is not None and u not in seen:
            seen.add(u)
            node = self.tracks.get(u, {})
            if "thread" in node:
                pid = node["thread"][0]
                break
            if "pid" in node:
                pid = node["pid"]
                if u == uuid:  # slices on the process track itself
                    names.append(node.get("name") or self.process_names.get(pid, f"process {pid}"))
                break
            names.append(node.get("name") or self._unnamed(u))
            u = node.get("parent")
        return pid or 0, synthetic_tid(uuid), "/".join(reversed(names)), names[0]

    def _unnamed(self, uuid: int) -> str:
        """An unnamed track is named after its slices when they share one name (as Perfetto's UI does)."""
        if uuid == 0:
            return "global"
        names = self.slice_names.get(uuid, set())
        return next(iter(names)) if len(names) == 1 and None not in names else f"track {uuid}"

    def _clock_map(self):
        """A function (builtin clock, ns) -> ns on the trace clock."""
        target = self.primary if self.primary is not None else BOOTTIME
        offsets: dict[int, int] = {target: 0}
        unrelated = []

        def offset(clock: int) -> int:
            if clock not in offsets:
                snap = next((s for s in self.snapshots if clock in s and target in s), None)
                if snap is None:
                    unrelated.append(clock)
                offsets[clock] = 0 if snap is None else snap[target] - snap[clock]
            return offsets[clock]

        def to_ns(ts: tuple[int, int]) -> int:
            return ts[1] + offset(ts[0])

        self._clock_target, self._clock_offsets, self._clock_unrelated = target, offsets, unrelated
        return to_ns

    def _flow_rows(self, arrows: list[tuple]) -> None:
        """One s row (earlier event) and one f row (later event) per arrow; lone ends keep one row."""
        out = self.out
        arrows.sort(key=lambda a: (a[0], a[1]))
        open_: dict[int, tuple[int, bool]] = {}  # flow id -> (row index of the chain's latest event, has an arrow)
        serial: Counter = Counter()

        def label(fid: int) -> str:
            serial[fid] += 1
            return str(fid) if serial[fid] == 1 else f"{fid}.{serial[fid] - 1}"

        def flow_row(index: int, ph: str, flow_id: str, fid: int) -> None:
            r = out.rows[index]
            out.rows.append(("flow", ph, "flow", r[3], r[4], None, r[6], r[7], r[8], None, None, None, None, flow_id,
                             None, orjson.dumps({"perfetto_flow_id": fid}).decode()))  # fmt: skip

        n_arrows = lone_starts = lone_ends = 0
        for _, index, fid, terminating in arrows:
            prev = open_.pop(fid, None)
            if prev is not None:
                lab = label(fid)
                flow_row(prev[0], "s", lab, fid)
                flow_row(index, "f", lab, fid)
                n_arrows += 1
            elif terminating:
                flow_row(index, "f", label(fid), fid)
                lone_ends += 1
            if not terminating:
                open_[fid] = (index, prev is not None)
        for fid, (index, linked) in open_.items():
            if not linked:
                flow_row(index, "s", label(fid), fid)
                lone_starts += 1
        self.flow_counts = {"arrows": n_arrows, "starts_without_end": lone_starts, "ends_without_start": lone_ends}

    def _notes(self) -> None:
        notes = self.out.notes
        notes["unit"] = ("one TracePacket: read counts packets by payload type, skipped the packets that gave "
                         "nothing; a slice is 2 packets (BEGIN, END) and 1 row; flow and metadata rows are derived")  # fmt: skip
        target = self._clock_target
        tname = CLOCK_NAMES.get(target, str(target))
        if not self.snapshots:
            notes["clock"] = (
                f"packet timestamps in ns as written (clock ids {sorted(self.clocks_used)}), no ClockSnapshot"
            )
        else:
            moved = {CLOCK_NAMES.get(c, str(c)): off for c, off in self._clock_offsets.items() if c != target}
            notes["clock"] = f"ns on the trace clock {tname} (id {target}); offsets added per clock: {moved}"
            if self._clock_unrelated:
                notes["clock"] += f"; clocks kept as written (no snapshot relates them): {self._clock_unrelated}"
        notes["timestamp_clocks"] = dict(self.clocks_used)  # "64 -> 3": sequence clock resolved onto builtin 3
        notes["clock_snapshots"] = {"count": len(self.snapshots), "first": {str(k): v for k, v in
                                    (self.snapshots[0].items() if self.snapshots else ())},
                                    "primary_trace_clock": self.primary}  # fmt: skip
        notes["packets_by_type"] = dict(self.out.read)
        notes["sequences"] = len(self.seqs)
        notes["tracks"] = len(self.tracks)
        notes["flows"] = self.flow_counts
        if self.unresolved:
            notes["unresolved_interned_ids"] = dict(self.unresolved)
        if self.not_decoded_fields:
            notes["events_with_fields_not_decoded"] = dict(self.not_decoded_fields)


def _meta(name: str, pid: int, tid: int | None, value: str) -> tuple:
    return ("metadata", "M", None, name, None, None, pid, tid, None, None, None, None, None, None,
            orjson.dumps({"name": value}).decode(), None)  # fmt: skip


def read(path) -> Export:
    """Every packet of the trace decoded or counted as skipped; InputError at the first broken packet."""
    path = Path(path)
    reader = _Reader(path)
    for offset, payload in _packets(path):
        reader.packet(offset, payload)
    if not reader.out.read:
        raise InputError(path, "byte 0", "expected a Perfetto trace (at least one TracePacket)")
    return reader.finish()
