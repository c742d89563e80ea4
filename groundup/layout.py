"""Where everything lives on disk: the one module that names run, checkpoint, model and tokenizer files.

    MODEL/                          a model directory (what --model and import/merge-lora --out mean)
        model.safetensors           every persistent tensor, no pickle
        model.toml                  the ModelConfig
        tokenizer/                  the tokenizer the model reads (optional beside a run's checkpoint)
    TOKENIZER/                      a tokenizer directory (either backend, see groundup.tokenizer)
        tokenizer.json              Hugging Face `tokenizers` format
        groundup_tokenizer.json     groundup's own backend: special-token roles, chat template, hash
        tokenizer_config.json       a Hugging Face tokenizer's special tokens and chat template
    ADAPTER/                        a LoRA adapter (peft reads it; see interop/peft_format.py)
        adapter_config.json, adapter_model.safetensors, groundup_adapter.json
    RUN/                            a training run (pretraining or any post-training verb)
        config.toml                 the fully resolved config
        metrics.jsonl               one JSON object per logged step or event
        summary.json                what the run returned, written at its end
        data_report.json            post-training: examples read, rows packed, padding and dropped tokens
        reference_logps.safetensors DPO/KTO: the reference log-likelihoods, computed once
        tokenizer/                  a copy of the tokenizer: the run is self-contained
        checkpoints/step_NNNNNNN/   a model directory + optimizer.pt, loader.pt, trainer.pt, meta.json
        checkpoints/latest          the newest complete step directory's name, written last
        .lock                       held by the one process that writes the run (see io.writer_lock)
        hang-rank{R}.txt            every thread's stack of a process the hang detector ended
        launch.sbatch, ray/         what `groundup launch` submitted (Slurm), Ray Train's own state
    ANY OUTPUT FOLDER/              what a verb writes with --out (a run, a model, shards, results, ...)
        .groundup-output.json       {"verb": "sft"}: the verb that made it (see claim_output_dir)

A checkpoint's meta.json records an xxh3-128 digest of each of its files, so every reader (resume,
generate, export, eval) can tell an intact checkpoint from a truncated or corrupted one, and does.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Callable, Iterable

import xxhash

from groundup.errors import CheckpointError, DataError
from groundup.io import atomic_write_json, ensure_writable_dir

# Model directory
WEIGHTS_FILE = "model.safetensors"
MODEL_CONFIG_FILE = "model.toml"
QUANTIZATION_TABLE = "quantization"  # the table of MODEL/model.toml that marks a quantized model (quant/spec.py)
TOKENIZER_DIR = "tokenizer"

# Tokenizer directory
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_META_FILE = "groundup_tokenizer.json"
HF_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
HF_SPECIAL_TOKENS_FILE = "special_tokens_map.json"
HF_CHAT_TEMPLATE_FILE = "chat_template.jinja"  # newer Hugging Face tokenizers keep the template here

# Hugging Face model directory (what `export hf` writes and `import hf` reads)
HF_CONFIG_FILE = "config.json"
HF_GENERATION_CONFIG_FILE = "generation_config.json"
HF_WEIGHTS_FILE = "model.safetensors"
HF_WEIGHTS_INDEX_FILE = "model.safetensors.index.json"

# Adapter directory (LoRA; peft's layout, plus groundup's own metadata)
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_META_FILE = "groundup_adapter.json"

# Run directory
RUN_CONFIG_FILE = "config.toml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
DATA_REPORT_FILE = "data_report.json"  # post-training runs: examples, packing, padding, dropped, replay
REFERENCE_LOGPS_FILE = "reference_logps.safetensors"  # DPO/KTO: the reference model's log-likelihoods, once
STEP_LABELS_FILE = "step_labels.jsonl"  # `rm --process`: the Math-Shepherd step labels it trained on
PROCESS_REWARD_FILE = "process_reward.json"  # `rm --process`: how its solutions split into steps (prm:PATH reads it)
CHECKPOINTS_DIR = "checkpoints"
LATEST_POINTER = "latest"
CHECKPOINT_META_FILE = "meta.json"
CHECKPOINT_FORMAT = "groundup-checkpoint"
LOCK_FILE = ".lock"  # held (flock) by the one process writing the run; released when it exits
HANG_DUMP_FILE = "hang-rank{rank}.txt"  # every thread's stack of a process the hang detector ended (train/hang.py)
FAULT_DONE_FILE = ".fault-{index}.done"  # an injected test fault that fired, so a restarted attempt skips it
SLURM_SCRIPT_FILE = "launch.sbatch"  # the batch script `groundup launch --backend slurm` wrote and submitted
RAY_STORAGE_DIR = "ray"  # Ray Train's storage_path for a run launched with --backend ray (its own state)
STEP_DIR = re.compile(r"^step_(\d{7,})$")


def step_name(step: int) -> str:
    return f"step_{step:07d}"


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def latest_pointer(run_dir: str | Path) -> Path:
    return checkpoints_dir(run_dir) / LATEST_POINTER


def is_run_dir(path: str | Path) -> bool:
    """True when `path` already holds (the start of) a training run."""
    path = Path(path)
    return (path / RUN_CONFIG_FILE).is_file() or checkpoints_dir(path).is_dir()


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_WEIGHTS_FILE).is_file()


def is_model_dir(path: str | Path) -> bool:
    path = Path(path)
    return (path / WEIGHTS_FILE).is_file() and (path / MODEL_CONFIG_FILE).is_file()


# ----------------------------------------------------------------------------- checkpoint integrity


def file_digest(path: Path) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def read_latest(run_dir: str | Path) -> str | None:
    """The step directory name `checkpoints/latest` holds, or None when missing or unreadable."""
    pointer = latest_pointer(run_dir)
    try:
        name = pointer.read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if STEP_DIR.match(name) else None


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every step directory, newest first (complete or not)."""
    ckpt_dir = checkpoints_dir(run_dir)
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return sorted(found, reverse=True)


def read_checkpoint_meta(step_dir: Path) -> dict:
    """A checkpoint's meta.json as a dict (CheckpointError when missing, unreadable or not an object)."""
    path = step_dir / CHECKPOINT_META_FILE
    try:
        meta = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: unreadable ({e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    return meta


def checkpoint_problem(step_dir: Path) -> str | None:
    """Why `step_dir` is not a complete, intact checkpoint (None when it is)."""
    if not (step_dir / CHECKPOINT_META_FILE).is_file():
        return f"no {CHECKPOINT_META_FILE} (the write did not finish)"
    try:
        meta = read_checkpoint_meta(step_dir)
    except CheckpointError as e:
        return str(e)
    files = meta.get("files")
    if meta.get("format") != CHECKPOINT_FORMAT or not isinstance(files, dict):
        return f"{CHECKPOINT_META_FILE} is not a groundup checkpoint's"
    for name, digest in files.items():
        path = step_dir / str(name)
        if "/" in str(name) or not path.is_file():
            return f"{name} is missing"
        if file_digest(path) != digest:
            return f"{name} does not match its checksum (truncated or corrupt)"
    return None


def find_intact_checkpoint(run_dir: str | Path, note: Callable[[str], None] = print) -> Path | None:
    """The newest intact checkpoint: the one `latest` names, else the newest older one that checks out."""
    pointer = latest_pointer(run_dir)
    named = read_latest(run_dir)
    if pointer.is_file() and named is None:
        note(f"warning: {pointer} is damaged; looking for the newest intact checkpoint")
    candidates = list_checkpoints(run_dir)
    if named:  # the pointer's target first; anything newer was never vouched for
        named_step = next((s for s, p in candidates if p.name == named), None)
        if named_step is None:
            note(f"warning: {pointer} names {named}, which does not exist")
        else:
            candidates = [(s, p) for s, p in candidates if s <= named_step]
    for _, path in candidates:
        why = checkpoint_problem(path)
        if why is None:
            return path
        note(f"warning: checkpoint {path.name} is unusable ({why}); trying the previous one")
    return None


# ----------------------------------------------------------------------------- what a user points at


def resolve_model_dir(path: str | Path, note: Callable[[str], None] = print) -> Path:
    """The model directory behind what a user passes as `--model` (also spelled `--checkpoint` or `--base`).

    A model directory (model.safetensors + model.toml) or an adapter directory, one checkpoint step directory (verified
    against its meta.json: a corrupt one is refused), or a training run directory, whose newest
    intact checkpoint is used (a damaged newer one is skipped with a warning, as resume does).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint or run directory")
    if (path / WEIGHTS_FILE).is_file() or is_adapter_dir(path):
        if (path / CHECKPOINT_META_FILE).is_file():  # a checkpoint step directory: verify it
            why = checkpoint_problem(path)
            if why:
                raise CheckpointError(f"{path}: checkpoint is unusable ({why})")
        return path
    if checkpoints_dir(path).is_dir():
        found = find_intact_checkpoint(path, note)
        if found is None:
            raise CheckpointError(f"{path}: no intact checkpoint in {checkpoints_dir(path)}")
        return found
    raise CheckpointError(f"{path}: neither a model directory ({WEIGHTS_FILE} + {MODEL_CONFIG_FILE}) nor a run "
                          f"directory with {CHECKPOINTS_DIR}/")


def is_tokenizer_dir(path: str | Path) -> bool:
    return (Path(path) / TOKENIZER_FILE).is_file()


def find_tokenizer_dir(model_dir: str | Path) -> Path | None:
    """The tokenizer saved with a model: MODEL/tokenizer, or RUN/tokenizer for a run's checkpoint."""
    model_dir = Path(model_dir)
    for candidate in (model_dir / TOKENIZER_DIR, model_dir.parent.parent / TOKENIZER_DIR):
        if is_tokenizer_dir(candidate):
            return candidate
    return None


def check_tokenizer_fits(tokenizer_vocab: int, model_vocab: int, tokenizer_where: str | Path,
                         model_where: str | Path) -> None:
    """A tokenizer with more ids than the model has embeddings was not trained with it: refuse."""
    if tokenizer_vocab > model_vocab:
        raise CheckpointError(f"{tokenizer_where} has {tokenizer_vocab} tokens but {model_where} embeds only "
                              f"{model_vocab}: they were not trained together")


# ----------------------------------------------------------------------------- who made an output folder
#
# Every verb that writes a folder claims it first with `claim_output_dir`, the one rule: a folder that
# holds another verb's output is refused (one line naming the folder, the verb that made it and the verb
# asked), whether the verb starts afresh or is asked to --resume. The maker is the verb named in the
# folder's OUTPUT_MARKER_FILE, written with the folder's first output (`mark_output_dir`), or, for a
# folder made before markers existed, read from its layout (`made_by`). What a verb may do with a folder
# of its own depends on how it writes (FOLDER_VERBS). --overwrite is an explicit, whole replacement: only
# a verb that builds its folder under a temporary name and renames it into place (REPLACED) takes it,
# and then it replaces a folder of any maker, and only once the new one is complete.

OUTPUT_MARKER_FILE = ".groundup-output.json"

RUN = "run"  # a training run written as it goes: a second start is refused, --resume continues it
CONTINUED = "continued"  # written as it goes: a rerun of the same verb continues or refreshes it
REPLACED = "replaced"  # renamed into place when complete: a non-empty folder only with --overwrite, whole
ANNOTATES = "annotates"  # writes beside a training run or a demo (report.md), never a folder of its own

FOLDER_VERBS: dict[str, str] = {
    "data sample": CONTINUED, "data extract": CONTINUED, "data curate": CONTINUED, "tokenizer train": CONTINUED, "data tokenize": CONTINUED,
    "train": RUN, "sft": RUN, "dpo": RUN, "kto": RUN, "rm": RUN, "grpo": RUN, "rft": CONTINUED,
    "merge-lora": REPLACED, "quantize": REPLACED, "export hf": REPLACED, "import hf": REPLACED,
    "import gguf": REPLACED, "eval": REPLACED, "eval contamination": REPLACED, "demo": CONTINUED,
    "eval --export-lm-eval": REPLACED, "eval --compare": REPLACED,
    "data annotate": CONTINUED, "report": ANNOTATES, "arena": CONTINUED,
}  # fmt: skip
REPORTED = {"train", "sft", "dpo", "kto", "rm", "grpo", "rft", "demo"}  # what `report` writes report.md into
POSTTRAIN_SECTIONS = ("rft", "sft", "dpo", "kto", "grpo", "rm")  # a run's config.toml section naming its verb


def made_by(path: str | Path) -> str | None:
    """The verb that made the folder `path`: its marker's, else (a folder from before markers) what its
    layout says, a training run by its config.toml; None when neither tells."""
    path = Path(path)
    try:
        verb = json.loads((path / OUTPUT_MARKER_FILE).read_bytes().decode("utf-8")).get("verb")
        if isinstance(verb, str) and verb:
            return verb
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, AttributeError):
        pass  # no marker, or a damaged one: the layout decides
    try:
        keys = tomllib.loads((path / RUN_CONFIG_FILE).read_bytes().decode("utf-8")).keys()
    except (OSError, UnicodeDecodeError, ValueError):
        keys = None
    if keys is not None:
        section = next((s for s in POSTTRAIN_SECTIONS if s in keys), None)
        if section:
            return section
        if "dedup" in keys and "mixing" in keys:  # data curate saves its config beside its shards
            return "data curate"
        if "model" in keys and "data" in keys:
            return "train"
    if checkpoints_dir(path).is_dir():
        return "train"
    if (path / TOKENIZER_META_FILE).is_file() and not (path / HF_CONFIG_FILE).exists():
        return "tokenizer train"
    return None


def mark_output_dir(path: str | Path, verb: str) -> Path:
    """Record `verb` as the maker of the folder `path` (created if missing), in one atomic write (a marker
    naming it already is kept). Call it with the folder's first output: inside the temporary folder of a
    REPLACED verb, once claim_output_dir's checks pass for the others."""
    if verb not in FOLDER_VERBS:
        raise ValueError(f"{verb!r} is not a verb of layout.FOLDER_VERBS")
    path = ensure_writable_dir(path)
    if made_by(path) != verb or not (path / OUTPUT_MARKER_FILE).is_file():
        atomic_write_json(path / OUTPUT_MARKER_FILE, {"verb": verb})
    return path


def claim_output_dir(path: str | Path, verb: str, *, resume: bool = False, overwrite: bool = False,
                     sources: Iterable[str | Path] = (), mark: bool = False) -> Path:
    """The rule every verb that writes a folder keeps, before it writes anything (see above).

    `resume`: the verb continues its own unfinished output; `overwrite`: it replaces the folder whole
    (REPLACED verbs only); `sources`: what the verb reads, refused as the output (or a folder holding it)
    since a replacement would delete it; `mark`: also create the folder and write the marker (verbs that
    write as they go). Raises DataError naming the folder, its maker and `verb`."""
    how = FOLDER_VERBS.get(verb)
    if how is None:
        raise ValueError(f"{verb!r} is not a verb of layout.FOLDER_VERBS")
    path = Path(path)
    exists = path.exists() or path.is_symlink()
    if exists and not path.is_dir():
        raise DataError(f"{path}: exists and is not a directory; 'groundup {verb}' writes a folder")
    maker = made_by(path) if exists else None
    if how == ANNOTATES:
        if maker is not None and maker not in REPORTED:
            raise DataError(f"{path} holds the output of 'groundup {maker}'; 'groundup {verb}' writes only into a "
                            "training run or a demo folder")
    elif maker is not None and maker != verb:
        if resume:
            raise DataError(f"cannot resume {path}: it holds the output of 'groundup {maker}', not a "
                            f"'groundup {verb}' run")
        if not (how == REPLACED and overwrite):
            replace = " or pass --overwrite to replace it whole" if how == REPLACED else ""
            raise DataError(f"{path} holds the output of 'groundup {maker}'; 'groundup {verb}' does not write into "
                            f"another verb's folder: choose another --out{replace}")
    target = path.resolve()
    for source in sources:
        source = Path(source).resolve()
        if target == source or target in source.parents:
            raise DataError(f"{path}: it is or contains {source}, which this command reads; choose another --out")
    if exists and maker in (verb, None):
        if how == RUN and not resume and is_run_dir(path):
            raise DataError(f"{path} already holds a training run: resume it with 'groundup {verb} --resume {path}' "
                            "or choose another --out")
        if how == REPLACED and not overwrite and any(path.iterdir()):
            raise DataError(f"{path}: exists and is not empty; pass --overwrite to replace it")
    if mark:
        mark_output_dir(path, verb)
    return path


def claim_output_file(path: str | Path, verb: str, what: str = "file") -> Path:
    """A verb that writes one file (`what`: "pairs file") refuses an --out that is a folder, naming the verb
    that made it."""
    path = Path(path)
    if path.is_dir():
        maker = made_by(path)
        if maker:
            raise DataError(f"{path} holds the output of 'groundup {maker}'; 'groundup {verb}' writes a {what}: "
                            f"--out names the {what} to write")
        raise DataError(f"{path} is a directory: --out names the {what} to write")
    return path
