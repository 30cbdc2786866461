"""One prefill per prompt, shared by every method that decodes it.

The prompt runs through the full model once. Each method's drafter may observe that forward (its
`prefill_observers()`, e.g. SparseSpec-L's SnapKV-style observation window): the layer's SDPA output is
computed once (`attention.ObservedPrefillHook`) and each observer gets the layer's (layer_idx, query,
key, visible mask, scaling). What the forward leaves, `SharedPrefill` (run by `SharedPrefill.run`):

- the prompt's KV cache, which no method writes: each method decodes in its own copy of it (the
  loop's `BatchCache.load`), unless it is the only consumer (`exclusive`);
- the next-token logits after the prompt, from which each method picks its first token with its
  own sampler (so sampled runs stay seeded per method);
- the wall time of the forward, reported as every method's prefill time.

`sparsespec.api.prefill` builds the methods, runs this and hands each method its `Prefilled`
(its start); `generate(..., prefilled=...)` decodes from that.

A `PrefillMemo` keeps prefills past one call, so that runs in one process that decode the same
prompts (the jobs of a batch-size sweep) prefill each prompt once. What it keeps is the forward's
results and what the observers read of it: per layer, the last queries (every observer reads an
observation window of them, declared by its drafter's `prefill_query_rows()`) and their mask rows;
the keys are the cache's. A later prefill of the prompt replays the observers on those, without a
forward, and reports the kept forward's time. With a folder (`disk_dir`), it keeps the same on disk
for later processes (sparsespec/engine/prefill_disk.py).

Names, one per concept: `prefill` (the act, sparsespec/api.py), `SharedPrefill` (one prompt's
forward), `Prefilled` (one method's start from it), `PrefillMemo` and its `KeptPrefill` entries.
"""
from __future__ import annotations

import hashlib
import logging
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from sparsespec.engine.attention import ObservedPrefillHook
from sparsespec.engine.cache import PreallocatedCache, num_decoder_layers
from sparsespec.engine.prefill_disk import PrefillDisk
from sparsespec.engine.timing import Stopwatch

log = logging.getLogger(__name__)


@dataclass
class SharedPrefill:
    prompt: torch.Tensor              # (n,) the prompt's token ids
    cache: PreallocatedCache          # the prompt's K/V, n positions; never written after the forward
    logits: torch.Tensor              # (V,) the target's next-token logits after the prompt
    seconds: float                    # wall time of the one forward (synchronised on GPU)
    exclusive: bool = False           # one consumer: it decodes in `cache` itself, no copy
    reused: bool = False              # served by a `PrefillMemo`: `seconds` is the kept forward's time

    @classmethod
    def run(cls, model, prompt: torch.Tensor, observers: list, room: int = 0) -> "SharedPrefill":
        """The prompt through the full model, once, with every observer. `room`: positions past the
        prompt for its one consumer to decode in the same cache (0: shared, each consumer copies)."""
        cache = PreallocatedCache(num_decoder_layers(model), prompt.numel() + room)
        watch = Stopwatch(prompt.device)
        with watch:
            out = model(input_ids=prompt.view(1, -1), past_key_values=cache, use_cache=True,
                        attn_hook=ObservedPrefillHook(observers) if observers else None, logits_to_keep=1)
            logits = out.logits[0, -1]
        return cls(prompt=prompt, cache=cache, logits=logits, seconds=watch.seconds, exclusive=room > 0)


@dataclass
class Prefilled:
    """One method's start from a shared prefill: the forward's results, and the method's drafter and
    controller (built before the forward, so the drafter's policy could observe it)."""
    shared: SharedPrefill
    method: str
    options: dict                     # resolved: controller and drafter options
    drafter: object
    controller: object
    max_new_tokens: int
    used: bool = field(default=False)


# --- prefills kept across runs ----------------------------------------------------------------

class QueryTailRecorder:
    """A prefill observer that keeps, per layer, what observers read: the last `rows` queries
    (B, H, rows, D), their visible rows (B|1, 1, rows, N) or None (plain causal), and the scaling."""

    def __init__(self, rows: int):
        self.rows = rows
        self.layers: dict[int, tuple] = {}

    def __call__(self, layer, query, key, visible, scaling) -> None:
        tail = query[:, :, -self.rows:].clone()
        self.layers[layer] = (tail, None if visible is None else visible[:, :, -self.rows:].clone(), scaling)


@dataclass
class KeptPrefill:
    shared: SharedPrefill
    query_tail: QueryTailRecorder

    @property
    def nbytes(self) -> int:
        tensors = [self.shared.logits] + [t for layer in self.shared.cache.layers if layer.is_initialized
                                          for t in (layer.keys, layer.values)]
        tensors += [t for q, v, _ in self.query_tail.layers.values() for t in (q, v) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def replay(self, observers: list) -> None:
        """Each observer sees every layer as in the forward, its query and mask cut to the kept rows."""
        n = self.shared.prompt.numel()
        for layer, (query, visible, scaling) in sorted(self.query_tail.layers.items()):
            key = self.shared.cache.layers[layer].keys[:, :, :n]
            for observe in observers:
                observe(layer, query, key, visible, scaling)

    def fields(self) -> dict:
        """What a file keeps of it (sparsespec/engine/prefill_disk.py): tensors and numbers. The cache of a
        kept prefill holds exactly the prompt's n positions, so its buffers are saved whole."""
        s = self.shared
        return {"prompt": s.prompt, "logits": s.logits, "seconds": s.seconds, "rows": self.query_tail.rows,
                "kv": [(layer.keys, layer.values) for layer in s.cache.layers],
                "query_tail": dict(self.query_tail.layers)}

    @classmethod
    def from_fields(cls, fields: dict, model, prompt: torch.Tensor) -> "KeptPrefill":
        """The kept prefill of `prompt` that `fields()` saved; ValueError if they are of another prompt
        or model shape."""
        n, kv = prompt.numel(), fields["kv"]
        if not torch.equal(fields["prompt"], prompt):
            raise ValueError("the file holds another prompt")
        if len(kv) != num_decoder_layers(model) or any(k.shape[2] != n or v.shape[2] != n for k, v in kv):
            raise ValueError(f"the file's cache is not {num_decoder_layers(model)} layers of {n} positions")
        cache = PreallocatedCache(len(kv), n)
        for layer, (keys, values) in zip(cache.layers, kv):
            layer.update(keys, values)
        recorder = QueryTailRecorder(fields["rows"])
        recorder.layers = dict(fields["query_tail"])
        shared = SharedPrefill(prompt=prompt, cache=cache, logits=fields["logits"], seconds=fields["seconds"])
        return cls(shared, recorder)


class PrefillMemo:
    """Prefills kept for later runs in this process, the least recently used dropped first beyond
    `max_bytes` (0: keeps nothing). A prompt is found again by its ids and the model's identity (its
    config, name, dtype, device and a strided sample of every weight), so another model never matches;
    a prefill of another model drops the kept prefills of the previous one. The query-tail recorder
    adds a copy of `min_rows` query rows per layer to the timed forward, nothing else.

    With `disk_dir`, prefills are also kept on disk under the same key, up to `disk_bytes`
    (sparsespec/engine/prefill_disk.py), so that later processes find them: a prompt missing here is looked
    for there before a forward runs (`disk_hits` counts those found, and `hits` counts them too)."""

    def __init__(self, max_bytes: int = 0, min_rows: int = 64, disk_dir=None, disk_bytes: int = 0):
        self.min_rows = min_rows      # query rows kept at least, so later observers with a wider window still fit
        self.kept: OrderedDict[tuple[str, str], KeptPrefill] = OrderedDict()
        self.hits = self.misses = self.disk_hits = 0
        self._paused = False
        self._fingerprints: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.resize(max_bytes, disk_dir, disk_bytes)

    def resize(self, max_bytes: int, disk_dir=None, disk_bytes: int = 0) -> None:
        """Keep up to `max_bytes` in memory, and up to `disk_bytes` in `disk_dir` (None: none on disk)."""
        self.max_bytes = max_bytes
        self.disk = None if disk_dir is None else PrefillDisk(disk_dir, disk_bytes)
        self._evict(0)

    @contextmanager
    def paused(self):
        """Prefills in the block neither use nor fill the memo (a warm-up on a prompt's prefix)."""
        self._paused, before = True, self._paused
        try:
            yield
        finally:
            self._paused = before

    @property
    def nbytes(self) -> int:
        return sum(kept.nbytes for kept in self.kept.values())

    def model_key(self, model) -> str:
        """The model's identity, computed once per model object."""
        if model not in self._fingerprints:
            digest = hashlib.sha1(model.config.to_json_string(use_diff=False).encode())
            digest.update(str(getattr(model.config, "_name_or_path", "")).encode())
            for name, weight in model.named_parameters():
                flat = weight.detach().reshape(-1)
                sample = flat[::max(1, flat.numel() // 256)][:256]
                digest.update(f"{name}|{weight.dtype}|{weight.device}|{tuple(weight.shape)}".encode())
                digest.update(sample.float().cpu().numpy().tobytes())
            self._fingerprints[model] = digest.hexdigest()
        return self._fingerprints[model]

    def key_of(self, model, prompt: torch.Tensor) -> tuple[str, str]:
        return self.model_key(model), hashlib.sha1(prompt.detach().cpu().numpy().tobytes()).hexdigest()

    def serve(self, model, prompt: torch.Tensor, observers: list, query_rows: int | None,
              room: int = 0) -> SharedPrefill:
        """The prompt's prefill, kept or run (and kept). `query_rows`: how many of the last queries
        the observers read (None: all of them, so the prefill is run and not kept). `room` > 0: a
        prefill its one consumer decodes in (`SharedPrefill.run`), so it is run and not kept."""
        if (self.max_bytes <= 0 and self.disk is None) or self._paused or query_rows is None or room > 0:
            return SharedPrefill.run(model, prompt, observers, room)
        key = self.key_of(model, prompt)
        kept = self.kept.get(key)
        if kept is not None and kept.query_tail.rows >= query_rows:
            self.kept.move_to_end(key)
        else:
            kept = self._from_disk(key, model, prompt, query_rows)
        if kept is not None:
            self.hits += 1
            kept.replay(observers)
            s = kept.shared
            return SharedPrefill(prompt=prompt, cache=s.cache, logits=s.logits, seconds=s.seconds, reused=True)
        self.misses += 1
        self._drop_stale(key)                          # before the forward, so their memory is free for it
        recorder = QueryTailRecorder(max(query_rows, self.min_rows))
        shared = SharedPrefill.run(model, prompt, [*observers, recorder])
        kept = KeptPrefill(shared, recorder)
        self._keep(key, kept)
        if self.disk is not None:
            self.disk.save(key, kept.fields(), kept.nbytes)
        return shared

    def _from_disk(self, key: tuple[str, str], model, prompt: torch.Tensor, query_rows: int) -> KeptPrefill | None:
        """The prompt's prefill from the disk, kept here too; None if none there has `query_rows` rows."""
        fields = None if self.disk is None else self.disk.load(key, prompt.device)
        if fields is None or fields["rows"] < query_rows:
            return None
        try:
            kept = KeptPrefill.from_fields(fields, model, prompt)
        except ValueError as error:
            log.warning("prefill cache: ignoring %s: %s; prefilling again", self.disk.path_of(key), error)
            return None
        self.disk_hits += 1
        self._keep(key, kept)
        return kept

    def _drop_stale(self, key: tuple[str, str]) -> None:
        """Drop another model's prefills, and this key's (too few rows)."""
        for other in [k for k in self.kept if k[0] != key[0] or k == key]:
            del self.kept[other]

    def _keep(self, key: tuple[str, str], kept: KeptPrefill) -> None:
        """Keep `kept` in memory if it fits."""
        self._drop_stale(key)
        size = kept.nbytes
        if size <= self.max_bytes:
            self._evict(size)
            self.kept[key] = kept

    def _evict(self, room: int) -> None:
        """Drop the least recently used until `room` more bytes fit."""
        while self.kept and self.nbytes + room > self.max_bytes:
            self.kept.popitem(last=False)
