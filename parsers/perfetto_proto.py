"""Perfetto protobuf trace (a stream of TracePacket, optionally compressed) -> event_rows of one run.

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

Speed: the cyclic garbage collector is paused while reading (records are many small acyclic containers),
and a counter packet whose bytes match one already decoded except for its timestamp and value (a
"shape", see _counter_shape) is read straight from those bytes without the protobuf classes: a counter
series is most of a big trace. Both give the same rows as the general path.

Clock: packet timestamps in ns. Sequence-scoped clocks (ids 64-127, e.g. Chrome's incremental
microsecond clock) are resolved through the sequence's ClockSnapshot; builtin clocks are moved onto
the trace's primary clock (ClockSnapshot.primary_trace_clock, BOOTTIME by default) with the first
snapshot holding both. `notes.clock` says what was done, `notes.clock_snapshots` what was seen.
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from pathlib import Path

import orjson

from tracekit import compression
from tracekit.errors import InputError
from tracekit.parsers.rows import Export

FORMAT = "perfetto_proto"
DESCRIPTION = "Perfetto protobuf"
PACKET_TAG = 0x0A  # field 1, wire type 2
SNIFF_PACKETS = 4
CHUNK = 1 << 20
SEQ_CLEARED, SEQ_NEEDS = 1, 2
BOOTTIME = 6
SEQUENCE_CLOCKS = range(64, 128)
SLICE_BEGIN, SLICE_END, INSTANT, COUNTER = 1, 2, 3, 4
TID_MOD = 2**31 - 1
_NO_TRACK: dict = {}
_PLAIN_COUNTER = (1, False, None)
_dumps = orjson.dumps


def _value_json(value) -> str:
    """A counter value as args JSON; one beyond 64 bits (an incremental sum, a large multiplier) goes in
    as a double rather than failing: orjson refuses such integers."""
    try:
        return _dumps({"value": value}).decode()
    except TypeError:
        return _dumps({"value": float(value)}).decode()


_DOUBLE = struct.Struct("<d")
CLOCK_NAMES = {1: "REALTIME", 2: "REALTIME_COARSE", 3: "MONOTONIC", 4: "MONOTONIC_COARSE", 5: "MONOTONIC_RAW",
               6: "BOOTTIME", 8: "TSC", 9: "PERF"}  # fmt: skip


def _pb():
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2

    return perfetto_trace_pb2


def _text(value):
    """A string field as text: the protobuf runtime hands a proto2 string that is not UTF-8 back as bytes."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


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


# ---------------------------------------------------------------------------------------------- sniff


def sniff(head: bytes, name: str, **_) -> bool:
    """True when the content is a TracePacket stream: the first packets chain, parse and each sets a known field."""
    if not head or head[0] != PACKET_TAG:
        return False  # cheap: most files are told apart by their first byte
    try:
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
    except Exception:  # anything unreadable is simply not ours
        return False


# ---------------------------------------------------------------------------------------------- stream


def _where(path: Path) -> str:
    """How an offset is named: in the decompressed stream for a compressed file."""
    try:
        return "decompressed byte" if compression.kind(path) else "byte"
    except OSError:
        return "byte"


def _packets(path: Path):
    """(byte offset, payload) of each packet; InputError at the offset of the packet that is cut or wrong.

    Offsets are in the decompressed stream for a compressed file.
    """
    where = _where(path)
    chunks = compression.chunks(path, CHUNK)
    buf, base = b"", 0  # buf holds stream bytes [base, base + len(buf))
    pos = 0
    done = False
    broken = None  # why a compressed stream ended early

    def more() -> bool:
        nonlocal buf, base, pos, done, broken
        if done:
            return False
        try:
            nxt = next(chunks, None)
        except compression.BrokenStream as e:  # reported at the packet it cuts
            nxt, broken = None, f"compressed data broken at {e.position}: {e.expected}"
        if nxt is None:
            done = True
            return False
        buf, base, pos = buf[pos:] + nxt, base + pos, 0
        return True

    while True:
        # the common case first: whole packets with a one-byte length, already in the buffer
        n = len(buf)
        while pos + 1 < n and buf[pos] == PACKET_TAG:
            length = buf[pos + 1]
            end = pos + 2 + length
            if length >= 0x80 or end > n:
                break
            yield base + pos, buf[pos + 2 : end]
            pos = end
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
            self.names[e.iid] = _text(e.name)
        for e in d.event_categories:
            self.cats[e.iid] = _text(e.name)
        for e in d.debug_annotation_names:
            self.ann_names[e.iid] = _text(e.name)
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


# -- counter packets by shape
#
# A counter series is hundreds of thousands of packets that differ only in their timestamp and value
# bytes. Once one has been decoded (by the protobuf classes) and found to be a plain counter event, its
# bytes with those two fields cut out are its shape; a later packet whose bytes match a shape is that
# same packet with another timestamp and value, read straight from the bytes.

PACKET_FIELDS = {3: "trusted_uid", 8: "timestamp", 10: "sequence id", 11: "track_event", 13: "sequence_flags",
                 58: "timestamp_clock_id"}  # fmt: skip
COUNTER_EVENT_FIELDS = {9: "type", 11: "track_uuid", 30: "counter_value", 44: "double_counter_value"}
MAX_SHAPE_MISSES = 64  # packets that looked like plain counters but were not: then stop trying


def _fields(buf: bytes, pos: int, end: int, known: dict) -> dict | None:
    """field number -> (wire type, value start, value end) of a message whose fields are all in `known`,
    each once, of wire type 0 (varint), 1 (fixed64) or 2 (bytes); None for any other message."""
    found = {}
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        if tag is None:
            return None
        number, wire = tag >> 3, tag & 7
        if number not in known or number in found:
            return None
        start = pos
        if wire == 0:
            _, pos = _varint(buf, pos, end)
            if _ is None:
                return None
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, start = _varint(buf, pos, end)
            if length is None:
                return None
            pos = start + length
        else:
            return None
        if pos > end:
            return None
        found[number] = (wire, start, pos)
    return found


def _counter_shape(payload: bytes):
    """(layout, shape bytes, value wire type) of a plain counter packet: layout = (timestamp start, end,
    value start, end); None when the packet has any other field (or a field twice)."""
    top = _fields(payload, 0, len(payload), PACKET_FIELDS)
    if top is None or set(top) - {3, 13, 58} != {8, 10, 11} or top[8][0] != 0 or top[11][0] != 2:
        return None
    _, ev_start, ev_end = top[11]
    ev = _fields(payload, ev_start, ev_end, COUNTER_EVENT_FIELDS)
    if ev is None or set(ev) not in ({9, 11, 30}, {9, 11, 44}):
        return None
    value_wire, value_start, value_end = ev[44] if 44 in ev else ev[30]
    ts_start, ts_end = top[8][1:]
    if value_wire != (1 if 44 in ev else 0) or ts_start > value_start:
        return None
    layout = (ts_start, ts_end, value_start, value_end)
    return layout, payload[:ts_start] + payload[ts_end:value_start] + payload[value_end:], value_wire


_CONT = [int.from_bytes(b"\x80" * (n - 1) + b"\x00", "little") if n else 0 for n in range(11)]
_CONT_MASK = [int.from_bytes(b"\x80" * n, "little") for n in range(11)]


def _varint_exact(b: bytes) -> int | None:
    """The varint that fills `b` (1 to 10 bytes) exactly: continuation bits on all but the last byte, else None.

    Read as one little-endian int whose 7-bit groups are then packed (no byte loop: this runs once a packet)."""
    n = len(b)
    x = int.from_bytes(b, "little")
    cont = _CONT[n]
    if x & _CONT_MASK[n] != cont:
        return None
    x ^= cont
    if n > 8:
        value = 0
        for byte in reversed(b):
            value = value << 7 | byte & 0x7F
        return value
    # 7-bit groups packed pairwise: bytes -> 14-bit, then 28-bit, then 56-bit lanes
    x = x & 0x007F007F007F007F | (x & 0x7F007F007F007F00) >> 1
    x = x & 0x00003FFF00003FFF | (x & 0x3FFF00003FFF0000) >> 2
    return x & 0x0FFFFFFF | (x & 0x0FFFFFFF00000000) >> 4


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.pb = _pb()
        self.out = Export(path, format=FORMAT)
        self.seqs: dict[int, _Sequence] = {}
        self.tracks: dict[int, dict] = {}
        self.records: list[list] = []
        self.keys: dict[int, tuple] = {}  # track uuid -> its track key
        self.counters: dict[int, tuple] = {}  # counter track uuid -> _counter_track(uuid)
        self.builtin_keys: dict[int, tuple] = {}
        # counter packets by shape (see _counter_shape): packet length -> [(layout, {shape bytes: (sequence id,
        # explicit clock id or None, sequence flags, track key, value is a double)})]
        self.layouts: dict[int, list] = {}
        self.shape_misses = 0
        self.marks: dict[tuple, list] = {}  # track key -> slice BEGIN records and END marks, in file order
        self.snapshots: list[dict[int, int]] = []
        self.primary: int | None = None
        # (clock, builtin clock it resolves onto or None) -> timestamps; made into notes' strings at the end
        self.clock_uses: dict[tuple, int] = {}
        self.track_extra: dict[int, str] = {}  # track uuid -> a slice's extra JSON, dumped once
        self.process_names: dict[int, str] = {}
        self.thread_names: dict[tuple[int, int], str] = {}
        self.unresolved: Counter = Counter()
        self.not_decoded_fields: Counter = Counter()
        from google.protobuf.message import DecodeError

        self._decode_error = DecodeError
        self._from_string = self.pb.TracePacket.FromString
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
        # the hottest function (one call per packet): attribute look-ups are hoisted into locals
        layouts = self.layouts.get(len(payload))
        if layouts is not None and self.shaped(payload, layouts):
            return
        try:
            p = self._from_string(payload)
        except self._decode_error as e:
            where = _where(self.path)
            raise InputError(self.path, f"{where} {offset}", f"expected a TracePacket ({e})") from None
        kind = p.WhichOneof("data") or "state only"
        read = self.out.read
        read[kind] = read.get(kind, 0) + 1
        seq_id = p.trusted_packet_sequence_id
        seq = self.seqs.get(seq_id)
        if seq is None:
            seq = self.seqs[seq_id] = _Sequence()
        if p.previous_packet_dropped:
            seq.valid = False  # interned data and deltas before the loss cannot be trusted
        flags = p.sequence_flags
        if p.incremental_state_cleared or flags & SEQ_CLEARED:
            seq.reset()
            seq.valid = True
        if p.HasField("trace_packet_defaults"):
            seq.defaults(p.trace_packet_defaults)
        if p.HasField("interned_data"):
            seq.intern(p.interned_data)
        if kind == "track_event":
            if flags & SEQ_NEEDS and not seq.valid:
                self.out.skipped["packet needing incremental state the sequence lost or never set"] += 1
                return
            if p.HasField("timestamp"):
                # timestamp() inlined for the commonest case: a builtin clock
                clock = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else seq.clock_id or BOOTTIME
                if clock < 64 or clock > 127:
                    uses = self.clock_uses
                    k = self.builtin_keys.get(clock)
                    if k is None:
                        k = self.builtin_keys[clock] = (clock, None)
                    uses[k] = uses.get(k, 0) + 1
                    ts = (clock, p.timestamp)
                else:
                    ts = self.timestamp(seq, p)
            else:
                ts = None
            records = len(self.records)
            reason = self.track_event(seq, p, ts)
            if reason:
                self.out.skipped[reason] += 1
            elif (
                self.shape_misses < MAX_SHAPE_MISSES
                and len(self.records) > records
                and self.records[-1][0] == "counter"
            ):
                self.learn_shape(payload, p, seq)
            return
        if kind == "compressed_packets":
            self.compressed(offset, p.compressed_packets)
            return
        if kind == "clock_snapshot":
            self.clock_snapshot(seq, p.clock_snapshot)
        if flags & SEQ_NEEDS and not seq.valid:
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

    def learn_shape(self, payload: bytes, p, seq: _Sequence) -> None:
        """Keep the shape of a counter packet that needed no state but its sequence's validity and clock."""
        rec = self.records[-1]
        shape = _counter_shape(payload)
        if (shape is None or rec[CAT] is not None or rec[NAME] is not None or p.sequence_flags & SEQ_CLEARED
                or p.previous_packet_dropped or p.incremental_state_cleared):  # fmt: skip
            self.shape_misses += 1
            return
        layout, key, value_wire = shape
        clock = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else None
        if (clock if clock is not None else seq.clock_id or BOOTTIME) in SEQUENCE_CLOCKS:
            self.shape_misses += 1  # delta-encoded timestamps need the sequence's clock state: not a shape
            return
        layouts = self.layouts.setdefault(len(payload), [])
        shapes = next((shapes for known, shapes in layouts if known == layout), None)
        if shapes is None:
            shapes = {}
            layouts.append((layout, shapes))
        shapes[key] = (p.trusted_packet_sequence_id, clock, p.sequence_flags, rec[KEY], value_wire == 1)

    def shaped(self, payload: bytes, layouts: list) -> bool:
        """A packet of a known counter shape recorded as packet() + track_event() would; False if it is none."""
        for (ts_start, ts_end, value_start, value_end), shapes in layouts:
            shape = shapes.get(payload[:ts_start] + payload[ts_end:value_start] + payload[value_end:])
            if shape is not None:
                break
        else:
            return False
        seq_id, clock, flags, key, double = shape
        raw_ts = _varint_exact(payload[ts_start:ts_end])
        if double:
            value = _DOUBLE.unpack_from(payload, value_start)[0]
        else:
            value = _varint_exact(payload[value_start:value_end])
            if value is None:
                return False
            if value >= 1 << 63:  # int64 as two's complement
                value -= 1 << 64
        seq = self.seqs[seq_id]  # created when the shape was learnt
        if clock is None:
            clock = seq.clock_id or BOOTTIME
        if raw_ts is None or 64 <= clock < 128:  # SEQUENCE_CLOCKS
            return False
        read = self.out.read
        read["track_event"] = read.get("track_event", 0) + 1
        if flags & SEQ_NEEDS and not seq.valid:
            self.out.skipped["packet needing incremental state the sequence lost or never set"] += 1
            return True
        uses = self.clock_uses
        k = self.builtin_keys.get(clock)
        if k is None:
            k = self.builtin_keys[clock] = (clock, None)
        uses[k] = uses.get(k, 0) + 1
        self._counter(seq, key, None, None, (clock, raw_ts), value)
        return True

    def _counter(self, seq, key, cat, name, ts, value) -> None:
        """One counter value on its track: incremental counters summed per sequence, the unit applied;
        args and extra go in as JSON text now: a counter's are final (a slice's may still merge its END's)."""
        uuid = key[1]
        counter = self.counters.get(uuid)
        if counter is None:
            counter = self.counters[uuid] = self._counter_track(uuid)
        mult, incremental, extra = counter
        if incremental:
            value = seq.counter_totals[uuid] = seq.counter_totals.get(uuid, 0) + value
        self.records.append(["counter", "C", cat, name, ts, None, key, _value_json(value * mult), extra, None])

    def compressed(self, offset: int, blob: bytes) -> None:
        """A deflated run of packets (the service's packet compression): each inner packet counts as one."""
        where = _where(self.path)
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
            uses = self.clock_uses
            k = (clock, ref_clock)
            uses[k] = uses.get(k, 0) + 1
            return ref_clock, ref_ns + (value - ref_value) * mult
        uses = self.clock_uses
        k = (clock, None)
        uses[k] = uses.get(k, 0) + 1
        return clock, p.timestamp

    # -- tracks

    def track_descriptor(self, seq, p, ts):
        d = p.track_descriptor
        self.counters.pop(d.uuid, None)  # a descriptor (re)sent mid-trace applies from here on
        t = self.tracks.setdefault(d.uuid, {})
        if d.HasField("parent_uuid"):
            t["parent"] = d.parent_uuid
        which = d.WhichOneof("static_or_dynamic_name")
        if which and getattr(d, which):
            t["name"] = _text(getattr(d, which))
        if d.HasField("thread"):
            th = d.thread
            t["thread"] = (th.pid, th.tid)
            if th.thread_name:
                self.thread_names[(th.pid, th.tid)] = _text(th.thread_name)
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
        name, cmdline = _text(name), [_text(c) for c in cmdline]
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
            self.thread_names[(d.pid, d.tid)] = _text(d.thread_name)
        if d.HasField("reference_timestamp_us"):
            seq.legacy_us = d.reference_timestamp_us
        return None

    def process_tree(self, seq, p, ts):
        tree = p.process_tree
        for proc in tree.processes:
            self._name_process(proc.pid, "", proc.cmdline)
        for th in tree.threads:
            if th.name:
                self.thread_names[(th.tgid or th.tid, th.tid)] = _text(th.name)
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
            uuid = e.track_uuid
            key = self.keys.get(uuid)
            if key is None:  # one tuple per track, shared by its records
                key = self.keys[uuid] = ("u", uuid)
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
            marks = self.marks.get(key)
            if marks is None:
                marks = self.marks[key] = []
            marks.append(end)
            return None
        which = e.WhichOneof("name_field")
        if which == "name":
            name = _text(e.name)
        elif e.name_iid:
            name = seq.names.get(e.name_iid)
            if name is None:
                self.unresolved["event name iid"] += 1
        elif e.HasField("legacy_event") and e.legacy_event.name_iid:
            name = seq.names.get(e.legacy_event.name_iid)
        else:
            name = None
        iids = e.category_iids
        if len(iids) == 1 and not e.categories:  # Chrome's usual event: one interned category
            cat = seq.cats.get(iids[0])
            if cat is None:
                self.unresolved["category iid"] += 1
                cat = f"<category iid {iids[0]}>"
        elif e.categories:
            cat = ",".join(e.categories)
        elif iids:
            cats = [seq.cats.get(i) for i in e.category_iids]
            if None in cats:
                self.unresolved["category iid"] += 1
            cat = ",".join(c if c is not None else f"<category iid {i}>" for c, i in zip(cats, e.category_iids))
        else:
            cat = None
        if typ == COUNTER:
            if key[0] != "u":
                return "counter event without a counter track"
            which = e.WhichOneof("counter_value_field")
            if which == "double_counter_value":
                value = e.double_counter_value
            elif which == "counter_value":
                value = e.counter_value
            else:
                return "counter event without a value"
            self._counter(seq, key, cat, name, ts, value)
            return None
        if typ not in (SLICE_BEGIN, INSTANT):
            return f"track event type {typ} (not decoded)"
        # (an explicit source_location_iid 0 gives args {}, written as no args like None)
        args = self.args(seq, e) if (e.debug_annotations or e.HasField("task_execution")
                                     or e.WhichOneof("source_location_field") is not None) else None  # fmt: skip
        if e.extra_counter_values or e.extra_double_counter_values:
            self.not_decoded_fields["extra_counter_values (thread time/instruction counts)"] += 1
        if key[0] == "u":
            extra = self.track_extra.get(key[1])
            if extra is None:
                extra = self.track_extra[key[1]] = orjson.dumps({"track_uuid": key[1]}).decode()
        else:
            extra = None
        if typ == INSTANT:
            rec = ["instant", "i", cat, name, ts, None, key, args, extra, None]
        else:
            rec = ["user_annotation", "X", cat, name, ts, None, key, args, extra, None]
            if dur is not None:
                rec[END] = (ts[0], ts[1] + dur)
            else:
                marks = self.marks.get(key)
                if marks is None:
                    marks = self.marks[key] = []
                marks.append(rec)
        self._flows(rec, e)
        self.records.append(rec)
        return None

    def _counter_track(self, uuid: int) -> tuple:
        """(unit multiplier, incremental, extra JSON) of a counter track, as its descriptors say so far."""
        mult, incremental, unit = self.tracks.get(uuid, _NO_TRACK).get("counter", _PLAIN_COUNTER)
        extra = orjson.dumps({"track_uuid": uuid, "unit": unit} if unit else {"track_uuid": uuid}).decode()
        return mult, incremental, extra

    def _flows(self, rec: list, e) -> None:
        ids, ends, old_ids, old_ends = e.flow_ids, e.terminating_flow_ids, e.flow_ids_old, e.terminating_flow_ids_old
        if not (ids or ends or old_ids or old_ends):
            return
        flows = [(f, False) for f in ids]
        if old_ids:
            flows += [(f, False) for f in old_ids]
        if ends:
            flows += [(f, True) for f in ends]
        if old_ends:
            flows += [(f, True) for f in old_ends]
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
        self.clocks_used = Counter({(str(c) if ref is None else f"{c} -> {ref}"): n
                                    for (c, ref), n in self.clock_uses.items()})  # fmt: skip
        to_ns = self._clock_map()
        self._pair_slices(to_ns)
        self.slice_names = None  # made on first need: only unnamed tracks need it
        offsets, offset = self._clock_offsets, self._offset
        places: dict[tuple, tuple] = {}
        synthetic: dict[tuple[int, int], str] = {}
        arrows: list[tuple] = []  # (ts, order, record row index, flow id, terminating)
        tracks = self.tracks
        rows = out.rows
        append = rows.append
        dumps = _dumps
        for kind, ph, cat, name, start, end, key, args, extra, flows in self.records:
            if kind is None:
                continue
            clock, ts = start
            off = offsets.get(clock)
            ts += offset(clock) if off is None else off
            place = places.get(key)
            if place is None:
                # a counter's name is its track's: one look-up per track
                name_of_track = tracks.get(key[1], _NO_TRACK).get("name") if key[0] == "u" else None
                place = places[key] = (*self._place(key), name_of_track)
                if place[3] is not None:
                    synthetic[(place[0], place[1])] = place[3]
            if kind == "counter":
                name = place[4] or name or place[2]
                append((kind, ph, cat, name, ts, None, place[0], place[1], place[2], None, None, None, None, None,
                        args, extra))  # fmt: skip
                continue
            dur = None
            if kind == "user_annotation":
                dur = to_ns(end) - ts  # >= 0: paired in time order
            if args is not None and args.__class__ is not str:
                args = dumps(args).decode() if args else None
            if flows:
                for fid, terminating in flows:
                    arrows.append((ts, len(rows), fid, terminating))
            append((kind, ph, cat, name, ts, dur, place[0], place[1], place[2], None, None, None, None, None, args,
                    extra))  # fmt: skip
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
        offsets, offset = self._clock_offsets, self._offset
        for marks in self.marks.values():
            order = []
            for i, m in enumerate(marks):
                clock, ts = m[START]
                off = offsets.get(clock)
                order.append((ts + (offset(clock) if off is None else off), i))
            order.sort()
            stack = []
            for _, i in order:
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
        if self.slice_names is None:
            self.slice_names = {}
            for rec in self.records:
                if rec[KIND] is not None and rec[KEY][0] == "u":
                    self.slice_names.setdefault(rec[KEY][1], set()).add(rec[NAME])
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
        self._offset = offset
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


def read(path, **_) -> Export:
    """Every packet of the trace decoded or counted as skipped; InputError at the first broken packet."""
    import gc

    path = Path(path)
    reader = _Reader(path)
    # the records and rows are hundreds of thousands of small containers with no cycles among them:
    # the cyclic collector would rescan them over and over (a quarter of the time), so it waits until the end
    collecting = gc.isenabled()
    gc.disable()
    try:
        packet = reader.packet
        for offset, payload in _packets(path):
            packet(offset, payload)
        if not reader.out.read:
            raise InputError(path, "byte 0", "expected a Perfetto trace (at least one TracePacket)")
        return reader.finish()
    finally:
        if collecting:
            gc.enable()
