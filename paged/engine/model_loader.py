"""Loading the model and tokenizer, and choosing the device (vLLM v1
``vllm/model_executor/model_loader/``, 0.10.2).

``load_model(model, dtype)`` accepts ``None`` (the built-in byte-level Llama, ``paged/models.py``), a hub
name or a local folder (``AutoModelForCausalLM.from_pretrained``; the local cache is tried first, the hub
asked once within ``HUB_TIMEOUT_S`` before a download), or a ``PreTrainedModel`` used as given.
``resolve_device`` checks a device string before anything is loaded; ``eos_token_ids`` collects the
token ids that end a sequence.
"""

from __future__ import annotations

import os
import threading

import torch

HUB_TIMEOUT_S = 3.0  # seconds: one bounded question to the hub before transformers' download (which retries ~25 s)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device to run on: ``None`` picks CUDA when available, else CPU.

    Raises:
        ValueError: a device other than ``"cpu"`` / ``"cuda"`` / ``"cuda:N"``, CUDA when this torch
            sees no GPU, or a CUDA index past the GPUs present.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device) if isinstance(device, (str, torch.device)) else None
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(
            f"device must be 'cpu' or 'cuda' (or 'cuda:N'); got {device!r} (paged runs on CPU or "
            "an NVIDIA GPU through CUDA)"
        )
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = (
                "a CPU-only build"
                if torch.version.cuda is None
                else f"built for CUDA {torch.version.cuda}"
            )
            raise ValueError(
                f"device {device!r} needs CUDA, but torch {torch.__version__} ({build}) sees no GPU "
                "(torch.cuda.is_available() is False); use device='cpu'"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    return dev


def _looks_local(name: str) -> bool:
    """A path rather than a hub name: starts with ``.``, ``/`` or ``~``, exists, or sits in an existing folder."""
    parent = os.path.dirname(name)
    return (
        name.startswith((".", "/", "~"))
        or os.path.exists(name)
        or bool(parent and os.path.isdir(parent))
    )


def _check_hub(name: str) -> None:
    """Ask the hub about ``name`` once, within ``HUB_TIMEOUT_S`` (``huggingface_hub.model_info``).

    Returns when the hub answered (the download may go ahead). Raises ``ValueError`` when
    ``HF_HUB_OFFLINE`` is set, the hub is unreachable or silent, the name is invalid, or the hub has no
    such model. Run in a daemon thread so that even a hanging name lookup cannot hold the caller.
    """
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, RepositoryNotFoundError

    hub = constants.ENDPOINT
    if constants.HF_HUB_OFFLINE:
        raise ValueError(
            f"model {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set, so "
            f"the hub ({hub}) was not asked; download it once with the network on, or pass a folder"
        )
    answer: dict = {}

    def ask() -> None:
        try:
            huggingface_hub.HfApi(endpoint=hub).model_info(name, timeout=HUB_TIMEOUT_S)
            answer["ok"] = True
        except Exception as err:  # reported below, in the caller's thread
            answer["error"] = err

    thread = threading.Thread(target=ask, name="paged-hub-check", daemon=True)
    thread.start()
    thread.join(HUB_TIMEOUT_S + 0.5)
    err = answer.get("error")
    offline = "; check the network, or pass a local folder"
    # httpx / requests ReadTimeout, ConnectTimeout, ...
    if not answer or "Timeout" in type(err).__name__:
        raise ValueError(
            f"the Hugging Face hub ({hub}) is unreachable: no answer within {HUB_TIMEOUT_S:g} s "
            "(paged.engine.model_loader.HUB_TIMEOUT_S), "
            f"and model {name!r} is not in the local cache{offline}"
        ) from err
    if isinstance(err, HFValidationError):
        raise ValueError(
            f"model {name!r} is neither an existing folder nor a valid hub name: {err}"
        ) from err
    if isinstance(err, RepositoryNotFoundError):
        raise ValueError(
            f"model {name!r} was not found on the hub ({hub}); a private or gated model needs "
            "`hf auth login` first"
        ) from err
    if err is not None and not isinstance(err, HfHubHTTPError):  # no HTTP answer at all
        first = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(
            f"the Hugging Face hub ({hub}) is unreachable ({type(err).__name__}: {first}), and model "
            f"{name!r} is not in the local cache{offline}"
        ) from err


def load_model(model, dtype: torch.dtype | None):
    """``(model, tokenizer_or_None)`` for ``None`` (built-in), a name / path, or a ``PreTrainedModel``.

    A name is looked up in the local Hugging Face cache first (no network); only when it is missing
    there is the hub asked, once and within ``HUB_TIMEOUT_S``, before the download.

    Raises:
        TypeError: ``model`` of another type.
        ValueError: a local-looking path that does not exist, a name the hub does not know or cannot be
            asked about (offline, unreachable), or a model transformers cannot load (the cause is chained).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

    if model is None:
        from paged.models import load_default

        return load_default(dtype or torch.float32)
    if isinstance(model, PreTrainedModel):
        return (model.to(dtype) if dtype is not None else model).eval(), None
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(
            f"model must be None, a hub name or folder path, or a PreTrainedModel; "
            f"got {type(model).__name__}"
        )
    from paged.models import quiet_progress_bars

    name, local = os.fspath(model), _looks_local(os.fspath(model))
    if local:
        name = os.path.expanduser(name)
        if not os.path.isdir(name):
            what = "is a file, not a model folder" if os.path.exists(name) else "does not exist"
            raise ValueError(
                f"model folder {model!r} {what} ({os.path.abspath(name)}); pass a folder holding "
                "config.json and the weights, a hub name such as 'org/model', None for the built-in "
                "model, or a PreTrainedModel"
            )

    asked_hub = []  # the hub is asked at most once, before the first download

    def from_pretrained(cls, **kwargs):
        """``cls.from_pretrained(name)`` from the local cache (no network); a name missing there is
        looked up on the hub (``_check_hub``, once) and downloaded. What transformers cannot load
        raises ``_load_error``; what the hub check finds raises as ``_check_hub`` says."""
        try:
            with quiet_progress_bars():
                return cls.from_pretrained(name, local_files_only=True, **kwargs)
        # not (fully) in the local cache; for a folder: no config.json or weights
        except OSError as err:
            if local:
                raise _load_error(model, cls, err) from err
        except Exception as err:  # an unknown architecture, a bad config, ...
            raise _load_error(model, cls, err) from err
        if not asked_hub:
            _check_hub(name)  # fails within HUB_TIMEOUT_S when the hub cannot be asked
            asked_hub.append(name)
        try:
            with quiet_progress_bars():
                return cls.from_pretrained(name, **kwargs)
        except Exception as err:
            raise _load_error(model, cls, err) from err

    loaded = from_pretrained(AutoModelForCausalLM, dtype=dtype or torch.float32)
    # a model without tokenizer files: token-id prompts only (a hub model's tokenizer is downloaded
    # apart from its weights)
    try:
        tokenizer = from_pretrained(AutoTokenizer)
    except Exception:
        tokenizer = None
    return loaded.eval(), tokenizer


def _load_error(model, cls, err: Exception) -> ValueError:
    first = str(err).splitlines()[0] if str(err) else ""
    return ValueError(
        f"model {model!r} could not be loaded with {cls.__name__}.from_pretrained "
        f"({type(err).__name__}: {first}); pass None for the built-in model, a local folder, "
        "or a PreTrainedModel"
    )


def eos_token_ids(model, tokenizer) -> set[int]:
    ids = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is not None:
            ids |= set(value) if isinstance(value, (list, tuple, set)) else {int(value)}
    return ids
