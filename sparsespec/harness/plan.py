"""Planning a run: each method's folder and what it has finished (resume), what decodes each batch
of prompts and in which order, and which cost profiles are still to measure.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sparsespec.hf_reference import is_reference

from sparsespec.harness import calibration
from sparsespec.harness.calibration import RunCalibration
from sparsespec.harness.order import prompt_order
from sparsespec.harness.results import SamplesFile, check_resume, sample_key
from sparsespec.harness.run_config import AR, MethodSpec, RunConfig

REFERENCE = "ar (reference)"   # the AR decode a prompt needs as the reference but no folder records


@dataclass
class MethodRun:
    """One method's share of a run: its spec (folder included) and the results it holds."""
    spec: MethodSpec
    samples: SamplesFile = field(init=False)
    finished: dict = field(default_factory=dict)   # (prompt_id, label) -> sample
    resumed: bool = False
    tracker: object = None
    git: dict = field(default_factory=dict)    # environment.git_state() read once as the sitting starts
    machine: dict = field(default_factory=dict)  # environment.sitting_machine(): the CPU/GPU this sitting decodes on
    decoded: int = 0                           # samples this sitting added (0: a resume with nothing left to decode)

    def __post_init__(self):
        self.samples = SamplesFile(self.spec.folder)

    @property
    def entry(self) -> str:
        return self.spec.entry

    @property
    def method(self) -> str:
        return self.spec.name

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def stamp(self) -> dict:
        """This sitting's code, code_dirty and machine, stamped on each new sample: a folder resumed
        over several sittings may hold samples of several codes and machines."""
        return {"code": self.git.get("code"), "code_dirty": self.git.get("code_dirty"), **self.machine}

    def done(self, prompt) -> bool:
        return (str(prompt.id), self.label) in self.finished


def result_names(config: RunConfig, spec: MethodSpec) -> dict:
    """The names a sample and the summary carry (the method by its label: sparsespec_fixed etc.)."""
    return {"model": config.model.name, "task": config.task.name, "source": config.task.source, "method": spec.label}


def resume_settings(config: RunConfig, spec: MethodSpec) -> dict:
    """Every setting a sample depends on. num_prompts, logging and warm-up are left out: a resume
    may ask for more prompts or log elsewhere, and still reuse the finished ones."""
    return {"model": config.model.spec, "task": config.task.settings, "ctx": config.ctx,
            "method": spec.name, "label": spec.label, "options": spec.options,
            "seed": config.seed, "max_new_tokens": config.max_new_tokens, "temperature": config.temperature,
            "top_p": config.top_p, "stop_at_eos": config.stop_at_eos, "compare_ar": config.compare_ar,
            "dtype": config.dtype, "device": config.device,
            **({"batch_size": config.batch_size} if config.batch_size > 1 else {})}   # batch 1: as before


def open_results(run: MethodRun, config: RunConfig) -> None:
    """Create the method's folder, or resume the results it holds (same settings only)."""
    run.spec.folder.mkdir(parents=True, exist_ok=True)
    run.resumed = check_resume(run.spec.folder, resume_settings(config, run.spec))
    run.finished = {sample_key(s): s for s in run.samples.load()}


def batches(num_prompts: int, size: int) -> list[list[int]]:
    """The prompt indices of each batch, `size` at a time (the last may be short)."""
    return [list(range(i, min(i + size, num_prompts))) for i in range(0, num_prompts, size)]


def decoders_for(runs: list[MethodRun], config: RunConfig) -> dict[str, tuple[str, dict]]:
    """What to decode for a prompt, by entry: AR first (recorded, or only as the reference), then `runs`."""
    ar_runs = {run.entry: (AR, {}) for run in runs if run.method == AR}
    others = {run.entry: (run.method, run.spec.options) for run in runs if run.method != AR}
    reference = {REFERENCE: (AR, {})} if config.compare_ar and others and not ar_runs else {}
    return {**reference, **ar_runs, **others}


def in_run_order(decoders: dict, runs: list[MethodRun], config: RunConfig, index: int) -> dict:
    """`decoders` (`decoders_for` some of `runs`) in the run order of the batch whose first prompt is
    `index` (order.py), drawn over all of `runs` so that a resume decodes what is left in the order the
    first sitting had; the unrecorded AR reference takes AR's place. `fixed`: as `decoders_for` lists them."""
    order = prompt_order(list(dict.fromkeys([AR, *(run.entry for run in runs)])), config.seed, index, config.run_order)
    place = {label: order.index(AR if label == REFERENCE else label) for label in decoders}
    return dict(sorted(decoders.items(), key=lambda item: place[item[0]]))


def reference_of(gens: dict, runs: list[MethodRun]):
    """The AR decode of the batch, the reference of every speed-up (None when there is none)."""
    ar_entries = [REFERENCE] + [run.entry for run in runs if run.method == AR]
    return next((gens[entry] for entry in ar_entries if entry in gens), None)


def shared_with(runs: list[MethodRun], config: RunConfig) -> list[str]:
    """The entries decoded from each prompt's one shared prefill (transformers' decoders prefill their own)."""
    entries = [r.entry for r in runs if not r.spec.is_reference]
    return ([REFERENCE] if config.compare_ar and not any(r.method == AR for r in runs) else []) + entries


def profiles_to_measure(todo: list[MethodRun], config: RunConfig, cost_priors: RunCalibration) -> dict:
    """label -> ProfileJob (sparsespec/harness/calibration.py) still to measure: for each drafting run in `todo`
    not yet calibrated, a thread probe at every count (sparsespec/harness/thread_choice.py), and for one whose
    controller reads costs (the entropy controller) a cost profile sized to the run; AR steps at every count and
    attention path while AR's are unchosen and an engine method decodes (every method's k = 0 rounds are AR
    steps, and take the path chosen). Each is measured on the prefill of the batch about to be decoded,
    before its methods decode, so it costs no prefill of its own."""
    if not config.cost_profile:
        return {}
    wanted = {run.entry: (run.method, run.spec.options) for run in todo
              if run.entry not in cost_priors and not run.spec.is_reference
              and calibration.has_thread_probe(run.method)}
    ar = AR not in cost_priors.choices and any(not is_reference(m) for m, _ in decoders_for(todo, config).values())
    return calibration.plan_profiles(wanted, ar=ar, max_new_tokens=config.max_new_tokens,
                                     num_prompts=config.num_prompts)
