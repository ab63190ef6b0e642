"""Start the ranks of a tensor-parallel job, and turn any rank's failure into one clear error.

Two ways in:

- ``run_tp(n, fn, *args)`` from an ordinary process starts ``n`` ranks (gloo on CPU,
  NCCL on CUDA), runs ``fn(tp, *args)`` on each and returns rank 0's result. Under
  torchrun (``RANK`` and ``WORLD_SIZE`` set) it starts nothing: this process is one
  rank, it joins the group, and every rank gets its own result back.
- ``init_tp(n)`` inside a rank joins (or creates) the process group.

A rank that dies leaves its peers blocked in a collective. Collective timeouts bound
that wait, but the parent does not wait for them: it watches its children, and as soon
as one fails it kills the rest and raises EagletError naming the rank.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from eaglet.errors import EagletError, Interrupted
from eaglet.parallel.state import SINGLE, TPGroup

DEFAULT_TIMEOUT_S = 120.0  # collectives; loading a large shard happens before the first one
MAX_CPU_RANKS = 64  # gloo processes on one host; beyond this it is a typo, not a plan
_POLL_S = 0.05
_GRACE_S = 2.0  # after a failure, how long to wait for the other ranks' reports


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def is_main_process() -> bool:
    """True where results should be printed: the only process, or rank 0 under torchrun."""
    return int(os.environ.get("RANK", "0")) == 0


def _is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def check_tp_size(n: int, device: str | torch.device = "cpu") -> None:
    """Refuse a tp this host cannot run, in one sentence."""
    if n < 1:
        raise EagletError(f"--tp must be at least 1, got {n}")
    if _is_cuda(device):
        have = torch.cuda.device_count()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", n))  # ranks on this host under torchrun
        if local > have:
            raise EagletError(f"--tp {n} needs {local} CUDA device{'s' * (local > 1)} on this host "
                              f"but {have} {'is' if have == 1 else 'are'} visible")
    elif n > MAX_CPU_RANKS:
        raise EagletError(f"--tp {n} is more than the {MAX_CPU_RANKS} CPU (gloo) ranks eaglet starts on one host")


def rank_device(device: str | torch.device) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` for CUDA under tp > 1, else ``device`` as given."""
    dev = torch.device(device)
    if dev.type == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return dev


def init_tp(n: int | None = None, device: str | torch.device = "cpu",
            timeout_s: float = DEFAULT_TIMEOUT_S) -> TPGroup:
    """Join the process group described by the environment (torchrun's variables) as one rank.

    Without those variables this is tp=1 and returns SINGLE. Calling it again returns
    the group already joined.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if n is not None and n != world:
        raise EagletError(f"--tp {n} does not match the {world} ranks this job was started with")
    if world == 1:
        return SINGLE
    check_tp_size(world, device)
    rank = int(os.environ["RANK"])
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {}
        if _is_cuda(device):
            # On a collective timeout NCCL first dumps its flight recorder and waits up to a
            # minute for it before aborting: a stalled peer would outlive timeout_s. Abort at
            # once and take the process down (the parent then names the rank); users may override.
            os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "0")
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
            dev = rank_device(device)
            torch.cuda.set_device(dev)
            kwargs["device_id"] = dev  # eager NCCL init: a bad setup fails here, not in the first all-reduce
        dist.init_process_group("nccl" if _is_cuda(device) else "gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s), **kwargs)
        # Under torchrun nothing else ends the group (spawned ranks end it themselves).
        atexit.register(leave_group, True)
    return TPGroup(rank, world, dist.group.WORLD)


def end_torchrun_rank(code: int) -> int:
    """Under torchrun, end this rank's process here: ``code`` 0 waits for every rank first.

    The process exits without interpreter teardown. Finalising Python while the group's
    C++ threads live (and their peers close sockets) has aborted a rank of a finished job
    (CI, twice: "terminate called without an active exception", after the output was
    complete); past the last barrier nothing is left that the OS does not clean up. A rank
    that failed leaves at once: its peers' collectives then fail instead of waiting.
    Elsewhere this returns ``code``.
    """
    if not (under_torchrun() and dist.is_initialized()):
        return code
    if code == 0 and not _meet():
        code = 1  # a peer failed: its own exit code tells torchrun why
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _meet() -> bool:
    """Wait for every rank of the group; False when a peer has failed (nothing to wait for then)."""
    try:
        dist.barrier()
        return True
    except Exception:  # noqa: BLE001
        return False


def leave_group(meet: bool = False) -> None:
    """End this process's part in the group; ``meet`` waits for every rank first (torchrun's exit)."""
    if dist.is_initialized():
        if meet:
            # Under torchrun the ranks leave at interpreter exit, each on its own schedule; one
            # that tore the group down while its peer was still on it has been seen to abort
            # that peer under load ("terminate called without an active exception").
            _meet()
        dist.destroy_process_group()


def run_tp(n: int, fn: Callable[..., Any], *args: Any, device: str | torch.device = "cpu",
           timeout_s: float = DEFAULT_TIMEOUT_S, sigterm_to_rank0: bool = False) -> Any:
    """Run ``fn(tp, *args)`` on ``n`` ranks and return rank 0's result.

    ``fn`` must be a module-level function and ``args`` and the result picklable (the
    ranks are spawned processes). tp=1 runs ``fn`` here, in this process.
    ``sigterm_to_rank0``: for jobs whose rank 0 decides how the ranks stop (a server, a
    training loop that saves first). The ranks then run in a process group of their own,
    so a terminal's Ctrl-C reaches only this process, and each SIGINT or SIGTERM it gets
    becomes one SIGTERM to rank 0; an ``Interrupted`` on rank 0 is raised again here.
    Otherwise a signal ends this process and with it the ranks.
    """
    if under_torchrun():
        return fn(init_tp(n, device, timeout_s), *args)
    check_tp_size(n, device)
    if n == 1:
        return fn(SINGLE, *args)
    return _spawn(n, fn, args, device, timeout_s, sigterm_to_rank0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _context() -> mp.context.BaseContext:
    # Plain fork is unsafe once CUDA or OpenMP threads run in this process. A forkserver
    # is a fresh process that imports torch once (without touching CUDA) and forks every
    # rank from there: each later job starts in milliseconds instead of seconds.
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "eaglet.parallel.launch"])
    return ctx


def _spawn(n: int, fn: Callable[..., Any], args: tuple, device: str | torch.device, timeout_s: float,
           sigterm_to_rank0: bool = False) -> Any:
    ctx = _context()
    messages = ctx.Queue()
    # The whole environment travels: a forkserver rank would otherwise see the environment
    # of the moment the server started, not of this call.
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(n),
           "LOCAL_WORLD_SIZE": str(n)}
    # CPU ranks share the cores; oversubscribed OpenMP threads make every rank crawl.
    threads = None if _is_cuda(device) else max(1, _cpu_count() // n)
    procs = [ctx.Process(target=_rank_main, name=f"eaglet-rank{r}",
                         args=(r, env, fn, args, str(device), timeout_s, threads, messages, sigterm_to_rank0))
             for r in range(n)]
    finished = False
    previous = {}
    try:
        for p in procs:
            p.start()
        if sigterm_to_rank0:
            def to_rank0(*_) -> None:
                if procs[0].is_alive():
                    os.kill(procs[0].pid, signal.SIGTERM)

            previous = {s: signal.signal(s, to_rank0) for s in (signal.SIGINT, signal.SIGTERM)}
        result = _watch(procs, messages)
        finished = True
        return result
    except Interrupted:
        finished = True  # an orderly end: the ranks leave the group and exit on their own
        raise
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _stop(procs, wait_s=10.0 if finished else 0.0)
        messages.close()


def _watch(procs: list, messages) -> Any:
    """Wait for every rank's report; on a failure raise its first cause (the caller kills the rest)."""
    reports: dict[int, tuple[bool, Any]] = {}  # rank -> (ok, payload), in arrival order
    failed_at = None
    while True:
        _drain(messages, reports, _POLL_S)
        exited = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode is not None}
        if failed_at is None and all(ok for ok, _ in reports.values()) and not any(exited.values()):
            if len(reports) == len(procs):
                return pickle.loads(reports[0][1])
            if len(exited) == len(procs):  # all gone cleanly, so any report still missing is in the pipe
                _drain(messages, reports, 0)
                missing = sorted(set(range(len(procs))) - reports.keys())
                if missing:
                    raise EagletError(f"rank {missing[0]} failed: it exited without reporting a result")
            continue
        failed_at = failed_at or time.monotonic()
        # One failure makes its peers fail too (connection reset, timeout). Wait, briefly,
        # until every rank has reported or exited, so that the cause is named, not a symptom.
        if len(reports.keys() | exited.keys()) == len(procs) or time.monotonic() - failed_at > _GRACE_S:
            _drain(messages, reports, 0)
            raise _first_cause(reports, exited)


def _drain(messages, reports: dict[int, tuple[bool, Any]], timeout: float) -> None:
    try:
        msg = messages.get(timeout=timeout) if timeout else messages.get_nowait()
        while True:
            rank, ok, payload = msg
            reports[rank] = (ok, payload)
            msg = messages.get_nowait()
    except queue.Empty:
        pass


def _first_cause(reports: dict[int, tuple[bool, Any]], exited: dict[int, int]) -> EagletError:
    # A rank that died without a word (killed, os._exit) broke the others' connections; a
    # rank that raised reported before its exit could break anything, so it comes first.
    silent = [r for r, code in sorted(exited.items()) if code != 0 and r not in reports]
    if silent:
        rank, code = silent[0], exited[silent[0]]
        if code == -signal.SIGABRT:  # how NCCL's watchdog ends a rank
            return EagletError(f"rank {rank} failed: it aborted (a failed or timed-out NCCL collective "
                               "does this; the rank's log above says which)")
        if code < 0:
            return EagletError(f"rank {rank} failed: it was killed by {signal.Signals(-code).name}")
        return EagletError(f"rank {rank} failed: it exited with status {code} without reporting an error")
    rank, (_, (kind, text)) = next((r, v) for r, v in reports.items() if not v[0])
    if kind == "interrupted":  # rank 0 saved and stopped on a signal: the command's own ending
        return Interrupted(text)
    # A user error (bad config, heads not divisible) is the same one sentence on every rank.
    return EagletError(text if kind == "user" else f"rank {rank} failed: {text}")


def _stop(procs: list, wait_s: float) -> None:
    """Let finished ranks exit on their own for up to ``wait_s``; end the rest."""
    deadline = time.monotonic() + wait_s
    for p in procs:
        if p.pid is not None:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in procs:
        if p.pid is None:
            continue
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _rank_main(rank: int, env: dict[str, str], fn: Callable[..., Any], args: tuple, device: str,
               timeout_s: float, threads: int | None, messages, own_group: bool = False) -> None:
    if own_group:
        os.setpgrp()  # out of the terminal's reach: signals come from the launching process only
    os.environ.clear()
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        tp = init_tp(int(env["WORLD_SIZE"]), device, timeout_s)
        result = fn(tp, *args)
        messages.put((rank, True, pickle.dumps(result) if rank == 0 else None))
    except Interrupted as e:  # rank 0 saved and stopped the others: an orderly end, the group is whole
        messages.put((rank, False, ("interrupted", str(e))))
    except BaseException as e:  # KeyboardInterrupt too: the parent must hear why this rank stopped
        if not isinstance(e, EagletError):
            traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:400]
        text = str(e) if isinstance(e, EagletError) else f"{type(e).__name__}: {first}".rstrip(": ")
        messages.put((rank, False, ("user" if isinstance(e, EagletError) else "bug", text)))
        messages.close()
        messages.join_thread()
        sys.stderr.flush()
        # Skip interpreter teardown: destroying a process group whose peers are gone can hang.
        os._exit(1)
    leave_group()
