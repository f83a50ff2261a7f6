"""`LLMEngine`: add requests, `step()` them, hand back outputs and the step's telemetry.

Size: the orchestrator of scheduler, block manager and runner (nano-vllm's `llm_engine` shape) with
the KV cache sizing it needs to build them.
"""

from __future__ import annotations

import logging
import os
import time
from operator import attrgetter

import torch

from otel_llm.engine.kv_residency import KVResidencySampler
from otel_llm.engine.recorder import StepRecorder
from otel_llm.engine.step import FinishReason, ForwardSource, SchedulerSnapshot, StepLane

from .block_manager import BlockManager
from .config import EngineConfig
from .model import LlamaModel
from .model_runner import ModelRunner
from .null_runner import NullRunner
from .outputs import RequestOutput, StepOutput
from .perf import PerfEstimator
from .request import Request
from .sampling import SamplingParams
from .scheduler import Scheduler, SchedulerOutput
from .sequence import Sequence

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "StepOutput"]

logger = logging.getLogger(__name__)

_COMPUTED, _REQUEST = attrgetter("num_computed_tokens"), attrgetter("request")
_CPU_KV_BUDGET_BYTES = 1 << 30
_CUDA_KV_FRACTION = 0.5


class LLMEngine:
    """A paged-KV continuous-batching engine for one Llama model.

    Single-threaded: every method must be called from the one engine-loop thread.
    The loop only stamps lifecycle events and step outputs on its `StepRecorder`;
    aggregation happens wherever `StepOutput.telemetry` is decoded.
    """

    def __init__(self, config: EngineConfig, loaded_model=None):
        self.config = config
        torch.set_num_threads(config.num_threads or _default_num_threads())
        device = _resolve_device(config.device)
        dtype_name = _resolve_dtype(config.dtype, device)
        if loaded_model is None:
            from otel_llm.server.model import load_model

            # the loaders know float32 and bfloat16; float16 is cast from float32 on the way to the device
            loaded_model = load_model(config.model, "float32" if dtype_name == "float16" else dtype_name)
        model_config = loaded_model.config
        dtype = getattr(torch, dtype_name)
        self.model_name = loaded_model.name
        self.tokenizer = loaded_model.tokenizer
        self.eos_token_ids = frozenset(model_config.eos_token_ids)
        self.max_model_len = config.max_model_len or model_config.max_position_embeddings
        if self.max_model_len > model_config.max_position_embeddings:
            raise ValueError(
                f"max_model_len={self.max_model_len}: above the model's "
                f"max_position_embeddings={model_config.max_position_embeddings}"
            )
        if loaded_model.weights is None:  # the "null" model: every step but the forward pass
            self.runner = NullRunner(config.null_step_s)
            self.perf = None  # it computes nothing to estimate
        else:
            self.runner = ModelRunner(model_config, loaded_model.weights, self.max_model_len, device, dtype,
                                      config.seed)
            self.perf = PerfEstimator.for_model(model_config, dtype)
        num_blocks = config.num_kv_blocks or _auto_num_blocks(config, model_config, self.max_model_len, device, dtype)
        if num_blocks * config.block_size < self.max_model_len:
            raise ValueError(
                f"num_kv_blocks={num_blocks}: {num_blocks} x block_size {config.block_size} tokens "
                f"cannot hold one max_model_len={self.max_model_len} sequence"
            )
        self.runner.allocate_kv_cache(num_blocks, config.block_size)
        self.residency = KVResidencySampler(config.kv_cache_metrics_sample) \
            if config.kv_cache_metrics_sample and config.log_stats else None
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching,
                                          self.residency)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        self.recorder = StepRecorder(enabled=config.log_stats)
        self.lane_on = config.log_stats and config.engine_lane
        self._requests: dict[int, Request] = {}
        self._aborts: list[int] = []
        self._last_snapshot_s: float | None = None
        self._last_busy = (False, False)
        self._reported = (0, 0, 0)  # prefix queries, prefix hits, preemptions at the last snapshot

    # ---- public API -------------------------------------------------------------------

    def add_request(self, rid: int, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Queue a request. Raises ValueError for a duplicate rid, an empty prompt, a prompt
        longer than max_model_len, or n above max_num_seqs."""
        if rid in self._requests:
            raise ValueError(f"rid={rid}: already in the engine")
        if not prompt_token_ids:
            raise ValueError(f"request {rid}: the prompt is empty")
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"request {rid}: n={params.n} is above max_num_seqs={self.config.max_num_seqs}")
        if len(prompt_token_ids) > self.max_model_len:
            raise ValueError(
                f"request {rid}: prompt of {len(prompt_token_ids)} tokens is longer than "
                f"max_model_len={self.max_model_len}"
            )
        new_decoder = self.tokenizer.incremental_decoder if self.tokenizer is not None else None
        request = Request(rid, list(prompt_token_ids), params, new_decoder)
        self._requests[rid] = request
        self.scheduler.add(request)
        self.recorder.queued(rid)

    def abort(self, rid: int) -> None:
        """Finish the request with ABORT at the next step (unknown rids are ignored)."""
        if rid in self._requests:
            self._aborts.append(rid)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> StepOutput:
        """Schedule, run the model once, sample, detokenize, check stops; stamp telemetry."""
        start_ns = time.monotonic_ns() if self.lane_on else 0
        outputs: list[RequestOutput] = []
        if self._aborts:
            self._finish_aborted(outputs)
        sched = self.scheduler.schedule()
        for request in sched.preempted:
            self.recorder.preempted(request.rid)
        for request in sched.scheduled:
            self.recorder.scheduled(request.rid, request.num_cached_tokens if request.num_schedules == 1 else 0)
        batch = self._batch(sched) if self.lane_on else None
        if sched.seqs:
            self._execute(sched, outputs)
        elif self.scheduler.waiting and not self.scheduler.running:
            self._fail_unschedulable(outputs)
        if self.recorder.enabled:
            self._maybe_snapshot()
            if self.residency is not None:
                self.recorder.kv_evictions(self.residency.drain())
            if self.lane_on:
                self.recorder.lane(self._lane(sched, start_ns, batch))
        return StepOutput(outputs, self.recorder.end_step_bytes(sched.num_prompt_tokens))

    def generate(self, prompts: list[str] | list[list[int]], params: SamplingParams | None = None) -> list[str]:
        """Run `prompts` (text or token ids) to completion; the text of each one's sequence 0."""
        params = params or SamplingParams()
        base = max(self._requests, default=-1) + 1
        texts = {base + i: "" for i in range(len(prompts))}
        for i, prompt in enumerate(prompts):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
            self.add_request(base + i, ids, params)
        while any(rid in self._requests for rid in texts):
            for out in self.step().outputs:
                if out.rid in texts and out.seq_index == 0:
                    texts[out.rid] += out.text_delta
        return list(texts.values())

    # ---- one step ---------------------------------------------------------------------

    def _execute(self, sched: SchedulerOutput, outputs: list[RequestOutput]) -> None:
        sampled, rows = self._sampling_rows(sched)
        token_ids = self.runner.run(sched.seqs, sched.num_new_tokens, sched.blocks_to_copy, rows)
        for seq, n in zip(sched.seqs, sched.num_new_tokens):
            seq.num_computed_tokens += n
        self._process_samples(sampled, token_ids, outputs)

    @staticmethod
    def _sampling_rows(sched: SchedulerOutput):
        """Sequences whose new tokens reach their end sample one token each; a request's
        first sampling draws n tokens from sequence 0's logits (one per future sibling)."""
        sampled: list[Sequence] = []
        rows = []
        for k, (seq, n) in enumerate(zip(sched.seqs, sched.num_new_tokens)):
            if seq.num_computed_tokens + n == seq.num_tokens:
                request = seq.request
                sampled.append(seq)
                for i in range(request.params.n) if request.needs_fork else (seq.index,):
                    rows.append((k, request.params, request.generators[i]))
        return sampled, rows

    def _process_samples(self, sampled: list[Sequence], token_ids: list[int], outputs: list[RequestOutput]) -> None:
        """Append tokens (forking n > 1 requests first), stamp outputs, finish requests."""
        out_rids: list[int] = []
        out_counts: list[int] = []
        finished: list[tuple[Request, FinishReason]] = []
        i = 0
        for seq in sampled:
            request = seq.request
            if request.needs_fork:
                for child in request.fork():
                    self.block_manager.fork(child)
                targets = request.seqs
            else:
                targets = [seq]
            for target in targets:
                self._append_token(target, token_ids[i], outputs)
                i += 1
            # a request's sequences are contiguous in the schedule
            if out_rids and out_rids[-1] == request.rid:
                out_counts[-1] += len(targets)
            else:
                out_rids.append(request.rid)
                out_counts.append(len(targets))
            if request.finished:
                finished.append((request, targets[-1].finish_reason))
        if out_rids:
            self.recorder.outputs(out_rids, out_counts)
        for request, reason in finished:
            self._finish_request(request, reason)

    def _append_token(self, seq: Sequence, token: int, outputs: list[RequestOutput]) -> None:
        seq.token_ids.append(token)
        params = seq.request.params
        reason = None
        cut = False
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            reason = FinishReason.STOP  # the stop token's text is not output
        elif seq.decoder is not None:
            delta = seq.decoder.add((token,))
            if delta:
                seq.text += delta
                cut = bool(params.stop) and self._cut_at_stop_string(seq, len(delta))
                if cut:
                    reason = FinishReason.STOP
        if reason is None and (seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len):
            reason = FinishReason.LENGTH
        if reason is not None:
            if seq.decoder is not None and not cut:
                seq.text += seq.decoder.flush()
            self._finish_seq(seq, reason)
            end = len(seq.text)
        else:
            # text that may be the start of a stop string waits until it is settled
            hold = max(map(len, params.stop)) - 1 if params.stop else 0
            end = max(seq.num_sent_chars, len(seq.text) - hold)
        delta = seq.text[seq.num_sent_chars:end]
        seq.num_sent_chars = end
        request = seq.request
        outputs.append(RequestOutput(
            request.rid, seq.index, [token], delta, reason is not None, reason,
            request.num_prompt_tokens, request.num_cached_tokens,
        ))

    @staticmethod
    def _cut_at_stop_string(seq: Sequence, delta_len: int) -> bool:
        """Truncate `seq.text` before the first stop string that the new text completes."""
        text = seq.text
        for stop in seq.request.params.stop:
            idx = text.find(stop, max(0, len(text) - delta_len - len(stop) + 1))
            if idx != -1:
                seq.text = text[:idx]
                return True
        return False

    def _finish_seq(self, seq: Sequence, reason: FinishReason) -> None:
        seq.finish_reason = reason
        self.block_manager.free(seq)

    def _finish_request(self, request: Request, reason: FinishReason) -> None:
        self.scheduler.remove(request)
        del self._requests[request.rid]
        max_seq_tokens = max(s.num_output_tokens for s in request.seqs) if request.params.n > 1 else 0
        self.recorder.finished(request.rid, reason, max_seq_tokens)

    def _finish_aborted(self, outputs: list[RequestOutput]) -> None:
        for rid in self._aborts:
            request = self._requests.get(rid)
            if request is None:
                continue
            for seq in request.unfinished_seqs:
                self._finish_seq(seq, FinishReason.ABORT)
                outputs.append(RequestOutput(
                    rid, seq.index, [], "", True, FinishReason.ABORT,
                    request.num_prompt_tokens, request.num_cached_tokens,
                ))
            self._finish_request(request, FinishReason.ABORT)
        self._aborts.clear()

    def _fail_unschedulable(self, outputs: list[RequestOutput]) -> None:
        """Nothing runs and the queue head cannot get blocks: it never will; finish it with ERROR."""
        request = self.scheduler.waiting[0]
        logger.error("request %d needs more KV blocks than the cache has; finishing it with ERROR", request.rid)
        for seq in request.unfinished_seqs:
            self._finish_seq(seq, FinishReason.ERROR)
            outputs.append(RequestOutput(
                request.rid, seq.index, [], "", True, FinishReason.ERROR,
                request.num_prompt_tokens, request.num_cached_tokens,
            ))
        self._finish_request(request, FinishReason.ERROR)

    def _batch(self, sched: SchedulerOutput) -> tuple[int, int, int, int, int]:
        """(prefill tokens, distinct requests, FLOPs, bytes read, bytes written) of the step about to run.
        A sequence computing prompt positions, or several tokens at once, is prefilling (vLLM's rule);
        the estimates are vLLM's, from the model's shape and each sequence's context after the step."""
        seqs = sched.seqs
        if not sched.num_prompt_tokens and len(seqs) == sum(sched.num_new_tokens):  # decode only: C-level sums
            contexts = sum(map(_COMPUTED, seqs)) + len(seqs)  # each sequence's context after its one token
            cost = self.perf.estimate(len(seqs), contexts, contexts) if self.perf is not None else (0, 0, 0)
            return (0, len(set(map(_REQUEST, seqs))), *cost)
        # vLLM's ExecutionContext sums: tokens x context, contexts, and the prefilling sequences' share
        prefill = requests = prefilling = prefill_context = context_sum = token_context = 0
        last = None
        for seq, n in zip(seqs, sched.num_new_tokens):
            context = seq.num_computed_tokens + n
            context_sum += context
            token_context += n * context
            if n > 1 or context <= seq.num_prompt_tokens:
                prefill += n
                prefilling += 1
                prefill_context += context
            if seq.request is not last:  # a request's sequences are contiguous in the schedule
                requests += 1
                last = seq.request
        cost = (0, 0, 0) if self.perf is None else self.perf.estimate(
            sum(sched.num_new_tokens), context_sum, token_context, prefilling, prefill, prefill_context)
        return (prefill, requests, *cost)

    def _lane(self, sched: SchedulerOutput, start_ns: int, batch: tuple[int, int, int, int, int]) -> StepLane:
        """The step itself, after it ran (`batch`: what `_batch` said before)."""
        prefill, requests, flops, read, write = batch
        timer = self.runner.timer
        forward_ns = timer.read_ns() if timer is not None and sched.seqs else 0
        s = self.scheduler
        return StepLane(start_ns, forward_ns, prefill, sum(sched.num_new_tokens) - prefill, requests, len(s.running),
                        len(s.waiting), len(sched.preempted), self.block_manager.usage, flops, read, write,
                        sched.blocked, timer.source if forward_ns else ForwardSource.NONE)

    def _maybe_snapshot(self) -> None:
        s = self.scheduler
        now = time.monotonic()
        busy = (bool(s.running), bool(s.waiting))
        if (self._last_snapshot_s is not None and busy == self._last_busy
                and now - self._last_snapshot_s < self.config.snapshot_interval_s):
            return
        bm = self.block_manager
        counters = (bm.prefix_queries, bm.prefix_hits, s.num_preemptions)
        q, h, p = (a - b for a, b in zip(counters, self._reported))
        self.recorder.snapshot(SchedulerSnapshot(len(s.running), len(s.waiting), bm.usage, q, h, p))
        self._reported = counters
        self._last_snapshot_s = now
        self._last_busy = busy


def _default_num_threads() -> int:
    """At most 2, leaving a core to the API process: the dummy-size matmuls gain little
    from threads, and OpenMP threads fighting for a busy core slow a step down 5-10x."""
    return max(1, min(2, (os.cpu_count() or 1) - 1))


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: CUDA is not available")
    return torch.device(device)


def _resolve_dtype(dtype: str, device: torch.device) -> str:
    """`dtype` with "auto" resolved: bfloat16 on CUDA, float32 on CPU.

    On CPU, correct answers outweigh native bf16's faster decode: bf16 rounding moves
    SmolLM2's logits by ~0.1, more than the 0.08 by which "The" leads "L" in its greedy
    answer to "What is the capital of France?" (benchmarks/dtype_bench.py).
    """
    if dtype == "auto":
        return "bfloat16" if device.type == "cuda" else "float32"
    return dtype


def _auto_num_blocks(config: EngineConfig, model_config, max_model_len: int, device: torch.device, dtype) -> int:
    per_block = LlamaModel.kv_bytes_per_block(model_config, config.block_size, dtype)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = int(free * _CUDA_KV_FRACTION)
    else:
        budget = _CPU_KV_BUDGET_BYTES
    blocks_per_seq = -(-max_model_len // config.block_size)
    return max(1, min(budget // per_block, config.max_num_seqs * blocks_per_seq))
