"""The engine protocol: what every decoder a job can run says about itself, and how it is opened,
asked to decode and closed.

An `Engine` is a registry entry (`ENGINES`, keyed by the name its rows carry in the `decoder` column):
its baseline (the plain engine its speedup is over; itself for a plain one), whether it runs in torch
or behind a server, the limits the config checks, and `open`, which returns a `Session` for one job.
Import-light on purpose: configs validate against `ENGINES` before torch or transformers load, so the
engine modules import their decode functions inside `open`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from specbench.registry import Registry

if TYPE_CHECKING:
    from specbench.config import Config
    from specbench.decoding.decoder import DecodeResult
    from specbench.models.pair import Pair

TORCH = "torch"  # runs in this process on the pair's models
SERVER = "server"  # runs in a server process the job starts (llama.cpp's llama-server)
RUNTIMES = (TORCH, SERVER)


class Session(Protocol):
    """One engine opened for one job: decodes batches of token ids until closed."""

    def decode(self, ids: list[list[int]], seed: int, max_new_tokens: int) -> DecodeResult: ...

    def close(self) -> None: ...


@dataclass
class TorchSession:
    """A session over a decode function of (ids, seed, max_new_tokens); nothing to close."""

    fn: Callable[[list[list[int]], int, int], Any]

    def decode(self, ids: list[list[int]], seed: int, max_new_tokens: int) -> DecodeResult:
        return self.fn(ids, seed, max_new_tokens)

    def close(self) -> None:
        pass


def _nothing(cfg: Config) -> None:
    return None


def _no_keys(cfg: Config) -> dict:
    return {}


@dataclass(frozen=True)
class Engine:
    """One decoder a job can run. `open(cfg, pair, slot)` -> Session; `slot` is the engine's index in
    the job's list (servers on a fixed port take port + slot)."""

    name: str
    baseline: str  # the plain engine this one's speedup is over (its own name for a plain engine)
    runtime: str  # TORCH | SERVER
    open: Callable[[Config, Pair, int], Session]
    description: str
    needs_draft_model: bool = False  # refuses model-free drafts (n-gram)
    batch_one: bool = False  # decodes one prompt per call: batch_size 1 only
    timed_rounds: bool = True  # its round rows carry C_d / C_t / C_o (llama.cpp logs counts only)
    tunable: bool = True  # the tuner may measure it
    check: Callable[[Config], None] = field(default=_nothing)  # config checks of its own (ValueError)
    preflight: Callable[[Config], None] = field(default=_nothing)  # before models load (binaries present)
    row_keys: Callable[[Config], dict] = field(default=_no_keys)  # job keys its rows carry differently
    # Once per job, after the measured batches: {table name: rows} of its own costs; engines sharing the
    # same function share one call (the torch engines: C_t(k) and the floor; llama.cpp's: llama-bench).
    costs: Callable[..., dict] | None = None

    @property
    def speculative(self) -> bool:
        return self.baseline != self.name


ENGINES: Registry[Engine] = Registry("decoder")


def register(engine: Engine) -> Engine:
    if engine.runtime not in RUNTIMES:
        raise ValueError(f"engine {engine.name!r}: runtime={engine.runtime!r}: must be one of {list(RUNTIMES)}")
    return ENGINES.register(engine.name, engine)


def engine(name: str, field: str = "decoder") -> Engine:
    """The registered engine `name`, or a ValueError naming `field`, the value and the choices."""
    return ENGINES.get(name, field)


def speculative_names() -> list[str]:
    """Engines that draft and verify (the choices of the config's `decoder`)."""
    return [n for n in ENGINES if ENGINES.get(n).speculative]


def baseline_names() -> list[str]:
    """Plain engines: each is its own baseline."""
    return [n for n in ENGINES if not ENGINES.get(n).speculative]


def is_baseline(name: str) -> bool:
    """A plain engine's rows (unknown names, e.g. from rows of another version, are not)."""
    return name in ENGINES and not ENGINES.get(name).speculative


def baseline_of(name: str, default: str) -> str:
    """The plain engine `name` is paired with; `default` for names no engine registers."""
    return ENGINES.get(name).baseline if name in ENGINES else default


def has_timed_rounds(name: str) -> bool:
    """Whether `name`'s round rows carry times (unknown names: assume so, as rows of old runs do)."""
    return ENGINES.get(name).timed_rounds if name in ENGINES else True


def runs_in(name: str, runtime: str) -> bool:
    return ENGINES.get(name).runtime == runtime


@contextmanager
def open_engines(cfg: Config, pair: Pair, names: list[str]) -> Iterator[dict[str, Session]]:
    """`with open_engines(cfg, pair, names) as sessions: sessions[name].decode(...)`: every engine of the
    job opened once (servers started, plain model copies loaded) and closed at the end, also on errors."""
    with ExitStack() as stack:
        sessions: dict[str, Session] = {}
        for slot, name in enumerate(names):
            session = ENGINES.get(name).open(cfg, pair, slot)
            stack.callback(session.close)
            sessions[name] = session
        yield sessions
