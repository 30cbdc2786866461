"""The lm-eval model `sparsespec`: lm-eval's Hugging Face model with generation through `sparsespec.generate`.

Everything but generation is lm-eval's own `HFLM`: loading, tokenization, truncation, chat templates
and log-likelihoods (so `loglikelihood` scores equal the `hf` model's exactly). Each `generate_until`
request is decoded by `sparsespec.generate` with the method and options given in `--model_args`: with
`--batch_size N` (N > 1) and a method that runs batched (sparsespec/engine/loop.py), HFLM's own batches of N
left-padded requests are decoded together, each request lossless as if alone; other methods decode one
request at a time (a warning says so; `batch_size` still batches log-likelihoods). E.g.

    pretrained=meta-llama/Meta-Llama-3-8B-Instruct,method=sparsespec,controller=entropy,recent=64

Arguments that `HFLM` takes go to `HFLM`; the others are the method's options. `pretrained` also takes
`embedded:<name>`, one of the offline models of `sparsespec.models`. The speculation statistics of
every request are kept and reported through `get_model_info()`, which lm-eval writes into its results
(`config.sparsespec`); a table is printed when generation ends.

Importing this module registers the model; `python -m sparsespec.lm_eval.cli` does that, then runs lm-eval.
"""
from __future__ import annotations

import inspect
import logging

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from tqdm import tqdm

import sparsespec
from sparsespec.lm_eval import stats as lm_eval_stats
from sparsespec.engine.eos import eos_token_ids
from sparsespec.errors import ConfigError, UnavailableError, describe
from sparsespec.method_options import coerce_options, option_names, resolve
from sparsespec.models import EMBEDDED_MODELS, load_model

logger = logging.getLogger(__name__)

EMBEDDED_PREFIX = "embedded:"
# HFLM forwards unknown keyword arguments to `from_pretrained`; these are the ones accepted here.
FROM_PRETRAINED_ARGS = frozenset({"attn_implementation", "low_cpu_mem_usage", "rope_parameters"})
HFLM_ARGS = frozenset(inspect.signature(HFLM.__init__).parameters) - {"self", "kwargs"}
# Generation kwargs of lm-eval tasks that `sparsespec.generate` honours, and values of the others
# that change nothing (greedy or plain sampling), so they can be ignored safely.
NEUTRAL_GEN_KWARGS = {"top_k": (None, 0), "num_beams": (1,), "repetition_penalty": (1.0,),
                      "typical_p": (1.0,), "min_p": (None, 0.0), "num_return_sequences": (1,)}


@register_model("sparsespec")
class SparseSpecLM(HFLM):
    """HFLM whose `generate_until` decodes with a sparsespec method, through one path: lm-eval's
    left-padded batches (`batch_size=N`; a method that cannot draft for a batch decodes its rows one
    at a time inside `sparsespec.generate`)."""

    def __init__(self, pretrained, method: str = "sparsespec", **model_args):
        method, hf_args, options = parse_model_args(method, model_args)
        pretrained, hf_args = resolve_pretrained(pretrained, hf_args)
        try:
            super().__init__(pretrained=pretrained, **hf_args)
        except OSError as err:  # transformers' "not found / not cached / gated": say it in one line
            raise UnavailableError(f"cannot load pretrained={pretrained!r}: {describe(err)}") from err
        self.method = method
        self.method_options = options
        self.request_stats: list[dict] = []
        self._last_generation = None
        self._batch_generations: dict[tuple, list] = {}     # unpadded context ids -> its requests' Generations
        self.generation_batch_size = self.generation_batch_size_for(self.batch_size)

    def generation_batch_size_for(self, batch_size) -> int:
        """Requests `generate_until` decodes together: `--batch_size N` (`auto` is refused earlier)."""
        return int(batch_size) if str(batch_size).isdigit() else 1

    # --- generation -------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """HFLM's own request handling (truncation, stop strings, decoding), in HFLM's batches of
        `--batch_size`. Each request's Generation is found again by its context ids, encoded as HFLM
        encodes them."""
        chunks = [requests] if self.generation_batch_size > 1 else [[request] for request in requests]
        quiet = disable_tqdm or self.rank != 0
        outputs = []
        for chunk in tqdm(chunks, disable=quiet or len(chunks) == 1, desc=f"generate_until ({self.method})"):
            self._batch_generations = {}
            texts = super().generate_until(chunk, disable_tqdm=quiet or len(chunk) == 1)
            for request, text in zip(chunk, texts):
                generation = self.generation_of(request)
                self.request_stats.append(lm_eval_stats.request_record(request, generation, text))
                self._last_generation = generation
            outputs += texts
        if self.request_stats and self.rank == 0:
            print(lm_eval_stats.format_table(self.speculation_report()))
        return outputs

    def generation_of(self, request):
        """The Generation of `request`, by its context ids (identical contexts: one each, in order)."""
        context, gen_kwargs = request.args
        max_gen = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
        ids, _ = self.tok_batch_encode([context], left_truncate_len=self.max_length - max_gen,
                                       truncation=self.truncation)
        same_context = self._batch_generations.get(tuple(ids[0].tolist()))
        if not same_context:       # a statistic silently missing would bias the report
            raise RuntimeError("a request's generation was not found by its context ids; "
                               "the speculation statistics would be incomplete")
        return same_context.pop(0)

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str],
                        **generation_kwargs) -> torch.Tensor:
        """(B, L) left-padded contexts and their attention mask (none: unpadded) -> (B, L + longest
        output), each row's new tokens after its padded context, shorter outputs padded with an end
        token; HFLM applies the stop strings to the decoded text."""
        attention_mask = generation_kwargs.pop("attention_mask", None)
        mask = torch.ones_like(context) if attention_mask is None else attention_mask
        generations = sparsespec.generate(
            self.model, context, attention_mask=mask, method=self.method,
            max_new_tokens=max_length - context.shape[1], eos_token_id=self.stop_token_ids(),
            **sampling_args(generation_kwargs), **self.method_options)
        width = max(len(g.tokens) for g in generations)
        pad = self.stop_token_ids()[0] if self.stop_token_ids() else 0
        new = torch.full((context.shape[0], width), pad, dtype=context.dtype, device=context.device)
        for row, (ids, m, generation) in enumerate(zip(context, mask, generations)):
            new[row, :len(generation.tokens)] = torch.tensor(generation.tokens, dtype=context.dtype)
            self._batch_generations.setdefault(tuple(ids[m.bool()].tolist()), []).append(generation)
        return torch.cat([context, new], dim=1)

    def stop_token_ids(self) -> list[int]:
        """The tokens that end HF generation here: the generation config's EOS and lm-eval's EOT."""
        return sorted(eos_token_ids(self.model, extra=[self.eot_token_id]))

    # --- reporting --------------------------------------------------------------------------
    def speculation_report(self) -> dict:
        resolved = self._last_generation.options if self._last_generation is not None else None
        return lm_eval_stats.report(self.method, self.method_options, self.request_stats, resolved)

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        info["sparsespec"] = self.speculation_report()
        return info


# --- model_args ---------------------------------------------------------------------------------
def parse_model_args(method, model_args: dict) -> tuple[str, dict, dict]:
    """Split lm-eval's model_args into HFLM's and the method's options, coerced to their declared
    types and checked (sparsespec/method_options.py), all before the model loads."""
    known_options = option_names(method)     # also rejects an unknown method, in one line
    hf_args, options = {}, {}
    for key, value in model_args.items():
        if key in HFLM_ARGS or key in FROM_PRETRAINED_ARGS:
            hf_args[key] = value
        elif key in known_options:
            options[key] = value
        else:
            raise ConfigError(
                f"unknown model_arg {key!r} for method {method!r}; method options: "
                f"{', '.join(sorted(known_options)) or '(none)'}; other keys go to lm-eval's HFLM "
                f"(e.g. pretrained, dtype, device, max_length, batch_size)")
    if str(hf_args.get("batch_size", 1)).startswith("auto"):
        raise ConfigError("batch_size=auto is not supported by the sparsespec model; "
                          "give an integer (it batches log-likelihoods, and generation for the batched methods)")
    options = coerce_options(method, options)
    resolve(method, options)   # every value checked now; a budget needs no context (too big: dense draft)
    return method, hf_args, options


# --- loading ------------------------------------------------------------------------------------
def embedded_name(pretrained) -> str | None:
    """The embedded model that `pretrained=embedded:<name>` names (None for anything else); an
    unknown name is a ConfigError, found without loading anything."""
    if not (isinstance(pretrained, str) and pretrained.startswith(EMBEDDED_PREFIX)):
        return None
    name = pretrained[len(EMBEDDED_PREFIX):]
    if name not in EMBEDDED_MODELS:
        raise ConfigError(f"pretrained={pretrained!r} names no embedded model; accepted: "
                          f"{', '.join(EMBEDDED_PREFIX + known for known in EMBEDDED_MODELS)}, a hub id or a folder")
    return name


def resolve_pretrained(pretrained, hf_args: dict) -> tuple[object, dict]:
    """`embedded:<name>` loads through `sparsespec.models`; anything else is HFLM's to load."""
    name = embedded_name(pretrained)
    if name is None:
        return pretrained, hf_args
    hf_args = dict(hf_args)
    dtype = hf_args.pop("dtype", "auto")
    model, tokenizer = load_model({"name": name, "embedded": name},
                                  dtype="float32" if dtype in (None, "auto") else str(dtype),
                                  device=available_device(hf_args.get("device")))
    hf_args.setdefault("tokenizer", tokenizer)
    return model, hf_args


def available_device(device: str | None) -> str | None:
    """lm-eval's CLI always passes a device (default cuda:0); like HFLM, fall back when CUDA is absent."""
    if device and device.startswith("cuda") and not torch.cuda.is_available():
        logger.warning("device %s requested but CUDA is not available; using the CPU", device)
        return None
    return device


# --- generation arguments -----------------------------------------------------------------------
def sampling_args(gen_kwargs: dict) -> dict:
    """lm-eval's normalized generation kwargs -> `temperature` and `top_p` of `sparsespec.generate`."""
    kwargs = dict(gen_kwargs)
    do_sample = kwargs.pop("do_sample", None)
    temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
    top_p = float(kwargs.pop("top_p", 1.0) or 1.0)
    for key, value in kwargs.items():
        if value not in NEUTRAL_GEN_KWARGS.get(key, ()):
            raise ConfigError(f"generation kwarg {key}={value!r} is not supported by the sparsespec "
                              "model; it honours do_sample, temperature, top_p, until, max_gen_toks")
    if not do_sample:
        temperature = 0.0
    return {"temperature": temperature, "top_p": top_p}
