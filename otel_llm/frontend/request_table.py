"""The frontend's columnar request table: steps in, intervals and aggregates out.

Per-request state lives in slot-indexed numpy arrays. A request handle is
`(generation << 32) | slot`; the engine echoes it back in every event, so a
step is applied with a handful of vectorised operations and no per-token
Python work. The capacity is a power of two, so `handle & (cap - 1)` is always
a valid slot; a stale or unknown handle simply differs from the slot's live
handle and is dropped, counted in
`otel_llm.telemetry.dropped`.

Steady decode is deferred: a request that produced one token in every output
step since its state was last written is "in a run". Its ITLs all equal the
step deltas, so a step records one ITL value with a count, and its `last`,
`chunks` and Triton response stats are brought up to date only when it leaves
the run (a step without it, finish) or at a checkpoint (statistics read, or
every `_RUN_STEPS` steps). A step that lists exactly the previous step's
requests costs one bytes compare. (A step listing the same request twice is
counted once when detectable; that is an engine bug, never an exception.)

Request-level work is folded in batches: a step checks its lifecycle events' handles and keeps
the events, a first token only stamps its request's slot, and a finished request's handle stops
being valid at once while its state stays in its slot, until `fold` applies the events and
observes `fold_at` first tokens or finished requests together (a dozen histogram records cost
about the same for one request or a hundred; 128 at a time, the engine lane's per-request step
summaries too) and frees the finished slots. The owner folds before
every read (snapshot, Triton statistics), so a read never misses one. With a tracer the spans of
the sampled requests are built at the fold, so a sampled request's finish waits for the batch at
most `SPANS_WITHIN_NS` (checked at each step), and not at all when no request is left live: the
span trees of a busy engine are built up to a hundred at a time.

Interval semantics are vLLM v1's (`vllm/v1/metrics/stats.py`):
queue = first SCHEDULED - QUEUED (reschedules after preemption ignored),
prefill = first token - SCHEDULED, decode = last token - first token,
inference = last token - SCHEDULED, all on the engine's monotonic clock;
TTFT and e2e = frontend receive time - frontend arrival time, on the
frontend's monotonic clock. Preemptions inside a phase count toward it.

Prompt accounting is vLLM 0.32's (`PrefillStats`, `PromptTokenStats`): the
first SCHEDULED event's hits split the prompt (a reschedule after preemption
does not change it) into local prefix-cache hits, KV-connector hits and
computed tokens (hits are clamped to the prompt; a negative one reads 0); the
split is counted by source at the request's first token, with its prompt tokens,
and its computed part observed at finish (`prefill_kv_computed_tokens`).

With SLO objectives (`goodput`), folded finished requests are judged against them in batches of
`_JUDGE_BATCH` (and before every read, `judge`): a few numpy operations per batch.

Thread-safety: single writer; the owner holds its lock around every call.

Size: one noun, the columnar table: its column arrays and the vectorised step update share one owner
and one set of invariants (slots, handles, fold order); the step-level stats it shares with the vLLM
plugin are `canonical.step_stats`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from otel_llm.canonical.aggregation import TRACE_COLUMNS
from otel_llm.canonical.instruments import DIMENSIONS
from otel_llm.canonical.metrics_state import MetricsState
from otel_llm.canonical.step_stats import (
    add_prefix_cache, add_spec_decoding, clear_scheduler, fold_kv_evictions, set_scheduler,
)
from otel_llm.engine.kv_residency import KVEvictions
from otel_llm.engine.step import HEADER_SIZE as _HEADER_SIZE
from otel_llm.engine.step import EventKind, FinishReason, SchedulerSnapshot, SpecDecodingStats, StepRecord
from otel_llm.frontend.request import RequestInfo
from otel_llm.frontend.timings import engine_ordered, request_timings
from otel_llm.slo.goodput import GOODPUT

_NUM_REASONS = len(FinishReason)
# Plain ints: comparing a numpy array with an IntEnum member costs ~5x more than with an int.
_QUEUED, _SCHEDULED, _PREEMPTED = int(EventKind.QUEUED), int(EventKind.SCHEDULED), int(EventKind.PREEMPTED)
MAX_RESPONSE_INDEX = 8192  # Triton response_stats keys kept per model

# Per-slot int64 columns: the rows of one [len(_INT_FIELDS), capacity] array (`_ints`), each
# also an attribute (a view), so a finish gathers or clears all of them in one operation.
# Generated tokens = chunks (outputs seen) + extra_gen (tokens beyond 1 per output).
# num_cached / num_external: the first scheduling's local prefix-cache and KV-connector hits (tokens).
# fin_*: a finished request's frontend receive ns, reason and max sequence tokens, until it is folded.
# op: its (operation, stream) series (`instruments.request_series`).
_INT_FIELDS = ("arrival", "queued", "sched", "first", "last", "first_recv", "num_prompt", "extra_gen",
               "num_cached", "num_external", "max_tokens", "n", "npre", "chunks", "mat_seq",
               "fin_recv", "fin_reason", "fin_max_seq", "op")
_EVENT_ROW = np.full(256, -1, np.int64)  # uint8 event kind -> its column's row in `_ints` (-1: none)
_EVENT_ROW[_QUEUED], _EVENT_ROW[_SCHEDULED] = _INT_FIELDS.index("queued"), _INT_FIELDS.index("sched")
# Rows of (prompt, local hits, external hits), as one [3, 1] index: `_ints[_SPLIT_ROWS, slots]` gathers them at once.
_SPLIT_ROWS = np.array([[_INT_FIELDS.index(f)] for f in ("num_prompt", "num_cached", "num_external")])
_RUN_STEPS = 4096  # step timestamps kept for deferred (run) updates; then a checkpoint
_PENDING_EVENTS = 4096  # lifecycle events kept before they are applied (and applied at every fold)
_JUDGE_BATCH = 1024  # finished requests judged against their SLO objectives at once (and before every read)
SPANS_WITHIN_NS = 100_000_000  # with a tracer, a sampled request's spans are emitted at most this long after its finish
FOLD_BATCH = 128  # first tokens, and finished requests, folded into the aggregates at once (and before every read)


@dataclass(frozen=True)
class FinishedBatch:
    """Requests finished in one step, columnar (copies; safe after the slots are reused)."""

    infos: list[RequestInfo]
    reason: np.ndarray  # uint8 FinishReason
    arrival: np.ndarray  # frontend monotonic ns
    finish_recv: np.ndarray  # frontend monotonic ns
    queued: np.ndarray  # engine monotonic ns (0 = never seen)
    sched: np.ndarray
    first: np.ndarray
    last: np.ndarray
    first_recv: np.ndarray  # frontend monotonic ns of the first token (0 = none)
    num_prompt: np.ndarray
    num_gen: np.ndarray
    num_cached: np.ndarray  # local + external hits (vLLM's num_cached_tokens)
    npre: np.ndarray
    engine_valid: np.ndarray  # bool: engine timestamps complete and ordered
    trace: np.ndarray  # [n, TRACE_COLUMNS] uint64 (see aggregation.TRACE_COLUMNS)
    preemption_ts: list[list[int]]  # engine monotonic ns per request
    outputs: list[list[str] | None]  # response text per choice, only when content capture is on


class RequestTable:
    """Slot-indexed per-request arrays plus the step-application logic."""

    def __init__(self, metrics: MetricsState, capacity: int = 256, max_capacity: int = 1 << 20,
                 fold_batch: int = FOLD_BATCH, fold_sampled: bool = False):
        """`fold_batch`: first tokens and finished requests are folded into the aggregates this many
        at a time (`fold`); `fold_sampled`: a sampled request's finish (a tracer emits its spans at the
        fold) waits at most `SPANS_WITHIN_NS` for the batch, and none when it leaves no request live."""
        if capacity & (capacity - 1) or max_capacity & (max_capacity - 1):
            raise ValueError(f"capacities must be powers of two, got {capacity}, {max_capacity}")
        self.metrics = metrics
        # Triton response_stats: count and ns per response index; the last entry counts indices past the cap.
        self.resp_count = np.zeros(MAX_RESPONSE_INDEX + 1, np.int64)
        self.resp_ns = np.zeros(MAX_RESPONSE_INDEX + 1, np.float64)
        # Runs: a request that output one token in each output step since its `mat_seq` is "in
        # run"; its `last`/`chunks`/response stats are brought up to date only when it leaves the
        # run (a step without it, finish) or at a checkpoint. So steady decode writes nothing per request.
        self.seq = 0  # output steps so far
        self._run_base = 0  # _step_delta[i] = ns from output step _run_base + i to the next one
        self._step_delta = np.zeros(_RUN_STEPS, np.int64)
        self.n_run = 0
        self._prev_key: bytes | None = None  # output rids of the previous step, when all were valid
        self.last_step_ts = 0
        self.batch_sizes: dict[int, list[int]] = {}  # batch size -> [count, ns]
        self.max_capacity = max_capacity
        self.cap = 0
        self.handle = np.zeros(0, np.int64)  # live handle per slot, 0 = free
        self._next_gen: list[int] = []  # a slot's last generation (read and written one at a time)
        self.in_run = np.zeros(0, bool)
        self.trace = np.zeros((0, TRACE_COLUMNS), np.uint64)
        self._ints = np.zeros((len(_INT_FIELDS), 0), np.int64)
        self.infos: list[RequestInfo | None] = []
        self.preemption_ts: list[list[int] | None] = []
        self.outputs: list[list[str] | None] = []
        self._free: list[int] = []
        self.fold_at = fold_batch
        self.fold_sampled = fold_sampled
        self._sampled_since = 0  # frontend ns of the oldest finished sampled request not folded (0: none)
        self._retired: list[int] = []  # slots of finished requests not folded yet (see `fold`)
        self._firsts: list[int] = []  # slots whose first token is not folded yet
        self._pending_events: list[tuple] = []  # (slots, kind, ts, value, external) per step, not applied yet
        self._num_events = 0
        self.num_active = 0
        self.goodput = None  # an `otel_llm.slo.goodput.Goodput` (ns): judges every folded finished request
        self._unjudged: list[tuple[np.ndarray, list | None]] = []  # (ints, adapters) per fold
        self._num_unjudged = 0
        # handles whose response asked for their timings -> the `timings` object once finished (`timings.py`)
        self.timed: dict[int, dict | None] = {}
        self.live_hits = 0  # live requests with prefix-cache or KV-connector hits (none: their work is skipped)
        self.dropped = {"unknown_request": 0, "out_of_order": 0, "bad_value": 0, "table_full": 0}
        self._grow(capacity)

    def _grow(self, new_cap: int) -> None:
        def widen(a: np.ndarray) -> np.ndarray:
            out = np.zeros((new_cap,) + a.shape[1:], a.dtype)
            out[: len(a)] = a
            return out

        for f in ("handle", "trace", "in_run"):
            setattr(self, f, widen(getattr(self, f)))
        self._next_gen.extend([0] * (new_cap - self.cap))
        ints = np.zeros((len(_INT_FIELDS), new_cap), np.int64)
        ints[:, : self.cap] = self._ints
        self._ints = ints
        for i, f in enumerate(_INT_FIELDS):
            setattr(self, f, ints[i])
        self.infos.extend([None] * (new_cap - self.cap))
        self.preemption_ts.extend([None] * (new_cap - self.cap))
        self.outputs.extend([None] * (new_cap - self.cap))
        self._free.extend(range(new_cap - 1, self.cap - 1, -1))
        self.cap = new_cap

    # -- frontend events -------------------------------------------------------------

    def allocate(self, info: RequestInfo, op_index: int, arrival_ns: int, trace: tuple[int, int, int, int]) -> int:
        """Register an arriving request; returns its handle, or -1 if the table is full."""
        if not self._free:
            if self.cap >= self.max_capacity:
                self.dropped["table_full"] += 1
                return -1
            self._grow(min(self.cap * 2, self.max_capacity))
        slot = self._free.pop()
        g = self._next_gen[slot] % 0x7FFFFFFF + 1
        self._next_gen[slot] = g
        handle = (g << 32) | slot
        self.handle[slot] = handle
        self.op[slot] = op_index
        self.arrival[slot] = arrival_ns
        self.num_prompt[slot] = info.prompt_tokens
        self.max_tokens[slot] = -1 if info.max_tokens is None else info.max_tokens
        self.n[slot] = info.n
        self.trace[slot] = trace
        self.infos[slot] = info
        self.num_active += 1
        return handle

    def slot_of(self, handle: int) -> int | None:
        """The slot of a live handle, or None (stale, unknown or malformed)."""
        slot = handle & (self.cap - 1)
        return slot if handle > 0 and self.handle[slot] == handle else None

    def _slots(self, rids: np.ndarray, reason: str = "unknown_request") -> tuple[np.ndarray, np.ndarray | None]:
        """Map handles to slots; returns (slots of valid handles, mask or None if all valid)."""
        slot = rids & (self.cap - 1)  # capacity is a power of two: always in range
        if self.handle[slot].tobytes() == rids.tobytes():  # all valid: one memcmp
            return slot, None
        ok = self.handle[slot] == rids
        self.dropped[reason] += int((~ok).sum())
        return slot[ok], ok

    # -- engine steps ----------------------------------------------------------------

    def apply(self, rec: StepRecord, now_ns: int) -> FinishedBatch | None:
        """Apply one engine step received at frontend time `now_ns`."""
        if len(rec.event_rid):
            self._events(rec)
        out_tokens = self._outputs(rec, now_ns) if len(rec.output_rid) else 0
        self._step_tokens(rec.num_computed_prompt_tokens + out_tokens)
        if rec.snapshot is not None:
            self._snapshot(rec.snapshot)
        if rec.spec_decoding is not None:
            self._spec_decoding(rec.spec_decoding)
        if rec.kv_evictions is not None:
            self._kv_evictions(rec.kv_evictions)
        if len(rec.finished_rid):
            self._finish(rec.finished_rid, rec.finished_reason, rec.finished_max_seq_tokens, now_ns)
        return self.fold() if self.fold_due(now_ns) else None

    def _events(self, rec: StepRecord) -> None:
        """Lifecycle events: their handles are checked now, and they are kept until the next fold
        (`_apply_events`; nothing reads queue, schedule or preemption times before it)."""
        s, ok = self._slots(rec.event_rid)
        kind, ts, val, ext = rec.event_kind, rec.event_ts_ns, rec.event_value, rec.event_external
        if ext is not None and len(ext) != len(kind):
            self.dropped["bad_value"] += 1
            ext = None
        if ok is not None:
            kind, ts, val = kind[ok], ts[ok], val[ok]
            ext = None if ext is None else ext[ok]
        if len(s):
            self._pending_events.append((s, kind, ts, val, ext))
            self._num_events += len(s)
            if self._num_events >= _PENDING_EVENTS:
                self._apply_events()

    def _apply_events(self) -> None:
        """The events kept since the last fold, in order: QUEUED and SCHEDULED set their column once
        (vLLM ignores reschedules), a first scheduling's hits split the prompt, preemptions count."""
        parts, self._pending_events, self._num_events = self._pending_events, [], 0
        if len(parts) == 1:
            s, kind, ts, val, ext = parts[0]
        else:
            s, kind, ts, val = (np.concatenate(column) for column in list(zip(*parts))[:4])
            ext = None if all(p[4] is None for p in parts) else np.concatenate(
                [p[4] if p[4] is not None else np.zeros(len(p[0]), np.int64) for p in parts])
        pre = kind == _PREEMPTED
        if pre.any():
            for slot, t in zip(s[pre].tolist(), ts[pre].tolist()):
                self.npre[slot] += 1
                if self.preemption_ts[slot] is None:
                    self.preemption_ts[slot] = []
                self.preemption_ts[slot].append(t)
        rows = _EVENT_ROW[kind]
        known = rows >= 0
        self.dropped["bad_value"] += int(np.count_nonzero(~known & ~pre))  # no such event kind
        i = np.flatnonzero(known)
        key = s[i] * len(_INT_FIELDS) + rows[i]
        if _repeats(key):  # the same event again: the first counts
            i = i[np.unique(key, return_index=True)[1]]
        i = i[self._ints[rows[i], s[i]] == 0]  # only the first QUEUED/SCHEDULED counts (vLLM: ignore reschedules)
        s, kind, val = s[i], kind[i], val[i]
        self._ints[rows[i], s] = ts[i]
        if val.any() or ext is not None:  # a first scheduling's hits split the prompt
            sched = kind == _SCHEDULED
            self._prompt_split(s[sched], val[sched], None if ext is None else ext[i][sched])

    def apply_steady(self, data: bytes, ts: int, num_computed_prompt_tokens: int, body: int = _HEADER_SIZE) -> bool:
        """The steady decode step: `data` (a step record, see `step.outputs_only_header`) whose body
        (from offset `body`) is exactly the previous output step's rids, one token each. Costs one bytes
        compare and two histogram updates whatever the batch size. False: not that; apply the full record."""
        if self.n_run * 8 + body != len(data) or not self._prev_key or not data.endswith(self._prev_key):
            return False
        self._advance(ts, self.n_run, self.n_run)
        self._step_tokens(num_computed_prompt_tokens + self.n_run)
        self.metrics.add("otel_llm.usage.generation_tokens", self.n_run)
        return True

    def _step_tokens(self, tokens: int) -> None:
        if tokens > 0:
            self.metrics.histograms["otel_llm.step.tokens"].record_repeated(tokens, 1)

    def _outputs(self, rec: StepRecord, now_ns: int) -> int:
        """The token path: a fixed, small number of vectorised operations plus work for the
        requests whose run starts or ends (see `apply_steady` for the common case)."""
        rids, ts = rec.output_rid, rec.step_ts_ns
        s, ok = self._slots(rids)
        total = len(s)
        if not rec.outputs_all_one:  # spec decode, n > 1, or bad counts
            n = rec.output_num_tokens if ok is None else rec.output_num_tokens[ok]
            good = n > 0
            if not good.all():
                self.dropped["bad_value"] += int((~good).sum())
                s, n, ok = s[good], n[good], good
            total = int(n.sum())
            self.extra_gen[s] += n - 1
        cont = self.in_run[s]
        k = int(np.count_nonzero(cont))
        if k > self.n_run:  # the same request listed twice: count it once
            s = np.unique(s)
            cont = self.in_run[s]
            k = int(np.count_nonzero(cont))
        if k < self.n_run:  # some running requests produced nothing this step: their runs end
            gone = self.in_run.copy()
            gone[s] = False
            gone = np.flatnonzero(gone)
            self._materialise(gone)
            self.in_run[gone] = False
            self.n_run -= len(gone)
        if not len(s):
            return 0
        self._advance(ts, k, len(s))
        if k < len(s):
            self._entrants(s[~cont] if k else s, ts, now_ns)
        self._prev_key = rids.tobytes() if ok is None else None
        self.metrics.add("otel_llm.usage.generation_tokens", total)
        return total

    def _advance(self, ts: int, continuing: int, batch_size: int) -> None:
        """One output step: `continuing` requests in a run each get ITL = the step delta (deferred)."""
        if continuing:
            self.metrics.histograms["otel_llm.request.inter_token_latency"].record_repeated(
                ts - self.last_step_ts, continuing)
        entry = self.batch_sizes.get(batch_size)  # Triton batch_stats: per batch size, time since the previous step
        if entry is None:
            entry = self.batch_sizes[batch_size] = [0, 0]
        entry[0] += 1
        entry[1] += ts - self.last_step_ts if self.last_step_ts else 0
        self._step_delta[self.seq - self._run_base] = ts - self.last_step_ts
        self.seq += 1
        self.last_step_ts = ts
        if self.seq - self._run_base == _RUN_STEPS:
            self.checkpoint()

    def _entrants(self, e: np.ndarray, ts: int, now_ns: int) -> None:
        """Requests outputting without having output in the previous step: first tokens (their
        TTFT, prompt tokens and first response are folded later, see `fold`) and resumptions."""
        if _repeats(e):
            e = np.unique(e)  # the same request listed twice counts once
        is_first = self.first[e] == 0
        first = e if is_first.all() else e[is_first]
        if len(first):
            self.first[first] = ts
            self.first_recv[first] = now_ns
            self._firsts.extend(first.tolist())
            if len(self._firsts) >= self.fold_at:
                self._fold_pending()
        if len(first) < len(e):
            back = e[~is_first]
            resp_ns = ts - self.last[back]
            self.metrics.histograms["otel_llm.request.inter_token_latency"].record(resp_ns)
            self._add_responses(self.chunks[back], resp_ns)
        self.last[e] = ts
        self.chunks[e] += 1
        self.mat_seq[e] = self.seq
        self.in_run[e] = True
        self.n_run += len(e)

    def _fold_pending(self) -> None:
        """The events, then the first tokens, kept since the last fold."""
        if self._pending_events:
            self._apply_events()
        if self._firsts:
            self._fold_firsts()

    def _fold_firsts(self) -> None:
        """First tokens since the last fold: TTFT, prompt tokens by source, Triton's first response."""
        f = np.array(self._firsts, np.int64)
        self._firsts = []
        self.metrics.histograms["gen_ai.server.time_to_first_token"].record(
            self.first_recv[f] - self.arrival[f], self.op[f], self.trace[f])
        self._prompt_sources(f)
        sched = self.sched[f]
        self._add_responses(np.zeros(len(f), np.int64), np.where(sched > 0, self.first[f] - sched, 0))

    def _prompt_split(self, s: np.ndarray, local: np.ndarray, external: np.ndarray | None) -> None:
        """The first scheduling's hits of requests `s`, clamped to their prompt (negative: 0)."""
        prompt = self.num_prompt[s]
        local = np.minimum(np.maximum(local, 0), prompt)
        self.num_cached[s] = local
        if external is not None:
            external = np.minimum(np.maximum(external, 0), prompt - local)
            self.num_external[s] = external
            local = local + external
        self.live_hits += int(np.count_nonzero(local))

    def _prompt_sources(self, s: np.ndarray) -> None:
        """Prompt tokens of requests at their first token, in all and by source (vLLM's PromptTokenStats)."""
        if self.live_hits:  # prompt, local hits, external hits: one gather ([3, n]), one sum
            total, local_hits, external_hits = self._ints[_SPLIT_ROWS, s].sum(axis=1).tolist()
        else:
            total, local_hits, external_hits = int(self.num_prompt[s].sum()), 0, 0
        m = self.metrics
        m.add("otel_llm.usage.prompt_tokens", total)
        by_source = m.counters["otel_llm.usage.prompt_tokens_by_source"]
        by_source[0] += total - local_hits - external_hits
        if local_hits or external_hits:
            by_source[1] += local_hits
            by_source[2] += external_hits
            m.add("otel_llm.usage.prompt_tokens_cached", local_hits + external_hits)

    def _add_responses(self, index: np.ndarray, ns: np.ndarray) -> None:
        """Triton response_stats: count and ns per response index; indices past the cap are dropped."""
        cap, counts, total = MAX_RESPONSE_INDEX, self.resp_count, self.resp_ns
        if len(index) > 16:
            index = np.minimum(index, cap)
            counts += np.bincount(index, minlength=cap + 1)
            total += np.bincount(index, weights=ns, minlength=cap + 1)
            return
        for i, v in zip(index.tolist(), ns.tolist()):  # a few requests: scalar updates are cheaper
            i = min(i, cap)
            counts[i] += 1
            total[i] += v

    def _materialise(self, slots: np.ndarray) -> None:
        """Bring `last`, `chunks` and response stats of requests in a run up to the latest step.

        A request in a run output one token in every output step after its `mat_seq`; those
        steps' durations are in `_step_delta` (from `_run_base` on; `checkpoint` restarts it)."""
        slots = slots[self.in_run[slots]]
        if len(slots) > 16:
            return self._materialise_many(slots)
        deltas, cap, counts, ns = self._step_delta, MAX_RESPONSE_INDEX, self.resp_count, self.resp_ns
        chunks, mat_seq, last = self.chunks, self.mat_seq, self.last
        steps = self.seq - self._run_base
        for slot in slots.tolist():  # scalar work per request: cheaper for a few
            since = int(mat_seq[slot]) - self._run_base
            c, k = int(chunks[slot]), steps - since  # deferred outputs: indices c .. c+k-1
            end = min(c + k, cap)
            if end > c:
                counts[c:end] += 1
                ns[c:end] += deltas[since: since + end - c]
            counts[cap] += c + k - max(end, c)  # past the cap
            chunks[slot] = c + k
            last[slot] = self.last_step_ts
            mat_seq[slot] = self.seq

    def _materialise_many(self, slots: np.ndarray) -> None:
        """`_materialise` of many requests at once: each one's deferred responses c .. end-1 laid out
        in one index array (`n` per request), counted and timed with a bincount each."""
        cap = MAX_RESPONSE_INDEX
        since = self.mat_seq[slots].astype(np.int64) - self._run_base
        c = self.chunks[slots].astype(np.int64)
        k = (self.seq - self._run_base) - since
        end = np.minimum(c + k, cap)
        n = np.maximum(end - c, 0)
        total = int(n.sum())
        if total:
            j = np.arange(total) - np.repeat(np.cumsum(n) - n, n)  # 0 .. n-1 within each request
            index = np.repeat(c, n) + j
            self.resp_count += np.bincount(index, minlength=cap + 1)
            self.resp_ns += np.bincount(index, weights=self._step_delta[np.repeat(since, n) + j], minlength=cap + 1)
        self.resp_count[cap] += int((c + k - np.maximum(end, c)).sum())  # past the cap
        self.chunks[slots] = c + k
        self.last[slots] = self.last_step_ts
        self.mat_seq[slots] = self.seq

    def checkpoint(self) -> None:
        """Materialise every running request and restart the run timeline (before reading
        response stats, and before `_step_delta` fills up)."""
        self._materialise(np.flatnonzero(self.in_run))
        self._run_base = self.seq

    def _snapshot(self, snap: SchedulerSnapshot) -> None:
        m = self.metrics
        if not (0.0 <= snap.kv_usage <= 1.0) or min(snap.running, snap.waiting, snap.prefix_queries,
                                                      snap.prefix_hits, snap.preemptions, snap.waiting_deferred,
                                                      snap.external_prefix_queries, snap.external_prefix_hits) < 0 \
                or snap.waiting_deferred > snap.waiting:
            self.dropped["bad_value"] += 1  # also catches NaN kv_usage
            return
        set_scheduler(m, snap.running, snap.waiting, snap.waiting_deferred, snap.kv_usage)
        add_prefix_cache(m, snap.prefix_queries, snap.prefix_hits, snap.external_prefix_queries,
                         snap.external_prefix_hits)
        m.add("otel_llm.scheduler.preemptions", snap.preemptions)

    def _spec_decoding(self, sd: SpecDecodingStats) -> None:
        """A step's speculative decoding; negative totals drop the step, a bad per-position part
        (past MAX_SPEC_POSITIONS, or negative) only that part (counted either way)."""
        if min(sd.num_drafts, sd.num_draft_tokens, sd.num_accepted_tokens) < 0:
            self.dropped["bad_value"] += 1
            return
        self.dropped["bad_value"] += add_spec_decoding(
            self.metrics, sd.num_drafts, sd.num_draft_tokens, sd.num_accepted_tokens,
            (np.asarray(sd.accepted_per_pos, np.int64),))

    def _kv_evictions(self, kv: KVEvictions) -> None:
        """Sampled KV block evictions (ns); a step with a negative time is dropped (counted)."""
        if any(len(a) and a.min() < 0 for a in kv):
            self.dropped["bad_value"] += 1
            return
        fold_kv_evictions(self.metrics, *(a.astype(np.float64) for a in kv))

    def engine_gone(self) -> None:
        clear_scheduler(self.metrics)

    def finish_from_frontend(self, handle: int, reason: FinishReason, now_ns: int) -> FinishedBatch | None:
        """Finish a request the engine will never report (engine died, rejected before it)."""
        self._finish(np.array([handle], np.int64), np.array([reason], np.uint8), np.zeros(1, np.int32), now_ns)
        return self.fold() if self.fold_due(now_ns) else None

    def _finish(self, rids: np.ndarray, reasons: np.ndarray, max_seq: np.ndarray, now_ns: int) -> None:
        """Requests finished (frontend receive time `now_ns`): their handles stop being valid
        now and their state is kept until they are folded (`fold`, when `fold_due`)."""
        s, ok = self._slots(rids)
        if ok is not None:
            reasons, max_seq = reasons[ok], max_seq[ok]
        if _repeats(s):  # the same request finished twice in one step
            s, first_idx = np.unique(s, return_index=True)
            self.dropped["out_of_order"] += len(reasons) - len(s)
            reasons, max_seq = reasons[first_idx], max_seq[first_idx]
        bad = reasons >= _NUM_REASONS
        if bad.any():
            self.dropped["bad_value"] += int(bad.sum())
            reasons = np.where(bad, FinishReason.ERROR, reasons).astype(np.uint8)
        if not len(s):
            return
        self._materialise(s)
        if self.timed:
            self._stamp_timings(s, now_ns)
        self.n_run -= int(np.count_nonzero(self.in_run[s]))
        self.in_run[s] = False
        self.handle[s] = 0
        self.fin_recv[s] = now_ns
        self.fin_reason[s] = reasons
        self.fin_max_seq[s] = max_seq
        self.num_active -= len(s)
        self._retired.extend(s.tolist())
        if self.fold_sampled and not self._sampled_since and self.trace[s, 2].any():
            self._sampled_since = now_ns

    def fold_due(self, now_ns: int) -> bool:
        """The finished requests kept should be folded now: a batch of `fold_at`, or a sampled one that
        should not wait longer (`SPANS_WITHIN_NS` since its finish, or no request is live: nothing else
        will finish soon)."""
        since = self._sampled_since
        return len(self._retired) >= self.fold_at or (
            since != 0 and (self.num_active == 0 or now_ns - since >= SPANS_WITHIN_NS))

    def _stamp_timings(self, s: np.ndarray, now_ns: int) -> None:
        """The timings of the finishing requests a response waits for (their columns are complete once
        the events kept since the last fold are applied)."""
        timed = [(slot, h) for slot, h in zip(s.tolist(), self.handle[s].tolist()) if h in self.timed]
        if timed and self._pending_events:
            self._apply_events()
        for slot, h in timed:
            col = dict(zip(_INT_FIELDS, self._ints[:, slot].tolist()))
            self.timed[h] = request_timings(
                col["arrival"], col["first_recv"], now_ns, col["queued"], col["sched"], col["first"], col["last"],
                col["num_prompt"], col["num_cached"] + col["num_external"], col["chunks"] + col["extra_gen"],
                col["chunks"], col["npre"])

    @property
    def num_unfolded(self) -> int:
        """Finished requests not folded into the aggregates yet."""
        return len(self._retired)

    def fold(self) -> FinishedBatch | None:
        """Fold what is kept into the aggregates, in order (events, first tokens, then finished
        requests: a request may have all three) and free the finished requests' slots; returns
        those (for Triton statistics and spans), or None if there were none. Called every `fold_at`
        first tokens or finishes, and by the owner before it reads the aggregates: a batch costs
        about what one costs, and a read never misses one."""
        self._fold_pending()
        self._sampled_since = 0
        if not self._retired:
            return None
        s = np.array(self._retired, np.int64)
        self._retired = []
        m, h = self.metrics, self.metrics.histograms
        trace = self.trace[s]
        ints = self._ints[:, s]  # one gather; copies, safe after release
        col = dict(zip(_INT_FIELDS, ints))
        op = col["op"]
        q, sc, f, last, arrival = col["queued"], col["sched"], col["first"], col["last"], col["arrival"]
        num_gen, num_prompt = col["chunks"] + col["extra_gen"], col["num_prompt"]
        reasons, max_seq, now_ns = col["fin_reason"].astype(np.uint8), col["fin_max_seq"], col["fin_recv"]
        series_reason = op * _NUM_REASONS + reasons
        m.add_many("otel_llm.request.finished", series_reason)
        h["gen_ai.server.request.duration"].record(now_ns - arrival, series_reason, trace)
        prompt = num_prompt.astype(np.float64)
        h["otel_llm.request.prompt_tokens"].record(prompt, op, trace)
        h["otel_llm.request.generation_tokens"].record(num_gen.astype(np.float64), op, trace)
        h["otel_llm.request.max_generation_tokens"].record(
            np.where(max_seq > 0, max_seq, num_gen).astype(np.float64), op)
        h["otel_llm.request.params.n"].record(col["n"].astype(np.float64), op)
        mt = col["max_tokens"]
        has_mt = mt >= 0
        h["otel_llm.request.params.max_tokens"].record(mt[has_mt].astype(np.float64), op[has_mt])
        h["otel_llm.request.preemptions"].record(col["npre"].astype(np.float64), op)
        if self.live_hits:
            cached = col["num_cached"] + col["num_external"]  # clamped to the prompt when scheduled
            self.live_hits -= int(np.count_nonzero(cached))
            h["otel_llm.request.prefill_kv_computed_tokens"].record(prompt - cached, op)
        else:
            cached = col["num_cached"]  # all 0
            h["otel_llm.request.prefill_kv_computed_tokens"].record(prompt, op)
        # Engine intervals: only for requests whose engine timestamps are complete and ordered.
        has_tokens = f > 0
        valid = engine_ordered(q, sc, f, last)
        inconsistent = has_tokens & ~valid
        if inconsistent.any():
            self.dropped["out_of_order"] += int(inconsistent.sum())
        if valid.any():
            v_op, v_tr = op[valid], trace[valid]
            qv, sv, fv, lv = q[valid], sc[valid], f[valid], last[valid]
            h["otel_llm.request.queue.duration"].record(sv - qv, v_op, v_tr)
            h["otel_llm.request.prefill.duration"].record(fv - sv, v_op, v_tr)
            h["otel_llm.request.decode.duration"].record(lv - fv, v_op, v_tr)
            h["otel_llm.request.inference.duration"].record(lv - sv, v_op, v_tr)
            g = num_gen[valid]
            tpot = np.where(g > 1, (lv - fv) / np.maximum(g - 1, 1), 0.0)
            h["gen_ai.server.time_per_output_token"].record(tpot, v_op, v_tr)
        slots = s.tolist()
        if self.goodput is not None:  # judged in batches (a tracer folds one request at a time)
            self._unjudged.append((ints, [self.infos[i].lora_name for i in slots] if self.goodput.adapters else None))
            self._num_unjudged += len(slots)
            if self._num_unjudged >= _JUDGE_BATCH:
                self.judge()
        batch = FinishedBatch(
            [self.infos[i] for i in slots], reasons, arrival, now_ns, q, sc, f, last, col["first_recv"],
            num_prompt, num_gen, cached, col["npre"], valid, trace,
            [self.preemption_ts[i] or [] for i in slots], [self.outputs[i] for i in slots],
        )
        self._release(s, slots)
        return batch

    def judge(self) -> None:
        """Goodput: the finished requests folded since the last call against their SLO objectives (TTFT
        and e2e on the frontend's clock, TPOT as its histogram has it; NaN where a request has none).
        Called every `_JUDGE_BATCH` requests and by the owner before it reads the aggregates."""
        if not self._unjudged:
            return
        batches, self._unjudged, self._num_unjudged = self._unjudged, [], 0
        ints = np.concatenate([b[0] for b in batches], axis=1) if len(batches) > 1 else batches[0][0]
        adapters = [a for b in batches for a in b[1]] if self.goodput.adapters else None
        col = dict(zip(_INT_FIELDS, ints))
        q, sc, f, last, arrival, first_recv = (col[k] for k in ("queued", "sched", "first", "last", "arrival",
                                                                "first_recv"))
        gen = col["chunks"] + col["extra_gen"]
        timed = engine_ordered(q, sc, f, last) & (gen > 1)
        tpot = np.where(timed, (last - f) / np.maximum(gen - 1, 1), np.nan)
        ttft = np.where(first_recv > 0, first_recv - arrival, np.nan)
        e2e = (col["fin_recv"] - arrival).astype(np.float64)
        self.goodput.count(self.metrics.counters[GOODPUT], col["op"], ttft, tpot, e2e, col["fin_reason"], adapters)

    def _release(self, s: np.ndarray, slots: list[int]) -> None:
        self._ints[:, s] = 0
        self.trace[s] = 0
        for i in slots:
            self.infos[i] = None
            self.preemption_ts[i] = None
            self.outputs[i] = None
        self._free.extend(slots)


def _repeats(a: np.ndarray) -> bool:
    """Whether a slot occurs twice in `a` (a set of a step's few slots: ~20x cheaper than np.unique)."""
    return len(a) > 1 and len(set(a.tolist())) < len(a)


_OPERATIONS = DIMENSIONS["gen_ai.operation.name"]
_OPERATION_INDEX = {name: i for i, name in enumerate(_OPERATIONS)}


def operation_index(name: str) -> int:
    """`name`'s index in the operation dimension; an unknown one counts as the last, "_OTHER"."""
    return _OPERATION_INDEX.get(name, len(_OPERATIONS) - 1)
