"""Which matmul precision is safe *and* worth it on this machine.

Tuned-lens training and its held-out metrics multiply by the unembedding in
bfloat16 where that is faster. On some x86 CPUs (seen with AMX and avx512_bf16)
libtorch's bfloat16 kernels kill the whole process with a floating-point
exception inside ``torch.autograd.grad``; a Python ``try`` cannot catch that. So
bfloat16 is used only after a probe has run the very same products (forward and
backward, at the caller's shapes) in a *child* process and seen it finish with
results close to float32 (on rows spread over each product), and seen it run
faster than float32 at the largest product the caller runs (after a warm-up,
alternating the two dtypes; a lost race is run once more before it counts). The
verdict is cached per CPU model and flags, torch version, thread count and
shapes, in ``<cache>/precision/``, unless its timings were too uneven to trust (a
busy machine); a crash in the probe only costs the child.

``DEPTHKIT_BF16=0`` forces float32 without probing; ``DEPTHKIT_BF16=1`` trusts
bfloat16 without probing (at your own risk).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from depthkit.core.files import atomic_write, cache_dir

PROBE_VERSION = 7
PROBE_TIMEOUT_S = 300
# bfloat16 must beat float32 by this factor to be chosen (a near tie is not worth
# its rounding error).
MIN_SPEEDUP = 1.1
# Where bfloat16 is emulated it runs many times slower than float32; this much
# slower on the small product ends the probe before the full-size checks.
EMULATED_SLOWDOWN = 4.0
# A timing series whose median exceeds its minimum by more than this was taken on
# a busy machine: a "no" from the full-size race is then used but not cached, so
# the next run probes again.
MAX_SPREAD = 1.25
# Largest relative error (norm of difference / norm of float32 result) accepted for
# the logits and for the input gradient. bfloat16 keeps 8 bits of mantissa: a
# correct kernel lands near 1e-2 on random data.
MAX_REL_ERROR = 0.05
# Rows of each bfloat16 product checked against float32 (spread over the product).
REF_ROWS = 64

# The child repeats what tuned_lens does: readout (x.to(bf16) @ W_bf16).float(),
# a log-softmax, and the gradient w.r.t. the float32 input through the cast.
_PROBE = textwrap.dedent(
    """
    import json, statistics, sys, time
    import torch
    d, v = int(sys.argv[1]), int(sys.argv[2])
    rows = [int(r) for r in sys.argv[3].split(",")]
    g = torch.Generator().manual_seed(0)
    W = torch.randn(d, v, generator=g) / d ** 0.5
    Wb = W.to(torch.bfloat16).contiguous()
    def race(n, reps):
        x = torch.randn(n, d, generator=g)
        xb = x.to(torch.bfloat16)
        bf16, f32 = (lambda: (xb @ Wb).float()), (lambda: x @ W)
        # The first calls pay for kernel choice and weight packing; alternating the
        # two afterwards lets a background load slow both alike.
        bf16(); f32()
        tb, tf = [], []
        for _ in range(reps):
            for fn, out in ((bf16, tb), (f32, tf)):
                t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
        spread = max(statistics.median(s) / min(s) for s in (tb, tf))
        return {"t_bf16": min(tb), "t_f32": min(tf), "spread": spread, "timed_rows": n}
    # Speed first, on a small product: where bfloat16 is emulated the full-size
    # checks below would take minutes for nothing.
    small = race(min(max(rows), 32), 2)
    if small["t_bf16"] > EMULATED * small["t_f32"]:
        print(json.dumps({"max_rel_error": None, **small}))
        sys.exit(0)
    errors = []
    for n in rows:
        x = torch.randn(n, d, generator=g)
        xb = x.clone().requires_grad_()
        zb = (xb.to(torch.bfloat16) @ Wb).float()
        (gb,) = torch.autograd.grad(torch.log_softmax(zb, -1)[:, :7].sum(), xb)
        # Rows are independent, so a float32 reference on rows spread over the whole
        # bfloat16 product (first and last included, where kernels handle their
        # tails) checks it at a fraction of the cost of a full float32 pass.
        pick = torch.linspace(0, n - 1, min(n, REF_ROWS)).round().long().unique()
        xf = x[pick].clone().requires_grad_()
        zf = xf @ W
        (gf,) = torch.autograd.grad(torch.log_softmax(zf, -1)[:, :7].sum(), xf)
        rel = lambda a, b: float((a - b).norm() / b.norm().clamp_min(1e-30))
        errors.append(max(rel(zb.detach()[pick], zf.detach()), rel(gb[pick], gf)))
    # Judged at the largest product the caller runs: small products can lose to
    # float32 on packing costs while the large ones, where the time goes, win.
    print(json.dumps({"max_rel_error": max(errors), **race(max(rows), 3)}))
    """
).replace("EMULATED", repr(EMULATED_SLOWDOWN)).replace("REF_ROWS", repr(REF_ROWS))


@dataclass(frozen=True)
class Verdict:
    """The outcome of a probe: whether bfloat16 products are used, and why."""

    use_bf16: bool
    reason: str
    max_rel_error: float | None = None
    speedup: float | None = None  # float32 time / bfloat16 time
    steady: bool = True  # False: timed on a busy machine, so not worth caching

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def cpu_signature() -> dict[str, object]:
    """What decides which CPU kernels libtorch picks."""
    model, flags = platform.processor() or "", ""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        if key.strip() in ("flags", "Features") and not flags:
            flags = value.strip()
    wanted = sorted(f for f in flags.split() if f.startswith(("amx", "avx512", "avx2", "fma", "asimd", "sve", "bf16")))
    return {
        "machine": platform.machine(),
        "cpu": model,
        "flags": wanted,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def _key(d_model: int, d_vocab: int, rows: tuple[int, ...]) -> str:
    blob = json.dumps({"v": PROBE_VERSION, "cpu": cpu_signature(), "shape": [d_model, d_vocab, list(rows)]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_probe(d_model: int, d_vocab: int, rows: tuple[int, ...] = (1, 32, 128, 256), *, script: str = _PROBE) -> Verdict:
    """Run the bfloat16 products in a child process and judge them (not cached).
    ``script`` is replaceable for tests."""
    cmd = [sys.executable, "-c", script, str(d_model), str(d_vocab), ",".join(map(str, rows))]
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return Verdict(False, f"the bfloat16 probe did not finish in {PROBE_TIMEOUT_S} s")
    if proc.returncode != 0:
        how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with status {proc.returncode}"
        last = (proc.stderr.strip().splitlines() or [""])[-1][:200]
        return Verdict(False, f"the bfloat16 probe {how} on this CPU ({last})".replace(" ()", ""))
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        err = None if out["max_rel_error"] is None else float(out["max_rel_error"])
        t_bf16, t_f32 = float(out["t_bf16"]), float(out["t_f32"])
        steady = float(out.get("spread", 1.0)) <= MAX_SPREAD
        timed_rows = int(out.get("timed_rows", max(rows)))
    except (ValueError, KeyError, IndexError, TypeError):
        return Verdict(False, f"the bfloat16 probe printed no verdict ({proc.stdout[-200:]!r})")
    speedup = t_f32 / max(t_bf16, 1e-9)
    timed = f"{speedup:.2f}x float32 on {timed_rows} rows"
    if err is None:  # far slower already on a small product: accuracy was not checked
        # (steady whatever the spread: bf16_verdict races again before it counts)
        return Verdict(False, f"bfloat16 products are not faster here ({timed})", None, speedup)
    if not err <= MAX_REL_ERROR:
        return Verdict(False, f"bfloat16 products are off by {err:.3g} (relative) on this CPU", err, speedup)
    if speedup < MIN_SPEEDUP:
        return Verdict(False, f"bfloat16 products are not faster here ({timed})", err, speedup, steady)
    return Verdict(True, f"bfloat16 products verified: {timed}, relative error {err:.3g}", err, speedup)


def _slower_only(v: Verdict) -> bool:
    """A "no" given because bfloat16 was slower: a lost race (results checked and
    right) or the early exit on the small product (results not checked), not a crash
    or a wrong result."""
    return (
        not v.use_bf16 and v.speedup is not None and (v.max_rel_error is None or v.max_rel_error <= MAX_REL_ERROR)
    )


def _after_second_race(first: Verdict, again: Verdict) -> Verdict:
    """What counts after a race bfloat16 lost on speed (``first``) was run again. The
    second race can win, or show a crash or a wrong result; between two "no"s for speed
    a race that checked the results beats the early exit that did not (a timing spike
    on the small product can fake that exit: 1 in 30 quiet probes at 64 x 320 here),
    then the better speed-up counts."""
    if not _slower_only(again):
        return again
    return max(first, again, key=lambda v: (v.max_rel_error is not None, v.speedup or 0.0))


def bf16_verdict(
    d_model: int, d_vocab: int, device: str | torch.device = "cpu", rows: tuple[int, ...] = (1, 32, 128, 256)
) -> Verdict:
    """Whether to multiply [rows, d_model] inputs by a [d_model, d_vocab]
    unembedding in bfloat16 here: a cached probe at exactly these shapes on CPU
    (kernels are chosen per shape); yes on a GPU that supports it."""
    forced = os.environ.get("DEPTHKIT_BF16", "").strip()
    if forced == "0":
        return Verdict(False, "DEPTHKIT_BF16=0")
    if forced == "1":
        return Verdict(True, "DEPTHKIT_BF16=1 (not probed)")
    if forced:
        raise ValueError(f"DEPTHKIT_BF16={forced!r}: set it to 0 (float32) or 1 (bfloat16 unprobed), or unset it to probe.")
    dev = torch.device(device)
    if dev.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return Verdict(ok, "CUDA device" + ("" if ok else " without bfloat16 support"))
    if dev.type != "cpu":
        return Verdict(False, f"no probe for device type {dev.type!r}: float32")
    rows = tuple(sorted({int(r) for r in rows if int(r) > 0})) or (1,)
    path = cache_dir("precision", f"bf16-{_key(d_model, d_vocab, rows)}.json")
    try:
        cached = json.loads(path.read_text())
        return Verdict(**cached["verdict"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    verdict = run_probe(d_model, d_vocab, rows)
    if _slower_only(verdict):
        # A load elsewhere can only slow a race, and a cached "no" would train every
        # lens on this machine in float32 from then on (and an unchecked one refuses
        # bfloat16 models): race once more.
        verdict = _after_second_race(verdict, run_probe(d_model, d_vocab, rows))
    if not verdict.steady:
        return verdict
    try:
        record = {"verdict": verdict.as_dict(), "cpu": cpu_signature(), "shape": [d_model, d_vocab, list(rows)]}
        atomic_write(path, json.dumps(record, indent=1))
    except OSError:
        pass  # an unwritable cache only means probing again next time
    return verdict


def matmul_dtype(
    requested: str,
    d_model: int,
    d_vocab: int,
    device: str | torch.device = "cpu",
    rows: tuple[int, ...] = (1, 32, 128, 256),
) -> tuple[torch.dtype, Verdict | None]:
    """The dtype to use for [rows, d_model] @ [d_model, d_vocab] products the caller
    asked to run in ``requested`` ("bfloat16" or "float32"), and the probe verdict
    when one was consulted."""
    if requested == "float32":
        return torch.float32, None
    if requested != "bfloat16":
        raise ValueError(f"matmul dtype {requested!r}: choose 'bfloat16' or 'float32'.")
    verdict = bf16_verdict(d_model, d_vocab, device, rows)
    return (torch.bfloat16 if verdict.use_bf16 else torch.float32), verdict
