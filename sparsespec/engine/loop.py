"""The decode loop: B prompts of different lengths decoded together, lossless per sequence. One
prompt is an ordinary batch of B = 1.

    start from each prompt's prefill (its own, its drafter observing it, or a shared one:
        `generate(prompts, prefilled=[...])`; sparsespec/api.py prepares them)
    copy the B prompt caches into one `BatchCache` (sequence b's position p at slot p; a batch of
        one decodes in its own prefill's cache, no copy)
    repeat while a sequence is unfinished:
        k      = the batch controller's draft length (one k for every sequence of the batch)
        drafts = (B, k): the sparse-KV draft over per-sequence, per-layer, per-KV-head positions
        verify [last_b, d_b1..d_bk] for every b in one forward, explicit attention, (B, 1, k+1, N) mask
        accept a_b per sequence (greedy or exact rejection sampling); L_b += a_b + 1 (the rollback)
        a finished sequence (EOS, max_new_tokens) leaves the batch: its rows are dropped, so it
        costs nothing after the round it finished in

As code: `decode_together` = `set_up` (cache, sequences, first tokens) -> `loop` -> `collect`; one
round, `batch_round` = `propose` -> `verify` -> `accept` -> `commit` -> `learn`.

Threads: each round runs at the intra-op thread count its `thread_rule` sets for rounds of its draft
limit, and the rule learns from the round's seconds (sparsespec/engine/thread_rule.py: online between
1 and the caller's count, or fixed); `decode` restores the caller's count at the end.

The batch's caches and hooks: sparsespec/engine/batch_cache.py.

The batch's k (one per round, `Controller.keep_drafting_batch`): a fixed-k controller drafts its k;
the entropy controller maximises the expected tokens *over the batch* per unit of batch cost,
    R(k) = sum_b (1 + sum_{m<=k} pi^b_m) / (k C_d + C_v(k)),
with pi^b the survival of sequence b from its own draft entropies; C_d and C_v are the batched
step's measured costs. Each sequence's `Round` records its own accepted count and entropies; the
times in it are the batch's (shared by every sequence of that round).

Drafts: the loop asks the first sequence's drafter for the batch's proposer (`Drafter.batch_proposer`,
sparsespec/methods/base.py) and talks to the drafters only through that contract: the gathered
sparse-KV policies gather each sequence's own positions into one padded draft cache, LayerSkip drafts
with the first layers over the batch cache, prompt lookup looks up per sequence, AR proposes nothing.
A drafter that is not `batchable` (oracle, Quest, assisted, a static draft) drafts one sequence at a
time: its batch of B prompts is decoded as B batches of one, in order, through this same loop
(`decode_each`). Rows decoded one after another (these, and the harness's transformers rows) are timed
by one rule, `one_after_another`: each row's `decode_s` is its own decoding, so its tokens/s compares
with the same prompt decoded alone, and the batch's `decode_s` is the sum of the rows' (its throughput:
summed tokens over summed time).

Sampling: one `Sampler` for the batch; each row is drawn on its own and each sequence runs exact
rejection sampling on its own drafts (`accept_sampling`), so each output keeps the model's
distribution (tests/test_batch.py enumerates the joint distribution of a batch of two).
"""
from __future__ import annotations

import time

import torch

from sparsespec.engine.attention import DEFAULT_AR_ATTENTION, sparsespec_attention
from sparsespec.engine.batch_cache import BatchCache, BatchVerifyHook
from sparsespec.engine.cache import num_decoder_layers
from sparsespec.engine.eos import through_eos
from sparsespec.errors import ConfigError
from sparsespec.engine.generation import Generation, Round
from sparsespec.engine.logits import target_logits
from sparsespec.engine.proposers import BatchDraft, DecodeState
from sparsespec.engine.sampling import Sampler, accept_sampling
from sparsespec.engine.selection import sliding_window_of
from sparsespec.engine.thread_rule import FixedThreads
from sparsespec.engine.timing import RoundTimers, Stopwatch, synchronize
from sparsespec.threads import using


# --- input: a batch of prompts ----------------------------------------------------------------

def is_batch(input_ids, attention_mask) -> bool:
    """A list/tuple of prompts (tensors or lists: a flat list of ints is one prompt), a 2-D batch of
    more than one row, or any input with a mask."""
    if attention_mask is not None:
        return True
    if isinstance(input_ids, (list, tuple)):
        return bool(input_ids) and all(isinstance(p, (list, tuple)) or (isinstance(p, torch.Tensor) and p.dim() > 0)
                                       for p in input_ids)
    return isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] > 1


def prompts_of(input_ids, attention_mask, as_prompt) -> list[torch.Tensor]:
    """A list of 1-D prompts, or padded (B, L) ids with a (B, L) mask (1 = token, 0 = pad, either
    side) -> B prompts, each checked by `as_prompt` (one (L_b,) long tensor)."""
    if isinstance(input_ids, (list, tuple)):
        if attention_mask is not None:
            raise ConfigError("attention_mask goes with padded (B, L) input_ids, not with a list of prompts")
        return [as_prompt(non_empty(ids, f"prompt {row} of the batch is empty")) for row, ids in enumerate(input_ids)]
    ids = torch.as_tensor(input_ids)
    if ids.dim() != 2:
        raise ConfigError(f"batched input_ids must be (B, L) with an attention_mask; got shape {tuple(ids.shape)}")
    if attention_mask is None:
        return [as_prompt(row) for row in ids]
    mask = torch.as_tensor(attention_mask)
    if mask.shape != ids.shape:
        raise ConfigError(f"attention_mask shape {tuple(mask.shape)} differs from input_ids shape {tuple(ids.shape)}")
    return [as_prompt(non_empty(row[m.to(ids.device).bool()], f"attention_mask row {b} is all zeros: the mask "
                                f"leaves prompt {b} of the batch empty"))
            for b, (row, m) in enumerate(zip(ids, mask))]


def non_empty(prompt, problem: str):
    """`prompt` when it holds a token, else a ConfigError saying `problem`."""
    if torch.as_tensor(prompt).numel() == 0:
        raise ConfigError(problem + "; each prompt needs at least one token")
    return prompt


# --- the loop ----------------------------------------------------------------------------------

class Sequence:
    """One sequence of the batch: its drafter (policy state), ids, output and trace."""

    def __init__(self, index: int, prompt, drafter, sampler, capacity: int, max_new_tokens: int, model,
                 cache: BatchCache):
        self.index, self.drafter = index, drafter
        n = prompt.numel()
        self.state = DecodeState(model=model, cache=cache, ids=torch.zeros(capacity, dtype=torch.long,
                                 device=prompt.device), length=n, prompt_len=n, sampler=sampler,
                                 max_new_tokens=max_new_tokens)
        self.state.ids[:n] = prompt
        self.row = index            # this sequence's row in the batch cache (rows shift as others finish)
        self.tokens: list[int] = []
        self.rounds: list[Round] = []
        self.prefill_s = 0.0
        self.finished_at = 0.0      # seconds from the start of batched decoding to this sequence's end

    def wanted(self) -> int:
        return self.state.max_new_tokens - len(self.tokens)

    def done(self, stop_ids) -> bool:
        return self.wanted() <= 0 or bool(stop_ids and self.tokens and self.tokens[-1] in stop_ids)


class BatchGenerations(list):
    """One `Generation` per prompt, in order, plus the batch's own totals: `decode_s` (wall time
    of the batched loop; decoded one sequence at a time, the sum of the sequences': `one_after_another`),
    `prefill_s` (the B prefills, run one by one), `batch_size`."""
    decode_s: float = 0.0
    prefill_s: float = 0.0
    batch_size: int = 0

    @property
    def new_tokens(self) -> int:
        return sum(len(g.tokens) for g in self)

    @property
    def tokens_per_s(self) -> float:
        """Throughput over the batch: decode tokens of every sequence over the batch's decode time."""
        decode_tokens = sum(g.decode_tokens for g in self)
        return decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


def one_at_a_time(drafter, size: int) -> bool:
    """Whether a batch of `size` prompts of `drafter`'s method decodes one sequence at a time."""
    return size > 1 and not drafter.batchable


def decode(model, starts: list, sampler: Sampler, stop_ids: set, cost_prior=None,
           ar_attention: str = DEFAULT_AR_ATTENTION, thread_rule=None) -> BatchGenerations:
    """Decode from `starts` (one `Prefilled` per prompt, of one method, checked by the caller):
    together when the method's drafter is `batchable`, else one sequence at a time. `ar_attention`:
    how an AR step (k = 0) attends (sparsespec/engine/attention.py, `AR_ATTENTION`). `thread_rule`:
    the count each round runs at (sparsespec/engine/thread_rule.py; None: the process's count, as it
    is); the process's count is restored at the end."""
    rule = FixedThreads(None) if thread_rule is None else thread_rule
    with using(torch.get_num_threads()):
        if one_at_a_time(starts[0].drafter, len(starts)):
            return decode_each(model, starts, sampler, stop_ids, cost_prior, ar_attention, rule)
        return decode_together(model, starts, sampler, stop_ids, cost_prior, ar_attention, rule)


def decode_each(model, starts: list, sampler: Sampler, stop_ids: set, cost_prior=None,
                ar_attention: str = DEFAULT_AR_ATTENTION, thread_rule=None) -> BatchGenerations:
    """`starts` decoded as batches of one, in order, each with its own controller, drawing from the
    one `sampler` and running at the one `thread_rule`'s counts; timed as rows `one_after_another`."""
    rows = []
    for start in starts:
        (gen,) = decode_together(model, [start], sampler, stop_ids, cost_prior, ar_attention, thread_rule)
        rows.append(gen)
    return one_after_another(rows)


def one_after_another(gens: list) -> BatchGenerations:
    """Generations decoded one after another, as a batch. Each keeps its own times (a row's tokens/s
    is that of its prompt decoded alone); the batch's are the sums of theirs, so its throughput is
    their decode tokens over their summed decode time."""
    batch = BatchGenerations(gens)
    batch.decode_s = sum(g.decode_s for g in gens)
    batch.prefill_s = sum(g.prefill_s for g in gens)
    batch.batch_size = len(gens)
    return batch


def decode_together(model, starts: list, sampler: Sampler, stop_ids: set, cost_prior=None,
                    ar_attention: str = DEFAULT_AR_ATTENTION, thread_rule=None) -> BatchGenerations:
    """Decode from `starts` together; see the module docstring. The first start's controller is the
    batch's."""
    thread_rule = FixedThreads(None) if thread_rule is None else thread_rule
    for p in starts:
        p.used = True
    controller = starts[0].controller                      # the batch's one controller
    if cost_prior is not None:
        controller.use_cost_prior(cost_prior)
    cache, seqs, windows = set_up(model, starts, sampler, controller)
    proposer = seqs[0].drafter.batch_proposer(windows)
    clock = loop(model, cache, seqs, proposer, controller, sampler, windows, stop_ids, ar_attention, thread_rule)
    return collect(seqs, starts, clock, ar_attention, thread_rule)


def set_up(model, starts: list, sampler: Sampler, controller) -> tuple[BatchCache, list, list]:
    """The batch's cache, loaded from the prefills, and one `Sequence` per start, each holding its
    first token (picked from the prefill's logits) and its drafter's prefill set-up; each layer's window."""
    prompts = [p.shared.prompt for p in starts]
    device, max_new_tokens = prompts[0].device, starts[0].max_new_tokens
    capacity = max(p.numel() for p in prompts) + max_new_tokens + controller.max_k + 2
    windows = [sliding_window_of(model, i) for i in range(num_decoder_layers(model))]
    cache = BatchCache(num_decoder_layers(model), capacity, [p.numel() for p in prompts], device)
    cache.load([p.shared for p in starts])
    seqs = []
    for b, start in enumerate(starts):
        seq = Sequence(b, start.shared.prompt, start.drafter, sampler, capacity, max_new_tokens, model, cache)
        watch = Stopwatch(device)       # this method's share of the prefill: its first token, its set-up
        with watch:
            token, _ = sampler.pick(start.shared.logits)
            seq.state.ids[seq.state.length] = token
            start.drafter.after_prefill(seq.state)
        seq.tokens.append(int(token))
        seq.prefill_s = start.shared.seconds + watch.seconds
        seqs.append(seq)
    return cache, seqs, windows


def loop(model, cache: BatchCache, seqs: list, proposer, controller, sampler: Sampler, windows, stop_ids: set,
         ar_attention: str, thread_rule) -> Stopwatch:
    """Rounds until every sequence is done; a finished sequence leaves the batch (its rows are dropped)
    and records when it finished. Returns the clock of the whole loop."""
    device = cache.lengths.device
    active = [s for s in seqs if not s.done(stop_ids)]
    if active and len(active) < len(seqs):      # none left: every sequence ended at its first token
        cache.keep([s.index for s in active])
    clock = Stopwatch(device)
    with sparsespec_attention(model), clock:
        start_s = time.perf_counter()
        while active:
            batch_round(model, cache, active, proposer, controller, sampler, windows, ar_attention, thread_rule)
            finished = [s for s in active if cut_and_check(s, stop_ids)]
            if finished:
                synchronize(device)
                for s in finished:
                    s.finished_at = time.perf_counter() - start_s
                active = [s for s in active if s not in finished]
                if active:      # finished sequences leave: their rows cost nothing from now on
                    cache.keep([s.row for s in active])
    return clock


def collect(seqs: list, starts: list, clock: Stopwatch, ar_attention: str, thread_rule) -> BatchGenerations:
    """One `Generation` per sequence, in order, and the batch's totals."""
    out = BatchGenerations()
    out.decode_s, out.batch_size = clock.seconds, len(seqs)
    out.prefill_s = sum(s.prefill_s for s in seqs)
    for s, start in zip(seqs, starts):
        out.append(Generation(tokens=s.tokens, prefill_s=s.prefill_s, decode_s=s.finished_at, rounds=s.rounds,
                              prompt_tokens=s.state.prompt_len, method=start.method,
                              options={**start.options, **s.drafter.resolved_options, "ar_attention": ar_attention,
                                       **thread_rule.report()}))
    return out


def batch_round(model, cache: BatchCache, active: list, proposer, controller, sampler: Sampler, windows,
                ar_attention: str = DEFAULT_AR_ATTENTION, thread_rule=None) -> None:
    """One draft-verify-accept round for every active sequence (rows of `cache` in `active` order);
    `proposer` drafts for them (None: the method proposes nothing). A round of k = 0 is an AR step,
    the same code at the same cost as the `ar` method's: no observer records it, so it attends by
    `ar_attention` (the policies keep the scores of the last verification that had drafts). The round
    runs at the count `thread_rule` sets for rounds of its draft limit (0 for a method that proposes
    nothing: an AR step whatever the controller's limit), and tells it what it cost."""
    thread_rule = FixedThreads(None) if thread_rule is None else thread_rule
    for row, s in enumerate(active):
        s.row = row
    timers = RoundTimers(cache.lengths.device)
    limit = controller.start_round(limit=max(s.wanted() for s in active) - 1)   # 0: one plain AR step
    key = limit if proposer is not None else 0                                   # the round's draft limit
    count = thread_rule.before_round(key)
    last = torch.stack([s.state.last.view(()) for s in active])                  # (B,)
    draft = propose(proposer, cache, active, last, controller, sampler, timers, limit)
    k = controller.submit_count(len(draft.tokens)) if draft.tokens else 0
    drafts = torch.stack(draft.tokens[:k], dim=1) if k else last.new_zeros(len(active), 0)   # (B, k)
    with timers.verify:
        logits = verify(model, cache, active, last, drafts, windows, ar_attention)          # (B, k+1, V)
        accepted, following = accept(drafts, draft.probs[:k], logits, sampler)            # (B,) each
        commit(cache, active, drafts, accepted, following)
    thread_rule.observe(key, timers.seconds)
    learn(controller, active, draft, k, accepted, timers, count)


def propose(proposer, cache: BatchCache, active: list, last: torch.Tensor, controller, sampler: Sampler,
            timers: RoundTimers, limit: int) -> BatchDraft:
    """Up to `limit` draft tokens a sequence: (B,) per step, their distributions (B, V) when
    sampling, one entropy a sequence a step. Nothing when the method proposes nothing or limit is 0."""
    if proposer is None or limit == 0:
        return BatchDraft()
    return proposer.draft(cache, active, last, controller, sampler, timers)


def verify(model, cache: BatchCache, active: list, last: torch.Tensor, drafts: torch.Tensor, windows,
           ar_attention: str) -> torch.Tensor:
    """One forward of [last_b, d_b1..d_bk] for every sequence over the full cache -> (B, k+1, V)
    logits; each sequence's policy observes the attention when there are drafts (k > 0)."""
    k = drafts.shape[1]
    observers = [s.drafter.verify_observer() if k else None for s in active]
    hook = BatchVerifyHook(cache, windows, observers, ar_attention)
    inputs = torch.cat([last.view(-1, 1), drafts], dim=1)                              # (B, k+1)
    return target_logits(model, input_ids=inputs, position_ids=cache.slots(k + 1), past_key_values=cache,
                         use_cache=True, attn_hook=hook)


def accept(drafts: torch.Tensor, probs: list, logits: torch.Tensor, sampler: Sampler) -> tuple[list, list]:
    """(accepted a_b, the target's token after them) per sequence. Greedy: the longest prefix of
    drafts equal to the target's argmax, for the whole batch at once. Sampling: exact rejection
    sampling, each sequence on its own draws; `probs` per step (B, V), empty for one-hot drafts."""
    if sampler.greedy:
        target = logits.argmax(dim=-1)                                                 # (B, k+1)
        agree = (drafts == target[:, :drafts.shape[1]]).long()                         # (B, k)
        accepted = agree.cumprod(dim=1).sum(dim=1)                                     # (B,): the agreeing prefix
        following = target.gather(1, accepted.view(-1, 1)).view(-1)                    # (B,)
        accepted, following = torch.stack([accepted, following]).tolist()              # one sync for both
        return accepted, following
    picks = [accept_sampling(drafts[row], torch.stack([p[row] for p in probs]) if probs else None, logits[row],
                             sampler) for row in range(drafts.shape[0])]                # probs empty: one-hot drafts
    return [a for a, _ in picks], [t for _, t in picks]


def commit(cache: BatchCache, active: list, drafts: torch.Tensor, accepted: list, following: list) -> None:
    """Each sequence keeps its a_b accepted drafts and the target's next token; the cache rolls back
    to L_b + a_b + 1 (the rollback is setting the lengths)."""
    for row, (s, a, nxt) in enumerate(zip(active, accepted, following)):
        st = s.state
        st.ids[st.length + 1:st.length + 1 + a] = drafts[row, :a]
        st.length += a + 1
        st.ids[st.length] = nxt
    cache.set_lengths([s.state.length for s in active])


def learn(controller, active: list, draft: BatchDraft, k: int, accepted: list, timers: RoundTimers,
          threads: int = 0) -> None:
    """After the round: the drafters and the controller learn what was accepted, and each sequence
    records its `Round` and its new tokens. Times are the batch's, shared by every sequence."""
    per_seq = [list(col)[:k] for col in zip(*draft.entropies)] if draft.entropies else [[] for _ in active]
    verify_s, draft_s, select_s = timers.verify.seconds, timers.draft.seconds, timers.select.seconds
    for s, a in zip(active, accepted):
        s.drafter.after_verify(s.state, a, k)
    trace = controller.trace()                                                        # every round, k = 0 too
    controller.observe_batch(per_seq, accepted, k, draft_s / draft.steps if draft.steps else None, verify_s,
                             round_s=timers.seconds)
    for s, a, ents in zip(active, accepted, per_seq):
        st = s.state
        s.rounds.append(Round(drafted=k, accepted=a, emitted=a + 1, entropies=ents, draft_s=draft_s,
                              verify_s=verify_s, select_s=select_s, draft_steps=draft.steps, threads=threads,
                              **trace))
        s.tokens.extend(st.ids[st.length - a:st.length + 1].tolist())


def cut_and_check(s: Sequence, stop_ids) -> bool:
    """Cut the last round's tokens at EOS / max_new_tokens (its `emitted` follows); finished?"""
    last = s.rounds[-1]
    before = len(s.tokens) - last.emitted
    emitted = s.tokens[before:]
    if stop_ids:
        emitted = through_eos(emitted, stop_ids)
    emitted = emitted[:s.state.max_new_tokens - before]
    s.tokens[before:] = emitted
    last.emitted = len(emitted)
    return s.done(stop_ids)
