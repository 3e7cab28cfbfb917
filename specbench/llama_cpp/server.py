"""`llama-server` on 127.0.0.1, started and stopped by the job: a context manager that picks (or
checks) the port, waits for /health, streams completions and kills the process by its own PID.

Why the server and not the bindings: it is the front end users deploy; it reports drafted and
accepted counts per request (`timings.draft_n`, `timings.draft_n_accepted`) and, with
LLAMA_TRACE=1, one log line per verification round ("accepted a/n draft tokens"), which gives
the same per-round acceptance rows as specbench's decoder; and the binaries need no compiler
toolchain at import time (a broken build fails one job with a clear error, not the import).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from specbench.llama_cpp import procs
from specbench.llama_cpp.binaries import find_tool
from specbench.llama_cpp.options import DRAFT_SAMPLING, NGRAM_TYPES, amx_repack_flags, speculative_flags

SPEC_TYPES = ("draft-simple", *NGRAM_TYPES)
ROUND_LINE = re.compile(r"accepted\s+(\d+)/\s*(\d+) draft tokens")
DONE_LINE = re.compile(r"\btotal time\s*=")  # print_timings: the last line llama-server logs for a request


class LlamaServerError(RuntimeError):
    """llama-server did not start, died, or answered with an error; the message has its log tail."""


@dataclass(frozen=True)
class ServerSpec:
    """How one server is started: the target GGUF and, for speculation, a draft GGUF or an n-gram type."""

    target: Path
    draft: Path | None = None  # a draft model: llama.cpp's draft-simple
    spec_type: str | None = None  # None: draft-simple with `draft`, or no speculation without it
    draft_max: int = 0  # γ: --spec-draft-n-max
    draft_min: int = 0
    draft_p_min: float = 0.0
    draft_sampling: str = "greedy"
    ngram_size: int | None = None  # ngram-simple: the lookup n-gram's length (None: llama.cpp's 12)
    threads: int = 1
    ctx_size: int = 4096
    port: int = 0  # 0: a free port
    startup_timeout: float = 120.0
    bin_dir: str | None = None
    cache_prompt: bool = False  # measured jobs: off, every request prefills; the audit: on (distribution only)

    @property
    def speculative(self) -> bool:
        return self.draft is not None or self.spec_type is not None

    def args(self, port: int) -> list[str]:
        """The command line (the binary first)."""
        cmd = [str(find_tool("llama-server", self.bin_dir)), "-m", str(self.target)]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "-t", str(self.threads), "-tb", str(self.threads)]
        cmd += ["-c", str(self.ctx_size), "-np", "1", "--no-webui", "--metrics", *amx_repack_flags("llama-server")]
        cmd += [] if self.cache_prompt else ["--no-cache-prompt"]
        if self.speculative:
            draft = str(self.draft) if self.draft is not None else None
            sampling = self.draft_sampling if draft else None
            cmd += speculative_flags(
                self.draft_max, draft, self.spec_type, self.draft_min, self.draft_p_min, sampling, self.ngram_size
            )
            cmd += ["-td", str(self.threads), "-tbd", str(self.threads)] if draft else []
        return cmd


@dataclass
class Completion:
    """One streamed request as the client saw it, plus what the server reported and logged."""

    tokens: list[int]
    wall_time: float  # request sent -> last chunk received
    ttft: float  # request sent -> first chunk carrying a token
    first_chunk_tokens: int
    stop_type: str  # "eos" | "limit" | ...
    timings: dict
    rounds: list[tuple[int, int]] = field(default_factory=list)  # (accepted, drafted) per verification round


def free_port() -> int:
    """A port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port_free(port: int) -> None:
    """Raise naming the port when something already listens on 127.0.0.1:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise LlamaServerError(
                f"llama_cpp.port={port}: 127.0.0.1:{port} is already in use ({exc.strerror})"
            ) from exc


class LlamaServer:
    """`with LlamaServer(spec) as server: server.complete(ids, params, n_predict)`."""

    def __init__(self, spec: ServerSpec) -> None:
        for f in ("target", "draft"):
            path = getattr(spec, f)
            if path is not None and not Path(path).is_file():
                raise FileNotFoundError(f"llama_cpp {f} GGUF {str(path)!r}: no such file")
        if spec.spec_type is not None and spec.spec_type not in SPEC_TYPES:
            raise ValueError(f"llama_cpp.spec_type={spec.spec_type!r}: must be one of {list(SPEC_TYPES)}")
        if spec.draft_sampling not in DRAFT_SAMPLING:
            raise ValueError(f"llama_cpp.draft_sampling={spec.draft_sampling!r}: must be one of {list(DRAFT_SAMPLING)}")
        if spec.speculative and spec.draft_max < 1:
            raise ValueError(f"gamma={spec.draft_max}: a speculative llama-server needs --spec-draft-n-max >= 1")
        self.spec = spec
        self.port = 0
        self.process: subprocess.Popen | None = None
        self._log = None
        self.log_path: Path | None = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Start the process and wait until /health says ok (or raise with the log tail). However start ends
        short of that (an error, Ctrl-C, a signal), the process is stopped; a failed start keeps its log."""
        if self.spec.port:
            check_port_free(self.spec.port)
        self.port = self.spec.port or free_port()
        self.log_path = procs.new_log()
        self._log = open(self.log_path, "wb")
        env = {**os.environ, "LLAMA_TRACE": "1"}  # one "accepted a/n draft tokens" line per round
        try:
            self.process = subprocess.Popen(
                self.spec.args(self.port),
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # Ctrl-C reaches the job, which stops the server (and its group)
                preexec_fn=procs.die_with_parent(),  # the kernel kills it when the job dies, SIGKILL included
            )
            procs.track(self, self.stop)
            self._wait_healthy()
        except LlamaServerError as exc:
            self.stop(keep_log=True)
            raise LlamaServerError(f"{exc} (full log: {self.log_path})") from None
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LlamaServerError(
                    f"llama-server exited with code {self.process.returncode} on start: {self.log_tail()}"
                )
            try:
                status, _ = self._request("GET", "/health", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise LlamaServerError(f"llama-server not healthy after {self.spec.startup_timeout:.0f} s: {self.log_tail()}")

    def stop(self, keep_log: bool = False) -> None:
        """Terminate by PID (its own process group), kill after 10 s, remove the log (`keep_log`: keep it
        for the user, renamed so no sweep removes it); idempotent."""
        p, self.process = self.process, None
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=10)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    pass
        procs.untrack(self)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.log_path is not None and self.log_path.is_file():
            if keep_log:
                self.log_path = procs.keep_log(self.log_path)
            else:
                self.log_path.unlink(missing_ok=True)

    def log_tail(self, lines: int = 6) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "(empty log)"

    # ------------------------------------------------------------------ requests
    def _request(self, method: str, path: str, body: dict | None = None, timeout: float = 600):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def complete(self, ids: list[int], params: dict, n_predict: int) -> Completion:
        """Stream one completion of the token ids `ids` (the prompt is sent as ids: no re-tokenizing)."""
        if self.process is None or self.process.poll() is not None:
            raise LlamaServerError(f"llama-server is not running: {self.log_tail()}")
        log_start = self.log_path.stat().st_size
        body = {
            **params,
            "prompt": list(ids),
            "n_predict": int(n_predict),
            "stream": True,
            "cache_prompt": self.spec.cache_prompt,  # off: every request prefills, no state carried over
            "return_tokens": True,
        }
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        tokens: list[int] = []
        ttft, first_chunk, final = None, 0, None
        t0 = time.perf_counter()
        try:
            conn.request("POST", "/completion", body=json.dumps(body), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise LlamaServerError(f"llama-server /completion returned {resp.status}: {resp.read()[:300]!r}")
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise LlamaServerError(f"llama-server error: {chunk['error']}")
                new = chunk.get("tokens") or []
                if new and ttft is None:
                    ttft, first_chunk = time.perf_counter() - t0, len(new)
                tokens += new
                if chunk.get("stop"):
                    final = chunk
                    break
        finally:
            conn.close()
        wall = time.perf_counter() - t0
        if final is None:
            raise LlamaServerError(f"llama-server closed the stream before its last chunk: {self.log_tail()}")
        rounds = self._rounds_since(log_start) if self.spec.speculative else []
        return Completion(
            tokens=tokens,
            wall_time=wall,
            ttft=ttft if ttft is not None else wall,
            first_chunk_tokens=first_chunk,
            stop_type=str(final.get("stop_type", "")),
            timings=dict(final.get("timings") or {}),
            rounds=rounds,
        )

    def _rounds_since(self, offset: int, timeout: float = 10.0) -> list[tuple[int, int]]:
        """(accepted, drafted) per round from the log after `offset`, once the request's timings line is in."""
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
            if DONE_LINE.search(text) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return [(int(a), int(n)) for a, n in ROUND_LINE.findall(text)]
